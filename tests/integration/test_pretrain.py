"""Perception pretraining of the tiny base (#15): its corpus, its frames, its training."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from paravt_core.config import ConfigError, load_config
from paravt_core.miniature import pretrain
from paravt_core.refs import ArtifactRef, content_hash

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _cfg(out: Path, *extra: str):
    return load_config(REPO / "conf/pipeline/reproduce.yaml", [
        f"run.output_dir={out}", "model.pretrain.videos=3", "model.pretrain.windows_per_video=4",
        "model.pretrain.max_steps=3", "model.pretrain.micro_batch_size=2", "model.pretrain.checkpoint_every=3",
        "model.pretrain.reading_rows=8", "model.pretrain.reading_steps=2", "model.pretrain.sft_replay_rows=0", *extra])


def test_corpus_clips_are_captioned_with_the_truth_of_their_window(tmp_path: Path):
    from paravt_core.data.synth.traces import summarize_window
    from paravt_core.data.synth.world import derived_rng, sample_video, youtube_like_id

    cfg = _cfg(tmp_path)
    corpus = pretrain.build_corpus(cfg, log_line=lambda line: None)
    rows = pq.read_table(corpus.path / pretrain.CORPUS_FILE).to_pylist()
    # each video's clip windows, and its overview at model.pretrain.overview_rows of the teacher's budgets
    requests = [json.loads(row["messages"])[0]["content"][-1]["text"] for row in rows]
    assert requests.count(pretrain.CAPTION_REQUEST) == 3 * 4
    assert requests.count(pretrain.OVERVIEW_REQUEST) == 3 * cfg.model.pretrain.overview_rows == 3 * 4
    assert len(rows) == 3 * 4 + 3 * 4
    messages = json.loads(rows[0]["messages"])
    clip, request = messages[0]["content"]
    assert request["text"] == pretrain.CAPTION_REQUEST
    assert (clip["video_start"], clip["video_end"]) == (0.0, 16.0)  # the grid comes first
    assert Path(clip["video_url"]["url"].removeprefix("file://")).is_file()
    # the caption is the ground truth of that window of the corpus's own first video
    rng = derived_rng(cfg.data.synth.seed, "pretrain", cfg.model.pretrain.seed, 0)
    spec = sample_video(rng, cfg.data.synth, youtube_like_id(rng))
    assert Path(clip["video_url"]["url"]).stem == spec.video_id
    assert messages[1]["content"][0]["text"] == summarize_window(spec, 0, 16, background=True)
    # a second build reuses the folder; its hash is stable
    assert pretrain.build_corpus(cfg, log_line=lambda line: None) == corpus


def test_reading_rows_quote_the_note_of_the_asked_event_and_name_its_option(tmp_path: Path):
    import random

    from paravt_core.data.synth.world import sample_video

    cfg = _cfg(tmp_path, "model.pretrain.reading_rows=40")
    clips = pretrain.build_corpus(cfg, log_line=lambda line: None)
    corpus = pretrain.build_reading_corpus(cfg, clips, log_line=lambda line: None)
    rows = pq.read_table(corpus.path / pretrain.READING_FILE).to_pylist()
    # the clips are replayed beside the reading rows
    assert pq.read_table(corpus.path / pretrain.CORPUS_FILE).equals(pq.read_table(clips.path / pretrain.CORPUS_FILE))
    assert len(rows) == 40 and all(r["videos"] == [] for r in rows)
    for row in rows:
        user, answer = (m["content"][0]["text"] for m in json.loads(row["messages"]))
        assert user.startswith(pretrain.READING_NOTES + "\n00:00.0 to 00:16.0: ")
        assert "Answer with the option letter only." in user  # multiple choice only, as evaluated
        assert "Checking the options: A. " in answer
        assert answer.startswith("The notes say: From ")
    # one row checked against its truth: the quoted note holds the asked event, the letter is right
    rng = random.Random(7)
    spec = sample_video(rng, cfg.data.synth, "vid")
    row = pretrain.reading_row(random.Random(3), spec, 16, ("colour",))
    with pytest.raises(ValueError, match="no event supports a multiple-choice question on \\['when'\\]"):
        pretrain.reading_row(random.Random(3), spec, 16, ("when",))
    user, answer = (m["content"][0]["text"] for m in row["messages"])
    options = dict(line.split(". ", 1) for line in user.splitlines() if line[:2] in ("A.", "B.", "C.", "D."))
    letter = answer.rsplit("option ", 1)[1].rstrip(".")
    asked = next(e for e in spec.events if e.shape in user.split("Question: ")[1].split("\n")[0])
    assert options[letter].lower() == asked.colour
    assert f"{asked.colour} {asked.shape}" in answer.split(" So the answer")[0]
    # the reading settings key the reading corpus, not the clips (the perception phase stays cached)
    assert pretrain.corpus_dir(cfg) == pretrain.corpus_dir(_cfg(tmp_path))
    assert pretrain.reading_dir(cfg, clips) != pretrain.reading_dir(_cfg(tmp_path, "model.pretrain.reading_rows=41"), clips)
    # the questions' wording draws key it too (OptionStyle.of draws the rows' questions), the clips not
    worded = _cfg(tmp_path, "data.synth.second_wording=0.5")
    assert pretrain.corpus_dir(worded) == pretrain.corpus_dir(cfg)
    assert pretrain.reading_dir(worded, clips) != pretrain.reading_dir(cfg, clips)


def test_transcript_reading_rows_are_text_only_agent_transcripts_of_the_sft_layout(tmp_path: Path):
    """`reading_transcripts` lays that share of reading rows out as an SFT row without system
    prompt or frames: question, crop calls, the notes as tool replies, the teacher's final turn."""
    import random

    from paravt_core.data.synth.world import sample_video

    cfg = _cfg(tmp_path, "model.pretrain.reading_rows=40", "model.pretrain.reading_transcripts=0.5",
               # transcripts are written in the shared opening, without the teacher's budgets
               "data.synth.crop_opening=shared", "data.synth.teacher_budgets=null", "data.synth.skip_when_seen=1",
               "data.synth.direct_check=false")
    clips = pretrain.build_corpus(cfg, log_line=lambda line: None)
    corpus = pretrain.build_reading_corpus(cfg, clips, log_line=lambda line: None)
    rows = [json.loads(r["messages"]) for r in pq.read_table(corpus.path / pretrain.READING_FILE).to_pylist()]
    transcripts = [m for m in rows if len(m) > 2]
    assert 10 <= len(transcripts) <= 30 and len(rows) == 40  # a draw of one half
    for messages in transcripts:
        assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "tool", "assistant"]
        assert all(item["type"] == "text" for m in messages for item in m["content"])
        assert "Answer with the option letter only." in messages[0]["content"][0]["text"]
        assert messages[1]["content"][0]["text"].count("<tool_call>") == 3  # cover: every grid segment
        assert "Checking the options: A. " in messages[-1]["content"][0]["text"]
    # the other rows are the notes layout, and the row draw does not depend on the layout draw
    notes = pretrain.build_reading_corpus(_cfg(tmp_path, "model.pretrain.reading_rows=40"), clips,
                                          log_line=lambda line: None)
    assert pretrain.reading_dir(cfg, clips) != Path(notes.path)
    plain = [json.loads(r["messages"]) for r in pq.read_table(notes.path / pretrain.READING_FILE).to_pylist()]
    assert [m for m, p in zip(rows, plain) if len(m) == 2] == [p for m, p in zip(rows, plain) if len(m) == 2]
    # one transcript against its truth: the reply holding the event names its colour, the letter is right
    spec = sample_video(random.Random(7), cfg.data.synth, "vid")
    messages = pretrain.transcript_row(random.Random(3), spec, cfg.data.synth, ("colour",))["messages"]
    user, final = messages[0]["content"][0]["text"], messages[-1]["content"][0]["text"]
    options = dict(line.split(". ", 1) for line in user.splitlines() if line[:2] in ("A.", "B.", "C.", "D."))
    letter = final.rsplit("<answer>", 1)[1].split("</answer>")[0]
    asked = spec.events[0]
    assert options[letter].lower() == asked.colour
    assert any(f"{asked.colour} {asked.shape}" in m["content"][0]["text"] for m in messages if m["role"] == "tool")


