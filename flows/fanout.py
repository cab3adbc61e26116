"""RL rows fanned out over Prefect (issue #45 item 5; docs/scale.md, "Fanning out RL rows").

`fan_out` submits each row's unit of work (its RL run, then its evaluations; in the
reproduction also the SFT model's evaluations, flows/reproduce.py) as one task, the
`fanned-out` task, to a `ThreadPoolTaskRunner` of `run.fanout.max_concurrent` threads, and
hands back the results in the order the rows were given, so a report built from them is the
same whichever row finished first. With `max_concurrent: 1` the rows run one after the
other, in order, as the flows did before.

What makes two rows safe to run at once in one process: each row writes its own run folder
(`rl/<row>-<key>`) and evaluation folders (keyed by its model's hash); its MLflow runs are
addressed by id through `MlflowClient` (no fluent active run, which MLflow keeps per thread
anyway) with busy retries on SQLite; its DeepSpeed launch gets a rendezvous folder and a
master port of its own (`dist.launch.launch_workers`); the output-directory lock is the flow's,
re-entrant within the process; the flow's progress record is written from the flow's own
thread, in row order, as each row's result is gathered.

The thread budget (`run.fanout.threads_per_run`) reaches the RL ranks as OMP_NUM_THREADS
(`rl.stage.threads_per_rank`) and the row's in-process evaluations through
`torch.set_num_threads` in the row's thread: torch keeps that count per calling thread, so
one row's setting leaves the other rows' and the flow's own alone.

With `run.fanout.runner: work_pool` (issue #66; docs/scale.md "Rows on a cluster") each RL row
that comes with a `RowSpec` is instead a flow run of the `paravt/rl-row` deployment
(flows/rl_row.py), taken by whichever worker of `run.fanout.work_pool` is free (one per node,
`--limit 1`); its `fanned-out` task here submits it with `run_deployment`, so the row's run is
linked under the parent in the UI, and waits. A row whose flow run fails (after the row flow's
own retries) raises naming the row and its worker; one whose worker stops heart-beating (a
node lost) is marked crashed and submitted again, once, for another worker to resume from its
checkpoint. The jobs without a spec (the reproduction's SFT measurements) stay in this
process, at most `max_concurrent` at once.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, TypeVar

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel, ConfigDict

from paravt_core.atomic import atomic_write_text
from paravt_core.config import FanoutConfig, PipelineConfig, load_config
from paravt_core.data.stage import DataBundle
from paravt_core.job_tally import JobTally
from paravt_core.refs import ArtifactRef

T = TypeVar("T")

ROW_DEPLOYMENT = "paravt/rl-row"
POLL_S = 2.0  # how often the parent reads a row's flow run and its worker's heartbeat
LOST_ROW_RESUBMITS = 1  # a row whose worker went away runs once more, on another worker
HEARTBEATS_MISSED = 3  # as Prefect's server: a worker this many heartbeats late is offline
# ... and never sooner than this: marking a live worker's row crashed would start the row twice,
# and a loaded node's heartbeats were measured 3 s late at a 1 s interval (2 cores, load 8).
LOST_AFTER_S = 30.0


class RowSpec(BaseModel):
    """One RL row as the `paravt/rl-row` deployment rebuilds it on a worker: JSON, so it travels
    as a flow run parameter. `job` names the flow whose row it is (ablations or reproduce);
    `config_hash` is the parent's row config's `section_hash()`, which the worker's must equal
    (the same checkout and config files: the same cache keys); `shared_check` is a file the
    parent wrote under run.output_dir, which the worker must see (the shared location)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job: Literal["ablation", "reproduce"]
    label: str
    config_path: str
    overrides: list[str]
    rl_row: str
    row: str
    seed: int | None = None
    sequential_eval: bool = False
    sft_model: ArtifactRef
    data: DataBundle
    config_hash: str
    shared_check: str = ""

    def config(self) -> PipelineConfig:
        return load_config(self.config_path, self.overrides, self.rl_row)


def row_spec(job: Literal["ablation", "reproduce"], row: str, config_path: str, overrides: list[str],
             rl_row: Path, sft_model: ArtifactRef, data: DataBundle, seed: int | None = None,
             sequential_eval: bool = False, build: str | None = None) -> RowSpec:
    """The spec of one row, its config loaded now (a bad row file fails before any row runs);
    `build`: the SFT build it starts from, where the reproduction trains several (its label's)."""
    label = row if seed is None else f"{row} seed {seed}"
    label += "" if build is None else f" ({build})"
    cfg = load_config(config_path, overrides, rl_row)
    return RowSpec(job=job, label=label, config_path=str(config_path), overrides=list(overrides), rl_row=str(rl_row),
                   row=row, seed=seed, sequential_eval=sequential_eval, sft_model=sft_model, data=data,
                   config_hash=cfg.section_hash())


class RowFailed(RuntimeError):
    """A row submitted to the work pool did not complete; the message names the row and worker."""


