"""A locked MLflow database is waited for, within a bound, then named with what to do (issue #33 item 7)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from paravt_core.tracking import MlflowBusyError, retry_when_busy, start_stage_run


def _hold_lock(db: Path, seconds: float, ready: threading.Event) -> None:
    connection = sqlite3.connect(db, timeout=1)
    connection.execute("BEGIN EXCLUSIVE")
    ready.set()
    time.sleep(seconds)
    connection.rollback()
    connection.close()


def test_a_briefly_locked_database_is_waited_for(tmp_path: Path, caplog):
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    start_stage_run(uri, "exp", "first", {}, {})  # creates the schema
    ready = threading.Event()
    # MLflow's SQLite engine itself waits about 20 s on a lock (measured): hold it past that.
    holder = threading.Thread(target=_hold_lock, args=(db, 24.0, ready))
    holder.start()
    ready.wait()
    run_id = start_stage_run(uri, "exp", "second", {}, {"a": 1})
    holder.join()
    assert run_id
    assert "the MLflow database is locked; retrying" in caplog.text  # the lock outlasted SQLite's own wait


def test_a_database_locked_past_the_wait_names_the_fix(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PARAVT_MLFLOW_BUSY_WAIT_S", "1")
    calls = []

    @retry_when_busy("logging metrics to MLflow")
    def always_locked():
        calls.append(time.monotonic())
        raise RuntimeError("(sqlite3.OperationalError) database is locked")

    with pytest.raises(MlflowBusyError, match=r"logging metrics to MLflow: the MLflow database stayed locked .*"
                                              r"stop the other run or the MLflow UI"):
        always_locked()
    assert len(calls) >= 2  # retried before giving up

    @retry_when_busy("anything")
    def other_error():
        calls.append(0)
        raise ValueError("not a lock")

    before = len(calls)
    with pytest.raises(ValueError, match="not a lock"):
        other_error()
    assert len(calls) == before + 1


def _runs(uri: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    return [run for e in client.search_experiments() for run in client.search_runs([e.experiment_id])]


def test_a_lock_after_the_run_exists_makes_no_second_run(tmp_path: Path, monkeypatch):
    """A busy database while the params are logged retries the params only: one run, its params
    logged (the three calls once retried as one, creating a second run and leaving the first
    RUNNING forever)."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    real, failures = MlflowClient.log_batch, []

    def locked_once(self, run_id, *args, **kwargs):
        if not failures:
            failures.append(run_id)
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        return real(self, run_id, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", locked_once)
    run_id = start_stage_run(uri, "exp", "rl", {"stage": "rl"}, {"rl.lr": 0.1})
    runs = _runs(uri)
    assert failures == [run_id] and [run.info.run_id for run in runs] == [run_id]
    assert runs[0].data.params == {"rl.lr": "0.1"}


def test_a_stage_killed_while_logging_params_resumes_into_its_run(tmp_path: Path, monkeypatch):
    """`stage_run_id` records the run's id before the params: a stage that dies there (here: any
    error but a lock) finds its run again on resume instead of opening a second one."""
    from mlflow.tracking import MlflowClient

    from paravt_core.tracking import stage_run_id

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    real = MlflowClient.log_batch
    monkeypatch.setattr(MlflowClient, "log_batch", lambda *a, **k: (_ for _ in ()).throw(OSError("killed")))
    with pytest.raises(OSError, match="killed"):
        stage_run_id(tmp_path, uri, "exp", "rl", {"stage": "rl"}, {"rl.lr": 0.1})
    monkeypatch.setattr(MlflowClient, "log_batch", real)
    resumed = stage_run_id(tmp_path, uri, "exp", "rl", {"stage": "rl"}, {"rl.lr": 0.1})
    assert [run.info.run_id for run in _runs(uri)] == [resumed] == [(tmp_path / "mlflow_run_id").read_text()]