def test_reading_corpus_is_keyed_on_the_code_of_its_rows(tmp_path: Path, monkeypatch):
    """An edit to `reading_row` (in miniature/pretrain.py, outside the synth package) builds the
    reading corpus again instead of training on the stale one."""
    from paravt_core import refs

    cfg = _cfg(tmp_path)
    clips = pretrain.build_corpus(cfg, log_line=lambda line: None)
    before = pretrain.reading_dir(cfg, clips)
    real = refs.source_digest

    def edited(package: str, only=None) -> str:
        return "0" * 16 if only == ("pretrain.py",) else real(package, only)

    monkeypatch.setattr(refs, "source_digest", edited)
    assert pretrain.reading_dir(cfg, clips) != before


def test_no_pretraining_video_is_a_training_or_evaluation_video(tmp_path: Path):
    from paravt_core.data.synth.generate import generate_world

    cfg = _cfg(tmp_path, "data.synth.train_videos=4", "data.synth.eval_videos_per_split=2",
               "data.synth.eval_rows_per_split=2")
    corpus = pretrain.build_corpus(cfg, log_line=lambda line: None)
    world = generate_world(cfg.data.synth, tmp_path / "world", progress=False)
    manifest = json.loads(world.manifest.read_text())
    known = {v["video"]["video_id"] for v in manifest["train"]}
    known |= {v["video"]["video_id"] for split in manifest["eval"].values() for v in split["videos"]}
    ours = {p.stem for p in (corpus.path / "videos").glob("*.mp4")}
    assert len(ours) == 3 and not ours & known


