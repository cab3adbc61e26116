"""Table tests of the SPEC §4 rewards; every expected number is worked out by hand."""

from __future__ import annotations

import subprocess
import sys

import pytest

from paravt_core.rewards import (
    RewardBreakdown,
    TranscriptSegment,
    accuracy_reward,
    compute_reward,
    extract_answer,
    format_reward,
    has_answer,
    has_think,
    has_tool,
    mcq_accuracy,
    normalize_answer,
    scored_text,
    token_f1,
    tool_reward,
)

ARGUMENTS = '{"video_path": "v.mp4", "start_time": 10, "end_time": 20}'
CALL = '<tool_call>{"name": "crop_video", "arguments": ' + ARGUMENTS + "}</tool_call>"
THINK = "<think>I will look at the start.</think>"  # body of 25 characters: has_think


def test_reward_modules_import_no_model_library() -> None:
    # a fresh interpreter, since this test session may have imported torch elsewhere
    code = (
        "import sys, paravt_core.rewards, paravt_core.agent.tool_calls, paravt_core.rl.cli;"
        "print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


# --- SPEC §4.1 answer extraction -------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>x</think><answer> B </answer>", "B"),
        ("<answer>A</answer> then <answer>B</answer>", "A"),  # the first answer block
        ("<answer>\n red car \n</answer>", "red car"),
        ("<answer>  </answer>\nC", ""),  # a blank first answer is still the answer
        # rule 2: after the first </think>, tool blocks and chat markers removed
        (f"<think>r</think>{CALL} The cat <|im_end|>", "The cat"),
        ("<think>a</think>one<think>b</think>two", "one<think>b</think>two"),
        ("<think>r</think><tool_response>dog</tool_response>\n<|im_start|>Paris", "Paris"),
        # rule 3: nothing left after </think>, so the last plain line of the whole text
        ("Final: C\n<think>ok</think>\n<tool_code>crop_video(1, 2)</tool_code>\n<|im_end|>", "<think>ok</think>"),
        ("Let me see.\nThe answer is C  \n<tool_call>{}\n<|im_end|>\n\n", "The answer is C"),
        ("<|im_end|>\n<tool_call>", ""),  # rule 4
        ("", ""),
    ],
)
def test_extract_answer(text: str, expected: str) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Cat, sat!", "cat sat"),
        ("An  apple\tpie", "apple pie"),
        ("a.b", "b"),  # "a" is a whole word here, it goes before the "." does
        ("theatre", "theatre"),
        ("(A)", ""),
        ("[10.5, 20]", "105 20"),
    ],
)
def test_normalize_answer(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


# --- SPEC §4.2 accuracy -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prediction", "truth", "expected"),
    [
        ("(D)", "D", 1.0),  # ^\(?([A-D])\)?$
        ("(D", "D", 1.0),
        ("I think the answer is (B).", "B", 1.0),  # [Tt]he answer is\s*\(?([A-D])\)?
        ("option(C) fits", "C", 1.0),  # [Oo]ption\s*\(?([A-D])\)?
        ("D: the red car", "D", 1.0),  # ^([A-D])[.):]
        ("I pick C over B", "C", 1.0),  # \b([A-D])\b, first match C
        ("I pick C over B", "B", 0.0),  # first standalone letter is C, not B
        ("b", "B", 1.0),  # stripped prediction equals case-insensitively
        ("the answer is b", "B", 0.0),  # the searches are case-sensitive on the letter
        ("The answer is (B), definitely not C", "C", 0.0),  # every first match is B
        ("E", "E", 0.0),  # the ground truth must be A-D
        ("A", "AB", 0.0),
        (" c ", "c", 1.0),  # ground truth stripped and upper-cased
    ],
)
def test_mcq_accuracy(prediction: str, truth: str, expected: float) -> None:
    assert mcq_accuracy(prediction, truth) == expected


