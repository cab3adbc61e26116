"""Table tests of the SPEC §7 extraction and scoring rules; expected values worked by hand."""

from __future__ import annotations

import pytest

from paravt_core.scoring import (
    accuracy,
    extract_grounding_times,
    extract_mcq_letter,
    grounding_summary,
    interval_iou,
    mean_iou,
    recall_at,
    score_grounding,
    score_mcq,
)

MCQ_CASES = [
    # rule 1: <answer> body that is one letter, else its first standalone letter
    ("<answer>D</answer>", "D"),
    ("<answer> J </answer>", "J"),
    ("<answer>The answer is (B)</answer>", "B"),
    ("<answer>A) apples</answer>", "A"),
    ("B looks wrong. <answer>C</answer>", "C"),
    # rule 1 finds no letter in the body: later rules run on the whole response
    ("<answer>apples</answer> so C", "C"),
    # rule 2: the whole stripped response is one letter
    ("B", "B"),
    ("\n  C  \n", "C"),
    # rule 3: the letter after "answer is" / "answer:"
    ("Option A looks tempting, but the answer is C.", "C"),
    ("Answer: B", "B"),
    ("final answer :E", "E"),
    ("The answer is Apples", "A"),  # release quirk: no word boundary after the letter
    # rule 4: the first standalone letter anywhere
    ("Probably (D), the red one", "D"),
    ("I think B", "I"),  # release quirk: "I" is a letter A-J
    # rule 5: the first character
    ("yes", "y"),
    ("b", "b"),  # lower case is not a letter A-J
    ("K", "K"),
    ("", ""),
    ("   ", ""),
]


@pytest.mark.parametrize(("response", "expected"), MCQ_CASES)
def test_extract_mcq_letter(response: str, expected: str) -> None:
    assert extract_mcq_letter(response) == expected


@pytest.mark.parametrize(
    ("response", "answer", "pred", "score"),
    [
        ("Answer: C", "C", "C", 1.0),
        ("<answer>C</answer>", " C ", "C", 1.0),
        ("I think B", "B", "I", 0.0),
        ("b", "B", "b", 0.0),
        ("", "A", "", 0.0),
    ],
)
def test_score_mcq(response: str, answer: str, pred: str, score: float) -> None:
    assert score_mcq(response, answer) == (pred, score)


GROUNDING_CASES = [
    # M:SS(.f) - M:SS(.f) with dash, en dash or em dash
    ("0:24 - 0:30.5", (24.0, 30.5)),
    ("from 1:05 \u2013 1:10", (65.0, 70.0)),
    ("1:05\u20141:10", (65.0, 70.0)),
    ("58:00 - 59:30", (3480.0, 3570.0)),
    # clock range rejected (end >= 3600 s): the seconds rule then finds "00 - 60"
    ("59:00 - 60:30", (0.0, 60.0)),
    # clock range rejected (end < start); seconds rule's "30 - 0" too; first two numbers
    ("0:30 - 0:24", (0.0, 30.0)),
    # a - b in seconds
    ("24.3 - 30.4 seconds", (24.3, 30.4)),
    ("The event happens in the 12 - 17.5 seconds.", (12.0, 17.5)),
    ("12\u201318", (12.0, 18.0)),
    # a - b with b <= a is rejected; the first two numbers are kept as written
    ("30 - 20", (30.0, 20.0)),
    # start / end keywords beat the first two numbers
    ("In clip 3, the start: 10 and the end: 15", (10.0, 15.0)),
    ("STARTING TIME 4, FINISHING 8", (4.0, 8.0)),
    ("begin time 2.5 ending time 7", (2.5, 7.0)),
    # keywords must begin a word; then the first two numbers
    ("Clip 1 of 2: restart 9, weekend 12", (1.0, 2.0)),
    # only one keyword present: first two numbers
    ("start 4 and 6 later", (4.0, 6.0)),
    ("from 12 to 18", (12.0, 18.0)),
    # <time> content first, whole response if it yields nothing
    ("I guess 1 - 2. <time>10 - 20</time>", (10.0, 20.0)),
    ("<time>soon</time> from 3 - 7", (3.0, 7.0)),
    # no prediction
    ("I don't know", None),
    ("at 5 seconds", None),
    ("", None),
]