def test_pretraining_trains_the_base_and_resumes_to_the_same_model(tmp_path: Path):
    from paravt_core.model.stage import run as build_base

    cfg = _cfg(tmp_path)
    base = build_base(cfg)
    lines: list[str] = []
    trained = pretrain.run(cfg, base, log_line=lines.append)
    assert trained.kind == "base_model" and trained.sha256 != base.sha256
    # filed by its content key, a copy of the reading phase's model
    assert trained.path.parent.parent == (tmp_path / "cache" / "pretrain").resolve()
    (reading_dir,) = (tmp_path / "pretrain-reading").iterdir()
    assert content_hash(reading_dir / "model") == trained.sha256
    # two phases: captioned clips (3 steps), then reading rows (2 steps) from that model
    (perception_dir,) = [p for p in (tmp_path / "pretrain").iterdir() if not p.name.startswith(("corpus-", "reading-"))]
    for run_dir, stage, steps in ((perception_dir, "pretrain", 3), (reading_dir, "pretrain-reading", 2)):
        losses = [json.loads(line) for line in (run_dir / "losses.jsonl").read_text().splitlines()]
        assert [r["step"] for r in losses] == list(range(1, steps + 1))
        assert all(torch.isfinite(torch.tensor(r["loss"])) for r in losses)
        meta = json.loads((run_dir / "model" / "paravt_meta.json").read_text())
        assert meta["stage"] == stage and meta["steps"] == steps
    reading_job = json.loads((reading_dir / "job.json").read_text())
    assert content_hash(perception_dir / "model") in json.dumps(reading_job)
    # finished: a second call returns the filed model without training again
    again = pretrain.run(cfg, base, log_line=lines.append)
    assert again == ArtifactRef(kind="base_model", path=trained.path, sha256=content_hash(trained.path))
    assert lines[-1] == f"reused pretraining {trained.path.parent.name} from {trained.path.parent}"


def test_a_new_world_with_the_same_pretraining_corpus_reuses_the_pretraining(tmp_path: Path, monkeypatch):
    """#45 item 4: an edit to the world generator renames the corpus folder, so its rows' URIs and
    its parquet's bytes change, while its clips and captions stay the same: no second training.
    A corpus with one caption changed trains again."""
    from paravt_core import refs
    from paravt_core.model.stage import run as build_base
    from paravt_core.sft import stage as sft_stage

    real_digest, real_train = refs.source_digest, sft_stage.run
    trained: list[str] = []

    def world(digest: str) -> None:  # the world generator's code digest, as an edit changes it
        monkeypatch.setattr(refs, "source_digest",
                            lambda package, only=None: digest if package == "paravt_core.data.synth"
                            else real_digest(package, only))

    def train(*args, **kwargs):
        trained.append(kwargs["stage"])
        return real_train(*args, **kwargs)

    monkeypatch.setattr(sft_stage, "run", train)
    cfg = _cfg(tmp_path, "model.pretrain.reading_rows=0")  # one phase: the perception phase is the 27 minutes
    base = build_base(cfg)
    world("a" * 16)
    first = pretrain.run(cfg, base, log_line=lambda line: None)
    assert trained == ["pretrain"]
    world("b" * 16)
    lines: list[str] = []
    second = pretrain.run(cfg, base, log_line=lines.append)
    assert trained == ["pretrain"] and second == first  # no second training
    assert pretrain.corpus_dir(cfg).name.endswith("b" * 16)  # a corpus of its own: other URIs, other parquet bytes
    assert (pretrain.corpus_dir(cfg) / pretrain.CORPUS_FILE).is_file()
    assert lines[-1] == f"reused pretraining {first.path.parent.name} from {first.path.parent}"
    # a third world whose corpus has one caption changed: trained again (stopped at its first step here)
    world("c" * 16)
    corpus = pretrain.build_corpus(cfg, log_line=lambda line: None)
    rows = pq.read_table(corpus.path / pretrain.CORPUS_FILE).to_pylist()
    rows = [{"messages": json.loads(r["messages"]), "videos": r["videos"]} for r in rows]
    rows[0]["messages"][1]["content"][0]["text"] += " A red circle."
    pq.write_table(pretrain._table(rows), corpus.path / pretrain.CORPUS_FILE)

    def refused(*args, **kwargs):
        trained.append(kwargs["stage"])
        raise RuntimeError("trains")

    monkeypatch.setattr(sft_stage, "run", refused)
    lines.clear()
    with pytest.raises(RuntimeError, match="trains"):
        pretrain.run(cfg, base, log_line=lines.append)
    assert trained == ["pretrain", "pretrain"] and not any(line.startswith("reused") for line in lines)


