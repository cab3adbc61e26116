"""What the evaluated model is asked, per SPEC §7 prompt mode, and the rollout knobs per mode.

The strings the model sees are those of the public release (EvolvingLMMs-Lab/ParaVT,
`paravt/eval/driver.py` and `paravt/eval/utils.py`); each constant below names the file it
comes from. The question text itself (MCQ options, subtitles, the Charades-STA sentence) is
built by `samples.py`.

Prompt modes (each a system turn, then one user turn: overview frames, then the text):
- `direct`: system `DIRECT_SYSTEM`; the question, whose MCQ instruction is the release's
  direct-mode one (`DIRECT_MCQ_INSTRUCTION`, "Think step by step, use crop_video if
  needed, ...") instead of "Answer with the option letter only."; no tools, one generation.
- `reasoning`: system `REASONING_SYSTEM` (`<think>` then `<answer>`); the question; no
  tools, one generation.
- `agentic_general`: system `agentic_general_system()`: the role line, the `crop_video`
  schema inside <tools></tools>, the <tool_call> format with an example call, the
  invitation to emit multiple <tool_call> blocks in one turn, and the answer format. The
  user text is the question, a space, then "The video path for this video is: {basename}".
- `agentic_minimal`: system `AGENTIC_MINIMAL_SYSTEM`, the bare tool envelope (the schema
  and the generic <tool_call> format, no instruction); user text as `agentic_general`.
  The release uses it for Charades-STA.

Decided here, where the release leaves a choice or differs from training:
- The tool schema is part of the system TEXT, as in the release, and the `EpisodePrompt`
  carries no `tools`: the chat template then renders the system turn as written, on the
  hf engine (our template or the checkpoint's) and on an OpenAI-compatible server alike,
  instead of adding its own tool listing. Its wording is the release eval's
  ("Analyze a cropped video segment ..."), not training's `CROP_VIDEO_TOOL`.
- Training prompts are NOT these: the release's RL prompts come from the parquet rows
  (SPEC §8) and our synthetic `paravt_core.agent.prompts.question_prompt` keeps its own
  instruction; evaluation follows the release eval driver, so its agentic user text no
  longer equals training's `question_prompt` text.
- As in the release, the video path sentence is added only when the question does not
  already mention a "video path" (case-insensitive).
- Dispatch (SPEC §7, Table 2 block C): `parallel` runs up to `max_parallel` calls per turn;
  `sequential` runs ONE call per turn (extra calls of a turn get the rollout's "at most 1
  crop_video calls run per turn" error response). The release has no sequential prompt; ours
  is the `agentic_general` system prompt with its parallel paragraph replaced by
  `SEQUENTIAL_INSTRUCTION` and "(zero or more, parallel if multiple)" by "(at most one per
  turn)". `agentic_minimal` has no dispatch wording, so it is the same under both.

Forced answer (SPEC §7): agentic prompts carry a `ForcedAnswer`, the user turn added after
the last allowed tool round, in the release's words: MCQ "Based on the video and cropped
segments above, answer with ONLY the letter." (64 tokens), grounding "... Use the format:
'The event happens in the X.X - Y.Y seconds.'" (128 tokens). Decided here:
- Open-ended (MMVU "open") samples, which the release scores as MCQ, are asked in the MCQ
  turn's words for "ONLY a short word or phrase" (64 tokens).
- The generation after the forced turn has no think prefix: it asks for the bare answer
  within a small budget.
- Agentic modes end every other main-agent generation prompt with `<think>\\n` (SPEC §3:
  the rollout protocol is that of training and agentic evaluation); `direct` and
  `reasoning` have no prefix and no tool round (max_turns 0).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from paravt_core.agent.prompts import VIDEO_PATH_LINE, EpisodePrompt, ForcedAnswer
from paravt_core.agent.tool_calls import TOOL_NAME
from paravt_core.config import EvalConfig, RolloutConfig
from paravt_core.eval.samples import MCQ_INSTRUCTION, EvalSample

PromptMode = Literal["direct", "reasoning", "agentic_general", "agentic_minimal"]
Dispatch = Literal["parallel", "sequential"]
PROMPT_MODES: tuple[PromptMode, ...] = ("direct", "reasoning", "agentic_general", "agentic_minimal")
AGENTIC_MODES: frozenset[str] = frozenset({"agentic_general", "agentic_minimal"})

# paravt/eval/driver.py TOOL_SCHEMA: the schema the eval system prompts list, as json.dumps writes it.
EVAL_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Analyze a cropped video segment by sampling frames from a specific time range.",
        "parameters": {
            "type": "object",
            "properties": {
                "video_path": {"type": "string", "description": "Path to the video file"},
                "start_time": {"type": "number", "description": "Start time in seconds"},
                "end_time": {"type": "number", "description": "End time in seconds"},
            },
            "required": ["video_path", "start_time", "end_time"],
        },
    },
}
EVAL_TOOL_SCHEMA_TEXT = json.dumps(EVAL_TOOL_SCHEMA)

# paravt/eval/driver.py DIRECT_SYSTEM
DIRECT_SYSTEM = (
    "You are a helpful video understanding assistant. Watch the video carefully and answer the question. "
    "Provide your final answer in <answer></answer> tags."
)
# paravt/eval/driver.py REASONING_SYSTEM
REASONING_SYSTEM = (
    "You are a helpful assistant. When the user asks a question, your response must include two parts: "
    "first, the reasoning process enclosed in <think>...</think> tags, then the final answer enclosed in "
    "<answer>...</answer> tags."
)
# paravt/eval/driver.py GENERAL_AGENTIC_SYSTEM, with its dispatch paragraph and the note on
# the format's <tool_call> line left as slots (the release's values fill them in parallel
# dispatch); "{{" and "}}" are literal braces of the example call.
_AGENTIC_GENERAL_TEMPLATE = (
    "You are a video understanding agent that can analyze videos by cropping and examining specific segments.\n"
    "\n"
    "Available tool:\n"
    "<tools>\n"
    "{tool_schema}\n"
    "</tools>\n"
    "\n"
    "For tool calls, return a JSON object within <tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{{"name": "crop_video", "arguments": {{"video_path": "...", "start_time": 0, "end_time": 10}}}}\n'
    "</tool_call>\n"
    "\n"
    "{dispatch}\n"
    "\n"
    "Format strictly as:\n"
    "<think>your reasoning here</think>\n"
    "<tool_call>...</tool_call>  ({calls_per_turn})\n"
    "<answer>your final answer</answer>\n"
    "\n"
    "Always wrap your reasoning in <think> tags and your final answer in <answer> tags."
)
# paravt/eval/driver.py GENERAL_AGENTIC_SYSTEM (its dispatch paragraph and format note)
PARALLEL_INSTRUCTION = (
    "You may emit **multiple <tool_call> blocks in one turn** to analyze different segments in parallel — "
    "this is more efficient than sequential calls and is the recommended dispatch shape for this agent."
)
_PARALLEL_CALLS_PER_TURN = "zero or more, parallel if multiple"
# Ours (the release has no sequential prompt): the same slots for one call per turn.
SEQUENTIAL_INSTRUCTION = (
    "Emit **at most one <tool_call> block per turn** and wait for its response before the next call; "
    "calls run one at a time."
)
_SEQUENTIAL_CALLS_PER_TURN = "at most one per turn"
# paravt/eval/driver.py MINIMAL_AGENTIC_SYSTEM
AGENTIC_MINIMAL_SYSTEM = (
    "# Tools\n"
    "\n"
    "You may call one or more functions to assist with the user query.\n"
    "\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
    f"{EVAL_TOOL_SCHEMA_TEXT}\n"
    "</tools>\n"
    "\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)
# paravt/eval/utils.py load_samples: the MCQ instruction of prompt mode "direct".
DIRECT_MCQ_INSTRUCTION = (
    "Think step by step, use crop_video if needed, then provide your answer in <answer>X</answer> tags "
    "where X is the option letter."
)

# paravt/eval/driver.py eval_one: the forced final turns after the last tool round.
FORCED_MCQ = ForcedAnswer("Based on the video and cropped segments above, answer with ONLY the letter.", 64)
FORCED_GROUNDING = ForcedAnswer(
    "Based on the video and any cropped segments, provide your final answer about when the event happens. "
    "Use the format: 'The event happens in the X.X - Y.Y seconds.'", 128)
# Ours, in the MCQ turn's words (the release has no open-ended samples).
FORCED_OPEN = ForcedAnswer("Based on the video and cropped segments above, answer with ONLY a short word or phrase.",
                           64)
FORCED_ANSWERS: dict[str, ForcedAnswer] = {"mcq": FORCED_MCQ, "open": FORCED_OPEN, "grounding": FORCED_GROUNDING}


def agentic_general_system(dispatch: Dispatch = "parallel") -> str:
    """The `agentic_general` system prompt; under `parallel` the release's text exactly."""
    if dispatch == "parallel":
        dispatch_text, calls_per_turn = PARALLEL_INSTRUCTION, _PARALLEL_CALLS_PER_TURN
    elif dispatch == "sequential":
        dispatch_text, calls_per_turn = SEQUENTIAL_INSTRUCTION, _SEQUENTIAL_CALLS_PER_TURN
    else:
        raise ValueError(f"unknown dispatch {dispatch!r}; expected parallel or sequential")
    return _AGENTIC_GENERAL_TEMPLATE.format(tool_schema=EVAL_TOOL_SCHEMA_TEXT, dispatch=dispatch_text,
                                            calls_per_turn=calls_per_turn)


