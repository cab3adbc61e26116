"""The text the synthetic rows put in front of the model (SPEC §2, §7).

One system prompt, shared by the SFT traces and the RL prompts, states the response
grammar and carries the `crop_video` schema (SPEC §2) inline, so that each row is
self-contained. Question prompts follow SPEC §7: the MCQ layout "Question: ...\\nOptions:
\\nA. ...\\nAnswer with the option letter only.", and the agentic line "The video path for
this video is: {basename}".
"""

from __future__ import annotations

import json

from paravt_core.agent.prompts import CROP_VIDEO_TOOL
from paravt_core.data.synth.questions import Question

SYSTEM_PROMPT = (
    "You answer questions about long videos. You see overview frames sampled uniformly over the "
    "video, each preceded by its timestamp; short events can fall between them. To look closer, "
    "call the crop_video tool on time windows in seconds. You may emit multiple <tool_call> blocks "
    "in one turn: they run in parallel and each returns a summary of its window. Think inside "
    "<think> </think> first, and give the final answer inside <answer> </answer>.\n\n"
    "# Tools\n<tools>\n" + json.dumps(CROP_VIDEO_TOOL) + "\n</tools>\n"
    'For each call write <tool_call>{"name": "crop_video", "arguments": {"video_path": ..., '
    '"start_time": ..., "end_time": ...}}</tool_call>.'
)

ANSWER_INSTRUCTIONS = {
    "mcq": "Answer with the option letter only.",
    "tvg": "Answer with the start and end time in seconds as [start, end].",
    "oe": "Answer with a short phrase.",
}


def question_prompt(question: Question, video_name: str) -> str:
    """The user text of a sample: question, options, answer format and the video's name."""
    lines = [f"Question: {question.text}"]
    if question.qtype == "mcq":
        lines.append("Options:")
        lines += [f"{letter}. {option}" for letter, option in zip(question.letters, question.options, strict=True)]
    lines.append(ANSWER_INSTRUCTIONS[question.qtype])
    lines.append(f"The video path for this video is: {video_name}")
    return "\n".join(lines)


def eval_style_text(question: Question, video_name: str, mode: str) -> tuple[str, str]:
    """(system, user text) of a sample as the SPEC §7 evaluation asks it in prompt `mode`
    (`agentic_general` or `direct`): the same functions build both, so the rows of a world
    generated with `prompts: eval` ask exactly what the evaluation asks (#15)."""
    from pathlib import Path

    from paravt_core.eval.prompting import system_text, user_text
    from paravt_core.eval.samples import EvalSample, mcq_question, open_question

    if question.qtype == "mcq":
        text, kind, answer = mcq_question(question.text, question.options), "mcq", question.answer
    elif question.qtype == "oe":
        text, kind, answer = open_question(question.text), "open", question.answer
    else:
        text, kind, answer = f"Question: {question.text}\n{ANSWER_INSTRUCTIONS[question.qtype]}", "open", question.answer
    sample = EvalSample(id=question.video_id, split="synth", video_path=Path(video_name), question=text,
                        answer=answer, kind=kind, options=tuple(question.options))
    return system_text(mode), user_text(sample, mode)
