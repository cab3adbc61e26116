"""Answering one tool round: which call blocks run, and running them (SPEC §2, §3).

`plan_tool_round` decides the fate of every call block of a turn, in call order:
- a malformed block gets an error response; the valid blocks of the turn still run
  (per-block parsing, SPEC §2);
- only the first `max_parallel` well-formed calls of a turn are executed; later ones get
  an error response (SPEC §3). Malformed blocks do not use up that budget;
- a call whose window is invalid for the episode's video (start >= end, start at or past
  the end) gets an error response; a valid one has its end clamped to the duration;
- at most `max_parallel` error responses per turn (our bound; SPEC §3 answers every
  block): when more than one error block is left after them, they get ONE response
  "N further call blocks were ignored" (status "ignored", placed last) instead of one
  each, so 300 malformed blocks cost a few responses, not ~14 k tokens. A single
  leftover error block is answered as itself (one response either way).

`CropRunner.run` executes the planned windows of ALL episodes of a turn together: it
decodes each window from the episode's own video (the model-written `video_path` is never
looked at), at `crop_fps` with 1 to 16 frames (SPEC §3), and then either
- `subagent` mode (training): builds one sub-agent request per call (that window's
  frames only, as timestamped image items (SPEC §1), + the SPEC §3 summary request) and sends ALL of them in ONE engine call
  (`batched=False` sends one call per engine call, one after another, for comparison);
  the summary (special tokens dropped) is the tool response, which the rollout then
  truncates to `tool_response_max_tokens` tokens + " [truncated]";
- `frames` mode (the release's evaluation): the crop's frames go to the main agent with
  the text "N frames from S.Ss to E.Es." (SPEC §7).
Windows and sub-agent prompts are cached per (prompt, window, frame count), so rollouts
of a group that crop the same window decode it once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from paravt_core.agent.context import ChatRenderer, Encoded
from paravt_core.agent.engine import Generation, GenerationRequest, RolloutEngine, SamplingParams
from paravt_core.agent.media import with_frames
from paravt_core.agent.prompts import frames_tool_text, subagent_messages
from paravt_core.agent.tool_calls import ParsedBlock, validate_crop_call
from paravt_core.config import VideoConfig
from paravt_core.video import Frames, VideoFile, sample_window_frames

ToolMode = Literal["subagent", "frames"]
TOOL_MODES: tuple[ToolMode, ...] = ("subagent", "frames")


CallStatus = Literal["run", "malformed", "over_limit", "invalid_window", "ignored"]
EndReason = Literal["answer", "length", "max_turns"]


def episode_end(blocks: Sequence[ParsedBlock], cut_by_length: bool, turn: int, max_turns: int) -> EndReason | None:
    """Why an episode ends after a main-agent generation (SPEC §3), or None when its calls run:
    a generation cut by the token budget ends it ("length"), one without call blocks is the
    answer, and calls in the generation after the last allowed tool round are not run."""
    if cut_by_length:
        return "length"
    if not blocks:
        return "answer"
    if turn >= max_turns:
        return "max_turns"
    return None


@dataclass(frozen=True)
class PlannedCall:
    """The fate of one call block: an error response, or a window of the episode's video to run."""

    block_index: int
    status: CallStatus
    error: str | None = None  # the error tool response, unless status is "run"
    window: tuple[float, float] | None = None  # seconds, end clamped to the duration
    num_frames: int | None = None
    ignored_calls: int = 0  # "ignored": how many of the folded blocks were well-formed calls

    @property
    def rejected_calls(self) -> int:
        """Well-formed calls this entry answers with an error."""
        return self.ignored_calls + (self.status in ("over_limit", "invalid_window"))

    @property
    def runs(self) -> bool:
        return self.status == "run"


def plan_tool_round(blocks: Sequence[ParsedBlock], duration: float, max_parallel: int) -> list[PlannedCall]:
    """The turn's `PlannedCall`s in call order, one per block until `max_parallel` error
    responses were given, then the folded "ignored" one (rules in the module docstring)."""
    planned = _plan_each_block(blocks, duration, max_parallel)
    errors = [call for call in planned if not call.runs]
    if len(errors) <= max_parallel + 1:
        return planned
    folded = errors[max_parallel:]
    folded_ids = {id(call) for call in folded}
    kept = [call for call in planned if id(call) not in folded_ids]
    ignored = PlannedCall(folded[0].block_index, "ignored", error=(
        f"Error: {len(folded)} further call blocks were ignored; at most {max_parallel} errors are answered per "
        f"turn. Write at most {max_parallel} well-formed crop_video calls."),
        ignored_calls=sum(call.status in ("over_limit", "invalid_window") for call in folded))
    return [*kept, ignored]


