"""What the evaluated model is asked, per SPEC §7 prompt mode, and the rollout knobs per mode.

Prompt modes (the question text itself, MCQ options and subtitles included, is built by
`samples.py`):
- `direct`: the question alone; no tools, one generation.
- `reasoning`: the question, then "Think step by step inside <think></think>, then give the
  final answer inside <answer></answer>."; no tools, one generation.
- `agentic_general`: the tool schema in the system turn; the question, the agentic
  instruction of training ("... you may emit multiple <tool_call> blocks in one turn ...",
  `paravt_core.agent.prompts.question_prompt`), then "The video path for this video is:
  {basename}".
- `agentic_minimal`: the bare tool envelope (the schema in the system turn, no
  instruction); the question, then the video path line. The SPEC uses it for Charades-STA.

Dispatch (SPEC §7, Table 2 block C): `parallel` runs up to `max_parallel` calls per turn;
`sequential` runs ONE call per turn (extra calls of a turn get the rollout's "at most 1
crop_video calls run per turn" error response), and `agentic_general` then says "emit at
most one <tool_call> block per turn" instead of inviting several.

Forced answer (SPEC §7): agentic prompts carry a `ForcedAnswer`, the user turn added after
the last allowed tool round: MCQ "answer with ONLY the letter" (64 tokens), grounding "The
event happens in the X.X - Y.Y seconds." (128 tokens). Decided here, where the SPEC is
silent:
- Open-ended (MMVU "open") samples are asked for "ONLY a short word or phrase" (64 tokens).
- The generation after the forced turn has no think prefix: it asks for the bare answer
  within a small budget.
- Agentic modes end every other main-agent generation prompt with `<think>\\n` (SPEC §3:
  the rollout protocol is that of training and agentic evaluation); `direct` and
  `reasoning` have no prefix and no tool round (max_turns 0).
"""

from __future__ import annotations

from typing import Literal

from paravt_core.agent.prompts import (
    AGENTIC_INSTRUCTION,
    CROP_VIDEO_TOOL,
    VIDEO_PATH_LINE,
    EpisodePrompt,
    ForcedAnswer,
)
from paravt_core.config import EvalConfig, RolloutConfig
from paravt_core.eval.samples import EvalSample

PromptMode = Literal["direct", "reasoning", "agentic_general", "agentic_minimal"]
Dispatch = Literal["parallel", "sequential"]
PROMPT_MODES: tuple[PromptMode, ...] = ("direct", "reasoning", "agentic_general", "agentic_minimal")
AGENTIC_MODES: frozenset[str] = frozenset({"agentic_general", "agentic_minimal"})

REASONING_INSTRUCTION = (
    "Think step by step inside <think></think>, then give the final answer inside <answer></answer>."
)
SEQUENTIAL_INSTRUCTION = (
    "Think step by step inside <think></think>. If you need a closer look at part of the video, call "
    "crop_video; emit at most one <tool_call> block per turn and wait for its response before the next. "
    "Give the final answer inside <answer></answer>."
)
_OUT_OF_TOOLS = "You have used all your tool calls. Based on the evidence so far, "
FORCED_MCQ = ForcedAnswer(_OUT_OF_TOOLS + "answer with ONLY the letter of the correct option.", 64)
FORCED_OPEN = ForcedAnswer(_OUT_OF_TOOLS + "answer with ONLY a short word or phrase.", 64)
FORCED_GROUNDING = ForcedAnswer(
    _OUT_OF_TOOLS + "give the time span now, in the form: The event happens in the X.X - Y.Y seconds.", 128)
FORCED_ANSWERS: dict[str, ForcedAnswer] = {"mcq": FORCED_MCQ, "open": FORCED_OPEN, "grounding": FORCED_GROUNDING}


def prompt_mode_for(sample: EvalSample, eval_cfg: EvalConfig) -> PromptMode:
    """`grounding_prompt_mode` for grounding samples (Charades-STA), `prompt_mode` otherwise."""
    return eval_cfg.grounding_prompt_mode if sample.kind == "grounding" else eval_cfg.prompt_mode


def is_agentic(mode: PromptMode) -> bool:
    return mode in AGENTIC_MODES


def user_text(sample: EvalSample, mode: PromptMode, dispatch: Dispatch = "parallel") -> str:
    """The text after the overview frames in the user turn. Parallel `agentic_general` is
    the text of training's `question_prompt` (a unit test holds them equal)."""
    path_line = VIDEO_PATH_LINE.format(basename=sample.video_path.name)
    if mode == "direct":
        return sample.question
    if mode == "reasoning":
        return f"{sample.question}\n{REASONING_INSTRUCTION}"
    if mode == "agentic_general":
        instruction = SEQUENTIAL_INSTRUCTION if dispatch == "sequential" else AGENTIC_INSTRUCTION
        return f"{sample.question}\n{instruction}\n{path_line}"
    if mode == "agentic_minimal":
        return f"{sample.question}\n{path_line}"
    raise ValueError(f"unknown prompt mode {mode!r}; expected one of {PROMPT_MODES}")


def episode_prompt(sample: EvalSample, mode: PromptMode, dispatch: Dispatch, nframes: int) -> EpisodePrompt:
    """The `EpisodePrompt` of one sample: overview video, text, tools, forced answer."""
    forced = FORCED_ANSWERS[sample.kind] if is_agentic(mode) else None
    content = [{"type": "video"}, {"type": "text", "text": user_text(sample, mode, dispatch)}]
    tools = (CROP_VIDEO_TOOL,) if is_agentic(mode) else ()
    return EpisodePrompt(sample.id, sample.video_path, ({"role": "user", "content": content},), nframes, tools,
                         forced)


def rollout_config(eval_cfg: EvalConfig, mode: PromptMode, base: RolloutConfig) -> RolloutConfig:
    """The rollout knobs of one prompt mode: eval's turns, budget and dispatch over the
    training rollout's sub-agent budget and tool-response truncation (SPEC §3, §7)."""
    agentic = is_agentic(mode)
    return RolloutConfig.model_validate({
        **base.model_dump(),
        "max_turns": eval_cfg.max_turns if agentic else 0,
        "max_parallel": 1 if eval_cfg.dispatch == "sequential" else eval_cfg.max_parallel,
        "max_new_tokens": eval_cfg.max_new_tokens,
        "think_prefix": agentic,
    })
