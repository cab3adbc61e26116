"""The synthetic world of `paravt synth`: formats (SPEC §2, §3, §7, §8), determinism,
the offline hub mirror, and the property the world exists for: the overview misses the
events that a 1 fps crop of their window shows."""

from __future__ import annotations

import argparse
import io
import json
import math
import random
import re
import subprocess
import sys
import tarfile
import typing
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from paravt_core.data.synth import PARQUET_REPO, SOURCE_REPO, SynthConfig, generate_world
from paravt_core.data.synth.benchmarks import LAYOUTS
from paravt_core.data.synth.glyphs import DIGIT_BITMAPS, digit_mask, shape_mask
from paravt_core.data.synth.paravt import RL_FILE, SENTINEL_ROOTS
from paravt_core.data.synth.prompts import ANSWER_INSTRUCTIONS, question_prompt
from paravt_core.data.synth.questions import Question
from paravt_core.data.synth.traces import plan_crop_windows, segment_grid, summarize_window
from paravt_core.data.synth.world import COLOURS, Background, Event, VideoSpec, overview_frame_indices

SHARED_BENCHMARKS = Path(__file__).resolve().parents[2].parent / "shared" / "benchmarks"
SMALL = SynthConfig(
    seed=7,
    train_videos=16,
    eval_videos_per_split=3,
    eval_rows_per_split=5,
    min_duration_s=30,
    max_duration_s=60,
    width=64,
    height=64,
    sft_traces_per_video=2,
    rl_prompts_per_video=2,
    no_tool_share=0.25,
    validation=True,
)
SENTINEL_RE = re.compile(
    r"^(longvt_source/[^/]+/.+|museg/charades/[^/]+|museg/et_instruct_164k/[^/]+|selfqa/[^/]+)\.mp4$"
)
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
FINAL_RE = re.compile(r"\A<think>\n.{10,}\n</think>\n<answer>(.+)</answer>\Z", re.DOTALL)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return generate_world(SMALL, tmp_path_factory.mktemp("synth"), progress=False)


@pytest.fixture(scope="module")
def manifest(world) -> dict:
    return json.loads(world.manifest.read_text())


@pytest.fixture(scope="module")
def train_specs(manifest) -> dict[str, dict]:
    """Sentinel path -> the video record of the manifest."""
    return {v["sentinel"]: v["video"] for v in manifest["train"]}


def _rows(world, repo_id: str, path: str) -> list[dict]:
    return pq.read_table(world.repos[repo_id].folder / path).to_pylist()


def _sft_rows(world) -> list[dict]:
    shards = [path for path in world.repos[PARQUET_REPO].files if path.startswith("sft/")]
    return [row for path in shards for row in _rows(world, PARQUET_REPO, path)]


def _text(message: dict) -> str:
    return "".join(item["text"] for item in message["content"] if item["type"] == "text")


def _events_between(video: dict, start: float, end: float) -> list[dict]:
    return [e for e in video["events"] if e["start_s"] < end and e["end_s"] > start]


# ----- config -----------------------------------------------------------------------


def test_config_is_frozen_and_validated():
    with pytest.raises(ValidationError):
        SynthConfig(frames_per_second=2)  # extra="forbid"
    with pytest.raises(ValidationError):
        SynthConfig(min_duration_s=90, max_duration_s=60)
    with pytest.raises(ValidationError):
        SynthConfig(width=65)  # yuv420p needs even sides
    with pytest.raises(ValidationError):
        SynthConfig(fps=8)
    with pytest.raises(ValidationError):
        SynthConfig().seed = 3


# ----- world building blocks -------------------------------------------------------------


def test_digit_font_is_5x7_and_scales():
    assert all(len(rows) == 7 and all(len(r) == 5 for r in rows) for rows in DIGIT_BITMAPS.values())
    assert len({rows for rows in DIGIT_BITMAPS.values()}) == 10
    assert digit_mask(8, 3).shape == (21, 15)