@pytest.mark.parametrize(
    ("prediction", "truth", "question_type", "expected"),
    [
        ("", "A", "mcq", 0.0),
        ("B", "  ", "mcq", 0.0),
        ("Option B", "b", "mcq", 1.0),
        # any search whose FIRST match is the letter scores: option -> B, but \b -> A
        ("A option B", "A", "mcq", 1.0),
        ("The answer is E", "E", "mcq", 0.0),  # normalized "answer is e" != "e", E not A-D
        ("e", "E", "mcq", 1.0),  # normalized equality comes before the A-D rule
        # quirk of the release's normalization: "A" and "The" both normalize to ""
        ("The", "A", "mcq", 1.0),
        ("Paris", "paris!", "oe", 1.0),
        # tvg: overlap 15..20 = 5; union 10 + 10 - 5 = 15; IoU 5/15
        ("[10, 20]", "[15, 25]", "tvg", 1 / 3),
        # overlap 12.5..17.5 = 5; union 5 + 10 - 5 = 10
        ("12.5, 17.5", "[10.0, 20.0]", "tvg", 0.5),
        ("The event is at [10.0, 20.0].", "[10, 20]", "tvg", 1.0),
        ("[20, 10]", "[10, 20]", "tvg", 0.0),  # e <= s
        ("[10, 10]", "[5, 15]", "tvg", 0.0),  # e == s
        ("[1, 2]", "[5, 3]", "tvg", 0.0),  # ground truth with e <= s
        ("[0, 5]", "[5, 10]", "tvg", 0.0),  # touching, no overlap
        ("from 3 to 5", "[3, 5]", "tvg", 0.0),  # no "s, e" pair
        ("[1.2.3, 4]", "[1, 4]", "tvg", 0.0),  # not a decimal
        ("[3, 3]", "[3, 3]", "tvg", 1.0),  # normalized equality wins before the e <= s rule
    ],
)
def test_accuracy_reward(prediction: str, truth: str, question_type: str, expected: float) -> None:
    assert accuracy_reward(prediction, truth, question_type) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("prediction", "truth", "mode", "expected"),
    [
        ("a red car", "Red car.", "exact", 1.0),
        ("red cars", "red car", "exact", 0.0),
        # sets for the common tokens, lists for the lengths: common {cat} = 1,
        # precision 1/4, recall 1/1, F1 = 2 * 0.25 * 1 / 1.25 = 0.4
        ("cat cat cat dog", "cat", "f1", 0.4),
        # common {red, car} = 2, precision 2/2, recall 2/3, F1 = 2 * (2/3) / (5/3) = 0.8
        ("red car", "the big red car", "f1", 0.8),
        # common {dog} = 1, precision 1/1, recall 1/2, F1 = 2 * 0.5 / 1.5 = 2/3
        ("dog", "dog dog", "f1", 2 / 3),
        ("blue bike", "red car", "f1", 0.0),
        ("!!!", "cat", "f1", 0.0),  # no tokens left after normalization
        ("red car", "the big red car", "llm", 0.8),  # no judge: F1
    ],
)
def test_open_ended_accuracy(prediction: str, truth: str, mode: str, expected: float) -> None:
    assert accuracy_reward(prediction, truth, "oe", oe_mode=mode) == pytest.approx(expected)


def test_token_f1_is_symmetric_in_its_definition() -> None:
    # precision 1/1, recall 1/4 -> F1 = 2 * 0.25 / 1.25 = 0.4 (the mirror of the table case)
    assert token_f1("cat", "cat cat cat dog") == pytest.approx(0.4)


@pytest.mark.parametrize(
    ("verdict", "expected"),
    [
        (0.5, 0.5),
        (1, 1.0),
        (0.0, 0.0),
        (0.7, 0.8),  # not 0 / 0.5 / 1: F1 of "red car" vs "the big red car" = 0.8
        (RuntimeError("judge down"), 0.8),
        ("not a number", 0.8),
    ],
)
def test_llm_judge_and_f1_fallback(verdict: object, expected: float) -> None:
    seen = []

    def judge(prediction: str, ground_truth: str, question: str) -> float:
        seen.append((prediction, ground_truth, question))
        if isinstance(verdict, Exception):
            raise verdict
        return verdict

    score = accuracy_reward("red car", "the big red car", "oe", oe_mode="llm", judge=judge, question="What is parked?")
    assert score == pytest.approx(expected)
    assert seen == [("red car", "the big red car", "What is parked?")]