def system_text(mode: PromptMode, dispatch: Dispatch = "parallel") -> str:
    """The system turn of a prompt mode (module docstring)."""
    if mode == "direct":
        return DIRECT_SYSTEM
    if mode == "reasoning":
        return REASONING_SYSTEM
    if mode == "agentic_general":
        return agentic_general_system(dispatch)
    if mode == "agentic_minimal":
        return AGENTIC_MINIMAL_SYSTEM
    raise ValueError(f"unknown prompt mode {mode!r}; expected one of {PROMPT_MODES}")


def prompt_mode_for(sample: EvalSample, eval_cfg: EvalConfig) -> PromptMode:
    """`grounding_prompt_mode` for grounding samples (Charades-STA), `prompt_mode` otherwise."""
    return eval_cfg.grounding_prompt_mode if sample.kind == "grounding" else eval_cfg.prompt_mode


def is_agentic(mode: PromptMode) -> bool:
    return mode in AGENTIC_MODES


def _direct_question(sample: EvalSample) -> str:
    if sample.kind != "mcq":
        return sample.question
    if not sample.question.endswith(MCQ_INSTRUCTION):
        raise ValueError(f"sample {sample.id} ({sample.split}): an MCQ question must end with {MCQ_INSTRUCTION!r} "
                         "(samples.py builds it so); cannot put the direct-mode instruction in its place")
    return sample.question.removesuffix(MCQ_INSTRUCTION) + DIRECT_MCQ_INSTRUCTION


def user_text(sample: EvalSample, mode: PromptMode) -> str:
    """The text after the overview frames in the user turn (module docstring)."""
    if mode == "direct":
        return _direct_question(sample)
    if mode == "reasoning":
        return sample.question
    if mode in AGENTIC_MODES:
        if "video path" in sample.question.lower():
            return sample.question
        return f"{sample.question} {VIDEO_PATH_LINE.format(basename=sample.video_path.name)}"
    raise ValueError(f"unknown prompt mode {mode!r}; expected one of {PROMPT_MODES}")


def episode_prompt(sample: EvalSample, mode: PromptMode, dispatch: Dispatch, nframes: int) -> EpisodePrompt:
    """The `EpisodePrompt` of one sample: system turn, then overview video and text; the
    forced answer in agentic modes; no `tools` (the schema is in the system text)."""
    forced = FORCED_ANSWERS[sample.kind] if is_agentic(mode) else None
    messages = (
        {"role": "system", "content": system_text(mode, dispatch)},
        {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": user_text(sample, mode)}]},
    )
    return EpisodePrompt(sample.id, sample.video_path, messages, nframes, (), forced)


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
