"""PARA-GRPO rewards as pure functions of text (SPEC §4).

The reward is the weighted sum of the named terms in `REWARD_TERMS`, R = R_acc +
format_weight * R_fmt + R_tool, with the release's semantics, rule by rule: answer extraction
(SPEC §4.1), accuracy (§4.2), format with the answer-suffix and selective-anchoring knobs
(§4.3), tool use (§4.4) and the degenerate shortcut (§4). Each term owns its name (what the
step metrics, the episode log and `paravt rewards` print), its weight and whether the
`reward` section turns it on; a new term is one `RewardTerm` added to that list (its knob, if
it has one, a field of `config.RewardConfig`). No model library is imported here.

Points the SPEC leaves open, resolved here:
- §4.1 step 1 returns the first `<answer>` body even when it is blank (it then scores 0).
- §4.2 the normalized-equality test comes first for every question type, literally. A
  known quirk of those semantics, kept on purpose: the articles "a"/"an"/"the" vanish under
  normalization, so a ground-truth letter "A" normalizes to "" and equals any prediction
  that also normalizes to "" (e.g. "(a)", "The.").
- §4.2 mcq: the ground truth is stripped and upper-cased before the A-D check; a
  prediction scores 1 when ANY of the five searches has the ground-truth letter as its
  first match (the searches are not stopped at the first one that matches).
- §4.2 tvg: a matched number that is not a decimal (e.g. "1.2.3") counts as missing.
- §4.2 oe `llm`: the judge is an optional callable `judge(prediction, ground_truth,
  question) -> float`; with no judge, when it raises, or when it returns anything other
  than 0, 0.5 or 1, the F1 score is used instead.
- §4.3 the anchoring "+0.3 more" is earned only on top of the +0.4 (it needs `</think>`
  and has_think as well); the "first tool tag" is the first `<tool_call>` or
  `<tool_code>` (a `<tool_response>` is not a tool tag of the model's).

Which text is scored (SPEC §4.5) is decided by the RL stage; `scored_text` assembles it
from the transcript segments for either `reward.scope`.

Every scan is linear in the text's length: tag blocks are found with str.find
(`scoring.first_tag_body` / `tag_bodies`), the `[s, e]` interval by walking digit runs,
each giving the same result as the lazy regex it replaces, which rescanned the tail from
every unclosed opener (160 KB of `<answer>` openers) or every digit of a long number.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from paravt_core.scoring import first_tag_body, interval_iou, tag_bodies

logger = logging.getLogger(__name__)

QuestionType = Literal["mcq", "tvg", "oe"]
OpenEndedMode = Literal["exact", "f1", "llm"]
RewardScope = Literal["generated", "transcript"]
Judge = Callable[[str, str, str], float]

QUESTION_TYPES: tuple[QuestionType, ...] = ("mcq", "tvg", "oe")
OPEN_ENDED_MODES: tuple[OpenEndedMode, ...] = ("exact", "f1", "llm")
JUDGE_SCORES = (0.0, 0.5, 1.0)

_REMOVED_BLOCK_TAGS = ("tool_call", "tool_code", "tool_response")
_CHAT_MARKER_RE = re.compile(r"<\|im_end\|>|<\|im_start\|>")
_ARTICLE_RE = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION_RE = re.compile(r"[^\w\s]")
_MCQ_RES = tuple(
    re.compile(pattern)
    for pattern in (
        r"^\(?([A-D])\)?$",
        r"[Tt]he answer is\s*\(?([A-D])\)?",
        r"[Oo]ption\s*\(?([A-D])\)?",
        r"^([A-D])[.):]",
        r"\b([A-D])\b",
    )
)
_DECIMAL_RUN_RE = re.compile(r"[\d.]+")
_COMMA_THEN_RUN_RE = re.compile(r"\s*,\s*([\d.]+)")
_OPEN_THINK_RE = re.compile(r"<think>(.*?)(?=<tool_|<answer>|<\|im_end\|>|\Z)", re.DOTALL)
_TOOL_CALL_BODY_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_TOOL_CODE_BODY_RE = re.compile(r"<tool_code>(.*?)(?:</tool_code>|\Z)", re.DOTALL)
_BALANCED_PAIRS = (
    ("<think>", "</think>"),
    ("<tool_call>", "</tool_call>"),
    ("<tool_code>", "</tool_code>"),
    ("<answer>", "</answer>"),
)
_MIN_THINK_CHARS = 10
_DEGENERATE_MIN_STARTS = 5
_DEGENERATE_MAX_CHARS = 300


@dataclass(frozen=True)
class RewardBreakdown:
    """The extracted answer, each term's unweighted value by name (in `REWARD_TERMS`' order;
    a term the knobs turn off is 0) and the reward: the sum of the terms' weighted values."""

    answer: str
    terms: Mapping[str, float]
    total: float