def test_accuracy_rejects_unknown_types() -> None:
    with pytest.raises(ValueError, match="question_type"):
        accuracy_reward("A", "A", "yesno")
    with pytest.raises(ValueError, match="oe mode"):
        accuracy_reward("A", "B", "oe", oe_mode="bleu")


# --- SPEC §4.3 format helpers -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (THINK, True),
        ("<think>   123456789  </think>", False),  # 9 characters once stripped
        ("<think>1234567890</think>", True),  # 10 characters
        # a short first closed block is not rescued by a later long one
        ("<think>ok</think><think>this one is long enough</think>", False),
        ("<think>\nThe clip shows a dog running", True),  # open block up to the end
        ("<think>look<tool_call>much more text here</tool_call>", False),  # stops at <tool_
        ("<think>hmm<answer>a long answer body</answer>", False),  # stops at <answer>
        ("<think>short<|im_end|> and a long tail of text", False),  # stops at <|im_end|>
        ("no think tags, even a long line", False),
        ("</think><think>0123456789</think>", True),  # a stray close before the first <think>
        ("<think></think>0123456789</think>", False),  # the first closed block is empty
    ],
)
def test_has_think(text: str, expected: bool) -> None:
    assert has_think(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('<tool_call>{"name": "crop_video"}</tool_call>', True),
        ('<tool_call>{"name": "crop_video"}', True),  # body up to the end
        ('<tool_call>{"arguments": {}}</tool_call>', False),  # no "name"
        ('<tool_call>["name"]</tool_call>', False),  # not an object
        ("<tool_call>{broken</tool_call>", False),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", False),  # too deep: no crash
        ('<tool_call>{"name": ' + "9" * 5000 + "}</tool_call>", False),  # too long: no crash
        ("<tool_call>   </tool_call>", False),  # empty body
        ("<tool_call><|im_end|>", False),
        # the body runs to the end, so the trailing marker breaks the JSON
        ('<tool_call>{"name": "crop_video"}<|im_end|>', False),
        ("<tool_code>crop_video(1, 2)</tool_code>", True),
        ("<tool_code>  # note\nprint(crop_video(1, 2))</tool_code>", True),
        ("<tool_code>\n# crop_video(1, 2)\n</tool_code>", False),  # only a comment
        ("<tool_code>crop_video</tool_code>", False),  # no "("
        ("<tool_code></tool_code>", False),
        ("<tool_code><|im_end|> crop_video(1, 2)</tool_code>", False),
        ("<tool_response>crop_video(1, 2)</tool_response>", False),
        ("crop_video(1, 2)", False),
    ],
)
def test_has_tool(text: str, expected: bool) -> None:
    assert has_tool(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>B</answer>", True),
        ("<answer> \n </answer>", False),
        ("<answer> </answer><answer>B</answer>", True),  # some answer block is non-blank
        ("<answer>B", False),
    ],
)
def test_has_answer(text: str, expected: bool) -> None:
    assert has_answer(text) is expected


