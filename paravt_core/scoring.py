"""Scoring shared by the benchmark evaluator (SPEC §7) and the RL accuracy reward (SPEC §4.2).

Pure functions of text: no model, no torch. The benchmark side reproduces the release's
SPEC §7 rules, quirks included (a response "I think B" scores the letter "I" by rule 4;
"The answer is Apples" yields "A" by rule 3), because the paper's numbers were produced
with them. Where the SPEC §7 wording leaves a choice open we decide as follows:

- MCQ letters are upper case A-J only, as the SPEC regexes are; a lone "b" is not a letter
  (it falls to rule 5, the first character, and scores 0 against "B").
- An `<answer>` block whose body holds no letter does not decide: rules 2-5 then run on
  the whole response.
- Grounding: the full rule chain runs on the `<time>` body first, and again on the whole
  response only if the body yields nothing.
- Each of the two range rules looks at its FIRST match only; if that match fails its
  check (end > start, end < 3600 s) the rule yields nothing and the next rule is tried.
- The seconds range `a - b` accepts the same three dashes as the `M:SS` range.
- The start/end keywords must begin a word ("restart 5" is not a start time) and the number
  must follow the keyword directly, after an optional "time" and ":".
- A pair taken from the keyword or first-two-numbers rules is returned as written, even
  reversed; a reversed interval has IoU 0.
- A chosen pair holding a number too long for a float (the release's `float` gives inf,
  e.g. a 400-digit run) is no prediction: it scored IoU 0 there as well, and inf has no JSON
  form, so `eval score` printed `Infinity`, which JSON readers refuse (issue #48 item 4).
  The later rules are not tried, which could score a pair the release never looked at.
- Numbers are digit runs, as in the release's rules: "1e308 to 1e309" reads 1 and 308 (no
  rule reads an exponent), kept because the paper's grounding numbers were scored so.
- Aggregates are fractions in [0, 1] (the paper prints percentages) and refuse an empty
  list rather than invent a value.

Scanning is linear in the response length (a policy can emit 160 KB of `<answer>` openers
or a 40 000-digit number): tag bodies are found with `first_tag_body` (str.find, not a
lazy regex that rescans the tail from every unclosed opener), and number patterns only
start where a digit run starts (`(?<!\d)`), which keeps the leftmost match they had.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import NamedTuple

MCQ_LETTERS = "ABCDEFGHIJ"
RECALL_THRESHOLDS = (0.3, 0.5, 0.7)
MAX_CLOCK_SECONDS = 3600.0

_STANDALONE_LETTER = re.compile(r"\b([A-J])\b")
_ANSWER_IS_LETTER = re.compile(r"(?:answer|Answer)\s*(?:is|:)\s*([A-J])")

_NUMBER = r"(?<!\d)\d+(?:\.\d+)?"
_DASH = r"\s*[-\u2013\u2014]\s*"
_CLOCK = r"(?<!\d)(\d+):(\d{2}(?:\.\d+)?)"
_CLOCK_RANGE = re.compile(_CLOCK + _DASH + _CLOCK)
_SECONDS_RANGE = re.compile(f"({_NUMBER}){_DASH}({_NUMBER})")
_START_NUMBER = re.compile(
    rf"\b(?:starting|start|beginning|begin)(?:\s*time)?\s*(?::\s*)?({_NUMBER})", re.IGNORECASE
)
_END_NUMBER = re.compile(
    rf"\b(?:ending|end|finishing|finish)(?:\s*time)?\s*(?::\s*)?({_NUMBER})", re.IGNORECASE
)
_ANY_NUMBER = re.compile(_NUMBER)


class Scored(NamedTuple):
    """One scored response: what was extracted and the score it earned."""

    pred: str | tuple[float, float] | None
    score: float


def interval_iou(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Temporal IoU of two [start, end] intervals.

    SPEC §4.2 writes the union as len_a + len_b - overlap and SPEC §7 as
    max end - min start; both agree whenever the intervals overlap, and the IoU is 0
    otherwise, so one function serves both.
    """
    (s1, e1), (s2, e2) = a, b
    overlap = max(0.0, min(e1, e2) - max(s1, s2))
    if overlap <= 0.0:
        return 0.0
    union = (e1 - s1) + (e2 - s2) - overlap
    return overlap / union if union > 0 else 0.0


def first_tag_body(text: str, tag: str) -> str | None:
    """The body of the first `<tag>...</tag>`, as `re.search(r"<tag>(.*?)</tag>", re.DOTALL)`
    finds it, in linear time: when the first opener has no closer after it, no later one has."""
    opener, closer = f"<{tag}>", f"</{tag}>"
    start = text.find(opener)
    if start < 0:
        return None
    end = text.find(closer, start + len(opener))
    return text[start + len(opener) : end] if end >= 0 else None


def tag_bodies(text: str, tag: str) -> list[str]:
    """Every body `re.findall(r"<tag>(.*?)</tag>", re.DOTALL)` finds, in linear time."""
    opener, closer = f"<{tag}>", f"</{tag}>"
    bodies, position = [], 0
    while (start := text.find(opener, position)) >= 0:
        end = text.find(closer, start + len(opener))
        if end < 0:
            break
        bodies.append(text[start + len(opener) : end])
        position = end + len(closer)
    return bodies


