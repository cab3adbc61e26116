"""Rank start-up (issue #45 item 2): DeepSpeed ranks forked from the fork server
(paravt_core/forkserver.py) against ranks started as subprocesses, on this machine.

Each launch is `dist.launch.launch_workers` of a 2-rank script that does what every training rank
does before its first step: imports torch, DeepSpeed, transformers' Qwen3-VL code and MLflow,
joins the process group and all-reduces one tensor. The two modes alternate launch by launch,
so a machine loaded by others loads both. Printed: wall and CPU seconds per launch (CPU of
the ranks: reaped children for subprocesses, the server's report for forked ranks), their
ratio, and the server's own one-time start (its imports), with the number of launches after
which it has paid for itself.

Run: .venv/bin/python bench/rank_start.py [--launches 4]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RANK = """
import torch, deepspeed, mlflow
import torch.distributed as dist
from transformers.models.qwen3_vl import modeling_qwen3_vl
from paravt_core.dist.rank import init_distributed, shutdown_distributed
init_distributed()
x = torch.ones(4)
dist.all_reduce(x)
assert float(x[0]) == dist.get_world_size()
shutdown_distributed()
"""


def children_cpu() -> float:
    from paravt_core.forkserver import forked_cpu_seconds

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime + forked_cpu_seconds()


def one_launch(script: Path) -> tuple[float, float]:
    from paravt_core.dist.launch import launch_workers

    t0, c0 = time.perf_counter(), children_cpu()
    launch_workers(script, [], 2, log_line=lambda _: None, env={"PYTHONPATH": str(REPO)}, timeout_s=600,
                   threads_per_rank=1)
    return time.perf_counter() - t0, children_cpu() - c0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=4, help="launches per mode")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    os.environ["OMP_NUM_THREADS"] = "1"  # the ranks' (threads_per_rank), so the server's too
    from paravt_core import forkserver

    with tempfile.TemporaryDirectory(prefix="rank-start-") as folder:
        script = Path(folder) / "rank.py"
        script.write_text(RANK)
        t0, c0 = time.perf_counter(), children_cpu()
        server = forkserver.start(Path(folder) / "ranks.sock")
        start_wall = time.perf_counter() - t0
        times: dict[str, list[tuple[float, float]]] = {"subprocess": [], "forked": []}
        try:
            for i in range(args.launches):
                for mode in ("subprocess", "forked"):
                    if mode == "forked":
                        os.environ[forkserver.SOCKET_ENV] = str(server.socket_path)
                    else:
                        os.environ.pop(forkserver.SOCKET_ENV, None)
                    times[mode].append(one_launch(script))
                    print(f"launch {i + 1}/{args.launches} {mode}: {times[mode][-1][0]:.2f} s wall, "
                          f"{times[mode][-1][1]:.2f} CPU s", flush=True)
        finally:
            os.environ.pop(forkserver.SOCKET_ENV, None)
            server.stop()
        # The server is this process's child, reaped at stop: its usage then holds its own CPU
        # (the imports) and its reaped children's, the forked ranks already counted once.
        forked_cpu = sum(cpu for _, cpu in times["forked"])
        start_cpu = children_cpu() - c0 - sum(cpu for _, cpu in times["subprocess"]) - 2 * forked_cpu
    wall = {mode: statistics.median(w for w, _ in rows) for mode, rows in times.items()}
    cpu = {mode: statistics.median(c for _, c in rows) for mode, rows in times.items()}
    print(f"\n2-rank launch, median of {args.launches} (load average {os.getloadavg()[0]:.1f}):")
    print("| measure | subprocess ranks | forked ranks | ratio |")
    print("|---|---|---|---|")
    print(f"| wall s | {wall['subprocess']:.2f} | {wall['forked']:.2f} | {wall['subprocess'] / wall['forked']:.1f}x |")
    print(f"| CPU s | {cpu['subprocess']:.2f} | {cpu['forked']:.2f} | {cpu['subprocess'] / cpu['forked']:.1f}x |")
    saved = cpu["subprocess"] - cpu["forked"]
    print(f"server start: {start_wall:.1f} s wall, {start_cpu:.1f} CPU s once; paid back after "
          f"{start_cpu / saved:.1f} launches" if saved > 0 else "server start: never paid back")
    return 0


if __name__ == "__main__":
    sys.exit(main())