# --- SPEC §4.3 format reward --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "answer_suffix", "anchor_weight", "expected"),
    [
        # think + answer: 0.2 + 0.3 + 0.2 = 0.7; anchor 0.5 * (0.4 + 0.3) = 0.35; balanced
        # +0.1 -> 1.15, capped at 1.0
        (THINK + "<answer>B</answer>", True, 0.5, 1.0),
        (THINK + "<answer>B</answer>", True, 0.0, 0.8),  # 0.7 + 0.1
        (THINK + "<answer>B</answer>", False, 0.0, 0.7),  # 0.3 + 0.2 + 0.1 + 0.1
        (THINK + "<answer>B</answer>", False, 0.2, 0.84),  # 0.6 + 0.2 * 0.7 + 0.1
        # open think: 0.2 - 0.5 * 0.3 = 0.05; <think> vs </think> unbalanced
        ("<think>I am still thinking about it", True, 0.5, 0.05),
        # R_fmt negative: short open think, 0 - 0.5 * 0.3 = -0.15, no balance bonus at <= 0
        ("<think>short", True, 0.5, -0.15),
        ("<think>short", True, 1.0, -0.3),
        ("<think>short", True, 0.0, 0.0),
        # short closed block not rescued: 0 + 0.3 + 0.2; no anchor (has_think false); balanced
        ("<think>ok</think><think>this one is long enough</think><answer>A</answer>", True, 0.5, 0.6),
        # open think cut at <answer>: 0.3 + 0.2 - 0.15 = 0.35; unbalanced think
        ("<think>hmm<answer>the red car is long</answer>", True, 0.5, 0.35),
        # open think cut at <tool_: 0 - 0.15, no tool-order bonus without has_think
        ("<think>look" + CALL, True, 0.5, -0.15),
        # balanced tags but score 0: no +0.1
        ("<think>short</think>", True, 0.5, 0.0),
        # blank answer: 0.2 + 0.5 * 0.4 = 0.4; balanced +0.1
        (THINK + "<answer> </answer>", True, 0.5, 0.5),
        # no think, vanilla knobs: 0.2 + 0.1 = 0.3; balanced +0.1
        ("<answer>B</answer>", False, 0.0, 0.4),
        # "+0.3 more" needs the +0.4 first: no think, so anchor 0; 0.5 + 0.1
        ("<answer>B</answer>", True, 0.5, 0.6),
        # think then tool: 0.2 + 0.5 * 0.4 + 0.3 + 0.1 = 0.8
        (THINK + CALL, True, 0.5, 0.8),
        (THINK + CALL, True, 0.0, 0.6),  # 0.2 + 0.3 + 0.1
        # tool before think: 0.2 + 0.2, no order bonus, +0.1
        (CALL + THINK, True, 0.5, 0.5),
        # tool_code counts as a tool: 0.2 + 0.2 + 0.3 + 0.1
        (THINK + "<tool_code>crop_video('v.mp4', 0, 5)</tool_code>", True, 0.5, 0.8),
        # a commented-out tool_code is no tool: 0.2 + 0.2 + 0.1
        (THINK + "<tool_code># crop_video(1, 2)</tool_code>", True, 0.5, 0.5),
        # unclosed tool_call: has_tool, 0.2 + 0.2 + 0.3, tool_call tags unbalanced
        (THINK + '<tool_call>{"name": "crop_video"}', True, 0.5, 0.7),
        # extra </answer>: 0.7 with λ = 0, unbalanced answer tags
        (THINK + "<answer>B</answer></answer>", True, 0.0, 0.7),
        ("", True, 0.5, 0.0),
    ],
)
def test_format_reward(text: str, answer_suffix: bool, anchor_weight: float, expected: float) -> None:
    assert format_reward(text, answer_suffix=answer_suffix, anchor_weight=anchor_weight) == pytest.approx(expected)


# --- SPEC §4.4 tool reward ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "acc", "expected"),
    [
        (THINK + "<answer>B</answer>", 1.0, 0.0),  # no tool
        ("<tool_response>x</tool_response>", 1.0, 0.0),  # a response without a call
        (CALL, 0.0, 0.1),
        (CALL, 1.0, 0.6),  # 0.1 + 0.5
        (CALL, 0.4, 0.6),  # any acc > 0 earns the +0.5
        (CALL + "<tool_response>a dog</tool_response>", 0.0, 0.3),
        (CALL + "<tool_response>a dog</tool_response>", 1.0, 0.8),  # 0.3 + 0.5
        ("<tool_code>crop_video(1, 2)</tool_code>", 1.0, 0.6),
        ("<tool_call></tool_call><tool_response>x</tool_response>", 1.0, 0.0),  # empty body
    ],
)
def test_tool_reward(text: str, acc: float, expected: float) -> None:
    assert tool_reward(text, acc) == pytest.approx(expected)


# --- SPEC §4 scalar reward and degenerate shortcut ---------------------------------------

def _expected(answer: str, acc: float, fmt: float, tool: float, total: float) -> RewardBreakdown:
    return RewardBreakdown(answer, {"acc": acc, "format": fmt, "tool": tool}, total)