def test_sft_replays_rows_of_the_reading_corpus_beside_its_own(tmp_path: Path):
    """`model.pretrain.sft_replay_rows`: SFT trains on that many rows of the reading phase's
    corpus (reading rows and clips) beside its shards, drawn once per run folder."""
    from paravt_core.model.stage import run as build_base
    from paravt_core.sft import stage as sft_stage

    steps = ["sft.max_steps=2", "sft.checkpoint_every=2", "sft.zero_stage=0", "sft.num_ranks=1"]
    cfg = _cfg(tmp_path, "model.pretrain.sft_replay_rows=12", *steps)
    base = build_base(cfg)
    clips = pretrain.build_corpus(cfg, log_line=lambda line: None)
    reading = pretrain.build_reading_corpus(cfg, clips, log_line=lambda line: None)
    corpus_rows = {r["messages"] for name in (pretrain.READING_FILE, pretrain.CORPUS_FILE)
                   for r in pq.read_table(reading.path / name).to_pylist()}
    plain = sft_stage.run_dir(_cfg(tmp_path, *steps), base, clips)
    assert pretrain.sft_replay(_cfg(tmp_path, *steps)) is None
    replay = pretrain.sft_replay(cfg)
    assert replay.key == "replay=12"  # the run folder key of earlier runs with replay
    # the clips' folder stands in for SFT shards; the flow's SFT task hands over the same extra shard
    model = sft_stage.run(cfg, base, clips, log_line=lambda line: None, extra=replay)
    out = model.path.parent
    assert out != plain and out == sft_stage.run_dir(cfg, base, clips, extra=replay)  # a run with replay is another run
    job = json.loads((out / "job.json").read_text())
    assert job["data_files"] == [str(clips.path / pretrain.CORPUS_FILE), str(out / "replay.parquet")]
    replayed = pq.read_table(out / "replay.parquet").to_pylist()
    assert len(replayed) == 12 and {r["messages"] for r in replayed} <= corpus_rows
    assert {bool(r["videos"]) for r in replayed} == {True, False}  # both kinds (8 reading rows, 12 clips)
    assert json.loads((out / "model" / "paravt_meta.json").read_text())["steps"] == 2
    # the same draw for the same seed; too many rows is refused naming the corpus
    again = pretrain.replay_shard(cfg, tmp_path / "again.parquet", log_line=lambda line: None)
    assert pq.read_table(again).equals(pq.read_table(out / "replay.parquet"))
    with pytest.raises(ConfigError, match="sft_replay_rows=21 > the 20 rows"):
        _cfg(tmp_path, "model.pretrain.sft_replay_rows=21")


def test_pretraining_is_refused_for_a_real_checkpoint(tmp_path: Path):

    with pytest.raises(ConfigError, match="model.pretrain.enabled is for the tiny model"):
        _cfg(tmp_path, "model.base=Qwen/Qwen3-VL-8B-Instruct")


