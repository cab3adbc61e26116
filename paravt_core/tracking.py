"""MLflow runs for the stages: opened by the stage, written to by rank 0 of its workers."""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from paravt_core.atomic import atomic_write_text

log = logging.getLogger(__name__)
T = TypeVar("T")
# How long an MLflow call waits for a busy (locked) database before giving up, seconds.
BUSY_WAIT_ENV = "PARAVT_MLFLOW_BUSY_WAIT_S"
BUSY_WAIT_S = 120.0


class MlflowBusyError(RuntimeError):
    """The MLflow database stayed locked past the wait; the message says what to do."""


def _is_busy(error: BaseException) -> bool:
    text = f"{type(error).__name__}: {error}".lower()
    return "database is locked" in text or "database is busy" in text or "database table is locked" in text


def retry_when_busy(what: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Retry an MLflow call while its SQLite database is locked by another process (a
    `make ui` server mid-write, a second run), backing off up to `PARAVT_MLFLOW_BUSY_WAIT_S`
    seconds (120 by default), then raise `MlflowBusyError` saying what to do. Other errors
    pass through at once. The wrapped calls are idempotent or create one run each."""

    def wrap(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> T:
            budget = float(os.environ.get(BUSY_WAIT_ENV, BUSY_WAIT_S))
            started, delay = time.monotonic(), 0.5
            while True:
                try:
                    return fn(*args, **kwargs)
                except Exception as error:
                    if not _is_busy(error):
                        raise
                    waited = time.monotonic() - started
                    if waited + delay > budget:
                        raise MlflowBusyError(
                            f"{what}: the MLflow database stayed locked for {waited:.0f} s ({error}). Another "
                            "process holds it: stop the other run or the MLflow UI writing to it, or point "
                            "mlflow.tracking_uri at an MLflow server, then run again (finished stages are cached)"
                        ) from None
                    log.warning("%s: the MLflow database is locked; retrying in %.1f s", what, delay)
                    time.sleep(delay)
                    delay = min(delay * 2, 8.0)

        return call

    return wrap


def local_store_dir(tracking_uri: str) -> Path | None:
    """The folder of a local SQLite tracking store (`sqlite:///<path>`, the default one lies in
    `run.output_dir`); None for any other store (an MLflow server keeps its own artifacts)."""
    prefix = "sqlite:///"
    return Path(tracking_uri[len(prefix):]).parent if tracking_uri.startswith(prefix) else None


def experiment_id(client: Any, experiment: str, tracking_uri: str) -> str:
    """The experiment's id, created where missing. In a local SQLite store its artifacts go next to
    the database (`<store folder>/mlartifacts/<experiment>`): MLflow's default is `./mlruns` of
    whatever folder the process runs in, outside `run.output_dir`."""
    exp = client.get_experiment_by_name(experiment)
    if exp is not None:
        return exp.experiment_id
    store = local_store_dir(tracking_uri)
    location = (store / "mlartifacts" / experiment).resolve().as_uri() if store is not None else None
    return client.create_experiment(experiment, artifact_location=location)


@retry_when_busy("opening an MLflow run")
def _create_run(tracking_uri: str, experiment: str, run_name: str, tags: Mapping[str, str]) -> str:
    """One new run (a busy database rolls the insert back, so a retry creates no second run)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    return client.create_run(experiment_id(client, experiment, tracking_uri), run_name=run_name,
                             tags=dict(tags)).info.run_id


@retry_when_busy("logging an MLflow run's params")
def _log_params(tracking_uri: str, run_id: str, items: list[tuple[str, str]]) -> None:
    """Params in batches of 100; logging a param again with the same value is allowed, so a retry is safe."""
    import mlflow
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    for i in range(0, len(items), 100):
        client.log_batch(run_id, params=[mlflow.entities.Param(k, v) for k, v in items[i : i + 100]])


def start_stage_run(tracking_uri: str, experiment: str, run_name: str, tags: Mapping[str, str],
                    params: Mapping[str, Any], created: Callable[[str], None] | None = None) -> str:
    """Create an MLflow run with its params and tags; returns the run id.

    The run is created, then `created(run_id)` is called, then the params are logged: each step
    waits out a busy database on its own. (Retrying the three as one created a second run whenever
    the database was locked after the first existed, and left the first RUNNING forever: two
    work-pool rows writing one SQLite store.) `created` lets a stage record the id before anything
    else can fail, so a resumed stage finds its run (`stage_run_id`)."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    run_id = _create_run(tracking_uri, experiment, run_name, tags)
    if created is not None:
        created(run_id)
    _log_params(tracking_uri, run_id, [(k, str(v)[:6000]) for k, v in params.items()])
    return run_id


def stage_run_id(out_dir, tracking_uri: str, experiment: str, run_name: str, tags: Mapping[str, str],
                 params: Mapping[str, Any]) -> str:
    """The MLflow run of a stage's run folder: created once, reused when the stage resumes. Its id
    is in the folder (written atomically) as soon as the run exists, so a stage killed while logging
    its params resumes into the same run instead of leaving one RUNNING beside a second."""
    id_file = Path(out_dir) / "mlflow_run_id"
    if id_file.is_file():
        return id_file.read_text().strip()
    return start_stage_run(tracking_uri, experiment, run_name, tags, params,
                           created=lambda run_id: atomic_write_text(id_file, run_id))


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"sft": {"lr": 1}} -> {"sft.lr": 1}."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


class MetricLogger:
    """Per-step metrics into an existing run; a no-op object on ranks other than 0."""

    def __init__(self, tracking_uri: str | None, run_id: str | None, enabled: bool = True):
        self.enabled = enabled and run_id is not None
        if self.enabled:
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri)
            self.run_id = run_id

    @retry_when_busy("logging metrics to MLflow")
    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    @retry_when_busy("closing an MLflow run")
    def finish(self, status: str = "FINISHED") -> None:
        if self.enabled:
            self.client.set_terminated(self.run_id, status)