TRANSCRIPT = (
    "<think>\nI need to check the middle part.</think>\n"
    + CALL
    + "<|im_end|>\n<|im_start|>user\n<tool_response>A man opens a door.</tool_response><|im_end|>\n"
    + "<|im_start|>assistant\n<think>\nThe summary shows the door.</think>\n<answer>B</answer>"
)


@pytest.mark.parametrize(
    ("text", "answer", "question_type", "knobs", "expected"),
    [
        # format: 0.7 + 0.35 + 0.3 (think before tool) + 0.1 = 1.45 -> 1.0;
        # tool: 0.3 (response) + 0.5 = 0.8; total 1 + 1.0 + 0.8
        (TRANSCRIPT, "B", "mcq", {}, _expected("B", 1.0, 1.0, 0.8, 2.8)),
        (TRANSCRIPT, "B", "mcq", {"format_weight": 0.5}, _expected("B", 1.0, 1.0, 0.8, 2.3)),
        (TRANSCRIPT, "C", "mcq", {}, _expected("B", 0.0, 1.0, 0.3, 1.3)),
        # vanilla GRPO knobs: format 0.2 + 0.1 + 0.1 = 0.4; total 1 + 0.4
        (
            "<answer>B</answer>",
            "B",
            "mcq",
            {"answer_suffix": False, "anchor_weight": 0.0},
            _expected("B", 1.0, 0.4, 0.0, 1.4),
        ),
        # F1 0.8 (see the oe table), format 1.0 (capped), total 1.8
        (THINK + "<answer>red car</answer>", "the big red car", "oe", {}, _expected("red car", 0.8, 1, 0, 1.8)),
        (
            THINK + "<answer>red car</answer>",
            "the big red car",
            "oe",
            {"oe_mode": "exact"},
            _expected("red car", 0.0, 1.0, 0.0, 1.0),
        ),
        # IoU 1/3; format 1.0; tool 0.1 + 0.5; total 1/3 + 1 + 0.6
        (
            THINK + CALL + "<answer>[10, 20]</answer>",
            "[15, 25]",
            "tvg",
            {},
            _expected("[10, 20]", 1 / 3, 1.0, 0.6, 1 / 3 + 1.6),
        ),
        # negative format: acc 0, format -0.15, total -0.15
        ("<think>short", "B", "mcq", {}, _expected("<think>short", 0.0, -0.15, 0.0, -0.15)),
    ],
)
def test_compute_reward(text: str, answer: str, question_type: str, knobs: dict, expected: RewardBreakdown) -> None:
    result = compute_reward(text, answer, question_type, **knobs)
    assert result.answer == expected.answer
    assert result.terms == pytest.approx(expected.terms) and result.total == pytest.approx(expected.total)


STARTS = "<|im_start|>" * 5  # 60 characters
STARTS_4 = "<|im_start|>" * 4


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # 60 + 18 = 78 characters < 300 with five <|im_start|>: everything 0
        (STARTS + "<answer>B</answer>", _expected("B", 0.0, 0.0, 0.0, 0.0)),
        # 60 + 221 + 18 = 299 characters: still degenerate
        (STARTS + "x" * 221 + "<answer>B</answer>", _expected("B", 0.0, 0.0, 0.0, 0.0)),
        # 300 characters: scored; format 0.3 + 0.2 + 0.1 = 0.6, total 1.6
        (STARTS + "x" * 222 + "<answer>B</answer>", _expected("B", 1.0, 0.6, 0.0, 1.6)),
        # four <|im_start|>: scored as above
        (STARTS_4 + "<answer>B</answer>", _expected("B", 1.0, 0.6, 0.0, 1.6)),
    ],
)
def test_degenerate_shortcut(text: str, expected: RewardBreakdown) -> None:
    result = compute_reward(text, "B", "mcq")
    assert result.answer == expected.answer
    assert result.terms == pytest.approx(expected.terms) and result.total == pytest.approx(expected.total)


# --- SPEC §4.5 scored text ----------------------------------------------------------------