@pytest.mark.parametrize(("response", "expected"), GROUNDING_CASES)
def test_extract_grounding_times(response: str, expected: tuple[float, float] | None) -> None:
    assert extract_grounding_times(response) == expected


@pytest.mark.parametrize(
    ("response", "gt", "pred", "iou"),
    [
        ("12 - 18", (10.0, 20.0), (12.0, 18.0), 0.6),
        ("0:10 - 0:20", (15.0, 25.0), (10.0, 20.0), 1 / 3),
        ("30 - 20", (20.0, 30.0), (30.0, 20.0), 0.0),
        ("no idea", (1.0, 2.0), None, 0.0),
    ],
)
def test_score_grounding(
    response: str, gt: tuple[float, float], pred: tuple[float, float] | None, iou: float
) -> None:
    scored = score_grounding(response, gt)
    assert scored.pred == pred
    assert scored.score == pytest.approx(iou)


@pytest.mark.parametrize(
    ("a", "b", "iou"),
    [
        ((0.0, 10.0), (0.0, 10.0), 1.0),
        ((0.0, 10.0), (2.0, 4.0), 0.2),
        ((0.0, 4.0), (2.0, 6.0), 2 / 6),
        ((0.0, 4.0), (4.0, 6.0), 0.0),
        ((0.0, 1.0), (5.0, 6.0), 0.0),
    ],
)
def test_interval_iou(a: tuple[float, float], b: tuple[float, float], iou: float) -> None:
    assert interval_iou(a, b) == pytest.approx(iou)
    assert interval_iou(b, a) == pytest.approx(iou)


def test_accuracy_and_mean_iou() -> None:
    assert accuracy([1.0, 0.0, 1.0, 1.0]) == 0.75
    assert mean_iou([0.2, 0.6, 1.0]) == pytest.approx(0.6)


def test_recall_counts_iou_at_or_above_threshold() -> None:
    ious = [0.3, 0.29, 0.5, 0.7, 0.69]
    assert recall_at(ious, 0.3) == pytest.approx(4 / 5)  # 0.3, 0.5, 0.7, 0.69
    assert recall_at(ious, 0.5) == pytest.approx(3 / 5)  # 0.5, 0.7, 0.69
    assert recall_at(ious, 0.7) == pytest.approx(1 / 5)


def test_grounding_summary() -> None:
    summary = grounding_summary([0.0, 0.4, 0.6, 0.8])
    assert summary == pytest.approx({"mIoU": 0.45, "R@0.3": 0.75, "R@0.5": 0.5, "R@0.7": 0.25})


@pytest.mark.parametrize("aggregate", [accuracy, mean_iou, grounding_summary])
def test_aggregates_refuse_empty_input(aggregate) -> None:
    with pytest.raises(ValueError, match="zero samples"):
        aggregate([])


# --- hostile responses (issue #48 item 4) ----------------------------------------------

LONG_NUMBER = "9" * 400  # float() of it is inf


@pytest.mark.parametrize(
    "response",
    [f"from 1 to {LONG_NUMBER}", f"1 - {LONG_NUMBER}", f"<time>start 2 end {LONG_NUMBER}</time>"],
)
def test_a_time_too_long_for_a_float_is_no_prediction(response: str) -> None:
    # the release's float() gives inf and IoU 0; inf has no JSON form, so no prediction (score 0)
    assert extract_grounding_times(response) is None
    assert score_grounding(response, (1.0, 5.0)) == (None, 0.0)


def test_a_too_long_chosen_pair_is_not_replaced_by_a_later_rule() -> None:
    # the seconds range wins (as in the release); the first-two-numbers rule's (3, 4) is never used
    assert extract_grounding_times(f"3 4 then 1 - {LONG_NUMBER}") is None


def test_release_quirks_kept_for_hostile_responses() -> None:
    # SPEC §7 as the release scores it (paravt/eval/utils.py): numbers are digit runs, so an
    # exponent is not read; an <answer> body without a letter falls to rule 5, the first character
    assert extract_grounding_times("1e308 to 1e309") == (1.0, 308.0)
    assert score_mcq("<answer>AAAA</answer>", "A") == ("<", 0.0)