@pytest.mark.parametrize("shape", ["square", "circle", "triangle", "diamond", "star"])
def test_shapes_fill_a_sensible_part_of_their_box(shape):
    area = shape_mask(shape, 24).mean()
    assert 0.25 < area <= 1.0


@pytest.mark.parametrize(
    ("n_frames", "k", "expected"),
    [
        (60, 4, {0, 19, 20, 39, 40, 59, 7, 8, 22, 23, 37, 38, 52, 53}),
        (10, 1, {0, 5}),  # linspace(0, 9, 1) is [0]
        (10, 0, set()),
    ],
)
def test_overview_frame_indices_cover_both_conventions(n_frames, k, expected):
    assert overview_frame_indices(n_frames, k) == expected


def _spec_with(events: tuple[Event, ...]) -> VideoSpec:
    background = Background("blue", "top", 120, ((0.5, 0.5, 30.0, 0.0),))
    return VideoSpec("v", 120, 2.0, 64, 64, background, events)


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        ((0, 10), "Nothing notable happens in this window: only the plain background is visible."),
        ((18, 30), "From 00:20.0 to 00:23.0 a red circle appears in the top left corner."),
        ((22, 60), "From 00:22.0 to 00:23.0 a red circle appears in the top left corner. "
                   "From 00:40.0 to 00:42.5 an orange star moves from right to left across the frame."),
        ((10, 59), "From 00:20.0 to 00:23.0 a red circle appears in the top left corner. "
                   "From 00:40.0 to 00:42.5 an orange star moves from right to left across the frame."),
    ],
)
def test_window_summaries_report_events_in_temporal_order(window, expected):
    events = (
        Event("shape", 40, 46, 2.0, "red", shape="circle", position="top left"),
        Event("motion", 80, 85, 2.0, "orange", shape="star", direction="right to left"),
    )
    assert summarize_window(_spec_with(events), *window) == expected


def test_question_prompts_use_the_spec_mcq_layout():
    question = Question("v", "mcq", "colour", "What colour was the circle?", "B", "red", ("Blue", "Red", "Cyan", "Green"))
    assert question_prompt(question, "abc.mp4") == (
        "Question: What colour was the circle?\nOptions:\nA. Blue\nB. Red\nC. Cyan\nD. Green\n"
        "Answer with the option letter only.\nThe video path for this video is: abc.mp4"
    )
    grounding = Question("v", "tvg", "when", "When does the red circle appear?", "[20.0, 23.0]", "[20.0, 23.0]")
    assert question_prompt(grounding, "abc.mp4").splitlines()[1] == ANSWER_INSTRUCTIONS["tvg"]


# ----- ParaVT-Parquet: SFT ------------------------------------------------------------------


def _check_tool_calls(text: str, video_name: str, duration: float) -> list[tuple[float, float]]:
    """The call windows of a first assistant turn, checked against SPEC §2 and §3."""
    assert text.startswith("<think>\n") and "\n</think>\n<tool_call>" in text
    windows = []
    for body in TOOL_CALL_RE.findall(text):
        call = json.loads(body)
        assert call["name"] == "crop_video"
        args = call["arguments"]
        assert set(args) == {"video_path", "start_time", "end_time"}
        assert args["video_path"] == video_name
        assert 0 <= args["start_time"] < args["end_time"] <= duration
        assert args["end_time"] - args["start_time"] <= SMALL.max_crop_s
        windows.append((args["start_time"], args["end_time"]))
    assert 1 <= len(windows) <= SMALL.max_calls_per_trace
    assert windows == sorted(windows) and all(a[1] <= b[0] for a, b in zip(windows, windows[1:]))
    return windows


