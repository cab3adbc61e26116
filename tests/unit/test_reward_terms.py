"""The reward as a list of named terms (`rewards.REWARD_TERMS`, SPEC §4): its sum is bit for bit
the release's R = R_acc + format_weight * R_fmt + R_tool, and a term added to the list in that one
place reaches the reward, the step metrics, the episode log and `paravt rewards` by its name."""

from __future__ import annotations

import itertools
import struct
from types import SimpleNamespace

import pytest
import torch

from paravt_core import rewards
from paravt_core.config import RewardConfig, RLConfig
from paravt_core.rewards import (
    RewardTerm,
    accuracy_reward,
    compute_reward,
    extract_answer,
    format_reward,
    is_degenerate,
    reward_term_names,
    tool_reward,
)

CALL = '<tool_call>{"name": "crop_video", "arguments": {"video_path": "v.mp4", "start_time": 1, "end_time": 5}}</tool_call>'
TEXTS = [
    "<think>\nI need to check the middle part.</think>\n" + CALL + "<tool_response>x</tool_response><answer>B</answer>",
    "<think>I will look at the start.</think><answer>[10, 20]</answer>",
    # sums whose rounding depends on the order of the additions (IoU 1/3 or 0.45, tool 0.6)
    "<think>I will look at the start.</think>" + CALL + "<answer>[10, 20]</answer>",
    "<think>I will look" + CALL + "<answer>[12, 21]</answer>",
    "<think>short",
    "<answer>red car</answer>",
    "The answer is (C)",
    "<|im_start|>" * 5 + "<answer>B</answer>",
    "",
]
ANSWERS = [("B", "mcq"), ("C", "mcq"), ("[15, 25]", "tvg"), ("[11, 30]", "tvg"), ("the big red car", "oe")]


def _bits(value: float) -> bytes:
    return struct.pack("<d", value)


def test_the_listed_terms_in_their_order():
    assert reward_term_names() == ("acc", "format", "tool")


@pytest.mark.parametrize(("format_weight", "use_tool_reward"), [(1.0, True), (0.3, True), (0.7, True), (-0.7, True), (1.0, False)])
def test_the_sum_of_the_terms_is_the_release_formula_bit_for_bit(format_weight, use_tool_reward):
    for text, (answer, kind), suffix, anchor in itertools.product(TEXTS, ANSWERS, (True, False), (0.0, 0.5)):
        got = compute_reward(text, answer, kind, answer_suffix=suffix, anchor_weight=anchor,
                             format_weight=format_weight, use_tool_reward=use_tool_reward)
        acc = accuracy_reward(extract_answer(text), answer, kind)
        fmt = format_reward(text, answer_suffix=suffix, anchor_weight=anchor)
        tool = tool_reward(text, acc) if use_tool_reward else 0.0
        if is_degenerate(text):
            acc = fmt = tool = 0.0
        want = acc + format_weight * fmt + tool if use_tool_reward else acc + format_weight * fmt
        assert (got.terms, _bits(got.total)) == ({"acc": acc, "format": fmt, "tool": tool}, _bits(want)), text


def test_a_term_listed_twice_is_refused():
    twice = (*rewards.REWARD_TERMS, rewards.REWARD_TERMS[0])
    with pytest.raises(ValueError, match="'acc' is listed twice"):
        rewards.score_terms(rewards.Scored("x", "x", "x", "oe"), RewardConfig(), twice)


def _brevity(scored, knobs, earlier):
    """A toy term: -0.1 per 100 characters of the scored text past the first 100."""
    return -0.1 * max(len(scored.text) - 100, 0) / 100


@pytest.fixture
def toy_term(monkeypatch):
    """A toy term registered the way a new one is: appended to `rewards.REWARD_TERMS`."""
    monkeypatch.setattr(rewards, "REWARD_TERMS", (*rewards.REWARD_TERMS, RewardTerm("brevity", _brevity,
                                                                                  weight=lambda knobs: 2.0)))


def test_a_toy_term_reaches_the_reward_and_every_log_by_its_name(toy_term):
    from paravt_core.rl.cli import score_record
    from paravt_core.rl.episode_log import episode_records
    from paravt_core.rl.policy import paravt_reward, reward_means

    text = "<think>I will look at the start.</think>" + "x" * 260 + "<answer>B</answer>"  # 318 characters
    base = compute_reward(text, "B", "mcq")
    assert base.terms["brevity"] == pytest.approx(-0.218)
    assert base.total == pytest.approx(1.0 + base.terms["format"] + 2.0 * -0.218)

    # the RL stage's reward (the `reward` section's knobs, SPEC §4.5 scope)
    episode = SimpleNamespace(text=lambda scope: text, prompt_index=0, prompt_id="p0", sample_index=0, nframes=4,
                              tool_calls=0, end_reason="answer")
    prompt = SimpleNamespace(answer="B", question_type="mcq", question="Which?", video_key="v.mp4")
    scored = paravt_reward(RLConfig())(episode, prompt)
    assert scored == base

    # the step metrics: reward_<name> for every term, and the summed reward
    assert reward_means([scored]) == {"reward_acc": 1.0, "reward_format": scored.terms["format"],
                                      "reward_tool": 0.0, "reward_brevity": scored.terms["brevity"],
                                      "reward": scored.total}

    # the episode log
    traj = SimpleNamespace(episode=0, is_subagent=False, token_ids=torch.tensor([1, 2]),
                           loss_mask=torch.tensor([0, 1]), advantages=torch.tensor([0.0, 0.5]))
    (record,) = episode_records(1, 0, [episode], [prompt], [scored], torch.tensor([0.5]), [traj], 1.0)
    assert (record["brevity"], record["total"]) == (scored.terms["brevity"], scored.total)

    # `paravt rewards`
    out = score_record({"completion": text, "answer": "B", "question_type": "mcq", "answer_suffix": True,
                        "anchor_weight": 0.5, "format_weight": 1.0, "mode": "f1", "question": ""})
    assert list(out) == ["answer", "acc", "format", "tool", "brevity", "total", "tool_calls"]
    assert out["brevity"] == pytest.approx(-0.218) and out["total"] == pytest.approx(base.total)


def test_a_term_the_knobs_turn_off_is_logged_as_zero_and_left_out_of_the_sum():
    text = "<think>I will look at the start.</think>" + CALL + "<answer>B</answer>"
    on = compute_reward(text, "B", "mcq")
    off = compute_reward(text, "B", "mcq", use_tool_reward=False)
    assert on.terms["tool"] == pytest.approx(0.6) and off.terms["tool"] == 0.0
    assert off.total == on.terms["acc"] + on.terms["format"]
