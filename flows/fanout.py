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
master port of its own (`dist.launch_workers`); the output-directory lock is the flow's,
re-entrant within the process; the flow's progress record is written from the flow's own
thread, in row order, as each row's result is gathered.

The thread budget (`run.fanout.threads_per_run`) reaches the RL ranks as OMP_NUM_THREADS
(`rl.stage.threads_per_rank`) and the row's in-process evaluations through
`torch.set_num_threads` in the row's thread: torch keeps that count per calling thread, so
one row's setting leaves the other rows' and the flow's own alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner

from paravt_core.config import FanoutConfig

T = TypeVar("T")


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
    """Refuse rows at once where a CUDA device is visible: `dist.launch_workers` puts every
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


def fan_out(rows: Sequence[tuple[str, Callable[[], T]]], fanout: FanoutConfig,
            gathered: Callable[[str, T], None] = lambda label, result: None) -> list[T]:
    """Run each `(label, work)` as a `fanned-out` task, at most `fanout.max_concurrent` at once.

    Returns the results in the order of `rows`; `gathered(label, result)` is called in that
    order, from the caller's thread, as each becomes available. A row that fails raises here
    once the rows before it are gathered; rows not yet started are cancelled and the flow
    waits for the running ones to end (none is left training behind it).
    """
    results = []
    with ThreadPoolTaskRunner(max_workers=fanout.max_concurrent) as runner:
        futures = [(label, runner.submit(run_row, {"work": work, "label": label, "threads": fanout.threads_per_run}))
                   for label, work in rows]
        for label, future in futures:
            result = future.result()
            gathered(label, result)
            results.append(result)
    return results
