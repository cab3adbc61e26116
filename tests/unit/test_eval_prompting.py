"""Evaluation prompt modes, forced-answer turns and rollout knobs per mode (SPEC §7).

The expected strings below are written out from the public release's eval driver
(EvolvingLMMs-Lab/ParaVT `paravt/eval/driver.py`, `paravt/eval/utils.py`), so a drift in our
constants shows up here as a diff against the release's words.
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest

from paravt_core.agent.prompts import question_prompt
from paravt_core.config import EvalConfig, RolloutConfig
from paravt_core.eval.prompting import (
    AGENTIC_MINIMAL_SYSTEM,
    DIRECT_SYSTEM,
    EVAL_TOOL_SCHEMA_TEXT,
    FORCED_GROUNDING,
    FORCED_MCQ,
    FORCED_OPEN,
    REASONING_SYSTEM,
    SEQUENTIAL_INSTRUCTION,
    agentic_general_system,
    episode_prompt,
    prompt_mode_for,
    rollout_config,
    system_text,
    user_text,
)
from paravt_core.eval.samples import EvalSample

VIDEO = Path("/data/videomme/abc123.mp4")
MCQ_TEXT = "Question: What colour is the ball?\nOptions:\nA. red\nB. blue\nAnswer with the option letter only."
PATH_SENTENCE = "The video path for this video is: abc123.mp4"
TEMPLATE = Path(__file__).resolve().parents[2] / "paravt_core" / "model" / "chat_template.jinja"

RELEASE_SCHEMA = (
    '{"type": "function", "function": {"name": "crop_video", "description": "Analyze a cropped video segment by '
    'sampling frames from a specific time range.", "parameters": {"type": "object", "properties": {"video_path": '
    '{"type": "string", "description": "Path to the video file"}, "start_time": {"type": "number", "description": '
    '"Start time in seconds"}, "end_time": {"type": "number", "description": "End time in seconds"}}, "required": '
    '["video_path", "start_time", "end_time"]}}}'
)
RELEASE_GENERAL_SYSTEM = f"""You are a video understanding agent that can analyze videos by cropping and examining specific segments.

Available tool:
<tools>
{RELEASE_SCHEMA}
</tools>

For tool calls, return a JSON object within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": "crop_video", "arguments": {{"video_path": "...", "start_time": 0, "end_time": 10}}}}
</tool_call>

You may emit **multiple <tool_call> blocks in one turn** to analyze different segments in parallel — this is more efficient than sequential calls and is the recommended dispatch shape for this agent.

Format strictly as:
<think>your reasoning here</think>
<tool_call>...</tool_call>  (zero or more, parallel if multiple)
<answer>your final answer</answer>

Always wrap your reasoning in <think> tags and your final answer in <answer> tags."""  # noqa: E501
RELEASE_MINIMAL_SYSTEM = f"""# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{RELEASE_SCHEMA}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""  # noqa: E501


def mcq() -> EvalSample:
    return EvalSample(id="q1", split="videomme", video_path=VIDEO, question=MCQ_TEXT, answer="B", kind="mcq",
                      options=("red", "blue"))


def grounding() -> EvalSample:
    return EvalSample(id="g1", split="charades", video_path=VIDEO, question="Find the moment: a person sits.",
                      answer=(2.0, 6.5), kind="grounding", gt_start=2.0, gt_end=6.5)


def open_ended() -> EvalSample:
    return EvalSample(id="o1", split="mmvu", video_path=VIDEO, question="Question: What moves?\nAnswer with a short "
                      "word or phrase.", answer="a ball", kind="open")


def split_prompt(prompt) -> tuple[str, str]:
    """(system text, user text) of a prompt; the user turn is the overview video then text."""
    system, user = prompt.messages
    assert system["role"] == "system" and user["role"] == "user"
    assert user["content"][0] == {"type": "video"} and len(user["content"]) == 2
    return system["content"], user["content"][1]["text"]


def test_the_tool_schema_is_the_release_eval_schema_as_json_dumps_writes_it():
    assert EVAL_TOOL_SCHEMA_TEXT == RELEASE_SCHEMA
    assert json.loads(EVAL_TOOL_SCHEMA_TEXT)["function"]["parameters"]["required"] == [
        "video_path", "start_time", "end_time"]


def test_direct_mode_has_the_release_system_and_its_mcq_instruction():
    prompt = episode_prompt(mcq(), "direct", "parallel", nframes=16)
    system, text = split_prompt(prompt)
    assert system == DIRECT_SYSTEM == (
        "You are a helpful video understanding assistant. Watch the video carefully and answer the question. "
        "Provide your final answer in <answer></answer> tags.")
    assert text == ("Question: What colour is the ball?\nOptions:\nA. red\nB. blue\nThink step by step, use "
                    "crop_video if needed, then provide your answer in <answer>X</answer> tags where X is the "
                    "option letter.")
    assert prompt.tools == () and prompt.forced_answer is None and prompt.nframes == 16
    assert user_text(grounding(), "direct") == grounding().question  # only MCQ text changes


def test_direct_mode_refuses_an_mcq_question_without_the_standard_instruction():
    odd = EvalSample(id="q9", split="videomme", video_path=VIDEO, question="Pick one: A or B", answer="A",
                     kind="mcq", options=("x", "y"))
    with pytest.raises(ValueError, match=r"q9 \(videomme\).*must end with 'Answer with the option letter only.'"):
        user_text(odd, "direct")