def test_sft_rows_follow_the_response_grammar(world, train_specs):
    rows = _sft_rows(world)
    assert len(rows) == SMALL.train_videos * SMALL.sft_traces_per_video
    no_tool = 0
    for row in rows:
        (sentinel,) = row["videos"]
        video, name = train_specs[sentinel], sentinel.rsplit("/", 1)[1]
        messages = row["messages"]
        roles = [m["role"] for m in messages]
        assert roles[:2] == ["system", "user"] and roles[-1] == "assistant"
        video_items = [i for i in messages[1]["content"] if i["type"] == "video_url"]
        assert [i["video_url"]["url"] for i in video_items] == [sentinel]
        assert _text(messages[1]).endswith(f"The video path for this video is: {name}")
        assert FINAL_RE.match(_text(messages[-1])), _text(messages[-1])
        if roles == ["system", "user", "assistant"]:
            no_tool += 1
            assert "<tool_call>" not in _text(messages[-1])
            continue
        windows = _check_tool_calls(_text(messages[2]), name, video["duration_s"])
        assert roles == ["system", "user", "assistant", *["tool"] * len(windows), "assistant"]
        for (start, end), response in zip(windows, messages[3:-1], strict=True):
            assert ("Nothing notable" in _text(response)) == (not _events_between(video, start, end))
            assert "<tool_response>" not in _text(response)  # the chat template adds the tags
        assert any(_events_between(video, s, e) for s, e in windows)
    assert no_tool == round(SMALL.no_tool_share * len(rows))



def _spec(duration: float, *events: tuple[float, float]) -> VideoSpec:
    """A 2 fps video spec with shape events at the given seconds."""
    made = tuple(Event("shape", round(2 * s), round(2 * e), 2.0, "red", "circle", "centre") for s, e in events)
    return VideoSpec("v", round(2 * duration), 2.0, 64, 64, Background("grey", "left", 100, ()), made)


@pytest.mark.parametrize(
    ("duration", "event", "max_calls", "must_hold"),
    [
        (70.5, (20.0, 23.0), 3, {(16, 32)}),  # inside one segment
        (70.5, (30.5, 33.0), 3, {(16, 32), (32, 48)}),  # straddles a boundary: both segments
        (70.5, (66.0, 69.0), 3, {(64, 70)}),  # the last, shorter segment ends at the last whole second
        (70.5, (30.5, 33.0), 1, {(29, 34)}),  # one call allowed: a window centred on the event
    ],
)
def test_teacher_windows_are_grid_segments_that_hold_the_event(duration, event, max_calls, must_hold):
    spec = _spec(duration, event)
    grid = set(segment_grid(spec, 16))
    for seed in range(20):
        windows = plan_crop_windows(random.Random(seed), spec, 0, max_calls, 16.0)
        assert must_hold <= set(windows) and 1 <= len(windows) <= max_calls
        assert list(windows) == sorted(set(windows))
        if max_calls > 1:
            assert set(windows) <= grid

def test_sft_answers_match_the_ground_truth(world, train_specs):
    """A tvg answer is its event's window; an MCQ answer's option names an attribute of the video."""
    for row in _sft_rows(world):
        video = train_specs[row["videos"][0]]
        question, answer = _text(row["messages"][1]), FINAL_RE.match(_text(row["messages"][-1])).group(1)
        if "as [start, end]" in question:
            start, end = json.loads(answer)
            assert any(math.isclose(start, e["start_s"]) and math.isclose(end, e["end_s"]) for e in video["events"])
        elif "Options:" in question:
            option = re.search(rf"^{answer}\. (.+)$", question, re.MULTILINE).group(1).lower()
            facts = {video["background"]["tint"], video["background"]["bright_side"]}
            facts |= {str(e[k]) for e in video["events"] for k in ("colour", "shape", "position", "direction")}
            facts |= {("zero one two three four five six seven eight nine".split())[e["digit"]]
                      for e in video["events"] if e["digit"] is not None}
            assert option in facts


# ----- ParaVT-Parquet: RL -------------------------------------------------------------------


