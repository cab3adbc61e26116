"""ParaVT-Parquet rows and ParaVT-Source archives built from the world (SPEC §8).

Row formats:

- SFT (`sft/paravt_sft_{shard}.parquet`): `messages` (chat turns whose `content` is a list
  of items `{"type": "text", "text": ...}` or `{"type": "video_url", "video_url": {"url":
  ...}}`, the OpenAI layout; a struct column, so absent keys read back as null) and
  `videos` (the sentinel paths the messages use). A tool trace is system, user (video +
  question), assistant (`<think>` + parallel `<tool_call>` blocks), then ONE `tool`
  message per call in call order, then the final assistant turn. Consecutive `tool`
  messages are the ONE user turn of SPEC §3: the chat template renders them as a single
  user turn holding one `<tool_response>` block per call, so the content of a `tool`
  message is the bare summary, without tags.
- RL (`rl/paravt_rl_diverse.parquet`): `prompt` (system and user turns with string
  content; `<video>` marks where the video goes), `videos` (`[{"video": sentinel}]`) and
  `extra_info` (a JSON string with `answer`, `question_type` and `question`).

Videos are named by sentinel-relative paths under the four roots of SPEC §8, spread
round-robin; ParaVT-Source holds one zip per root whose members carry those paths.
Shard names follow the release's (each root feeds one shard).
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from paravt_core.data.synth.archives import zip_bytes
from paravt_core.data.synth.config import SynthConfig
from paravt_core.agent.prompts import subagent_instruction
from paravt_core.data.synth.prompts import SYSTEM_PROMPT, eval_style_text, question_prompt
from paravt_core.data.synth.questions import OptionStyle, Question, background_question, random_event_question
from paravt_core.data.synth.traces import (
    TRUTH,
    Reporter,
    TeacherTrace,
    Window,
    direct_trace,
    no_tool_trace,
    seen_trace,
    segment_grid,
    summarize_window,
    tool_trace,
    unlooked_trace,
)
from paravt_core.data.synth.world import VideoSpec, derived_rng, event_off_overviews, event_on_overview

SENTINEL_ROOTS = ("longvt_source", "museg/charades", "museg/et_instruct_164k", "selfqa")
SFT_SHARD_OF_ROOT = {
    "longvt_source": "longvideoreason",
    "museg/charades": "charades",
    "museg/et_instruct_164k": "museg",
    "selfqa": "selftrace",
}
LONGVT_SOURCE_NAME = "synthworld"  # the <src> level of longvt_source/<src>/<rel>
RL_FILE = "rl/paravt_rl_diverse.parquet"

# `video_start` / `video_end` (seconds, qwen-vl-utils' keys) mark a video item that shows only a
# window: the crop a sub-agent sees (SPEC §3). Null on every other item, as on release rows.
_CONTENT_ITEM = pa.struct(
    [
        ("type", pa.string()),
        ("text", pa.string()),
        ("video_url", pa.struct([("url", pa.string())])),
        ("video_start", pa.float64()),
        ("video_end", pa.float64()),
        ("nframes", pa.int64()),
    ]
)
SFT_SCHEMA = pa.schema(
    [
        ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.list_(_CONTENT_ITEM))]))),
        ("videos", pa.list_(pa.string())),
    ]
)
RL_SCHEMA = pa.schema(
    [
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("videos", pa.list_(pa.struct([("video", pa.string())]))),
        ("extra_info", pa.string()),
    ]
)


@dataclass(frozen=True)
class TrainVideo:
    """A training video and its sentinel-relative path."""

    spec: VideoSpec
    sentinel: str

    @property
    def name(self) -> str:
        """The file name the prompt and the tool calls use."""
        return posixpath.basename(self.sentinel)

    @property
    def root(self) -> str:
        return next(r for r in SENTINEL_ROOTS if self.sentinel.startswith(r + "/"))


def sentinel_path(root: str, video_id: str) -> str:
    """`longvt_source/<src>/<id>.mp4` or `<root>/<id>.mp4` (SPEC §8)."""
    if root == "longvt_source":
        return f"longvt_source/{LONGVT_SOURCE_NAME}/{video_id}.mp4"
    return f"{root}/{video_id}.mp4"


def sft_file(shard: str) -> str:
    return f"sft/paravt_sft_{shard}.parquet"


def source_archive(root: str) -> str:
    """ParaVT-Source zip holding one root: `museg/charades` -> `museg_charades.zip`."""
    return root.replace("/", "_") + ".zip"


def _text(text: str) -> list[dict]:
    return [{"type": "text", "text": text}]


def main_prompt(question: Question, video: TrainVideo, prompts: str = "training", direct: bool = False
                ) -> tuple[str, str]:
    """(system, user text) of a main-agent row: ours (`training`) or the evaluation's (`eval`:
    agentic_general, or direct for a direct-mode row), see `SynthConfig.prompts`."""
    if prompts == "eval":
        return eval_style_text(question, video.name, "direct" if direct else "agentic_general")
    return SYSTEM_PROMPT, question_prompt(question, video.name)


def sft_messages(trace: TeacherTrace, video: TrainVideo, prompts: str = "training") -> list[dict]:
    """The chat turns of one SFT row (see the module docstring for the tool turns)."""
    video_item = {"type": "video_url", "video_url": {"url": video.sentinel}}
    if trace.nframes is not None:  # the overview budget K the teacher read (SynthConfig.teacher_budgets)
        video_item["nframes"] = trace.nframes
    system, user_text = main_prompt(trace.question, video, prompts, trace.direct)
    user = [video_item, *_text(user_text)]
    messages = [{"role": "system", "content": _text(system)}, {"role": "user", "content": user}]
    if trace.first_turn is not None:
        messages.append({"role": "assistant", "content": _text(trace.first_turn)})
        messages += [{"role": "tool", "content": _text(response)} for response in trace.tool_responses]
    messages.append({"role": "assistant", "content": _text(trace.final_turn)})
    return messages


def sft_row(trace: TeacherTrace, video: TrainVideo, prompts: str = "training") -> dict:
    return {"messages": sft_messages(trace, video, prompts), "videos": [video.sentinel]}


def subagent_sft_row(video: TrainVideo, window: Window, reporter: Reporter = TRUTH) -> dict:
    """A sub-agent row (SPEC §3): the prompt the rollout gives a sub-agent for `window` (its
    frames, then the summary request of `agent.prompts`), answered by the window's summary."""
    start, end = window
    crop = {"type": "video_url", "video_url": {"url": video.sentinel}, "video_start": float(start),
            "video_end": float(end)}
    messages = [
        {"role": "user", "content": [crop, *_text(subagent_instruction(start, end))]},
        {"role": "assistant", "content": _text(summarize_window(video.spec, start, end, reporter=reporter))},
    ]
    return {"messages": messages, "videos": [video.sentinel]}