# --- multiple choice (SPEC §7, "MCQ letter extraction") -------------------------------


def _is_single_letter(text: str) -> bool:
    return len(text) == 1 and text in MCQ_LETTERS


def _letter_from_answer_tag(response: str) -> str | None:
    """Rule 1: the `<answer>` body if it is one letter, else its first standalone letter."""
    body = first_tag_body(response, "answer")
    if body is None:
        return None
    body = body.strip()
    if _is_single_letter(body):
        return body
    letter = _STANDALONE_LETTER.search(body)
    return letter.group(1) if letter else None


def extract_mcq_letter(response: str) -> str:
    """The option letter a response gives, by the first SPEC §7 rule that applies.

    1. `<answer>` body (one letter, else its first standalone letter A-J);
    2. the whole stripped response if it is one letter A-J;
    3. the letter after "answer is" / "Answer is" / "answer:" / "Answer:";
    4. the first standalone letter A-J anywhere;
    5. the first character of the stripped response ("" if it is empty).
    """
    text = response.strip()
    from_tag = _letter_from_answer_tag(text)
    if from_tag is not None:
        return from_tag
    if _is_single_letter(text):
        return text
    for pattern in (_ANSWER_IS_LETTER, _STANDALONE_LETTER):
        found = pattern.search(text)
        if found:
            return found.group(1)
    return text[:1]


def score_mcq(response: str, answer: str) -> Scored:
    """1.0 when the extracted letter equals the ground-truth letter, else 0.0 (SPEC §7)."""
    pred = extract_mcq_letter(response)
    return Scored(pred, 1.0 if pred == answer.strip() else 0.0)


# --- temporal grounding (SPEC §7, "Grounding time extraction") ------------------------


def _clock_range(text: str) -> tuple[float, float] | None:
    found = _CLOCK_RANGE.search(text)
    if found is None:
        return None
    m1, s1, m2, s2 = (float(g) for g in found.groups())
    start, end = 60.0 * m1 + s1, 60.0 * m2 + s2
    return (start, end) if start < end < MAX_CLOCK_SECONDS else None


def _seconds_range(text: str) -> tuple[float, float] | None:
    found = _SECONDS_RANGE.search(text)
    if found is None:
        return None
    start, end = float(found.group(1)), float(found.group(2))
    return (start, end) if end > start else None


def _keyword_times(text: str) -> tuple[float, float] | None:
    start, end = _START_NUMBER.search(text), _END_NUMBER.search(text)
    if start is None or end is None:
        return None
    return float(start.group(1)), float(end.group(1))


def _first_two_numbers(text: str) -> tuple[float, float] | None:
    numbers = _ANY_NUMBER.findall(text)
    if len(numbers) < 2:
        return None
    return float(numbers[0]), float(numbers[1])


_TIME_RULES = (_clock_range, _seconds_range, _keyword_times, _first_two_numbers)


def _times_in(text: str) -> tuple[float, float] | None:
    for rule in _TIME_RULES:
        times = rule(text)
        if times is not None:
            return times
    return None


def extract_grounding_times(response: str) -> tuple[float, float] | None:
    """The (start, end) seconds a grounding response predicts, or None (SPEC §7).

    Rules in order, on the `<time>` body if there is one, then on the whole response:
    `M:SS(.f) - M:SS(.f)` kept if start < end < 3600; `a - b` seconds kept if b > a;
    the numbers after start/begin and end/finish keywords if both exist; the first two
    numbers in the text. A pair holding a number too long for a float is no prediction.
    """
    body = first_tag_body(response, "time")
    times = _times_in(body) if body is not None else None
    if times is None:
        times = _times_in(response)
    return times if times is None or all(math.isfinite(t) for t in times) else None


def score_grounding(response: str, gt: tuple[float, float]) -> Scored:
    """IoU of the extracted interval with the ground truth; 0.0 without a prediction."""
    pred = extract_grounding_times(response)
    return Scored(pred, 0.0 if pred is None else interval_iou(pred, gt))


# --- aggregates (SPEC §7, "Output") ---------------------------------------------------


def _require_values(values: Sequence[float], what: str) -> None:
    if not values:
        raise ValueError(f"cannot compute {what} of zero samples")


def accuracy(scores: Sequence[float]) -> float:
    """Mean of per-sample 0/1 MCQ scores, as a fraction."""
    _require_values(scores, "accuracy")
    return sum(scores) / len(scores)


def mean_iou(ious: Sequence[float]) -> float:
    """mIoU: the mean per-sample IoU."""
    _require_values(ious, "mIoU")
    return sum(ious) / len(ious)


def recall_at(ious: Sequence[float], threshold: float) -> float:
    """R@k: the share of samples whose IoU is at least `threshold`."""
    _require_values(ious, f"R@{threshold}")
    return sum(1 for iou in ious if iou >= threshold) / len(ious)


def grounding_summary(ious: Sequence[float]) -> dict[str, float]:
    """{"mIoU": ..., "R@0.3": ..., "R@0.5": ..., "R@0.7": ...} over per-sample IoUs."""
    summary = {"mIoU": mean_iou(ious)}
    for threshold in RECALL_THRESHOLDS:
        summary[f"R@{threshold}"] = recall_at(ious, threshold)
    return summary
