"""Ablation rows on a Prefect work pool (issue #66; docs/scale.md "Rows on a cluster").

A real local Prefect server on a free port (its own PREFECT_HOME), the `paravt/rl-row`
deployment from prefect.yaml, and two process workers on one pool with a limit of one row
each. The tiny ablation flow's two rows run at once on the two workers, linked under the
parent flow run; one worker is killed mid-row and its row runs again on the other; the rows'
weights, evaluations and RL metrics equal those of the same rows run in process.
"""

from __future__ import annotations

import contextlib

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.integration.test_flows import fast_overrides

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
POOL = "paravt-rows-test"
WATCHDOG_S = 1800.0  # measured: 491 s on 2 cores at a load average of 9


def _prefect(env: dict[str, str], *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "prefect", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a process started in a session of its own, and everything it started."""
    import psutil

    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for member in family:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


@pytest.fixture()
def rows_pool(tmp_path: Path):
    """A server, the rows deployment on pool POOL, two workers `w1` and `w2`; yields
    (api url, {worker name: process}). Every process is killed at the end, also on failure."""
    from paravt_core.dist.launch import free_port

    home = tmp_path / "prefect-server-home"
    home.mkdir()
    url = f"http://127.0.0.1:{free_port()}/api"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": url, "PARAVT_ROOT": str(REPO),
           "PYTHONPATH": str(REPO), "PREFECT_LOGGING_TO_API_ENABLED": "true",
           "PREFECT_WORKER_HEARTBEAT_SECONDS": "2", "PREFECT_WORKER_QUERY_SECONDS": "1",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_API_BLOCKS_REGISTER_ON_START": "false"}
    log = open(tmp_path / "server.log", "w")
    processes: dict[str, subprocess.Popen] = {}
    # A row left waiting forever would hang the test: after WATCHDOG_S every process is killed,
    # and the flow fails instead.
    watchdog = threading.Timer(WATCHDOG_S, lambda: [_kill_tree(proc) for proc in list(processes.values())])
    watchdog.daemon = True
    watchdog.start()
    try:
        processes["server"] = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
             url.rsplit(":", 1)[1].split("/")[0]], env={**env, "PREFECT_API_URL": ""}, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "server.log").read_text()[-3000:]
                assert processes["server"].poll() is None, (tmp_path / "server.log").read_text()[-3000:]
                time.sleep(1)
        _prefect(env, "work-pool", "create", POOL, "--type", "process")
        # The deployment as prefect.yaml declares it, on the test's pool.
        _prefect(env, "--no-prompt", "deploy", "--name", "rl-row", "--pool", POOL)
        for name in ("w1", "w2"):
            processes[name] = subprocess.Popen(
                [sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL, "--type", "process",
                 "--limit", "1", "--name", name], cwd=tmp_path, env=env, stdout=open(tmp_path / f"{name}.log", "w"),
                stderr=subprocess.STDOUT, start_new_session=True)
        yield url, processes
    finally:
        watchdog.cancel()
        for proc in processes.values():
            _kill_tree(proc)
        log.close()


def _row_weights(out: Path) -> dict[str, str]:
    """row -> hash of its RL model's weights file (the folder's other files name its paths)."""
    from paravt_core.refs import file_hash

    return {folder.name.rsplit("-", 1)[0]: file_hash(folder / "model" / "model.safetensors")
            for folder in sorted((out / "rl").iterdir()) if (folder / "model").is_dir()}


def _rl_metrics(cfg) -> dict[str, dict[str, float]]:
    """row -> the RL run's metrics in MLflow (their last values), wall-clock ones left out. Finished
    runs only: a row killed with its worker between opening its MLflow run and recording its id in
    the run folder would leave that run RUNNING beside the attempt that finished (the window is now
    one file write, `tracking.stage_run_id`; it was the params' logging and any wait on the locked
    database, where a retry also opened a second run)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(cfg.mlflow_uri())
    experiment = client.get_experiment_by_name(cfg.mlflow.experiment)
    runs = [run for run in client.search_runs([experiment.experiment_id], "tags.stage = 'rl'")
            if run.info.status == "FINISHED"]
    metrics = {run.data.tags["ablation_row"]: {k: v for k, v in run.data.metrics.items() if not k.startswith("time_")}
               for run in runs}
    assert len(metrics) == len(runs), "one finished RL run a row"
    return metrics