# Not cached and not retried itself: the tasks it chains (rl, eval-checkpoint, eval-log) are,
# so a re-run finds a finished row in their caches and a failed one resumes from its checkpoint.
@task(name="fanned-out", cache_policy=NO_CACHE)
def run_row(work: Callable[[], T], label: str, threads: int | None) -> T:
    """One job (`work`: a row's RL run and evaluations, or one of the reproduction's SFT-model
    measurements), on `threads` torch threads in this thread."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    return work()


def check_fanout_fits(fanout: FanoutConfig) -> None:
    """Refuse rows at once where a CUDA device is visible: `dist.launch.launch_workers` puts every
    run's ranks on GPUs 0..N-1 (as the DeepSpeed launcher did), so two rows would train (and
    serve) on the same cards."""
    if fanout.max_concurrent == 1:
        return
    import torch

    if torch.cuda.is_available():
        raise ValueError(f"run.fanout.max_concurrent={fanout.max_concurrent} runs RL rows at once, but each row's "
                         "ranks take GPUs 0..N-1 of this machine, so they would share cards: set "
                         "run.fanout.max_concurrent=1 here (rows at once are for CPU runs, docs/scale.md "
                         "\"Fanning out RL rows\")")


def fan_out(rows: Sequence[tuple[str, Callable[[], T]] | tuple[str, Callable[[], T], RowSpec]],
            fanout: FanoutConfig, gathered: Callable[[str, T], None] = lambda label, result: None,
            clock: Callable[[], float] = time.monotonic) -> list[T]:
    """Run each `(label, work)` (or `(label, work, spec)`) as a `fanned-out` task, at most
    `fanout.max_concurrent` at once; with `fanout.runner: work_pool` a job with a spec is its
    `paravt/rl-row` flow run instead (`work` is then not called here) and all of those wait at once.

    Returns the results in the order of `rows`; `gathered(label, result)` is called in that
    order, from the caller's thread, as each becomes available. A row that fails raises here
    once the rows before it are gathered; rows not yet started are cancelled and the flow
    waits for the running ones to end (none is left training behind it). `clock` times the jobs
    for the progress lines (a `RunClock.running_now` leaves the process's stops out).
    """
    pooled = fanout.runner == "work_pool"
    # One line per job as it ends, in any order: how many are done and about how long the rest
    # take (not estimated where a work pool runs them: how many run at once is the pool's).
    tally = JobTally(len(rows), None if pooled else fanout.max_concurrent,
                     lambda line: get_run_logger().info("fan-out: %s", line), clock=clock)
    submitted = []
    for label, work, *spec in rows:
        if pooled and spec:
            submitted.append((label, _PoolRow(_mark_shared(spec[0]), fanout)))
        else:
            submitted.append((label, work))
    local = threading.Semaphore(fanout.max_concurrent)  # the jobs left in this process, as before
    results = []
    workers = len(submitted) if pooled else fanout.max_concurrent
    with ThreadPoolTaskRunner(max_workers=workers) as runner:
        futures = [(label, runner.submit(run_row, {
            "work": tally.timed(label, _bounded(work, local) if pooled else work), "label": label,
            "threads": fanout.threads_per_run})) for label, work in submitted]
        for label, future in futures:
            result = future.result()
            gathered(label, result)
            results.append(result)
    return results


def _bounded(work: Callable[[], T], slots: threading.Semaphore) -> Callable[[], T]:
    if isinstance(work, _PoolRow):  # waiting on a worker takes no slot here
        return work

    def bounded() -> T:
        with slots:
            return work()
    return bounded


def _mark_shared(spec: RowSpec) -> RowSpec:
    """`spec` with `shared_check`: a file written now under the row's run.output_dir, naming this
    host, that the row's worker must see (`check_shared`)."""
    out = spec.config().run.output_dir.resolve()
    mark = out / "rows" / f"shared-{socket.gethostname()}-{os.getpid()}.txt"
    atomic_write_text(mark, f"written by the flow on {socket.gethostname()} (pid {os.getpid()}) for its rows\n")
    return spec.model_copy(update={"shared_check": str(mark)})


def check_shared(spec: RowSpec, cfg: PipelineConfig) -> None:
    """On the worker, before any stage: the row's config is the parent's, and the parent's
    artifacts (its shared mark, the SFT model, the data) are reachable here. One clear error
    naming this host and what to do otherwise."""
    host = socket.gethostname()
    if cfg.section_hash() != spec.config_hash:
        raise ValueError(f"row {spec.label}: the config {spec.config_path} with its overrides and {spec.rl_row} "
                         f"loads differently on {host} than where the flow started (hash {cfg.section_hash()} != "
                         f"{spec.config_hash}): run the worker from the same checkout (git revision and conf/)")
    needed = [("run.output_dir (the shared artifact location)", Path(spec.shared_check)),
              ("the SFT model", spec.sft_model.path), ("the RL data", spec.data.rl.path),
              ("the eval data", spec.data.eval.path)]
    for what, path in needed:
        if not path.exists():
            raise FileNotFoundError(f"row {spec.label}: {what} {path} is not reachable from the worker on {host}: "
                                    "put run.output_dir on a filesystem every node mounts at the same path "
                                    "(docs/scale.md \"Rows on a cluster\")")


class _PoolRow:
    """A row's work when it runs on the work pool: submit its flow run and wait for it."""

    def __init__(self, spec: RowSpec, fanout: FanoutConfig):
        self.spec, self.fanout = spec, fanout

    def __call__(self) -> Any:
        from prefect.client.orchestration import get_client
        from prefect.deployments import run_deployment

        log = get_run_logger()
        # The row's result (pickled by Prefect) is written beside its artifacts, where this flow reads it.
        results = Path(self.spec.shared_check).parent / "results"
        with get_client(sync_client=True) as client:
            check_pool_has_workers(client, self.fanout.work_pool)
            deployment = client.read_deployment_by_name(ROW_DEPLOYMENT)
            if deployment.work_pool_name != self.fanout.work_pool:
                raise RowFailed(f"run.fanout.work_pool is {self.fanout.work_pool!r} but the {ROW_DEPLOYMENT} "
                                f"deployment sends its runs to {deployment.work_pool_name!r}: deploy it on the rows' pool "
                                f"(prefect deploy --name rl-row --pool {self.fanout.work_pool}) or set the knob")
            for attempt in range(LOST_ROW_RESUBMITS + 1):
                run = run_deployment(ROW_DEPLOYMENT, parameters={"spec": self.spec.model_dump(mode="json")},
                                     flow_run_name=f"{self.spec.label}", timeout=0,
                                     job_variables={"env": {"PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(results)}})
                log.info("row %s: flow run %s submitted to work pool %s", self.spec.label, run.name,
                         self.fanout.work_pool)
                run, lost = wait_for_row(client, run.id)
                worker = worker_text(run)
                if run.state.is_completed():
                    log.info("row %s: completed on %s", self.spec.label, worker)
                    return run.state.result()
                if not lost or attempt == LOST_ROW_RESUBMITS:
                    break
                log.warning("row %s: %s; submitting it again for another worker (it resumes from its checkpoint)",
                            self.spec.label, lost)
        why = lost or f"flow run {run.name} ended {run.state.name}: {run.state.message or 'no message'}"
        raise RowFailed(f"row {self.spec.label} did not complete on {worker}: {why}; its log is in the Prefect UI "
                        f"under flow run {run.name} ({run.id}); a re-run resumes it")


def check_pool_has_workers(client: Any, pool: str) -> None:
    """Refuse to submit rows nobody would take: the pool must exist and have a live worker."""
    from prefect.exceptions import ObjectNotFound

    try:
        client.read_work_pool(pool)
    except ObjectNotFound:
        raise RowFailed(f"run.fanout.work_pool {pool!r} does not exist: create it and start a worker on each node "
                        f"(prefect work-pool create {pool} --type process; prefect worker start --pool {pool} "
                        "--type process --limit 1), docs/scale.md \"Rows on a cluster\"") from None
    if not any(worker_alive(w) for w in client.read_workers_for_work_pool(pool)):
        raise RowFailed(f"no worker of work pool {pool!r} is alive: start one on each node (prefect worker start "
                        f"--pool {pool} --type process --limit 1), docs/scale.md \"Rows on a cluster\"")


def worker_alive(worker: Any, now: datetime | None = None) -> bool:
    """Whether `worker` heart-beat within `HEARTBEATS_MISSED` of its intervals (Prefect's own
    rule), or within `LOST_AFTER_S`, whichever is longer."""
    if worker.last_heartbeat_time is None:
        return False
    late = ((now or datetime.now(timezone.utc)) - worker.last_heartbeat_time).total_seconds()
    return late <= max(LOST_AFTER_S, HEARTBEATS_MISSED * (worker.heartbeat_interval_seconds or 30))


def worker_text(run: Any) -> str:
    """The worker that took a flow run (the label Prefect's worker gives its runs) and the pid."""
    name = (run.labels or {}).get("prefect.worker.name")
    if not name:
        return "no worker (it was never picked up)"
    pid = f", pid {run.infrastructure_pid}" if run.infrastructure_pid else ""
    return f"worker {name} of pool {run.work_pool_name}{pid}"


def wait_for_row(client: Any, run_id: Any) -> tuple[Any, str | None]:
    """Poll a row's flow run until it ends; returns it and, where its worker stopped
    heart-beating while it ran, why it was then marked crashed here (None otherwise)."""
    from prefect.states import Crashed

    while True:
        run = client.read_flow_run(run_id)
        if run.state is not None and run.state.is_final():
            return run, None
        name = (run.labels or {}).get("prefect.worker.name")
        if name and run.work_pool_name:
            alive = {w.name: worker_alive(w) for w in client.read_workers_for_work_pool(run.work_pool_name)}
            if not alive.get(name, False):
                lost = f"{worker_text(run)} stopped heart-beating while the row ran"
                client.set_flow_run_state(run_id, Crashed(message=lost), force=True)
                return client.read_flow_run(run_id), lost
        time.sleep(POLL_S)