def test_reasoning_mode_has_the_release_system_and_the_question_alone():
    prompt = episode_prompt(mcq(), "reasoning", "parallel", nframes=16)
    system, text = split_prompt(prompt)
    assert system == REASONING_SYSTEM == (
        "You are a helpful assistant. When the user asks a question, your response must include two parts: first, "
        "the reasoning process enclosed in <think>...</think> tags, then the final answer enclosed in "
        "<answer>...</answer> tags.")
    assert text == MCQ_TEXT
    assert prompt.tools == () and prompt.forced_answer is None


def test_agentic_general_is_the_release_system_prompt_and_question_then_path():
    prompt = episode_prompt(mcq(), "agentic_general", "parallel", nframes=8)
    system, text = split_prompt(prompt)
    assert system == agentic_general_system("parallel") == RELEASE_GENERAL_SYSTEM
    assert text == f"{MCQ_TEXT} {PATH_SENTENCE}"
    assert prompt.tools == ()  # the schema is in the system text, listed once
    assert prompt.forced_answer == FORCED_MCQ and prompt.nframes == 8


def test_agentic_user_text_is_no_longer_training_question_prompt_text():
    """Training keeps its own instruction (SPEC §8 rows / our synthetic prompt); eval follows the release."""
    trained = question_prompt("q1", VIDEO, MCQ_TEXT, nframes=8)
    (user,) = trained.messages
    assert user["content"][1]["text"] != user_text(mcq(), "agentic_general")


def test_agentic_general_sequential_swaps_only_the_dispatch_wording():
    sequential = agentic_general_system("sequential")
    assert SEQUENTIAL_INSTRUCTION in sequential and "at most one <tool_call> block per turn" in sequential
    assert "multiple <tool_call> blocks" not in sequential and "parallel" not in sequential
    assert "<tool_call>...</tool_call>  (at most one per turn)" in sequential
    release_lines, our_lines = RELEASE_GENERAL_SYSTEM.splitlines(), sequential.splitlines()
    changed = [i for i, (a, b) in enumerate(zip(release_lines, our_lines, strict=True)) if a != b]
    assert [release_lines[i] for i in changed] == [
        "You may emit **multiple <tool_call> blocks in one turn** to analyze different segments in parallel — this "
        "is more efficient than sequential calls and is the recommended dispatch shape for this agent.",
        "<tool_call>...</tool_call>  (zero or more, parallel if multiple)"]
    assert [our_lines[i] for i in changed] == [SEQUENTIAL_INSTRUCTION,
                                               "<tool_call>...</tool_call>  (at most one per turn)"]
    sys_text, _ = split_prompt(episode_prompt(mcq(), "agentic_general", "sequential", 8))
    assert sys_text == sequential


def test_agentic_minimal_is_the_release_bare_tool_envelope():
    prompt = episode_prompt(grounding(), "agentic_minimal", "parallel", nframes=8)
    system, text = split_prompt(prompt)
    assert system == AGENTIC_MINIMAL_SYSTEM == RELEASE_MINIMAL_SYSTEM
    assert system_text("agentic_minimal", "sequential") == system  # no dispatch wording to swap
    assert text == f"Find the moment: a person sits. {PATH_SENTENCE}"
    assert prompt.tools == () and prompt.forced_answer == FORCED_GROUNDING


def test_the_path_sentence_is_skipped_when_the_question_mentions_a_video_path():
    sample = EvalSample(id="q2", split="videomme", video_path=VIDEO, question="Which Video Path is shown?\n"
                        "Options:\nA. x\nB. y\nAnswer with the option letter only.", answer="A", kind="mcq",
                        options=("x", "y"))
    assert user_text(sample, "agentic_general") == sample.question


def test_forced_answer_texts_and_budgets_are_the_release_ones():
    assert FORCED_MCQ.text == "Based on the video and cropped segments above, answer with ONLY the letter."
    assert FORCED_MCQ.max_new_tokens == 64
    assert FORCED_GROUNDING.text == (
        "Based on the video and any cropped segments, provide your final answer about when the event happens. "
        "Use the format: 'The event happens in the X.X - Y.Y seconds.'")
    assert FORCED_GROUNDING.max_new_tokens == 128
    assert FORCED_OPEN.text == "Based on the video and cropped segments above, answer with ONLY a short word or phrase."
    assert FORCED_OPEN.max_new_tokens == 64
    assert not any(forced.think_prefix for forced in (FORCED_MCQ, FORCED_GROUNDING, FORCED_OPEN))
    assert episode_prompt(open_ended(), "agentic_general", "parallel", 8).forced_answer == FORCED_OPEN


def test_our_chat_template_renders_the_system_turn_as_written_and_lists_no_second_schema():
    """The tiny model's template: the system text verbatim, no template tool listing when the
    prompt has no tools, then the user turn (video pad, then the text)."""
    template = jinja2.Environment().from_string(TEMPLATE.read_text())
    prompt = episode_prompt(mcq(), "agentic_general", "parallel", nframes=8)
    rendered = template.render(messages=list(prompt.messages), tools=list(prompt.tools) or None,
                               add_generation_prompt=True)
    assert rendered == (f"<|im_start|>system\n{RELEASE_GENERAL_SYSTEM}<|im_end|>\n"
                        f"<|im_start|>user\n<|video_pad|>{MCQ_TEXT} {PATH_SENTENCE}<|im_end|>\n"
                        "<|im_start|>assistant\n")
    assert rendered.count("<tools>") == 1


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