def test_rl_rows_carry_prompt_videos_and_extra_info(world, train_specs):
    table = pq.read_table(world.repos[PARQUET_REPO].folder / RL_FILE)
    assert table.column_names == ["prompt", "videos", "extra_info"]
    assert table.schema.field("extra_info").type == pa.string()
    rows = table.to_pylist()
    assert len(rows) == SMALL.train_videos * SMALL.rl_prompts_per_video
    seen_types = set()
    for row in rows:
        assert [t["role"] for t in row["prompt"]] == ["system", "user"]
        assert row["prompt"][1]["content"].startswith("<video>\nQuestion: ")
        (video,) = row["videos"]
        assert SENTINEL_RE.match(video["video"]) and video["video"] in train_specs
        extra = json.loads(row["extra_info"])
        assert set(extra) == {"answer", "question_type", "question"}
        seen_types.add(extra["question_type"])
        if extra["question_type"] == "mcq":
            assert re.fullmatch(r"[A-D]", extra["answer"])
        elif extra["question_type"] == "tvg":
            start, end = json.loads(extra["answer"])
            assert 0 < start < end < train_specs[video["video"]]["duration_s"]
        else:
            assert extra["question_type"] == "oe" and re.fullmatch(r"[a-z ]+", extra["answer"])
        assert extra["question"] in row["prompt"][1]["content"]
    assert seen_types == {"mcq", "tvg", "oe"}


# ----- ParaVT-Source --------------------------------------------------------------------


def test_source_zips_hold_exactly_the_training_videos_by_sentinel_path(world, manifest):
    snapshot = world.repos[SOURCE_REPO].folder
    members = {}
    for path in world.repos[SOURCE_REPO].files:
        if path.endswith(".zip"):
            with zipfile.ZipFile(snapshot / path) as archive:
                root = path.removesuffix(".zip")
                for name in archive.namelist():
                    assert SENTINEL_RE.match(name) and name.replace("/", "_").startswith(root), (path, name)
                    members[name] = archive.getinfo(name).file_size
    assert set(members) == {v["sentinel"] for v in manifest["train"]}
    roots = {next(r for r in SENTINEL_ROOTS if name.startswith(r + "/")) for name in members}
    assert roots == set(SENTINEL_ROOTS)
    eval_names = {v["file_name"].rsplit("/", 1)[-1] for s in manifest["eval"].values() for v in s["videos"]}
    assert not eval_names & {name.rsplit("/", 1)[1] for name in members}  # held out by video
    assert all(size > 1000 for size in members.values())


# ----- the seven evaluation splits ---------------------------------------------------------


def _split_rows(world, split: str) -> pa.Table:
    layout = LAYOUTS[split]
    return pq.read_table(world.repos[layout.repo_id].folder / layout.annotation_file)


@pytest.mark.parametrize("split", sorted(LAYOUTS))
def test_eval_split_schema_matches_the_real_rows(world, split):
    name = "videomme" if split in ("videomme_wsub", "videomme_val") else split
    real_file = SHARED_BENCHMARKS / name / f"{name}.parquet"
    if not real_file.is_file():
        pytest.skip(f"real benchmark rows not found at {real_file}")
    ours, real = _split_rows(world, split).schema, pq.read_schema(real_file)
    assert ours.names == real.names
    for field in ours:
        if (split, field.name) == ("charades", "timestamp"):
            assert field.type == pa.list_(pa.float16())  # the dataset's float16 (the sample stores doubles)
        else:
            assert field.type == real.field(field.name).type, field.name
    rows = _split_rows(world, split).to_pylist()
    assert 1 <= len(rows) <= SMALL.eval_rows_per_split