def subagent_windows(cfg: SynthConfig, video: TrainVideo) -> list[Window]:
    """`subagent_traces_per_video` windows of one video: grid segments first, those holding an
    event before empty ones (so the sub-agent learns both kinds of summary), then random ones."""
    rng = derived_rng(cfg.seed, "subagent", video.spec.video_id)
    grid = segment_grid(video.spec, int(cfg.max_crop_s))
    busy = [w for w in grid if any(e.start_s < w[1] and e.end_s > w[0] for e in video.spec.events)]
    empty = [w for w in grid if w not in busy]
    rng.shuffle(busy)
    rng.shuffle(empty)
    windows = (busy + empty)[: cfg.subagent_traces_per_video]
    # Beyond the grid: whole-second windows of 4 s to max_crop_s anywhere in the video.
    last = int(video.spec.duration_s)
    for _ in range(MAX_REDRAWS * cfg.subagent_traces_per_video):
        if len(windows) >= cfg.subagent_traces_per_video:
            break
        length = rng.randint(4, int(cfg.max_crop_s))
        start = rng.randint(0, max(0, last - length))
        window = (start, min(start + length, last))
        if window not in windows:
            windows.append(window)
    return windows


def rl_row(question, video: TrainVideo, prompts: str = "training") -> dict:
    """One RL prompt with its reward ground truth (SPEC §4.2 question types)."""
    system, user_text = main_prompt(question, video, prompts)
    prompt = [
        {"role": "system", "content": system},
        {"role": "user", "content": "<video>\n" + user_text},
    ]
    extra = {"answer": question.answer, "question_type": question.qtype, "question": question.text}
    return {"prompt": prompt, "videos": [{"video": video.sentinel}], "extra_info": json.dumps(extra)}


def parquet_bytes(rows: Sequence[dict], schema: pa.Schema) -> bytes:
    """Rows as parquet with an explicit schema (no pandas metadata), same bytes every time."""
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(list(rows), schema=schema), sink, compression="zstd")
    return sink.getvalue().to_pybytes()


MAX_REDRAWS = 32


def _distinct(draw, seen: set[tuple]) -> Question | None:
    """A question not asked yet about this video (a video's rows must not repeat), or None."""
    for _ in range(MAX_REDRAWS):
        question = draw()
        key = (question.video_id, question.qtype, question.text, question.options)
        if key not in seen:
            seen.add(key)
            return question
    return None


