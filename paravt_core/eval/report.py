"""The evaluation report of one model, the Table-1-shaped comparison table, and MLflow logging.

`EvalReport` holds each evaluated split's summary (`results.summarize`), the results folder
and the average of the splits' primary metrics (the seven-split average when all seven of
SPEC §7 were evaluated). `format_table` lays reports out like the paper's Table 1 (SPEC §6):
one row per label (base / sft / rl ...), the seven splits in SPEC §6 order, Charades-STA as
mIoU, scores in percent, with the paper's two rows beneath for reference. The paper prints
no average; its rows' "avg" is the plain mean of their seven numbers, computed here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from paravt_core.eval.splits import EVAL_SPLITS, PAPER_ROWS, SPLITS
from paravt_core.tracking import retry_when_busy, start_stage_run

# Table 1's columns and the paper's rows, from the split records (`eval/splits.py`).
TABLE1_SPLITS = EVAL_SPLITS
TABLE1_HEADERS = tuple(SPLITS[split].column for split in TABLE1_SPLITS)
PAPER_TABLE1: dict[str, tuple[float, ...]] = {
    label: tuple(SPLITS[split].paper[label] for split in TABLE1_SPLITS) for label in PAPER_ROWS
}


class EvalReport(BaseModel):
    """One model's evaluation.

    Attributes:
        label: the row name (e.g. "base", "sft", "rl", "champion").
        model_sha256: content hash of the evaluated checkpoint.
        results_dir: where `<split>.jsonl` / `<split>.json` lie.
        summaries: split -> summary dict; `summary["primary"]` = {"name", "value"}.
        average: mean of the splits' primary values (fractions), over `summaries`.
    """

    model_config = ConfigDict(frozen=True)

    label: str
    model_sha256: str
    results_dir: Path
    summaries: dict[str, dict[str, Any]]
    average: float

    def primary(self, split: str) -> float | None:
        summary = self.summaries.get(split)
        return None if summary is None else float(summary["primary"]["value"])

    @property
    def complete(self) -> bool:
        """All seven SPEC §7 splits evaluated: `average` is the seven-split average."""
        return set(TABLE1_SPLITS) <= set(self.summaries)


def build_report(label: str, model_sha256: str, results_dir: Path,
                 summaries: Mapping[str, Mapping[str, Any]]) -> EvalReport:
    if not summaries:
        raise ValueError(f"report {label}: no split was evaluated")
    values = [float(summary["primary"]["value"]) for summary in summaries.values()]
    return EvalReport(label=label, model_sha256=model_sha256, results_dir=Path(results_dir),
                      summaries={split: dict(summary) for split, summary in summaries.items()},
                      average=sum(values) / len(values))


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def _report_row(label: str, report: EvalReport) -> str:
    cells = [_percent(report.primary(split)) for split in TABLE1_SPLITS]
    average = _percent(report.average) + ("" if report.complete else "*")
    return f"| {label} | " + " | ".join(cells) + f" | {average} |"


def _paper_row(label: str, values: tuple[float, ...]) -> str:
    average = sum(values) / len(values)
    return f"| {label} | " + " | ".join(f"{value:.1f}" for value in values) + f" | {average:.1f} |"


def _notes(reports: Mapping[str, EvalReport]) -> list[str]:
    notes = [("Scores in %: accuracy on the MCQ splits, mIoU on Charades-STA. Paper rows: SPEC §6 Table 1 "
              "(8B, 64 frames), for reference; their avg is the mean of the seven numbers.")]
    if any(not report.complete for report in reports.values()):
        notes.append("* avg over the evaluated splits only, not all seven.")
    for label, report in reports.items():
        mixed = [split for split, summary in report.summaries.items() if summary["primary"]["name"] == "score"]
        if mixed:
            notes.append(f"{label}: {', '.join(mixed)} mix MCQ and open-ended questions; shown is the mean "
                         "per-sample score (MCQ 0/1, open-ended token F1).")
        counts = ", ".join(f"{split} {report.summaries[split]['n']}" for split in TABLE1_SPLITS
                           if split in report.summaries)
        notes.append(f"{label}: samples per split: {counts}.")
    return notes


def format_table(reports: Mapping[str, EvalReport]) -> str:
    """A Markdown table shaped like the paper's Table 1, with the paper's rows beneath."""
    header = "| model | " + " | ".join(TABLE1_HEADERS) + " | avg |"
    rule = "|" + "---|" * (len(TABLE1_HEADERS) + 2)
    rows = [_report_row(label, report) for label, report in reports.items()]
    rows += [_paper_row(label, values) for label, values in PAPER_TABLE1.items()]
    return "\n".join([header, rule, *rows, "", *_notes(reports)]) + "\n"


def metric_name(split: str, name: str) -> str:
    """An MLflow metric name for a split's metric ("R@0.5" -> "R_at_0.5": MLflow refuses "@")."""
    return f"{split}/{name.replace('@', '_at_')}"


def report_metrics(report: EvalReport) -> dict[str, float]:
    """The metrics logged per evaluated model: each split's scores and tool use, the average."""
    metrics = {"average": report.average}
    for split, summary in report.summaries.items():
        for name, value in summary.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and name != "n":
                metrics[metric_name(split, name)] = float(value)
        metrics[metric_name(split, "primary")] = float(summary["primary"]["value"])
    return metrics


@retry_when_busy("logging an evaluation to MLflow")
def log_report(tracking_uri: str, experiment: str, run_name: str, report: EvalReport, table: str,
               tags: Mapping[str, str], params: Mapping[str, Any]) -> str:
    """An MLflow run for one evaluated model: metrics, the table and the per-split JSONs.

    Returns:
        the run id.
    """
    import time

    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    run_id = start_stage_run(tracking_uri, experiment, run_name, tags, params)
    client = MlflowClient(tracking_uri)
    now = int(time.time() * 1000)
    metrics = [Metric(name, value, now, 0) for name, value in report_metrics(report).items()]
    for start in range(0, len(metrics), 500):
        client.log_batch(run_id, metrics=metrics[start : start + 500])
    client.log_text(run_id, table, "eval_table.md")
    client.log_text(run_id, json.dumps(report.model_dump(mode="json"), indent=1), "eval_report.json")
    for split in report.summaries:
        path = report.results_dir / f"{split}.json"
        if path.is_file():
            client.log_artifact(run_id, str(path), artifact_path="results")
    client.set_terminated(run_id)
    return run_id