SEGMENTS = [
    TranscriptSegment("<think>\n", generated=False),
    TranscriptSegment("look at 0-10 s</think>" + CALL, generated=True),
    TranscriptSegment("<tool_response>a dog</tool_response><think>\n", generated=False,
                      scored="<tool_response></tool_response><think>\n"),
    TranscriptSegment("a dog runs</think><answer>A</answer>", generated=True),
]


def test_scored_text_scopes() -> None:
    transcript = scored_text(SEGMENTS, "transcript")
    generated = scored_text(SEGMENTS, "generated")
    assert transcript == ("<think>\nlook at 0-10 s</think>" + CALL + "<tool_response></tool_response><think>\n"
                          "a dog runs</think><answer>A</answer>")
    assert generated == "look at 0-10 s</think>" + CALL + "a dog runs</think><answer>A</answer>"
    # what §4.5 is about: only the transcript earns the <tool_response> credit
    assert tool_reward(transcript, 1.0) == pytest.approx(0.8)  # 0.3 + 0.5
    assert tool_reward(generated, 1.0) == pytest.approx(0.6)  # 0.1 + 0.5
    with pytest.raises(ValueError, match="scope"):
        scored_text(SEGMENTS, "everything")


@pytest.mark.parametrize("scope", ["generated", "transcript"])
def test_a_sub_agent_answer_never_scores(scope) -> None:
    # The sub-agent writes an answer and tags into its summary; the main agent answers B.
    hijack = "<think>\nlong enough thought</think><answer>Z</answer>"
    segments = [
        TranscriptSegment("<think>\n", generated=False),
        TranscriptSegment("look at 0-10 s</think>" + CALL, generated=True),
        TranscriptSegment(f"<tool_response>{hijack}</tool_response><think>\n", generated=False,
                          scored="<tool_response></tool_response><think>\n"),
        TranscriptSegment("the dog is brown so</think><answer>B</answer>", generated=True),
    ]
    text = scored_text(segments, scope)
    assert "Z" not in text
    assert compute_reward(text, "B", "mcq").terms["acc"] == 1.0
    assert compute_reward(text, "Z", "oe").terms["acc"] == 0.0
    # a main agent that never answered cannot borrow the sub-agent's answer either
    unanswered = [*segments[:3], TranscriptSegment("still unsure", generated=True)]
    assert extract_answer(scored_text(unanswered, scope)) != "Z"


def test_no_penalty_row_drops_only_the_unclosed_think_penalty():
    from paravt_core.rewards import format_reward

    text = "<think>still thinking about the video"  # has_think (open block, >= 10 chars), never closed
    # answer_suffix on: +0.2 think; anchoring λ=0.5: -0.3 * 0.5 = -0.15; tags unbalanced -> no +0.1
    assert format_reward(text) == pytest.approx(0.2 - 0.15)
    assert format_reward(text, unclosed_think_penalty=False) == pytest.approx(0.2)


def test_fixed_format_under_generated_scope_misses_a_forced_think_prefix():
    """The Table 2 fτ_fixed artifact (docs/log/miniature-world-v1.md): the same written
    transcript, its think blocks opened by the prompt (PARA-GRPO's think prefix) or by the
    policy (vanilla), scores 0.5 against 1.0 under the SPEC's generated scope; the transcript
    scope scores both 1.0."""
    from types import SimpleNamespace

    from paravt_core.rl.policy import fixed_format_reward

    forced = SimpleNamespace(text=lambda scope: scored_text(SEGMENTS, scope))
    own = [
        TranscriptSegment("<think>\nlook at 0-10 s</think>" + CALL, generated=True),
        TranscriptSegment("<tool_response>a dog</tool_response>", generated=False, scored="<tool_response></tool_response>"),
        TranscriptSegment("<think>\na dog runs</think><answer>A</answer>", generated=True),
    ]
    written = SimpleNamespace(text=lambda scope: scored_text(own, scope))
    assert fixed_format_reward(forced) == pytest.approx(0.5)
    assert fixed_format_reward(written) == pytest.approx(1.0)
    assert fixed_format_reward(forced, "transcript") == fixed_format_reward(written, "transcript") == pytest.approx(1.0)
