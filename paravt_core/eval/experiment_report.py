"""`paravt report`: the paper's tables and the fτ / κ curves, read back from MLflow.

Table 1 comes from the evaluation runs (tag `stage=eval`, one row per `label`, the latest
run of each label); Table 2 from the RL runs (tag `stage=rl`, one row per `ablation_row`:
fτ and κ are the means of the last three logged steps) joined with the evaluation run
whose label is the row name. The paper's numbers (SPEC §6) stand beside ours. The
Markdown report and the PNG plots are written to a folder and logged as MLflow artifacts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from paravt_core.atomic import atomic_write_text
from paravt_core.eval.report import PAPER_TABLE1, TABLE1_HEADERS, TABLE1_SPLITS, metric_name
from paravt_core.tracking import start_stage_run

# SPEC §6 Table 2: fτ, κ, VideoMME w/o, w/ sub, LVBench, MLVU (None where the paper gives none).
PAPER_TABLE2: dict[str, tuple[float | None, ...]] = {
    "base": (0.03, 0.45, 59.9, 68.4, 33.1, 58.3),
    "sft": (0.13, 2.50, 60.7, 69.0, 39.1, 63.7),
    "vanilla_grpo": (0.13, 0.02, 62.0, 68.6, 39.3, 64.5),
    "paragrpo": (0.41, 0.21, 62.1, 69.4, 39.8, 65.0),
    "anchoring_only": (0.35, 0.19, None, None, None, None),
    "gating_only": (0.10, 1.36, None, None, None, None),
    "no_tool_reward": (0.33, 0.04, None, None, None, None),
    "no_penalty": (0.36, 0.27, None, None, None, None),
    "paragrpo-sequential": (None, None, 61.4, 68.8, 37.5, 64.1),
}
TABLE2_SPLITS = ("videomme", "videomme_wsub", "lvbench", "mlvu")
TABLE2_LAST_STEPS = 3


@dataclass
class RLRow:
    """One RL row's per-step series. `f_tau` is fτ under the ONE fixed definition of SPEC §5
    (`f_tau_fixed`: answer_suffix on, λ = 0.5, scope generated), so rows with different
    reward knobs compare; `f_tau_own` is the row's own R_fmt, logged beside it."""

    row: str
    f_tau: list[tuple[int, float]]
    kappa: list[tuple[int, float]]
    f_tau_own: list[tuple[int, float]] = field(default_factory=list)

    def final(self, series: list[tuple[int, float]]) -> float | None:
        tail = [v for _, v in sorted(series)[-TABLE2_LAST_STEPS:]]
        return sum(tail) / len(tail) if tail else None


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


class ExperimentNotFound(ValueError):
    """No MLflow experiment of that name in the store; the message names the ones there are."""


def experiment_id(uri: str, experiment: str) -> str:
    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments() if e.name != "Default")
        raise ExperimentNotFound(f"no MLflow experiment {experiment!r} at {uri} (there: {', '.join(names) or 'none'}); "
                                 "pass the config's mlflow.experiment, or run the pipeline first")
    return exp.experiment_id


def _runs(uri: str, experiment: str, stage: str):
    client = _client(uri)
    exp_id = experiment_id(uri, experiment)
    return client.search_runs([exp_id], f"tags.stage = '{stage}'", order_by=["attributes.start_time ASC"])


def eval_rows(uri: str, experiment: str) -> dict[str, dict[str, float]]:
    """label -> metrics of its latest evaluation run."""
    return {run.data.tags.get("label", run.info.run_id): dict(run.data.metrics) for run in _runs(uri, experiment, "eval")}


def rl_rows(uri: str, experiment: str) -> list[RLRow]:
    client, rows = _client(uri), {}
    for run in _runs(uri, experiment, "rl"):
        name = run.data.tags.get("ablation_row")
        if not name:
            continue
        history = {m: [(h.step, h.value) for h in client.get_metric_history(run.info.run_id, m)]
                   for m in ("f_tau_fixed", "f_tau", "kappa")}
        rows[name] = RLRow(name, history["f_tau_fixed"], history["kappa"], history["f_tau"])
    return list(rows.values())


