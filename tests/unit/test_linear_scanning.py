"""Reward (SPEC §4) and benchmark (SPEC §7) scanning is linear in the text length and
finds exactly what the lazy regexes of the SPEC wording find.

The reference patterns below are the SPEC's regexes as written; the library scans with
str.find and digit-run walks instead, because the regexes rescan the tail from every
unclosed opener or every digit of a long number (quadratic).
"""

from __future__ import annotations

import random
import re
import time

import pytest

from paravt_core import scoring
from paravt_core import rewards

PIECES = ["<answer>", "</answer>", "<time>", "</time>", "<tool_call>", "</tool_call>", "<tool_code>",
          "</tool_code>", "<tool_response>", "</tool_response>", "1", "23", ".", ",", " ", "\n", "-", "\u2013",
          ":", "[", "]", "a", "B", "start ", "end ", "time", "x"]


def random_texts(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(0, 30))) for _ in range(count)]


def _reference_strip(text: str) -> str:
    for tag in ("tool_call", "tool_code", "tool_response"):
        text = re.sub(rf"<{tag}>.*?</{tag}>", "", text, flags=re.DOTALL)
    return re.sub(r"<\|im_end\|>|<\|im_start\|>", "", text).strip()


def _reference_interval(text: str) -> tuple[str, str] | None:
    found = re.search(r"\[?\s*([\d.]+)\s*,\s*([\d.]+)\s*\]?", text)
    return None if found is None else (found.group(1), found.group(2))


def _reference_times(text: str, number: str = r"\d+(?:\.\d+)?") -> list:
    dash = r"\s*[-\u2013\u2014]\s*"
    clock = r"(\d+):(\d{2}(?:\.\d+)?)"
    patterns = [clock + dash + clock, f"({number}){dash}({number})",
                rf"\b(?:starting|start|beginning|begin)(?:\s*time)?\s*:?\s*({number})",
                rf"\b(?:ending|end|finishing|finish)(?:\s*time)?\s*:?\s*({number})"]
    found = [re.search(p, text, re.IGNORECASE if "start" in p or "end" in p else 0) for p in patterns]
    return [m.groups() if m else None for m in found] + [re.findall(number, text)]


def test_scanners_agree_with_the_spec_regexes_on_random_texts():
    for text in random_texts(4000):
        for tag in ("answer", "time"):
            found = re.search(rf"<{tag}>(.*?)</{tag}>", text, re.DOTALL)
            assert scoring.first_tag_body(text, tag) == (found.group(1) if found else None), text
            assert scoring.tag_bodies(text, tag) == re.findall(rf"<{tag}>(.*?)</{tag}>", text, re.DOTALL), text
        assert rewards._strip_tool_blocks_and_markers(text) == _reference_strip(text), text
        assert rewards._first_interval_texts(text) == _reference_interval(text), text
        ours = [p.search(text) for p in (scoring._CLOCK_RANGE, scoring._SECONDS_RANGE, scoring._START_NUMBER,
                                         scoring._END_NUMBER)]
        assert [m.groups() if m else None for m in ours] + [scoring._ANY_NUMBER.findall(text)] == \
            _reference_times(text), text


ADVERSARIAL = {
    "160 KB of <answer> openers": "<answer>" * 20_000,
    "160 KB of <time> openers": "<time>" * 26_667,
    "unclosed tool blocks after </think>": "</think>" + "<tool_call><tool_code><tool_response>" * 4_000,
    "a 40k-digit number": "9" * 40_000,
    "40k digits, a dash, 40k digits": "1" * 40_000 + " - " + "2" * 40_000,
    "an unclosed bracket of 40k digits": "[" + "1" * 40_000,
    "40k digits and dots": "1." * 20_000,
    "a keyword before 40k spaces": "start" + " " * 40_000 + "x",
    "a digit run before 40k spaces": "12" + " " * 40_000 + "x",
    "a clock before 40k decimals": "1:00." + "9" * 40_000,
}


@pytest.mark.parametrize("text", list(ADVERSARIAL.values()), ids=list(ADVERSARIAL))
def test_long_adversarial_texts_score_in_linear_time(text):
    # This process's CPU time, not the wall clock: the bound must hold however loaded the
    # machine is (tests run beside each other). Here about 0.3 s; a quadratic scan takes tens of seconds.
    started = time.process_time()
    rewards.compute_reward(text, "A", "mcq")
    rewards.compute_reward(text, "[1, 2]", "tvg")
    rewards.compute_reward("[1, 2]", text, "tvg")  # a 40k-digit ground truth
    rewards.compute_reward(text, "a dog", "oe")
    scoring.score_mcq(text, "A")
    scoring.score_grounding(text, (1.0, 2.0))
    elapsed = time.process_time() - started
    assert elapsed < 1.0, f"{elapsed:.2f} s of CPU"


def test_results_on_long_inputs_are_unchanged():
    assert rewards.extract_answer("<answer>" * 20_000 + "B</answer>") == "<answer>" * 19_999 + "B"
    assert scoring.score_mcq("<answer>" * 20_000 + "B", "B").score == 1.0  # rule 4 on the whole text
    # 300 digits still fit a float; 400 give inf, no prediction since issue #48 (test_eval_scoring.py)
    assert scoring.extract_grounding_times("9" * 300 + " - " + "9" * 301) == (float("9" * 300), float("9" * 301))
    assert rewards.tvg_accuracy("[1, 2]" + "9" * 40_000, "[1, 2]") == 1.0
