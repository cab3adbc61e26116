"""Evaluation prompt modes, forced-answer turns and rollout knobs per mode (SPEC §7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from paravt_core.agent.prompts import CROP_VIDEO_TOOL, question_prompt
from paravt_core.config import EvalConfig, RolloutConfig
from paravt_core.eval.prompting import (
    FORCED_GROUNDING,
    FORCED_MCQ,
    FORCED_OPEN,
    REASONING_INSTRUCTION,
    episode_prompt,
    prompt_mode_for,
    rollout_config,
    user_text,
)
from paravt_core.eval.samples import EvalSample

VIDEO = Path("/data/videomme/abc123.mp4")
MCQ_TEXT = "Question: What colour is the ball?\nOptions:\nA. red\nB. blue\nAnswer with the option letter only."
PATH_LINE = "The video path for this video is: abc123.mp4"


def mcq() -> EvalSample:
    return EvalSample(id="q1", split="videomme", video_path=VIDEO, question=MCQ_TEXT, answer="B", kind="mcq",
                      options=("red", "blue"))


def grounding() -> EvalSample:
    return EvalSample(id="g1", split="charades", video_path=VIDEO, question="Find the moment: a person sits.",
                      answer=(2.0, 6.5), kind="grounding", gt_start=2.0, gt_end=6.5)


def open_ended() -> EvalSample:
    return EvalSample(id="o1", split="mmvu", video_path=VIDEO, question="Question: What moves?\nAnswer with a short "
                      "word or phrase.", answer="a ball", kind="open")


def text_of(prompt) -> str:
    (message,) = prompt.messages
    assert message["content"][0] == {"type": "video"}
    return message["content"][1]["text"]


def test_direct_mode_is_the_question_alone_without_tools_or_forced_turn():
    prompt = episode_prompt(mcq(), "direct", "parallel", nframes=16)
    assert text_of(prompt) == MCQ_TEXT
    assert prompt.tools == () and prompt.forced_answer is None and prompt.nframes == 16


def test_reasoning_mode_asks_for_think_then_answer():
    prompt = episode_prompt(mcq(), "reasoning", "parallel", nframes=16)
    assert text_of(prompt) == f"{MCQ_TEXT}\n{REASONING_INSTRUCTION}"
    assert "<think></think>" in REASONING_INSTRUCTION and "<answer></answer>" in REASONING_INSTRUCTION
    assert prompt.tools == () and prompt.forced_answer is None


def test_agentic_general_parallel_is_the_training_question_prompt():
    prompt = episode_prompt(mcq(), "agentic_general", "parallel", nframes=8)
    trained = question_prompt("q1", VIDEO, MCQ_TEXT, nframes=8)
    assert prompt.messages == trained.messages and prompt.tools == trained.tools == (CROP_VIDEO_TOOL,)
    text = text_of(prompt)
    assert "you may emit multiple <tool_call> blocks in one turn" in text
    assert text.startswith(MCQ_TEXT) and text.endswith(PATH_LINE)
    assert prompt.forced_answer == FORCED_MCQ


def test_agentic_general_sequential_asks_for_one_call_per_turn():
    text = user_text(mcq(), "agentic_general", "sequential")
    assert "at most one <tool_call> block per turn" in text
    assert "multiple" not in text and text.endswith(PATH_LINE)


def test_agentic_minimal_is_the_bare_tool_envelope():
    prompt = episode_prompt(grounding(), "agentic_minimal", "parallel", nframes=8)
    assert text_of(prompt) == f"Find the moment: a person sits.\n{PATH_LINE}"
    assert prompt.tools == (CROP_VIDEO_TOOL,)
    assert prompt.forced_answer == FORCED_GROUNDING


def test_forced_answer_texts_and_budgets_follow_spec_7():
    assert "answer with ONLY the letter" in FORCED_MCQ.text and FORCED_MCQ.max_new_tokens == 64
    assert "The event happens in the X.X - Y.Y seconds." in FORCED_GROUNDING.text
    assert FORCED_GROUNDING.max_new_tokens == 128
    assert "ONLY a short word or phrase" in FORCED_OPEN.text and FORCED_OPEN.max_new_tokens == 64
    assert not any(forced.think_prefix for forced in (FORCED_MCQ, FORCED_GROUNDING, FORCED_OPEN))
    assert episode_prompt(open_ended(), "agentic_general", "parallel", 8).forced_answer == FORCED_OPEN


def test_grounding_samples_use_the_grounding_prompt_mode():
    cfg = EvalConfig(prompt_mode="reasoning", grounding_prompt_mode="agentic_minimal")
    assert prompt_mode_for(grounding(), cfg) == "agentic_minimal"
    assert prompt_mode_for(mcq(), cfg) == prompt_mode_for(open_ended(), cfg) == "reasoning"


@pytest.mark.parametrize("mode", ["direct", "reasoning"])
def test_non_agentic_modes_get_one_generation_without_think_prefix(mode):
    cfg = rollout_config(EvalConfig(max_turns=3, max_new_tokens=99), mode, RolloutConfig())
    assert (cfg.max_turns, cfg.think_prefix, cfg.max_new_tokens) == (0, False, 99)


def test_agentic_rollout_knobs_come_from_eval_and_training():
    base = RolloutConfig(subagent_max_new_tokens=77, tool_response_max_tokens=300, max_new_tokens=5)
    parallel = rollout_config(EvalConfig(max_turns=2, max_parallel=4, max_new_tokens=50), "agentic_general", base)
    assert (parallel.max_turns, parallel.max_parallel, parallel.max_new_tokens, parallel.think_prefix) == (2, 4, 50,
                                                                                                         True)
    assert (parallel.subagent_max_new_tokens, parallel.tool_response_max_tokens) == (77, 300)
    sequential = rollout_config(EvalConfig(dispatch="sequential", max_parallel=4), "agentic_minimal", base)
    assert sequential.max_parallel == 1