@dataclass(frozen=True)
class Scored:
    """What every reward term reads: the scored text (SPEC §4.5), its extracted answer (§4.1)
    and the sample's ground truth; `judge` is the optional open-ended judge of §4.2."""

    text: str
    prediction: str
    answer: str
    question_type: QuestionType
    question: str = ""
    judge: Judge | None = None


def _one(knobs: Any) -> float:
    return 1.0


def _always(knobs: Any) -> bool:
    return True


@dataclass(frozen=True)
class RewardTerm:
    """One named term of the reward (SPEC §4).

    Attributes:
        name: the key it is logged under (`reward_<name>` in the step metrics, `<name>` in
            the episode log and in `paravt rewards`' output).
        value: `(scored, knobs, earlier) -> float`, a pure function; `knobs` is the `reward`
            section (`config.RewardConfig`, or any object with its fields) and `earlier` the
            values of the terms before it in the list (R_tool reads R_acc).
        weight: `knobs -> float`, its weight in the sum.
        enabled: `knobs -> bool`; a term turned off is logged as 0 and left out of the sum.
    """

    name: str
    value: Callable[[Scored, Any, Mapping[str, float]], float]
    weight: Callable[[Any], float] = _one
    enabled: Callable[[Any], bool] = _always


EMPTY_TOOL_RESPONSE = "<tool_response></tool_response>"


@dataclass(frozen=True)
class TranscriptSegment:
    """A piece of the main agent's transcript after the prompt (SPEC §4.5).

    Attributes:
        text: the exact text of the segment's tokens.
        generated: True for policy tokens, False for forced prefixes and tool turns.
        scored: what `reward.scope: transcript` scores in place of `text`; None scores
            `text`. A tool turn sets it to one empty `<tool_response></tool_response>`
            marker per call (then its think prefix), so no sub-agent text is ever scored.
        tokens: how many context tokens the segment holds (None where unknown); the RL
            trajectory contract rebuilds the loss mask from it (`rl/contracts.py`).
    """

    text: str
    generated: bool
    scored: str | None = None
    tokens: int | None = None


def compute_reward(
    text: str,
    answer: str,
    question_type: QuestionType,
    *,
    answer_suffix: bool = True,
    anchor_weight: float = 0.5,
    format_weight: float = 1.0,
    oe_mode: OpenEndedMode = "f1",
    judge: Judge | None = None,
    question: str = "",
    unclosed_think_penalty: bool = True,
    use_tool_reward: bool = True,
) -> RewardBreakdown:
    """Score one rollout text against its ground truth (SPEC §4), the knobs given one by one.

    Args:
        text: the scored text (see `scored_text` for SPEC §4.5).
        answer: the ground truth.
        question_type: "mcq", "tvg" or "oe".
        answer_suffix, anchor_weight: the format knobs of SPEC §4.3 (λ = anchor_weight).
        format_weight: weight of R_fmt in the scalar reward.
        oe_mode, judge, question: open-ended scoring, see `accuracy_reward`.
        unclosed_think_penalty: keep the anchoring's -0.3 for an unclosed `<think>`.
        use_tool_reward: add R_tool (SPEC §4.4) to the reward.
    """
    knobs = _Knobs(answer_suffix, anchor_weight, format_weight, oe_mode, unclosed_think_penalty, use_tool_reward)
    return score_terms(Scored(text, extract_answer(text), answer, question_type, question, judge), knobs)


