"""The miniature reproduction's report folder and its MLflow run (#15).

`write_report` writes `report.md` (`report_tables.py`), `steps.png` (`report_plot.py`) and the
measurements (`runs.json`, `budget.json`: `measurements.py`), and the running time
(`running_time.json`: `run_clock.py`) and which profile's part it is (`profile.json`), and logs
them to MLflow; `rebuild_report` replaces a report folder whole; `read_report_dir` and
`latest_logged` read the measurements back from a folder or from MLflow, `read_running_time` and
`latest_logged` the running time; `read_parts` merges the report folders of a profile run in parts.

A profile of many SFT builds (`make reproduce-conclusive`) outlasts a machine here: run in parts
(each a set of its builds, `reproduce.sft_seeds`), each part's report folder holds every
measurement its builds gave, and the parts merge into the profile's report. `Profile` says what
may merge: only parts whose settings are the same but for which builds they train.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from paravt_core.atomic import atomic_dir, atomic_write_text
from paravt_core.eval.experiment_report import _client, _runs
from paravt_core.miniature.intervals import by_row, rows_in_order
from paravt_core.miniature.measurements import (
    BudgetPoint,
    MeasurementsError,
    ModelRun,
    budget_from_json,
    check_distinct,
    runs_from_json,
)
from paravt_core.miniature.report_plot import plot_steps
from paravt_core.miniature.report_tables import report_markdown
from paravt_core.run_clock import ClockSummary, combined
from paravt_core.tracking import start_stage_run

if TYPE_CHECKING:
    from paravt_core.config import PipelineConfig

RUNNING_TIME = "running_time.json"  # a report folder's running time (`run_clock.ClockSummary`)
PROFILE = "profile.json"  # which profile's part a report folder is (`Profile`)


@dataclass(frozen=True)
class Profile:
    """Which measurements a report folder holds.

    Attributes:
        key: the hash of every setting its runs depend on (`PipelineConfig.section_hash`, the cache
            identity's choice of knobs), less which SFT builds it trains (`reproduce.sft_seeds`),
            where it writes (`run.name`, `run.output_dir`, `reproduce.report_dir`) and MLflow: parts
            of one profile have one key.
        sft_seeds: the SFT builds it trained, in order (empty: one SFT model, not named by build).
    """

    key: str
    sft_seeds: tuple[int, ...]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def of(cls, cfg: PipelineConfig) -> Profile:
        bare = cfg.model_copy(update={"reproduce": cfg.reproduce.model_copy(update={"sft_seeds": ()}),
                                      "run": cfg.run.model_copy(update={"name": "-", "output_dir": Path("-")})})
        return cls(bare.section_hash(*(name for name in type(cfg).model_fields if name != "mlflow")),
                   tuple(cfg.reproduce.sft_seeds))


def read_profile(folder: Path) -> Profile | None:
    """The profile a report folder records (`profile.json`); None where it has none (a report
    from before parts could merge, or one rebuilt from MLflow).

    Raises:
        MeasurementsError: the file is not a profile record (naming it).
    """
    path = Path(folder) / PROFILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return Profile(key=str(data["key"]), sft_seeds=tuple(int(seed) for seed in data["sft_seeds"]))
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise MeasurementsError(f"{path}: not a profile record ({error}); write the report again with "
                                "`paravt reproduce` (its stages come from the cache)") from None


class _Part(NamedTuple):
    """One report folder as `read_parts` reads it."""

    folder: Path
    runs: list[ModelRun]
    budget: list[BudgetPoint]
    running: ClockSummary | None
    profile: Profile | None


def read_parts(folders: Sequence[Path]
               ) -> tuple[list[ModelRun], list[BudgetPoint], ClockSummary | None, Profile | None]:
    """The measurements, budget sweep, running time and profile of one report folder, or of a
    profile run in parts (several folders, in any order): every part's runs, the parts taken in the
    order of their first builds; the sweep of the part with the lowest (a profile sweeps its first
    build only, `flows/reproduce.py`, and its builds go up: `make reproduce-conclusive`); the parts'
    running times added up (`run_clock.combined`; None unless every part has one).

    Raises:
        MeasurementsError (a ValueError): a part is not a report folder, records no profile, trains
            one unnamed SFT model, or comes from other settings than the first (its key differs),
            or two parts hold the same build; ClockError for a running time that does not read.
    """
    parts = [_Part(Path(f), *read_report_dir(f), read_running_time(f), read_profile(f)) for f in folders]
    if len(parts) == 1:
        return parts[0].runs, parts[0].budget, parts[0].running, parts[0].profile
    for part in parts:
        if part.profile is None:
            raise MeasurementsError(f"{part.folder / PROFILE} does not exist, so which settings its runs come from is "
                                    "not known: only parts that record it merge (write the part's report again with "
                                    "`paravt reproduce`; its stages come from the cache)")
        if not part.profile.sft_seeds:
            raise MeasurementsError(f"{part.folder} trains one SFT model not named by build (reproduce.sft_seeds "
                                    "empty): only parts that name their builds merge")
    parts.sort(key=lambda part: part.profile.sft_seeds[0])
    first = parts[0]
    seen: dict[int, Path] = {}
    for part in parts:
        if part.profile.key != first.profile.key:
            raise MeasurementsError(f"{part.folder} comes from other settings than {first.folder} (profile "
                                    f"{part.profile.key} against {first.profile.key}): only parts of one profile, "
                                    "differing in reproduce.sft_seeds alone, merge")
        for seed in part.profile.sft_seeds:
            if seed in seen:
                raise MeasurementsError(f"SFT build {seed} is in {seen[seed]} and in {part.folder}: its runs would "
                                        "count twice; give each build's part once")
            seen[seed] = part.folder
    # as one invocation lists them: every SFT model, then the RL runs build by build (`flows/reproduce.py`)
    runs = [run for sft in (True, False) for part in parts for run in part.runs if (run.row == "sft") == sft]
    check_distinct(runs, " + ".join(str(part.folder) for part in parts))  # a part whose runs name another's build
    times = [part.running for part in parts]
    running = combined(times) if all(times) else None
    return runs, first.budget, running, Profile(first.profile.key, tuple(seen))


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


def rebuilt_report_dir(out_dir: Path, source_dirs: Sequence[Path] = ()) -> Path:
    """`out_dir` checked as the folder a rebuilt report replaces whole (`rebuild_report`).

    Raises:
        MeasurementsError: `out_dir` is, holds or lies inside the folder read (a rebuild never
            writes where it reads: a failure there would damage the measurements themselves), or
            it exists and is not a report folder (its files would be replaced).
    """
    out = Path(out_dir).resolve()
    for source_dir in source_dirs:
        source = Path(source_dir).resolve()
        if out == source or source in out.parents or out in source.parents:
            raise MeasurementsError(f"--out {out_dir} would write into the folder the report is rebuilt from "
                                    f"({source_dir}); give a new folder")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "report.md").is_file())):
        raise MeasurementsError(f"--out {out_dir} exists and is not a report folder (no report.md); its files would "
                                "be replaced: give a new folder")
    return out


class ReportLogError(RuntimeError):
    """A rebuilt report was written but could not be logged to MLflow; the message names the
    folder, the store and the experiment."""


def rebuild_report(runs: Sequence[ModelRun], out_dir: Path, title: str, budget: Sequence[BudgetPoint] = (),
                   source_dirs: Sequence[Path] = (), running: ClockSummary | None = None,
                   profile: Profile | None = None, tracking_uri: str | None = None,
                   experiment: str | None = None) -> Path:
    """`write_report` into a fresh folder that replaces `out_dir` in one rename, so a failure
    leaves the old report (or none), never a half-written one; then, where a tracking URI and
    an experiment are given, logged there as one run (`log_report`: the merged report of a
    profile run in parts beside its parts' own). Returns the report's path.

    Raises:
        MeasurementsError: see `rebuilt_report_dir`.
        ReportLogError: the report is written, logging it failed (the store's error chained).
    """
    out = rebuilt_report_dir(out_dir, source_dirs)
    with atomic_dir(out) as tmp:
        write_report(runs, tmp, title, budget=budget, running=running, profile=profile)
    if tracking_uri and experiment:  # from the folder in place: a failed log leaves the report written
        try:
            log_report(out, runs, running, tracking_uri, experiment,
                       {"rebuilt_from": ", ".join(map(str, source_dirs))})
        except Exception as exc:  # MLflow's own, sqlalchemy's, OSError: the store, not the report, failed
            raise ReportLogError(f"the report is written to {out}, but logging it to MLflow experiment "
                                 f"{experiment!r} at {tracking_uri} failed ({type(exc).__name__}: {exc}); "
                                 "give a --tracking-uri that can be written and run it again") from exc
    return out / "report.md"


def write_report(runs: Sequence[ModelRun], out_dir: Path, title: str, tracking_uri: str | None = None,
                 experiment: str | None = None, budget: Sequence[BudgetPoint] = (),
                 running: ClockSummary | None = None, profile: Profile | None = None) -> Path:
    """`<out_dir>/report.md`, `steps.png` and `runs.json` (the measurements), and the running
    time and profile where given (`running_time.json`, `profile.json`); logged to MLflow as one
    run tagged `stage=reproduce` when a tracking URI is given. Returns the report's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figure = plot_steps(runs, out_dir / "steps.png")
    atomic_write_text(out_dir / "runs.json", json.dumps([asdict(r) for r in runs], indent=1))
    atomic_write_text(out_dir / "budget.json", json.dumps([asdict(p) for p in budget], indent=1))
    for name, given in ((RUNNING_TIME, running), (PROFILE, profile)):
        if given:
            atomic_write_text(out_dir / name, given.to_json())
        else:  # an earlier report's record is not this one's
            (out_dir / name).unlink(missing_ok=True)
    report = atomic_write_text(out_dir / "report.md", report_markdown(runs, figure.name, title, budget, running))
    if tracking_uri and experiment:
        log_report(out_dir, runs, running, tracking_uri, experiment)
    return report


def log_report(out_dir: Path, runs: Sequence[ModelRun], running: ClockSummary | None, tracking_uri: str,
               experiment: str, tags: Mapping[str, str] | None = None) -> str:
    """The report in `out_dir` (`write_report`'s files) logged to MLflow as one run tagged
    `stage=reproduce` (and `tags`): each row's mean accuracies and the running time in hours as
    metrics, the files as artifacts under `reproduce/`, which `latest_logged` reads back. Returns
    the run's id."""
    run_id = start_stage_run(tracking_uri, experiment, "reproduce", {"stage": "reproduce", **(tags or {})}, {})
    client = _client(tracking_uri)
    for row in rows_in_order(runs):
        mine = by_row(runs, row)
        client.log_metric(run_id, f"{row}_accuracy", sum(r.accuracy for r in mine) / len(mine))
        client.log_metric(run_id, f"{row}_accuracy_direct", sum(r.accuracy_direct for r in mine) / len(mine))
        if all(r.accuracy_val is not None for r in mine):
            client.log_metric(run_id, f"{row}_accuracy_val", sum(r.accuracy_val for r in mine) / len(mine))
    if running:
        client.log_metric(run_id, "running_time_h", running.running_s / 3600)
    for name in ("report.md", "steps.png", "runs.json", "budget.json", RUNNING_TIME, PROFILE):
        if (out_dir / name).is_file():
            client.log_artifact(run_id, str(out_dir / name), artifact_path="reproduce")
    client.set_terminated(run_id)
    return run_id