def test_eval_rows_follow_each_datasets_conventions(world):
    for row in _split_rows(world, "videomme").to_pylist():
        assert [o[:3] for o in row["options"]] == ["A. ", "B. ", "C. ", "D. "] and row["answer"] in "ABCD"
        assert row["question_id"].startswith(row["video_id"] + "-") and row["url"].endswith(row["videoID"])
    for row in _split_rows(world, "longvideobench").to_pylist():
        options = [row[f"option{i}"] for i in range(5)]
        assert options[row["correct_choice"]] != "N/A" and options[:4].count("N/A") == 0
        assert row["video_path"] == f"{row['video_id']}.mp4"
    for row in _split_rows(world, "lvbench").to_pylist():
        assert "\n(A) " in row["question"] and "\n(D) " in row["question"] and row["answer"] in "ABCD"
        assert re.fullmatch(r"\d\d:\d\d-\d\d:\d\d", row["time_reference"])
    for row in _split_rows(world, "mlvu").to_pylist():
        assert row["question"].endswith("\n") and f"(A) {row['candidates'][0]}\n" in row["question"]
        assert row["answer"] in "ABCD" and len(row["candidates"]) == 4
    kinds = set()
    for row in _split_rows(world, "mmvu").to_pylist():
        assert "/main/" in row["video"] and set(row["choices"]) == set("ABCDE")
        assert row["metadata"]["subject"] and row["metadata"]["rationale"]
        kinds.add(row["question_type"])
        if row["question_type"] == "open-ended":
            assert set(row["choices"].values()) == {""} and len(row["answer"]) > 1
        else:
            assert row["question_type"] == "multiple-choice" and row["answer"] in "ABCDE"
            assert all(row["choices"].values())
    assert kinds <= {"multiple-choice", "open-ended"}
    assert _split_rows(world, "charades").schema.field("timestamp").type == pa.list_(pa.float16())
    for row in _split_rows(world, "charades").to_pylist():
        start, end = row["timestamp"]
        assert re.fullmatch(r"[A-Z0-9]{5}\.mp4", row["video"]) and row["caption"].endswith(".")
        assert 0 < start < end and np.float16(start) == start and np.float16(end) == end


def _repo_video_names(world, layout) -> set[str]:
    """Paths under the layout's video folder, from the repo or its archive."""
    snapshot = world.repos[layout.repo_id].folder
    if layout.video_archive and ".tar.part." in layout.video_archive:
        parts = sorted(snapshot.glob(layout.video_archive.replace(".part.aa", ".part.*")))
        assert len(parts) > 1  # really split, as the real repo ships it
        joined = io.BytesIO(b"".join(p.read_bytes() for p in parts))
        with tarfile.open(fileobj=joined) as archive:
            names = archive.getnames()
    elif layout.video_archive:
        names = zipfile.ZipFile(snapshot / layout.video_archive).namelist()
    else:
        names = list(world.repos[layout.repo_id].files)
    prefix = layout.video_dir + "/" if layout.video_dir else ""
    return {n.removeprefix(prefix) for n in names if n.startswith(prefix) and n.endswith(".mp4")}


def test_every_eval_row_points_at_a_video_in_its_repo(world):
    file_of_row = {
        "videomme": lambda r: f"{r['videoID']}.mp4",
        "videomme_val": lambda r: f"{r['videoID']}.mp4",
        "longvideobench": lambda r: r["video_path"],
        "lvbench": lambda r: f"{r['key']}.mp4",
        "mlvu": lambda r: r["video_name"],
        "mmvu": lambda r: r["video"].split("/main/", 1)[1],
        "charades": lambda r: r["video"],
    }
    for split, file_name in file_of_row.items():
        videos = _repo_video_names(world, LAYOUTS[split])
        assert len(videos) == SMALL.eval_videos_per_split
        assert {file_name(r) for r in _split_rows(world, split).to_pylist()} <= videos
    wsub = LAYOUTS["videomme_wsub"]
    with zipfile.ZipFile(world.repos[wsub.repo_id].folder / wsub.subtitle_archive) as archive:
        subtitles = {n: archive.read(n).decode() for n in archive.namelist()}
    ids = {r["videoID"] for r in _split_rows(world, "videomme").to_pylist()}
    assert {f"subtitle/{i}.srt" for i in ids} <= set(subtitles)
    for text in subtitles.values():
        assert re.match(r"1\n\d\d:\d\d:\d\d,\d{3} --> \d\d:\d\d:\d\d,\d{3}\n\S", text)


# ----- hub mirror -------------------------------------------------------------------------