def score_terms(scored: Scored, knobs: Any, terms: Iterable[RewardTerm] | None = None) -> RewardBreakdown:
    """Every term of `terms` (default `REWARD_TERMS`) on one scored text, and their weighted sum.

    A degenerate text (`is_degenerate`, SPEC §4) scores 0 in every term."""
    terms = REWARD_TERMS if terms is None else tuple(terms)
    if is_degenerate(scored.text):
        return RewardBreakdown(scored.prediction, {term.name: 0.0 for term in terms}, 0.0)
    values: dict[str, float] = {}
    total = -0.0  # IEEE's additive identity: the sum is bit for bit the terms' own left-to-right sum
    for term in terms:
        if term.name in values:
            raise ValueError(f"reward term {term.name!r} is listed twice")
        if not term.enabled(knobs):
            values[term.name] = 0.0
            continue
        values[term.name] = term.value(scored, knobs, values)
        total += term.weight(knobs) * values[term.name]
    return RewardBreakdown(scored.prediction, values, total)


def reward_term_names() -> tuple[str, ...]:
    """The names the reward's terms are logged under, in their order."""
    return tuple(term.name for term in REWARD_TERMS)


@dataclass(frozen=True)
class _Knobs:
    """`compute_reward`'s keyword knobs under the `reward` section's field names."""

    answer_suffix: bool
    anchor_weight: float
    format_weight: float
    oe_mode: OpenEndedMode
    unclosed_think_penalty: bool
    use_tool_reward: bool


def is_degenerate(text: str) -> bool:
    """SPEC §4: five or more `<|im_start|>` in fewer than 300 characters scores 0 everywhere."""
    return text.count("<|im_start|>") >= _DEGENERATE_MIN_STARTS and len(text) < _DEGENERATE_MAX_CHARS


def extract_answer(text: str) -> str:
    """The final answer of a rollout text (SPEC §4.1)."""
    tagged = first_tag_body(text, "answer")
    if tagged is not None:
        return tagged.strip()
    if "</think>" in text:
        after_think = _strip_tool_blocks_and_markers(text.split("</think>", 1)[1])
        if after_think:
            return after_think
    return _last_plain_line(text)


def normalize_answer(text: str) -> str:
    """Lowercase, articles to spaces, drop non-word characters, collapse spaces (SPEC §4.1)."""
    text = _ARTICLE_RE.sub(" ", text.lower())
    return " ".join(_PUNCTUATION_RE.sub("", text).split())


def accuracy_reward(
    prediction: str,
    ground_truth: str,
    question_type: QuestionType,
    *,
    oe_mode: OpenEndedMode = "f1",
    judge: Judge | None = None,
    question: str = "",
) -> float:
    """R_acc (SPEC §4.2).

    For `oe_mode="llm"`, `judge(prediction, ground_truth, question)` must return 0, 0.5 or
    1; without a judge, or when it raises or returns another value, token F1 is used.
    """
    if question_type not in QUESTION_TYPES:
        raise ValueError(f"question_type must be one of {QUESTION_TYPES}, got {question_type!r}")
    if oe_mode not in OPEN_ENDED_MODES:
        raise ValueError(f"oe mode must be one of {OPEN_ENDED_MODES}, got {oe_mode!r}")
    if not prediction.strip() or not ground_truth.strip():
        return 0.0
    if normalize_answer(prediction) == normalize_answer(ground_truth):
        return 1.0
    if question_type == "mcq":
        return mcq_accuracy(prediction, ground_truth)
    if question_type == "tvg":
        return tvg_accuracy(prediction, ground_truth)
    if oe_mode == "exact":
        return 0.0
    if oe_mode == "llm":
        return _judged_or_f1(prediction, ground_truth, question, judge)
    return token_f1(prediction, ground_truth)


def mcq_accuracy(prediction: str, ground_truth: str) -> float:
    """1 if the prediction names the ground-truth letter A-D (SPEC §4.2 mcq)."""
    letter = ground_truth.strip().upper()
    if len(letter) != 1 or letter not in "ABCD":
        return 0.0
    if prediction.strip().upper() == letter:
        return 1.0
    for pattern in _MCQ_RES:
        found = pattern.search(prediction)
        if found is not None and found.group(1) == letter:
            return 1.0
    return 0.0


def tvg_accuracy(prediction: str, ground_truth: str) -> float:
    """IoU of the first `[s, e]` pair on each side, 0 if one is missing or empty (SPEC §4.2)."""
    predicted, truth = _first_interval(prediction), _first_interval(ground_truth)
    if predicted is None or truth is None:
        return 0.0
    return interval_iou(predicted, truth)


