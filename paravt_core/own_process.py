"""A library call in a process of its own, so the device memory it takes is returned when it ends.

The Prefect flow process runs every task of a run. A task that loads a model onto a GPU in it
keeps that memory until the run ends (PyTorch's caching allocator returns nothing to the card),
beside every later stage on the same card (#60 finding 1: the grammar check beside RL rank 0).
`call_in_own_process(target, job, work_dir)` runs `target` ("package.module:function", a
function of one JSON text returning one) in a child launched as a one-rank job by
`dist.launch.launch_workers`, the machinery that starts the SFT and RL ranks (forked from the fork
server where the tests run one, else a subprocess; its output lines streamed to `log_line`),
and returns what it returned. Run as a script, this file is that child.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path

from paravt_core.atomic import atomic_write_text
from paravt_core.dist.launch import launch_workers


def call_in_own_process(target: str, job: str, work_dir: str | Path, log_line: Callable[[str], None] = print) -> str:
    """`target(job)` in a child process; its job and result files are kept in `work_dir`.

    Raises:
        RuntimeError: the child failed (the message holds its exit code and last lines).
    """
    import torch

    work_dir = Path(work_dir).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", target)
    result = work_dir / f"{name}.result.json"
    result.unlink(missing_ok=True)  # an earlier attempt's result is not this one's
    job_file = atomic_write_text(work_dir / f"{name}.job.json",
                                 json.dumps({"target": target, "job": job, "result": str(result)}))
    # The caller's torch thread count goes with the call: a fan-out job sets it per thread
    # (`run.fanout.threads_per_run`, flows/fanout.py), and in process the call ran on it; a
    # one-rank launch would otherwise take every core (and other float reductions).
    launch_workers(Path(__file__), ["--job", str(job_file)], 1, log_line=log_line,
                   threads_per_rank=torch.get_num_threads())
    return result.read_text()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", required=True)
    parser.add_argument("--local_rank", type=int, default=0)  # launch_workers gives every rank one
    args = parser.parse_args(argv)
    # The library's log lines, which the flow process shows (PREFECT_LOGGING_EXTRA_LOGGERS), reach
    # it as output lines.
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.getLogger("paravt_core").addHandler(handler)
    logging.getLogger("paravt_core").setLevel(logging.INFO)
    spec = json.loads(Path(args.job).read_text())
    module, function = spec["target"].split(":")
    atomic_write_text(spec["result"], getattr(importlib.import_module(module), function)(spec["job"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
