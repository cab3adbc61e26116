"""Per-sample results, their durable log, and the per-split summary (SPEC §7 "Output").

- `score_sample` scores the final main-agent generation of an episode with the same code
  as `paravt eval score` (`scoring.py`): MCQ by the SPEC §7 letter rules, grounding by the
  SPEC §7 time extraction and IoU. Open-ended samples (MMVU "open"), for which the SPEC
  fixes no benchmark rule, are scored with the RL reward's token F1 (SPEC §4.2, oe mode
  `f1`) of the SPEC §4.1 extracted answer; their `scorer` field says "token_f1".
- `ResultsLog` appends each finished sample to `<results>/<split>.jsonl` as one JSON line,
  flushed and fsynced, so a killed run loses at most the sample being written; a torn
  last line (the process died mid-write) is cut off when the log is read back.
- `summarize` gives the split's primary metric ("accuracy" for MCQ splits, "mIoU" with
  R@0.3/0.5/0.7 for grounding, and for a split mixing MCQ and open samples "score", the
  mean per-sample score with MCQ accuracy and open token F1 beside it), tool use (average
  executed calls, share of samples with at least one), and breakdowns by duration group
  and by category. Fractions in [0, 1]. A sample whose video did not decode at run time
  is kept with score 0 (end reason "video_error") and listed under "errors" with why, so
  one bad file neither ends the split nor leaves it out of the denominator.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from paravt_core.atomic import atomic_write_text
from paravt_core.eval.samples import EvalSample
from paravt_core.scoring import accuracy, grounding_summary, score_grounding, score_mcq
from paravt_core.rewards import extract_answer, has_answer, token_f1

logger = logging.getLogger(__name__)

Scorer = Literal["mcq_letter", "iou", "token_f1"]
SCORERS: dict[str, Scorer] = {"mcq": "mcq_letter", "grounding": "iou", "open": "token_f1"}
RESPONSE_MAX_CHARS = 2000
TRUNCATED_MARK = " [truncated]"


@dataclass(frozen=True)
class EpisodeOutcome:
    """What one evaluated episode produced, whichever engine ran it.

    `final_text` is the last main-agent generation without its end-of-turn token: the
    text that is scored.
    """

    final_text: str
    turns: int
    tool_calls: int
    parse_failures: int
    rejected_calls: int
    unanswered_calls: int
    end_reason: str
    error: str | None = None  # why the episode could not run (its video did not decode); scored 0


VIDEO_ERROR = "video_error"


def video_error_outcome(error: Exception) -> EpisodeOutcome:
    """The outcome recorded for a sample whose video does not decode: no generation, score 0."""
    return EpisodeOutcome("", turns=0, tool_calls=0, parse_failures=0, rejected_calls=0, unanswered_calls=0,
                          end_reason=VIDEO_ERROR, error=str(error))


@dataclass(frozen=True)
class SampleResult:
    """One scored sample, as stored in the split's JSON line log and JSON file.

    `answer` / `pred` are a letter, a text, or [start, end] seconds (grounding; `pred`
    None when no time was found). `correct` is set for MCQ samples only.
    """

    id: str
    split: str
    kind: str
    answer: str | list[float]
    pred: str | list[float] | None
    score: float
    correct: bool | None
    scorer: Scorer
    tool_calls: int
    turns: int
    parse_failures: int
    rejected_calls: int
    unanswered_calls: int
    end_reason: str
    duration_group: str | None
    category: str | None
    response: str
    error: str | None = None
    # the final turn holds a closed, non-blank <answer> block (SPEC §4.3's has_answer), judged on
    # the whole text: `response` is cut at RESPONSE_MAX_CHARS, which a long reasoning's answer
    # lies past. None in records written before it was kept.
    answer_tag: bool | None = None

    def to_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> SampleResult:
        return cls(**record)


def truncate_response(text: str, max_chars: int = RESPONSE_MAX_CHARS) -> str:
    return text if len(text) <= max_chars else text[:max_chars] + TRUNCATED_MARK


def _scored(sample: EvalSample, text: str) -> tuple[str | list[float] | None, float]:
    if sample.kind == "mcq":
        scored = score_mcq(text, str(sample.answer))
        return scored.pred, scored.score
    if sample.kind == "grounding":
        start, end = sample.answer
        scored = score_grounding(text, (float(start), float(end)))
        return (None if scored.pred is None else list(scored.pred)), scored.score
    if sample.kind == "open":
        prediction = extract_answer(text)
        return prediction, token_f1(prediction, str(sample.answer))
    raise ValueError(f"sample {sample.id} ({sample.split}): unknown kind {sample.kind!r}")


def score_sample(sample: EvalSample, outcome: EpisodeOutcome) -> SampleResult:
    """Score an episode's final generation against the sample's answer (module docstring);
    an episode that could not run (`outcome.error`) scores 0 with no prediction."""
    pred, score = (None, 0.0) if outcome.error else _scored(sample, outcome.final_text)
    answer = list(sample.answer) if sample.kind == "grounding" else str(sample.answer)
    return SampleResult(
        id=sample.id, split=sample.split, kind=sample.kind, answer=answer, pred=pred, score=score,
        correct=(score == 1.0) if sample.kind == "mcq" else None, scorer=SCORERS[sample.kind],
        tool_calls=outcome.tool_calls, turns=outcome.turns, parse_failures=outcome.parse_failures,
        rejected_calls=outcome.rejected_calls, unanswered_calls=outcome.unanswered_calls,
        end_reason=outcome.end_reason, duration_group=sample.duration_group, category=sample.category,
        response=truncate_response(outcome.final_text), error=outcome.error,
        answer_tag=not outcome.error and has_answer(outcome.final_text))


# --- the durable log ------------------------------------------------------------------


class ResultsLog:
    """`<results>/<split>.jsonl`: one JSON object per finished sample, appended durably."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def load(self) -> dict[str, dict[str, Any]]:
        """Finished records by sample id; a torn last line is cut from the file first.

        Raises:
            ValueError: a complete line that is not a JSON object with an "id" (the file
                was edited or corrupted; delete it to evaluate the split again).
        """
        if not self.path.is_file():
            return {}
        self._cut_torn_tail()
        records: dict[str, dict[str, Any]] = {}
        with self.path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if line.strip():
                    records.update([self._parsed(line, number)])
        return records

    def _parsed(self, line: str, number: int) -> tuple[str, dict[str, Any]]:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{self.path}: line {number} is not JSON ({exc}); delete the file to "
                             "evaluate this split again") from exc
        if not isinstance(record, dict) or not isinstance(record.get("id"), str):
            raise ValueError(f"{self.path}: line {number} is not a result record with an \"id\"")
        return record["id"], record

    def _cut_torn_tail(self) -> None:
        data = self.path.read_bytes()
        if not data or data.endswith(b"\n"):
            return
        keep = data.rfind(b"\n") + 1
        logger.warning("%s: dropping a torn last line (%d bytes) left by an interrupted run", self.path,
                       len(data) - keep)
        with self.path.open("r+b") as f:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())

    def append(self, record: Mapping[str, Any]) -> None:
        """Append one record as a JSON line, flushed and fsynced before returning."""
        created = not self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record, ensure_ascii=False) + "\n"
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        if created:
            _fsync_dir(self.path.parent)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- summaries ------------------------------------------------------------------------


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def primary_metric(results: Sequence[SampleResult]) -> tuple[str, float]:
    """(name, value) of a group's headline metric: accuracy, mIoU, or the mean score."""
    kinds = {result.kind for result in results}
    scores = [result.score for result in results]
    if kinds == {"mcq"}:
        return "accuracy", accuracy(scores)
    if kinds == {"grounding"}:
        return "mIoU", grounding_summary(scores)["mIoU"]
    return "score", _mean(scores)