def token_f1(prediction: str, ground_truth: str) -> float:
    """Token F1: common tokens counted as sets, divided by the token list lengths (SPEC §4.2)."""
    predicted, truth = normalize_answer(prediction).split(), normalize_answer(ground_truth).split()
    common = len(set(predicted) & set(truth))
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(truth)
    return 2 * precision * recall / (precision + recall)


def format_reward(text: str, *, answer_suffix: bool = True, anchor_weight: float = 0.5,
                  unclosed_think_penalty: bool = True) -> float:
    """R_fmt (SPEC §4.3): capped at 1.0 above, not clamped below (it can be negative).

    `unclosed_think_penalty=False` drops the anchoring's -0.3 for an unclosed `<think>`
    (the "full minus penalty" ablation row of SPEC §6).
    """
    think, tool, answered = has_think(text), has_tool(text), has_answer(text)
    think_credit, open_credit, close_credit = (0.2, 0.3, 0.2) if answer_suffix else (0.3, 0.2, 0.1)
    score = think_credit if think else 0.0
    if answered:
        score += open_credit if "<answer>" in text else 0.0
        score += close_credit if "</answer>" in text else 0.0
    if anchor_weight > 0:
        score += anchor_weight * _anchor_bonus(text, think, answered, unclosed_think_penalty)
    if think and tool and _think_precedes_tools(text):
        score += 0.3
    if score > 0 and _tags_balanced(text):
        score += 0.1
    return min(score, 1.0)


def tool_reward(text: str, acc: float) -> float:
    """R_tool (SPEC §4.4): 0.1 for a tool call, 0.3 with a tool response, +0.5 if correct."""
    if not has_tool(text):
        return 0.0
    score = 0.3 if "<tool_response>" in text else 0.1
    if acc > 0:
        score += 0.5
    return min(score, 1.0)


def _accuracy_term(scored: Scored, knobs: Any, earlier: Mapping[str, float]) -> float:
    return accuracy_reward(scored.prediction, scored.answer, scored.question_type, oe_mode=knobs.oe_mode,
                           judge=scored.judge, question=scored.question)


def _format_term(scored: Scored, knobs: Any, earlier: Mapping[str, float]) -> float:
    return format_reward(scored.text, answer_suffix=knobs.answer_suffix, anchor_weight=knobs.anchor_weight,
                         unclosed_think_penalty=knobs.unclosed_think_penalty)


def _tool_term(scored: Scored, knobs: Any, earlier: Mapping[str, float]) -> float:
    return tool_reward(scored.text, earlier["acc"])


# The reward's terms, summed in this order: R = R_acc + format_weight * R_fmt + R_tool (SPEC §4).
# Token anchoring (`rl.anchoring_mode: token`) gives the "format" term its own advantage (SPEC §5).
REWARD_TERMS: tuple[RewardTerm, ...] = (
    RewardTerm("acc", _accuracy_term),
    RewardTerm("format", _format_term, weight=lambda knobs: knobs.format_weight),
    RewardTerm("tool", _tool_term, enabled=lambda knobs: knobs.use_tool_reward),
)


def has_think(text: str) -> bool:
    """The first closed think block, else the first open one, has >= 10 characters (SPEC §4.3)."""
    body = _first_closed_think_body(text)
    if body is None:
        open_block = _OPEN_THINK_RE.search(text)
        body = open_block.group(1) if open_block else ""
    return len(body.strip()) >= _MIN_THINK_CHARS


def has_tool(text: str) -> bool:
    """A `<tool_call>` JSON object with "name", or a `<tool_code>` line with a call (SPEC §4.3)."""
    return any(_is_json_call(body) for body in _tool_bodies(_TOOL_CALL_BODY_RE, text)) or any(
        _has_code_call(body) for body in _tool_bodies(_TOOL_CODE_BODY_RE, text)
    )


def has_answer(text: str) -> bool:
    """Some `<answer>...</answer>` has a non-blank body (SPEC §4.3)."""
    return any(body.strip() for body in tag_bodies(text, "answer"))