def _plan_each_block(blocks: Sequence[ParsedBlock], duration: float, max_parallel: int) -> list[PlannedCall]:
    planned, well_formed = [], 0
    for block in blocks:
        if block.call is None:
            planned.append(PlannedCall(block.index, "malformed", error=f"Error: {block.error}"))
            continue
        well_formed += 1
        if well_formed > max_parallel:
            planned.append(PlannedCall(block.index, "over_limit", error=(
                f"Error: at most {max_parallel} crop_video calls run per turn; this call was not executed.")))
            continue
        checked = validate_crop_call(block.call, duration)
        if checked.call is None:
            planned.append(PlannedCall(block.index, "invalid_window", error=f"Error: {checked.error}"))
        else:
            window = (checked.call.start_time, checked.call.end_time)
            planned.append(PlannedCall(block.index, "run", window=window, num_frames=checked.call.num_frames))
    return planned


@dataclass(frozen=True, eq=False)
class CropSource:
    """An episode's own video, opened once per prompt and shared by its group."""

    key: int  # the prompt's index in the batch: the cache key of its windows
    video: VideoFile
    duration: float


@dataclass(frozen=True)
class CropJob:
    source: CropSource
    window: tuple[float, float]
    num_frames: int | None = None


@dataclass
class CropResult:
    """A tool response: its text, and the frames (frames mode) or the sub-agent's run."""

    text: str  # before truncation
    frames: Frames | None = None
    request: GenerationRequest | None = None  # subagent mode: the sub-agent's prompt
    generation: Generation | None = None  # subagent mode: what it wrote


class CropRunner:
    """Decodes crop windows and runs the sub-agents of a turn (see the module docstring)."""

    def __init__(self, renderer: ChatRenderer, video_cfg: VideoConfig, tool_mode: ToolMode = "subagent"):
        if tool_mode not in TOOL_MODES:
            raise ValueError(f"tool_mode must be one of {TOOL_MODES}, got {tool_mode!r}")
        self.renderer = renderer
        self.video_cfg = video_cfg
        self.tool_mode = tool_mode
        self._frames: dict[tuple, Frames] = {}
        self._prompts: dict[tuple, Encoded] = {}

    def run(self, engine: RolloutEngine, jobs: Sequence[CropJob], params: SamplingParams,
            batched: bool = True) -> list[CropResult]:
        """Answer every job, in job order; sub-agents go to the engine in one call if `batched`."""
        if not jobs:
            return []
        if self.tool_mode == "frames":
            return [self._frames_result(job) for job in jobs]
        requests = [self.subagent_request(job) for job in jobs]
        if batched:
            generations = engine.generate(requests, params)
        else:
            generations = [engine.generate([request], params)[0] for request in requests]
        return [self._subagent_result(request, generation) for request, generation in zip(requests, generations)]

    def frames(self, job: CropJob) -> Frames:
        """The window's frames at crop fps, 1 to 16 frames (a requested count is clamped to that)."""
        key = _job_key(job)
        if key not in self._frames:
            cfg = self.video_cfg
            low, high = cfg.crop_min_frames, cfg.crop_max_frames
            if job.num_frames is not None:
                low = high = min(max(job.num_frames, cfg.crop_min_frames), cfg.crop_max_frames)
            self._frames[key] = sample_window_frames(
                job.source.video, *job.window, fps=cfg.crop_fps, min_frames=low, max_frames=high,
                min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels)
        return self._frames[key]

    def subagent_request(self, job: CropJob) -> GenerationRequest:
        """The sub-agent prompt of SPEC §3 for one window, tokenized with its frames."""
        key = _job_key(job)
        if key not in self._prompts:
            frames = self.frames(job)
            text = self.renderer.prompt_text(with_frames(subagent_messages(*job.window), [frames]), tools=None)
            self._prompts[key] = self.renderer.encode(text, [frames], continuation=False)
        prompt = self._prompts[key]
        return GenerationRequest(list(prompt.token_ids), prompt.vision)

    def _subagent_result(self, request: GenerationRequest, generation: Generation) -> CropResult:
        return CropResult(self.renderer.plain_text(generation.token_ids), request=request, generation=generation)

    def _frames_result(self, job: CropJob) -> CropResult:
        frames = self.frames(job)
        text = frames_tool_text(len(frames.indices), *job.window)
        return CropResult(text, frames=frames)


def _job_key(job: CropJob) -> tuple:
    return (job.source.key, job.window, job.num_frames)