def teacher_traces(cfg: SynthConfig, videos: Sequence[TrainVideo]) -> list[tuple[TrainVideo, TeacherTrace]]:
    """Up to `sft_traces_per_video` distinct traces per video; the no-tool slots are
    round(no_tool_share * n). A slot whose video has no question left is dropped. An agentic
    event question in the second wording is answered without a crop unless a stable draw per
    slot falls under `second_wording_look` (`traces.unlooked_trace`).

    With `teacher_budgets` (the overview-reading teacher, #46 item 2) every main-agent row gets
    its overview budget K by a stable draw per slot, and an agentic event question is answered
    from the K frames when the asked event is on them (`traces.seen_trace`; in a `skip_when_seen`
    share of those slots, the rest crop), else with crops;
    the wording no longer decides. With `subagent_error_rate`, reports follow `traces.Reporter`."""
    slots = [(video, k) for video in videos for k in range(cfg.sft_traces_per_video)]
    no_tool = set(derived_rng(cfg.seed, "no-tool").sample(range(len(slots)), round(cfg.no_tool_share * len(slots))))
    rest = [i for i in range(len(slots)) if i not in no_tool]
    direct = set(derived_rng(cfg.seed, "direct").sample(rest, round(cfg.direct_share * len(slots))))
    traces, seen, style, reporter = [], set(), OptionStyle.of(cfg), Reporter.of(cfg)
    for index, (video, k) in enumerate(slots):
        rng = derived_rng(cfg.seed, "sft", video.spec.video_id, k)
        budget = teacher_budget(cfg, video.spec.video_id, k)
        if index in no_tool:
            question = _distinct(lambda: background_question(rng, video.spec, rng.choice(("mcq", "oe")), style=style), seen)
            if question is not None:
                traces.append((video, dataclasses.replace(no_tool_trace(video.spec, question), nframes=budget)))
            continue
        question = _distinct(lambda: random_event_question(rng, video.spec, topics=cfg.question_topics, style=style), seen)
        if question is None:
            continue
        event = video.spec.events[question.event_index]
        on_overview = budget is not None and event_on_overview(video.spec, event, budget)
        answer_seen = on_overview and derived_rng(cfg.seed, "skip-seen", video.spec.video_id, k).random() < cfg.skip_when_seen
        if index in direct:
            hidden = event_off_overviews(video.spec, event, cfg)
            traces.append((video, direct_trace(video.spec, question, hidden=hidden, nframes=budget, seen=on_overview,
                                               check=cfg.direct_check)))
        elif answer_seen:
            traces.append((video, seen_trace(video.spec, question, budget)))
        elif (budget is None and question.wording
              and derived_rng(cfg.seed, "look", video.spec.video_id, k).random() >= cfg.second_wording_look):
            traces.append((video, unlooked_trace(video.spec, question)))
        else:
            traces.append((video, tool_trace(rng, video.spec, question, video.name, cfg.max_calls_per_trace,
                                             cfg.max_crop_s, cover=cfg.teacher_windows == "cover",
                                             final_reasoning=cfg.final_reasoning,
                                             crop_opening=cfg.crop_opening, reporter=reporter, nframes=budget)))
    return traces


def teacher_budget(cfg: SynthConfig, video_id: str, slot: int) -> int | None:
    """The overview budget K of a main-agent SFT row (`teacher_budgets`), a stable draw per
    video and slot; None without the overview-reading teacher."""
    if cfg.teacher_budgets is None:
        return None
    return derived_rng(cfg.seed, "teacher-budget", video_id, slot).choice(list(cfg.teacher_budgets))


def sft_shards(cfg: SynthConfig, videos: Sequence[TrainVideo]) -> dict[str, list[dict]]:
    """Repo path -> SFT rows, one shard per sentinel root."""
    shards: dict[str, list[dict]] = {sft_file(SFT_SHARD_OF_ROOT[root]): [] for root in SENTINEL_ROOTS}
    for video, trace in teacher_traces(cfg, videos):
        shards[sft_file(SFT_SHARD_OF_ROOT[video.root])].append(sft_row(trace, video, cfg.prompts))
    for video in videos:
        for window in subagent_windows(cfg, video):
            shards[sft_file(SFT_SHARD_OF_ROOT[video.root])].append(subagent_sft_row(video, window, Reporter.of(cfg)))
    return shards


def rl_rows(cfg: SynthConfig, videos: Sequence[TrainVideo]) -> list[dict]:
    """Up to `rl_prompts_per_video` distinct questions per video, types from mcq / tvg / oe:
    event questions, and background ones (mcq / oe) in `rl_overview_share` of the slots."""
    slots = [(video, k) for video in videos for k in range(cfg.rl_prompts_per_video)]
    overview = set(derived_rng(cfg.seed, "rl-overview").sample(range(len(slots)),
                                                              round(cfg.rl_overview_share * len(slots))))
    rows, seen, style = [], set(), OptionStyle.of(cfg)
    for index, (video, k) in enumerate(slots):
        rng = derived_rng(cfg.seed, "rl", video.spec.video_id, k)
        if index in overview:
            question = _distinct(lambda: background_question(rng, video.spec, rng.choice(("mcq", "oe")), style=style), seen)
        else:
            question = _distinct(lambda: random_event_question(rng, video.spec, topics=cfg.question_topics, style=style), seen)
        if question is not None:
            rows.append(rl_row(question, video, cfg.prompts))
    return rows


def source_archives(videos: Sequence[TrainVideo], media: Mapping[str, bytes]) -> dict[str, bytes]:
    """ParaVT-Source: zip name -> bytes, one zip per root, members named by sentinel path."""
    by_root: dict[str, dict[str, bytes]] = {root: {} for root in SENTINEL_ROOTS}
    for video in videos:
        by_root[video.root][video.sentinel] = media[video.sentinel]
    return {source_archive(root): zip_bytes(members) for root, members in by_root.items() if members}