def scored_text(segments: Iterable[TranscriptSegment], scope: RewardScope = "transcript") -> str:
    """The text the reward scores (SPEC §4.5).

    "generated" (the release, default of the paper rows) keeps the policy's own segments
    only; "transcript" joins every segment in order, forced prefixes and generations as
    they are and each tool turn as its empty markers (`TranscriptSegment.scored`).
    """
    if scope not in ("transcript", "generated"):
        raise ValueError(f"reward scope must be 'transcript' or 'generated', got {scope!r}")
    if scope == "generated":
        return "".join(seg.text for seg in segments if seg.generated)
    return "".join(seg.text if seg.scored is None else seg.scored for seg in segments)


def _without_blocks(text: str, tag: str) -> str:
    """`re.sub(r"<tag>.*?</tag>", "", text, flags=re.DOTALL)` in linear time."""
    opener, closer = f"<{tag}>", f"</{tag}>"
    kept, position = [], 0
    while (start := text.find(opener, position)) >= 0:
        end = text.find(closer, start + len(opener))
        if end < 0:
            break
        kept.append(text[position:start])
        position = end + len(closer)
    return "".join(kept) + text[position:]


def _strip_tool_blocks_and_markers(text: str) -> str:
    for tag in _REMOVED_BLOCK_TAGS:
        text = _without_blocks(text, tag)
    return _CHAT_MARKER_RE.sub("", text).strip()


def _last_plain_line(text: str) -> str:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line and not line.startswith(("<|im_", "<tool_")):
            return line
    return ""


def _first_interval_texts(text: str) -> tuple[str, str] | None:
    """The groups `re.search(r"\[?\s*([\d.]+)\s*,\s*([\d.]+)\s*\]?", text)` gives: its
    leftmost match always starts its first number at the start of a run of digits and dots
    (a start inside the run could move left), so the first run followed by a comma and
    another run is it."""
    for run in _DECIMAL_RUN_RE.finditer(text):
        after = _COMMA_THEN_RUN_RE.match(text, run.end())
        if after is not None:
            return run.group(), after.group(1)
    return None


def _first_interval(text: str) -> tuple[float, float] | None:
    found = _first_interval_texts(text)
    if found is None:
        return None
    try:
        start, end = float(found[0]), float(found[1])
    except ValueError:
        return None
    return (start, end) if end > start else None


def _judged_or_f1(prediction: str, ground_truth: str, question: str, judge: Judge | None) -> float:
    if judge is not None:
        try:
            score = float(judge(prediction, ground_truth, question))
        except Exception as exc:  # any judge failure falls back to F1, as SPEC §4.2 says
            logger.warning("LLM judge failed (%s); using token F1", exc)
        else:
            if score in JUDGE_SCORES:
                return score
            logger.warning("LLM judge returned %r, not one of %s; using token F1", score, JUDGE_SCORES)
    return token_f1(prediction, ground_truth)


def _anchor_bonus(text: str, think: bool, answered: bool, penalty: bool = True) -> float:
    if "</think>" in text and think:
        return 0.4 + (0.3 if answered and "</answer>" in text else 0.0)
    if penalty and "<think>" in text and "</think>" not in text:
        return -0.3
    return 0.0


def _first_closed_think_body(text: str) -> str | None:
    # The first match of <think>(.*?)</think>, found with str.find: the regex search is
    # quadratic on a rollout that repeats <think> without ever closing it.
    start = text.find("<think>")
    end = text.find("</think>", start + len("<think>")) if start >= 0 else -1
    return text[start + len("<think>") : end] if end >= 0 else None


def _think_precedes_tools(text: str) -> bool:
    tool_positions = [pos for pos in (text.find("<tool_call>"), text.find("<tool_code>")) if pos >= 0]
    think_position = text.find("<think>")
    return think_position >= 0 and bool(tool_positions) and think_position < min(tool_positions)


def _tags_balanced(text: str) -> bool:
    return all(text.count(opening) == text.count(closing) for opening, closing in _BALANCED_PAIRS)


def _tool_bodies(body_re: re.Pattern[str], text: str) -> list[str]:
    bodies = (body.strip() for body in body_re.findall(text))
    return [body for body in bodies if body and not body.startswith("<|im_end|>")]


def _is_json_call(body: str) -> bool:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):  # JSONDecodeError, overlong numbers, deep nesting
        return False
    return isinstance(payload, dict) and "name" in payload


def _has_code_call(body: str) -> bool:
    return any("(" in line and not line.strip().startswith("#") for line in body.splitlines())
