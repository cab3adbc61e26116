"""The miniature reproduction's report folder and its MLflow run (#15).

`write_report` writes `report.md` (`report_tables.py`), `steps.png` (`report_plot.py`) and the
measurements (`runs.json`, `budget.json`: `measurements.py`), and the running time
(`running_time.json`: `run_clock.py`), and logs them to MLflow; `rebuild_report` replaces a
report folder whole; `read_report_dir` and `latest_logged` read the measurements back from a
folder or from MLflow, `read_running_time` and `latest_logged` the running time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from paravt_core.atomic import atomic_dir, atomic_write_text
from paravt_core.eval.experiment_report import _client, _runs
from paravt_core.miniature.intervals import by_row, rows_in_order
from paravt_core.miniature.measurements import (
    BudgetPoint,
    MeasurementsError,
    ModelRun,
    budget_from_json,
    runs_from_json,
)
from paravt_core.miniature.report_plot import plot_steps
from paravt_core.miniature.report_tables import report_markdown
from paravt_core.run_clock import ClockSummary
from paravt_core.tracking import start_stage_run

if TYPE_CHECKING:
    from paravt_core.config import PipelineConfig

RUNNING_TIME = "running_time.json"  # a report folder's running time (`run_clock.ClockSummary`)


def row_variants(row: str, variants: Mapping[str, Sequence[str]]) -> list[tuple[str, list[str]]]:
    """(label, overrides) of each run a row gives per seed (`reproduce.variants`): the row as its
    file says when there are no variants; else one per variant, labelled `<row>.<variant>` and
    trained under that `rl.row` (its own run folder and cache key: a variant with no overrides
    trains the row again), with the variant's overrides after it."""
    if not variants:
        return [(row, [])]
    return [(f"{row}.{name}", [f"rl.row={row}.{name}", *sets]) for name, sets in variants.items()]


def latest_logged(tracking_uri: str, experiment: str
                  ) -> tuple[list[ModelRun], list[BudgetPoint], ClockSummary | None]:
    """The latest reproduction run's measurements in MLflow: its runs.json, its budget.json
    (the SFT model's budget sweep; empty before #35 logged it) and its running_time.json (None
    before the run clock, or where the flow had no clock), each where it logged one.

    Raises:
        ValueError: no reproduction run in the experiment; MeasurementsError or ClockError (both
            ValueErrors) for a logged file that does not read, naming the run.
    """
    import tempfile

    logged = _runs(tracking_uri, experiment, "reproduce")
    if not logged:
        raise ValueError(f"MLflow experiment {experiment!r} at {tracking_uri} has no reproduction run; "
                         "run `paravt reproduce` first")
    client, run_id = _client(tracking_uri), logged[-1].info.run_id
    with tempfile.TemporaryDirectory() as tmp:
        def logged_file(name: str) -> bytes:
            return Path(client.download_artifacts(run_id, f"reproduce/{name}", tmp)).read_bytes()

        runs = runs_from_json(logged_file("runs.json"), f"the runs.json of MLflow run {run_id}")
        names = {Path(f.path).name for f in client.list_artifacts(run_id, "reproduce")}
        budget = budget_from_json(logged_file("budget.json"), f"the budget.json of MLflow run {run_id}") \
            if "budget.json" in names else []
        running = ClockSummary.from_json(logged_file(RUNNING_TIME).decode(),
                                         f"the {RUNNING_TIME} of MLflow run {run_id}") \
            if RUNNING_TIME in names else None
    return runs, budget, running


def read_report_dir(folder: Path) -> tuple[list[ModelRun], list[BudgetPoint]]:
    """The measurements a report folder holds (`runs.json`, and `budget.json` where written)."""
    runs_file = Path(folder) / "runs.json"
    if not runs_file.is_file():
        raise ValueError(f"{runs_file} does not exist: give the report folder `paravt reproduce` wrote "
                         "(<run.output_dir>/report)")
    budget_file = Path(folder) / "budget.json"
    try:
        return runs_from_json(runs_file.read_bytes(), str(runs_file)), \
            budget_from_json(budget_file.read_bytes(), str(budget_file)) if budget_file.is_file() else []
    except OSError as error:
        raise MeasurementsError(f"cannot read the report folder {folder}: {error}") from None


