"""What the main agent and the sub-agents are asked (SPEC §2, §3).

- `EpisodePrompt`: one question about one video, as chat messages whose single
  `{"type": "video"}` item is where the overview frames go, plus the `crop_video` tool
  schema the system turn lists. `nframes` sets the overview frame count per prompt
  (nFrames gating, SPEC §5, picks it per prompt; None means the config's `video.nframes`).
- `question_prompt` builds our own agentic question for prompts made in code (tests,
  benchmarks): the question, an instruction ("you may emit multiple <tool_call> blocks in
  one turn"), then "The video path for this video is: {basename}". Evaluation asks in the
  release eval driver's words instead (`paravt_core.eval.prompting`).
- `messages_from_rl_prompt` turns an RL row's `prompt` turns (SPEC §8: the text `<video>`
  marks where the video goes) into such messages.
- `ForcedAnswer`: the evaluation's "answer now" user turn after the last tool round
  (SPEC §7), carried by an `EpisodePrompt`; training prompts have none.
- `subagent_messages` is the sub-agent's prompt of SPEC §3: the frames of one window only,
  the window as MM:SS to MM:SS with its duration, and a request for a concise factual
  summary in temporal order.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paravt_core.agent.tool_calls import TOOL_NAME

VIDEO_MARKER = "<video>"

CROP_VIDEO_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Look closer at a time window of the video. A helper watches the frames of that window "
            "and returns a short summary of what happens in it."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "video_path": {"type": "string", "description": "The video to crop."},
                "start_time": {"type": "number", "description": "Window start in seconds (or MM:SS)."},
                "end_time": {"type": "number", "description": "Window end in seconds (or MM:SS)."},
            },
            "required": ["video_path", "start_time", "end_time"],
        },
    },
}

AGENTIC_INSTRUCTION = (
    "Think step by step inside <think></think>. If you need a closer look at part of the video, call "
    "crop_video; you may emit multiple <tool_call> blocks in one turn and they run in parallel. "
    "Give the final answer inside <answer></answer>."
)
VIDEO_PATH_LINE = "The video path for this video is: {basename}"
SUBAGENT_INSTRUCTION = (
    "These frames show the window {start} to {end} ({duration:.1f} seconds) of a longer video. "
    "Write a concise, factual summary of what happens in this window, in temporal order."
)


@dataclass(frozen=True)
class ForcedAnswer:
    """A user turn asking for the answer now, added after the last allowed tool round (SPEC §7).

    Attributes:
        text: the user turn's text, e.g. "... answer with ONLY the letter ...".
        max_new_tokens: the budget of the generation that follows (SPEC §7: 64, or 128
            for grounding).
        think_prefix: end that generation's prompt with the think prefix too; off by
            default, since the turn asks for the bare answer within a small budget.
    """

    text: str
    max_new_tokens: int
    think_prefix: bool = False


@dataclass(frozen=True)
class EpisodePrompt:
    """One question about one video, put to the main agent.

    Attributes:
        prompt_id: identifies the row (rewards and logs refer to it).
        video_path: the sample's own video; every crop reads this file (SPEC §2).
        messages: chat messages; exactly one content item is `{"type": "video"}` (the overview).
        nframes: overview frame count for this prompt; None uses `video.nframes`.
        tools: tool schemas listed in the system turn.
        forced_answer: a user turn added after the last allowed tool round (SPEC §7
            evaluation); None adds nothing (training).
    """

    prompt_id: str
    video_path: Path
    messages: tuple[Mapping[str, Any], ...]
    nframes: int | None = None
    tools: tuple[Mapping[str, Any], ...] = field(default=(CROP_VIDEO_TOOL,))
    forced_answer: ForcedAnswer | None = None

    def __post_init__(self) -> None:
        videos = sum(1 for message in self.messages for item in _items(message) if item.get("type") == "video")
        if videos != 1:
            raise ValueError(f"prompt {self.prompt_id}: messages must hold exactly one video item, found {videos}")
        if self.nframes is not None and self.nframes < 1:
            raise ValueError(f"prompt {self.prompt_id}: nframes must be positive, got {self.nframes}")


def _items(message: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    content = message.get("content")
    return content if isinstance(content, list | tuple) else ()


def question_prompt(prompt_id: str, video_path: str | os.PathLike[str], question: str, *,
                    nframes: int | None = None) -> EpisodePrompt:
    """The agentic question of SPEC §7: overview video, question, instruction, video path line."""
    path = Path(video_path)
    text = f"{question}\n{AGENTIC_INSTRUCTION}\n{VIDEO_PATH_LINE.format(basename=path.name)}"
    messages = ({"role": "user", "content": [{"type": "video"}, {"type": "text", "text": text}]},)
    return EpisodePrompt(prompt_id, path, messages, nframes)


def messages_from_rl_prompt(turns: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    """Chat messages from an RL row's `prompt` turns (SPEC §8): `<video>` becomes the video item."""
    messages = []
    for number, turn in enumerate(turns):
        content = turn.get("content")
        if not isinstance(content, str):
            raise ValueError(f"prompt turn {number} ({turn.get('role')}) must have text content, got {type(content)}")
        pieces = content.split(VIDEO_MARKER)
        items: list[dict[str, Any]] = []
        for index, piece in enumerate(pieces):
            if index > 0:
                items.append({"type": "video"})
            if piece:
                items.append({"type": "text", "text": piece})
        messages.append({"role": turn["role"], "content": items})
    return tuple(messages)


def format_clock(seconds: float) -> str:
    """MM:SS of a time in seconds, seconds rounded down; minutes may exceed 59."""
    whole = max(0, math.floor(seconds + 1e-6))
    return f"{whole // 60:02d}:{whole % 60:02d}"


def subagent_instruction(start: float, end: float) -> str:
    """The text of the sub-agent prompt for the window [start, end] seconds (SPEC §3)."""
    return SUBAGENT_INSTRUCTION.format(start=format_clock(start), end=format_clock(end), duration=end - start)


def subagent_messages(start: float, end: float) -> list[dict[str, Any]]:
    """The sub-agent's chat: the window's frames, then the summary request (SPEC §3)."""
    content = [{"type": "video"}, {"type": "text", "text": subagent_instruction(start, end)}]
    return [{"role": "user", "content": content}]


def frames_tool_text(num_frames: int, start: float, end: float) -> str:
    """The text after a crop's frames in the `frames` tool mode (SPEC §7)."""
    return f"{num_frames} frames from {start:.1f}s to {end:.1f}s."