def test_offline_snapshot_download_resolves_every_repo(world):
    """A fresh interpreter with HF_HUB_OFFLINE=1 finds each repo through refs/main."""
    patterns = {PARQUET_REPO: ["sft/*.parquet", "rl/*.parquet"], SOURCE_REPO: ["*.zip"]}
    script = (
        "import json, sys\n"
        "from huggingface_hub import hf_hub_download, snapshot_download\n"
        "cache, repos = sys.argv[1], json.loads(sys.argv[2])\n"
        "out = {r: snapshot_download(r, repo_type='dataset', cache_dir=cache, revision='main', allow_patterns=p)"
        " for r, p in repos.items()}\n"
        "out['readme'] = hf_hub_download('yale-nlp/MMVU', 'README.md', repo_type='dataset', cache_dir=cache)\n"
        "print(json.dumps(out))\n"
    )
    repos = {repo_id: patterns.get(repo_id, ["*"]) for repo_id in world.repos}
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(world.out)}
    done = subprocess.run(
        [sys.executable, "-c", script, str(world.hub_cache), json.dumps(repos)],
        capture_output=True, text=True, env=env, check=True, timeout=120,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for repo_id, snapshot in world.repos.items():
        assert Path(found[repo_id]) == snapshot.folder
        for path in snapshot.files:
            link = snapshot.folder / path
            assert link.is_symlink() and link.resolve().parent.name == "blobs" and link.is_file()
        ref = (snapshot.folder.parents[1] / "refs" / "main").read_text()
        assert ref == snapshot.commit and re.fullmatch(r"[0-9a-f]{40}", ref)
    assert Path(found["readme"]).read_text().startswith("# yale-nlp/MMVU")


def test_lfs_blobs_are_named_by_sha256(world):
    import hashlib

    snapshot = world.repos[PARQUET_REPO].folder
    link = snapshot / RL_FILE
    assert link.resolve().name == hashlib.sha256(link.read_bytes()).hexdigest()


# ----- determinism ---------------------------------------------------------------------------


def test_the_validation_split_changes_no_byte_of_the_other_repos(tmp_path, world, manifest):
    cfg = SMALL.model_copy(update={"train_videos": 4, "eval_videos_per_split": 2, "eval_rows_per_split": 3})
    without = generate_world(cfg.model_copy(update={"validation": False}), tmp_path / "a", progress=False)
    with_val = generate_world(cfg, tmp_path / "b", progress=False)
    validation = LAYOUTS["videomme_val"]
    assert set(with_val.repos) == set(without.repos) | {validation.repo_id}
    for repo_id, snapshot in without.repos.items():
        assert with_val.repos[repo_id].commit == snapshot.commit, repo_id
    assert "videomme_val" not in without.counts and with_val.counts["videomme_val"] == 3
    # Its videos are its own: not the test split's, not the training videos.
    names = {split: {v["file_name"] for v in block["videos"]} for split, block in manifest["eval"].items()}
    assert len(names["videomme_val"]) == SMALL.eval_videos_per_split
    assert not names["videomme_val"] & names["videomme"]
    trained = {entry["video"]["video_id"] for entry in manifest["train"]}
    assert not {name.removesuffix(".mp4") for name in names["videomme_val"]} & trained


def test_same_seed_gives_the_same_bytes_and_another_seed_does_not(tmp_path):
    cfg = SMALL.model_copy(update={"train_videos": 4, "eval_videos_per_split": 1, "eval_rows_per_split": 2})
    first = generate_world(cfg, tmp_path / "a", progress=False)
    second = generate_world(cfg, tmp_path / "b", progress=False)
    other = generate_world(cfg.model_copy(update={"seed": cfg.seed + 1}), tmp_path / "c", progress=False)
    for repo_id, snapshot in first.repos.items():
        assert snapshot.commit == second.repos[repo_id].commit
        for path in snapshot.files:
            assert (snapshot.folder / path).read_bytes() == (second.repos[repo_id].folder / path).read_bytes()
        assert snapshot.commit != other.repos[repo_id].commit
    assert first.manifest.read_bytes() == second.manifest.read_bytes()


def test_rerun_into_the_same_folder_leaves_no_temporary_files(tmp_path):
    cfg = SMALL.model_copy(update={"train_videos": 4, "eval_videos_per_split": 1, "eval_rows_per_split": 1})
    generate_world(cfg, tmp_path, progress=False)
    world = generate_world(cfg, tmp_path, progress=False)
    leftovers = [p for p in tmp_path.rglob(".*") if p.name not in (".gitattributes",)]
    assert leftovers == []
    assert all((s.folder / f).is_file() for s in world.repos.values() for f in s.files)


# ----- the overview misses the event, a 1 fps crop shows it ----------------------------------


def _shows_event(frame: np.ndarray, colour: str, min_pixels: int = 20) -> bool:
    """Whether enough pixels of `frame` [H, W, 3] are close to the event's colour."""
    distance = np.abs(frame.astype(np.int16) - np.array(COLOURS[colour], dtype=np.int16)).max(axis=-1)
    return int((distance < 60).sum()) >= min_pixels


def _decoded_videos(world, manifest, folder: Path):
    """(video record, local mp4 path): training videos extracted with their sentinel names,
    then the evaluation videos stored loose in their repos."""
    snapshot = world.repos[SOURCE_REPO].folder
    for path in world.repos[SOURCE_REPO].files:
        if path.endswith(".zip"):
            zipfile.ZipFile(snapshot / path).extractall(folder)
    for record in manifest["train"]:
        yield record["video"], folder / record["sentinel"]
    for split in manifest["eval"].values():
        layout = split["layout"]
        if layout["video_archive"] is None:
            for record in split["videos"]:
                yield record["video"], world.repos[layout["repo_id"]].folder / layout["video_dir"] / record["file_name"]


def _overview_and_crop_hits(world, manifest, folder: Path, n_samples: int = 50) -> tuple[int, int]:
    """Of the first `n_samples` events: how many 4 uniform overview frames show, and in
    how many a 1 fps crop of the event's window shows the event on every frame (SPEC §3)."""
    import decord

    samples, overview_hits, crop_hits = 0, 0, 0
    for video, path in _decoded_videos(world, manifest, folder):
        reader = decord.VideoReader(str(path))
        assert len(reader) == video["n_frames"]
        overview = reader.get_batch(np.linspace(0, len(reader) - 1, 4).round().astype(int).tolist()).asnumpy()
        for event in video["events"][: n_samples - samples]:
            crop_times = np.arange(event["start_s"], event["end_s"], 1.0)
            crop = reader.get_batch([round(t * video["fps"]) for t in crop_times]).asnumpy()
            overview_hits += any(_shows_event(f, event["colour"]) for f in overview)
            crop_hits += all(_shows_event(f, event["colour"]) for f in crop)
            samples += 1
        if samples == n_samples:
            return overview_hits, crop_hits
    raise AssertionError(f"the world holds only {samples} events, fewer than {n_samples}")


def test_overview_frames_miss_events_that_a_one_fps_crop_shows(world, manifest, tmp_path):
    """Default world: events avoid the 4 overview instants, so the overview shows none."""
    overview_hits, crop_hits = _overview_and_crop_hits(world, manifest, tmp_path)
    assert crop_hits == 50
    assert overview_hits <= 5, f"the overview showed {overview_hits} of 50 events"


def test_without_avoidance_the_overview_still_misses_most_events(tmp_path):
    cfg = SMALL.model_copy(update={"overview_blind_frames": 0, "train_videos": 30, "eval_videos_per_split": 1})
    world = generate_world(cfg, tmp_path / "world", progress=False)
    manifest = json.loads(world.manifest.read_text())
    overview_hits, crop_hits = _overview_and_crop_hits(world, manifest, tmp_path / "media")
    assert crop_hits == 50
    assert overview_hits < 25, f"the overview showed {overview_hits} of 50 events"


def test_event_frames_are_exactly_the_events_window(world, manifest, tmp_path):
    """Frames just outside an event's window do not show it; the first and last inside do."""
    import decord

    for video, path in list(_decoded_videos(world, manifest, tmp_path))[:6]:
        reader = decord.VideoReader(str(path))
        for event in video["events"]:
            first, last = event["start_frame"], event["end_frame"] - 1
            frames = reader.get_batch([first - 1, first, last, last + 1]).asnumpy()
            assert [_shows_event(f, event["colour"]) for f in frames] == [False, True, True, False]


# ----- CLI ----------------------------------------------------------------------------------


def test_cli_synth_reads_yaml_overrides_seed_and_prints_a_summary(tmp_path, capsys):
    from paravt_core.data import cli

    config = tmp_path / "synth.yaml"
    config.write_text("synth:\n  train_videos: 4\n  eval_videos_per_split: 1\n  eval_rows_per_split: 2\n  seed: 1\n")
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    argv = ["synth", "--out", str(tmp_path / "out"), "--seed", "5", "--config", str(config), "--quiet"]
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "rl/paravt_rl_diverse.parquet" in printed and "charades" in printed and "total" in printed
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["config"]["seed"] == 5 and len(manifest["train"]) == 4

    config.write_text("train_videos: 2\n")
    args = parser.parse_args(["synth", "--out", str(tmp_path / "bad"), "--config", str(config), "--quiet"])
    assert args.func(args) == 2
    assert "train_videos" in capsys.readouterr().err


def test_no_row_repeats(world):
    # The data contracts refuse duplicate rows; a video's questions must be distinct.
    sft = [json.dumps(r, sort_keys=True, default=str) for r in _sft_rows(world)]
    assert len(sft) == len(set(sft))
    rl = [json.dumps(r, sort_keys=True, default=str) for r in _rows(world, PARQUET_REPO, "rl/paravt_rl_diverse.parquet")]
    assert len(rl) == len(set(rl))


# ----- planted empty videos (issue #12's demo) ----------------------------------------------


def test_empty_videos_name_only_known_sets_once():
    from paravt_core.data.synth.benchmarks import GENERATED_SPLITS
    from paravt_core.data.synth.config import VideoSet

    assert set(typing.get_args(VideoSet)) == {"train", *GENERATED_SPLITS}
    with pytest.raises(ValidationError):
        SynthConfig(empty_videos=("videomme_wsub",))  # shares videomme's videos: plant it there
    with pytest.raises(ValidationError):
        SynthConfig(empty_videos=("train", "train"))


def test_planting_empties_the_first_video_of_each_named_set_only():
    from paravt_core.data.synth.benchmarks import build_eval_split
    from paravt_core.data.synth.generate import plant_empty_videos, train_videos

    cfg = SMALL.model_copy(update={"empty_videos": ("train", "charades")})
    train = train_videos(cfg)
    splits = {split: build_eval_split(cfg, split) for split in ("charades", "mlvu")}
    media = {v.sentinel: b"mp4" for v in train}
    media |= {(split, v.file_name): b"mp4" for split, s in splits.items() for v in s.videos}
    planted, names = plant_empty_videos(cfg, train, splits, media)
    charades = splits["charades"]
    assert names == [train[0].sentinel, f"charades/{charades.layout.video_member(charades.videos[0].file_name)}"]
    emptied = {key for key, data in planted.items() if data == b""}
    assert emptied == {train[0].sentinel, ("charades", charades.videos[0].file_name)}
    assert media[train[0].sentinel] == b"mp4"  # the rendered media are left as they were


def test_captioning_wording_names_the_background_tint_of_empty_windows_only():
    """The captioning corpus names the tint of an empty window (its colour signal); a sub-agent's
    report does not (the tints share names with event colours), and an event's wording is the same."""
    from paravt_core.data.synth.traces import EMPTY_WINDOW

    spec = _spec_with((Event("shape", 40, 46, 2.0, "red", shape="circle", position="top left"),))
    assert summarize_window(spec, 0, 10) == EMPTY_WINDOW
    assert summarize_window(spec, 0, 10, background=True) == (
        "Nothing notable happens in this window: only the plain blue-tinted background is visible.")
    assert summarize_window(spec, 18, 30, background=True) == summarize_window(spec, 18, 30)