def clock_dir(cfg: PipelineConfig) -> Path:
    """Where `paravt reproduce`'s invocations with this config keep their heartbeat records
    (`run_clock.RunClock`): one folder per report folder and config, so another profile, or this
    one changed, starts a clock of its own."""
    return cfg.run.output_dir / "clock" / f"{cfg.reproduce.report_dir}-{cfg.section_hash()}"


def read_running_time(folder: Path) -> ClockSummary | None:
    """The running time a report folder recorded (`running_time.json`, `write_report`); None
    where it has none (a report from before the clock).

    Raises:
        ClockError: the file is not a running-time summary (naming it).
    """
    path = Path(folder) / RUNNING_TIME
    return ClockSummary.from_json(path.read_text(), str(path)) if path.is_file() else None


def rebuilt_report_dir(out_dir: Path, source_dir: Path | None = None) -> Path:
    """`out_dir` checked as the folder a rebuilt report replaces whole (`rebuild_report`).

    Raises:
        MeasurementsError: `out_dir` is, holds or lies inside the folder read (a rebuild never
            writes where it reads: a failure there would damage the measurements themselves), or
            it exists and is not a report folder (its files would be replaced).
    """
    out = Path(out_dir).resolve()
    if source_dir is not None:
        source = Path(source_dir).resolve()
        if out == source or source in out.parents or out in source.parents:
            raise MeasurementsError(f"--out {out_dir} would write into the folder the report is rebuilt from "
                                    f"({source_dir}); give a new folder")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "report.md").is_file())):
        raise MeasurementsError(f"--out {out_dir} exists and is not a report folder (no report.md); its files would "
                                "be replaced: give a new folder")
    return out


def rebuild_report(runs: Sequence[ModelRun], out_dir: Path, title: str, budget: Sequence[BudgetPoint] = (),
                   source_dir: Path | None = None, running: ClockSummary | None = None) -> Path:
    """`write_report` into a fresh folder that replaces `out_dir` in one rename, so a failure
    leaves the old report (or none), never a half-written one. Returns the report's path.

    Raises:
        MeasurementsError: see `rebuilt_report_dir`.
    """
    out = rebuilt_report_dir(out_dir, source_dir)
    with atomic_dir(out) as tmp:
        write_report(runs, tmp, title, budget=budget, running=running)
    return out / "report.md"


def write_report(runs: Sequence[ModelRun], out_dir: Path, title: str, tracking_uri: str | None = None,
                 experiment: str | None = None, budget: Sequence[BudgetPoint] = (),
                 running: ClockSummary | None = None) -> Path:
    """`<out_dir>/report.md`, `steps.png` and `runs.json` (the measurements), and the running
    time where given (`running_time.json`); logged to MLflow as one run tagged
    `stage=reproduce` when a tracking URI is given. Returns the report's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figure = plot_steps(runs, out_dir / "steps.png")
    data = atomic_write_text(out_dir / "runs.json", json.dumps([asdict(r) for r in runs], indent=1))
    budget_file = atomic_write_text(out_dir / "budget.json", json.dumps([asdict(p) for p in budget], indent=1))
    clock_file = atomic_write_text(out_dir / RUNNING_TIME, running.to_json()) if running else None
    if not running:  # an earlier report's figure is not this one's
        (out_dir / RUNNING_TIME).unlink(missing_ok=True)
    report = atomic_write_text(out_dir / "report.md", report_markdown(runs, figure.name, title, budget, running))
    if tracking_uri and experiment:
        run_id = start_stage_run(tracking_uri, experiment, "reproduce", {"stage": "reproduce"}, {})
        client = _client(tracking_uri)
        for row in rows_in_order(runs):
            mine = by_row(runs, row)
            client.log_metric(run_id, f"{row}_accuracy", sum(r.accuracy for r in mine) / len(mine))
            client.log_metric(run_id, f"{row}_accuracy_direct", sum(r.accuracy_direct for r in mine) / len(mine))
            if all(r.accuracy_val is not None for r in mine):
                client.log_metric(run_id, f"{row}_accuracy_val", sum(r.accuracy_val for r in mine) / len(mine))
        if running:
            client.log_metric(run_id, "running_time_h", running.running_s / 3600)
        for path in (report, figure, data, budget_file, *([clock_file] if clock_file else [])):
            client.log_artifact(run_id, str(path), artifact_path="reproduce")
        client.set_terminated(run_id)
    return report