def _scores(results: Sequence[SampleResult]) -> dict[str, float]:
    kinds = {result.kind for result in results}
    name, value = primary_metric(results)
    scores: dict[str, float] = {name: value}
    if kinds == {"grounding"}:
        scores.update(grounding_summary([result.score for result in results]))
    elif len(kinds) > 1:
        for kind, metric in (("mcq", "mcq_accuracy"), ("open", "open_token_f1"), ("grounding", "grounding_mIoU")):
            kept = [result.score for result in results if result.kind == kind]
            if kept:
                scores[metric] = _mean(kept)
    return scores


def _tool_use(results: Sequence[SampleResult]) -> dict[str, float]:
    return {
        "avg_tool_calls": _mean([result.tool_calls for result in results]),
        "tool_usage_rate": _mean([1.0 if result.tool_calls > 0 else 0.0 for result in results]),
        "avg_turns": _mean([result.turns for result in results]),
    }


def _answer_tag_rate(results: Sequence[SampleResult]) -> float | None:
    kept = [1.0 if result.answer_tag else 0.0 for result in results if result.answer_tag is not None]
    return _mean(kept) if kept else None


def _breakdown(results: Sequence[SampleResult], key: Callable[[SampleResult], str | None]) -> dict[str, dict]:
    groups: dict[str, list[SampleResult]] = {}
    for result in results:
        groups.setdefault(key(result) or "unknown", []).append(result)
    return {name: {"n": len(group), **_scores(group), **_tool_use(group)} for name, group in sorted(groups.items())}


def _count(values: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return dict(sorted(counts.items()))


def summarize(split: str, results: Sequence[SampleResult]) -> dict[str, Any]:
    """The split's summary (module docstring); `primary` names the headline metric."""
    if not results:
        raise ValueError(f"split {split}: no results to summarize; was the split empty?")
    name, value = primary_metric(results)
    return {
        "split": split,
        "n": len(results),
        "kinds": _count(result.kind for result in results),
        "primary": {"name": name, "value": value},
        **_scores(results),
        **_tool_use(results),
        # answers in the format asked for (SampleResult.answer_tag): what the paper's format claims
        # are about, on held-out data; None when no record kept it
        "answer_tag_rate": _answer_tag_rate(results),
        "parse_failures": sum(result.parse_failures for result in results),
        "rejected_calls": sum(result.rejected_calls for result in results),
        "unanswered_calls": sum(result.unanswered_calls for result in results),
        "end_reasons": _count(result.end_reason for result in results),
        "errors": [{"id": result.id, "error": result.error} for result in results if result.error],
        "by_duration": _breakdown(results, lambda result: result.duration_group),
        "by_category": _breakdown(results, lambda result: result.category),
    }


def write_split_results(path: Path, split: str, summary: Mapping[str, Any], results: Sequence[SampleResult]) -> Path:
    """`<results>/<split>.json`: {"split", "summary", "samples": [per-sample records]}, atomically."""
    document = {"split": split, "summary": dict(summary), "samples": [result.to_record() for result in results]}
    return atomic_write_text(path, json.dumps(document, indent=1, ensure_ascii=False) + "\n")