def test_overview_rows_show_the_k_frames_their_caption_describes(tmp_path: Path, tiny_model_dir: Path):
    """World version 3 (#46 item 2): the corpus's overview rows reach the trainer as the K
    overview frames of their video, and the caption says what those frames show."""
    from paravt_core.data.synth.world import derived_rng, event_on_overview, sample_video, youtube_like_id
    from paravt_core.model.loading import load_processor
    from paravt_core.sft.dataset import FrameCache, FrameSampling, OverlongPolicy, SFTDataset, read_sft_rows

    cfg = _cfg(tmp_path, "data.synth.teacher_budgets=[2,3,4,6]", "data.synth.second_wording_look=1.0",
               "model.pretrain.overview_rows=2")
    corpus = pretrain.build_corpus(cfg, log_line=lambda line: None)
    assert corpus.path != pretrain.build_corpus(_cfg(tmp_path / "plain"), log_line=lambda line: None).path
    rows = read_sft_rows([Path(corpus.path) / pretrain.CORPUS_FILE])
    overview = [r for r in rows if r["messages"][0]["content"][1]["text"] == pretrain.OVERVIEW_REQUEST]
    assert len(rows) == 3 * (4 + 2) and len(overview) == 3 * 2
    specs = {}
    for index in range(3):
        rng = derived_rng(cfg.data.synth.seed, "pretrain", cfg.model.pretrain.seed, index)
        spec = sample_video(rng, cfg.data.synth, youtube_like_id(rng))
        specs[spec.video_id] = spec
    # a frame choice the rows must override: every overview row shows its own K frames
    data = SFTDataset(overview, load_processor(tiny_model_dir),
                      FrameCache(tmp_path / "frames", FrameSampling.from_config(cfg.video)),
                      OverlongPolicy(4096, "skip"), frame_choices=(6,))
    for index, row in enumerate(overview):
        video = row["messages"][0]["content"][0]
        k, spec = video["nframes"], specs[Path(video["video_url"]["url"]).stem]
        caption = row["messages"][1]["content"][0]["text"]
        assert caption == pretrain.overview_caption(spec, k)
        assert caption.startswith("The overview frames show") and (
            "plain" in caption) != any(event_on_overview(spec, e, k) for e in spec.events)
        sample = data.encode(index)
        assert sample is not None and sample.image_grid_thw.shape[0] == k  # one timestamped image per frame


def test_corpus_depends_on_the_world_geometry_not_on_trace_settings(tmp_path: Path):
    same = _cfg(tmp_path, "data.synth.sft_traces_per_video=2", "data.synth.subagent_traces_per_video=1")
    assert pretrain.corpus_dir(same) == pretrain.corpus_dir(_cfg(tmp_path))
    assert pretrain.corpus_dir(_cfg(tmp_path, "data.synth.max_event_s=3.5")) != pretrain.corpus_dir(_cfg(tmp_path))
    assert pretrain.corpus_dir(_cfg(tmp_path, "model.pretrain.videos=4")) != pretrain.corpus_dir(_cfg(tmp_path))


@pytest.mark.parametrize("rows", ["model.pretrain.sft_replay_rows=0", "model.pretrain.sft_replay_rows=4"])
def test_text_only_rows_refuse_zero3_across_ranks_at_load(tmp_path: Path, rows: str):
    """Text-only micro-batches (reading rows, and their replay in SFT) skip the vision tower
    that other ZeRO-3 ranks gather: measured to stall at 2 CPU ranks, so the config says so
    when it loads instead of a stage hanging."""
    one = "model.pretrain.num_ranks=1"
    # SFT's ranks, where SFT replays the text-only rows
    with pytest.raises(ConfigError, match="hang sft.num_ranks=2 under sft.zero_stage=3"):
        _cfg(tmp_path, "sft.num_ranks=2", "sft.zero_stage=3", one, "model.pretrain.sft_replay_rows=4")
    _cfg(tmp_path, "sft.num_ranks=2", "sft.zero_stage=2", rows)
    _cfg(tmp_path, "sft.num_ranks=2", "sft.zero_stage=3", one, "model.pretrain.sft_replay_rows=0")
    _cfg(tmp_path, "sft.num_ranks=2", "sft.zero_stage=3", "model.pretrain.reading_rows=0")
    # the reading phase's own ranks (model.pretrain.num_ranks), whatever SFT's are
    with pytest.raises(ConfigError, match="hang model.pretrain.num_ranks=2 under sft.zero_stage=3"):
        _cfg(tmp_path, "model.pretrain.num_ranks=2", "sft.num_ranks=1", "sft.zero_stage=3", rows)
    _cfg(tmp_path, "model.pretrain.num_ranks=2", "sft.num_ranks=1", "sft.zero_stage=0", rows)
