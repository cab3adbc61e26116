"""The SFT acceptance check: which episodes follow the response grammar (SPEC §2-§3)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from paravt_core.rewards import TranscriptSegment as Seg
from paravt_core.sft.grammar import follows_grammar

CALL = '<tool_call>{"name": "crop_video", "arguments": {"video_path": "v.mp4", "start_time": 0, "end_time": 16}}</tool_call>'
THINK_CALL = f"plan\n</think>\n{CALL}<|im_end|>"
RESPONSE = "<|im_start|>user\n<tool_response>\nNothing notable.\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n"
FINAL = "evidence\n</think>\n<answer>B</answer><|im_end|>"


def episode(*segments: Seg, end_reason: str = "answer", parse_failures: int = 0, rejected_calls: int = 0,
            unanswered_calls: int = 0) -> SimpleNamespace:
    return SimpleNamespace(transcript=list(segments), end_reason=end_reason, parse_failures=parse_failures,
                           rejected_calls=rejected_calls, unanswered_calls=unanswered_calls)


def test_think_tool_calls_answer_and_think_answer_follow_the_grammar():
    assert follows_grammar(episode(Seg(THINK_CALL, True), Seg(RESPONSE, False), Seg(FINAL, True)))
    assert follows_grammar(episode(Seg(FINAL, True)))


@pytest.mark.parametrize(
    ("ep", "why"),
    [
        (episode(Seg(THINK_CALL, True), Seg(RESPONSE, False), Seg(FINAL, True), rejected_calls=1),
         "a crop window outside the video (or start >= end) was rejected"),
        (episode(Seg(THINK_CALL, True), Seg(RESPONSE, False), Seg(FINAL, True), parse_failures=1),
         "a call block did not parse"),
        (episode(Seg(THINK_CALL, True), end_reason="max_turns", unanswered_calls=1), "no answer turn"),
        (episode(Seg("evidence <answer>B</answer>", True)), "think never closed"),
        (episode(Seg("evidence\n</think>\n<answer> </answer>", True)), "empty answer"),
        (episode(Seg("evidence\n</think>\nB", True)), "no answer tags"),
        (episode(Seg(FINAL[:-5], True), end_reason="length"), "cut by max_new_tokens"),
        (episode(), "nothing generated"),
    ],
)
def test_broken_episodes_do_not(ep, why):
    assert not follows_grammar(ep), why


def test_held_out_prompts_take_the_main_agents_system_prompt_past_subagent_rows(tmp_path):
    """#15: sub-agent SFT rows have no system turn; the held-out prompts still get the main agent's."""
    from paravt_core.sft.grammar import held_out_prompts

    subagent_row = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Summarize."}]},
                                 {"role": "assistant", "content": [{"type": "text", "text": "Nothing."}]}]}
    main_row = {"messages": [{"role": "system", "content": [{"type": "text", "text": "MAIN SYSTEM"}]},
                             {"role": "user", "content": [{"type": "text", "text": "q"}]}]}
    sample = SimpleNamespace(id="s1", question="What colour?", video_path=str(tmp_path / "v.mp4"))
    (prompt,) = held_out_prompts([subagent_row, main_row], [sample])
    assert prompt.messages[0] == {"role": "system", "content": [{"type": "text", "text": "MAIN SYSTEM"}]}
    assert prompt.messages[1]["content"][1]["text"].endswith("The video path for this video is: v.mp4")


def test_held_out_prompts_take_the_system_prompt_of_a_row_that_calls_tools(tmp_path):
    """#15: rows asked in the evaluation's direct mode come with a system prompt without tools;
    the grammar check asks with the one the tool-calling rows were trained on."""
    from paravt_core.sft.grammar import held_out_prompts

    def row(system: str, answer: str) -> dict:
        return {"messages": [{"role": "system", "content": [{"type": "text", "text": system}]},
                             {"role": "user", "content": [{"type": "text", "text": "q"}]},
                             {"role": "assistant", "content": [{"type": "text", "text": answer}]}]}

    direct = row("DIRECT SYSTEM", "<answer>A</answer>")
    agentic = row("AGENTIC SYSTEM", '<think>x</think><tool_call>{"name": "crop_video"}</tool_call>')
    sample = SimpleNamespace(id="s1", question="What colour?", video_path=str(tmp_path / "v.mp4"))
    (prompt,) = held_out_prompts([direct, agentic], [sample])
    assert prompt.messages[0]["content"][0]["text"] == "AGENTIC SYSTEM"
    (prompt,) = held_out_prompts([direct], [sample])
    assert prompt.messages[0]["content"][0]["text"] == "DIRECT SYSTEM"


def test_the_grammar_check_generates_in_batches_of_sft_grammar_batch_in_prompt_order():
    # At 8B all 56 episodes in one generate need ~105 GB on one GPU (paravt plan); sft.grammar_batch
    # bounds a generate. None keeps the former single generate.
    from paravt_core.sft.grammar import in_batches

    calls = []

    def run(batch):
        calls.append(list(batch))
        return [f"episode {p}" for p in batch]

    assert in_batches(list(range(7)), 3, run) == [f"episode {i}" for i in range(7)]
    assert calls == [[0, 1, 2], [3, 4, 5], [6]]
    calls.clear()
    assert len(in_batches(list(range(7)), None, run)) == 7 and calls == [list(range(7))]


def test_no_held_out_sample_is_said_so_before_any_model_loads(tmp_path):
    """Issue #48 item 3: with no prepared benchmark split the check failed as if every video were undecodable."""
    from paravt_core.config import PipelineConfig
    from paravt_core.sft import grammar

    (tmp_path / "rows").mkdir()
    (tmp_path / "eval").mkdir()
    with pytest.raises(grammar.NoHeldOutPrompts, match=r"no held-out prompt: no benchmark split prepared under "
                                                       r".*eval \(found: none\) .*eval.splits must name"):
        # model folders that do not exist: the check must stop before loading any
        grammar.run(PipelineConfig(), tmp_path / "no-base", tmp_path / "no-sft", tmp_path / "rows", tmp_path / "eval")