def _cell(value: float | None, percent: bool = False, digits: int = 2) -> str:
    if value is None:
        return "–"
    return f"{100 * value:.1f}" if percent else f"{value:.{digits}f}"


def table1(evals: dict[str, dict[str, float]]) -> str:
    lines = ["| model | " + " | ".join(TABLE1_HEADERS) + " |", "|" + "---|" * (len(TABLE1_HEADERS) + 1)]
    for label, metrics in evals.items():
        cells = [_cell(metrics.get(metric_name(s, "primary")), percent=True) for s in TABLE1_SPLITS]
        lines.append(f"| {label} (ours) | " + " | ".join(cells) + " |")
    for label, values in PAPER_TABLE1.items():
        lines.append(f"| {label} | " + " | ".join(f"{v:.1f}" for v in values) + " |")
    return "\n".join(lines)


def table2(rows: Sequence[RLRow], evals: dict[str, dict[str, float]]) -> str:
    head = "| row | fτ | κ | VideoMME w/o | VideoMME w/ | LVBench | MLVU | paper fτ | paper κ | paper VideoMME w/o | paper w/ | paper LVBench | paper MLVU |"
    lines = [head, "|" + "---|" * 13]
    names = [r.row for r in rows] + [label for label in evals if label not in {r.row for r in rows}]
    by_name = {r.row: r for r in rows}
    for name in names:
        rl = by_name.get(name)
        ours = [rl.final(rl.f_tau) if rl else None, rl.final(rl.kappa) if rl else None]
        scores = [evals.get(name, {}).get(metric_name(s, "primary")) for s in TABLE2_SPLITS]
        paper = PAPER_TABLE2.get(name, (None,) * 6)
        cells = [_cell(v) for v in ours] + [_cell(v, percent=True) for v in scores]
        cells += [_cell(v) for v in paper[:2]] + [_cell(v, digits=1) for v in paper[2:]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: Sequence[RLRow], metric: str, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    for row in rows:
        series = sorted(getattr(row, metric))
        if series:
            ax.plot([s for s, _ in series], [v for _, v in series], marker="o", markersize=3, label=row.row)
    ax.set_xlabel("RL step")
    ax.set_ylabel({"f_tau": "fτ (fixed R_fmt, τ=0.7)", "kappa": "κ (tool calls per rollout)"}[metric])
    ax.grid(alpha=0.3)
    if rows:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def write_report(uri: str, experiment: str, out_dir: Path) -> Path:
    """Write `<out_dir>/report.md` and the plots; log them to an MLflow run; return the report path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    evals, rows = eval_rows(uri, experiment), rl_rows(uri, experiment)
    plots = [plot(rows, m, out_dir / f"{m}_per_step.png") for m in ("f_tau", "kappa")]
    text = "\n\n".join([
        f"# ParaVT report: experiment `{experiment}`",
        "## Table 1 (seven splits; % accuracy, Charades-STA mIoU)", table1(evals),
        f"## Table 2 (ablation rows; fτ and κ: mean of the last {TABLE2_LAST_STEPS} RL steps; fτ under one fixed "
        "definition for every row: answer_suffix on, λ = 0.5, scope generated)", table2(rows, evals),
        "## Curves", *[f"![{p.stem}]({p.name})" for p in plots],
    ]) + "\n"
    report = atomic_write_text(out_dir / "report.md", text)
    run_id = start_stage_run(uri, experiment, "report", {"stage": "report"}, {})
    client = _client(uri)
    for path in [report, *plots]:
        client.log_artifact(run_id, str(path), artifact_path="report")
    client.set_terminated(run_id)
    return report