def _kill_first_row_worker(url: str, processes: dict, killed: list) -> None:
    """Once both rows run, each on its worker, SIGKILL the worker (and its row) that took the
    first, a few seconds into it."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: url}), get_client(sync_client=True) as client:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not killed:
            running = [run for run in client.read_flow_runs() if run.state and run.state.is_running()
                       and (run.labels or {}).get("prefect.worker.name") in ("w1", "w2")]
            if len(running) == 2:
                time.sleep(3)
                victim = running[0].labels["prefect.worker.name"]
                _kill_tree(processes[victim])
                killed.append((victim, running[0].id))
            time.sleep(0.5)


@contextlib.contextmanager
def _drained_on_exit():
    """Flush Prefect's process-wide log and event senders while this test's server still runs.

    Flows run here in the test process send their logs and events through background workers
    that are one per process and per API; the one for this test's server outlives the test.
    Left alone, the session's Prefect harness drains every such worker at its teardown, after
    this server is gone, and waits on it without end (seen: the whole suite hung there)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    try:
        yield
    finally:
        APILogWorker.drain_all(timeout=60)
        EventsWorker.drain_all(timeout=60)


def test_rows_run_on_two_workers_survive_a_killed_worker_and_match_the_rows_run_in_process(rows_pool, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.ablations import AblationParams, ablations
    url, processes = rows_pool
    common = ["eval.splits=[videomme]", "run.fanout.threads_per_run=1"]
    params = {out: AblationParams(config_path=str(REPO / "conf/pipeline/tiny.yaml"), rows=["paragrpo", "vanilla_grpo"],
                                  sequential_eval=False, overrides=[*fast_overrides(tmp_path / out), *common, *extra])
              for out, extra in (("in_process", []),
                                 ("pooled", ["run.fanout.runner=work_pool", f"run.fanout.work_pool={POOL}"]))}
    killed: list = []
    with temporary_settings({PREFECT_API_URL: url}), _drained_on_exit():
        in_process = ablations(params["in_process"], return_state=True)
        assert in_process.is_completed(), in_process.message
        killer = threading.Thread(target=_kill_first_row_worker, args=(url, processes, killed), daemon=True)
        killer.start()
        pooled = ablations(params["pooled"], return_state=True)
        killer.join(timeout=5)
        assert pooled.is_completed(), pooled.message
        with get_client(sync_client=True) as client:
            parent = pooled.state_details.flow_run_id
            rows = [run for run in client.read_flow_runs() if run.deployment_id is not None]
            links = {run.id: client.read_task_run(run.parent_task_run_id).flow_run_id for run in rows}

    # Each row's flow run is linked under the parent (a task run of the parent's), and the first
    # attempts of the two rows ran at once on the two workers.
    assert len(rows) == 3 and set(links.values()) == {parent}, links
    assert killed, "no moment with both rows running on the two workers"
    victim, victim_run = killed[0]
    first = {run.id: run for run in rows}[victim_run]
    other = next(run for run in rows if run.name != first.name)
    assert {first.labels["prefect.worker.name"], other.labels["prefect.worker.name"]} == {"w1", "w2"}
    assert first.start_time < other.end_time and other.start_time < (first.end_time or first.state.timestamp)
    # The killed row was marked crashed, naming its worker, and ran again to completion on the other.
    assert first.state.is_crashed() and f"worker {victim}" in first.state.message
    again = next(run for run in rows if run.name == first.name and run.id != first.id)
    assert again.state.is_completed() and again.labels["prefect.worker.name"] != victim

    # Same rows, same results: the evaluation table, the weights and the RL runs' metrics in MLflow.
    assert pooled.result() == in_process.result()
    assert _row_weights(tmp_path / "pooled") == _row_weights(tmp_path / "in_process") != {}
    assert _rl_metrics(params["pooled"].load()) == _rl_metrics(params["in_process"].load()) != {}
