"""What every training rank does around its steps: join the process group (the rendezvous
`dist.launch` set up) and leave it, print its progress, and the tests' kill hook."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from paravt_core.dist.launch import RENDEZVOUS_FILE_ENV, release_shm_buffers

EXTENSIONS_ENV = "TORCH_EXTENSIONS_DIR"


def own_extensions_dir() -> None:
    """Keep the ops DeepSpeed builds at run time (the CPU accelerator's shm comm op, CPU Adam)
    in this virtual environment (`<venv>/torch_extensions`), unless TORCH_EXTENSIONS_DIR is set.

    torch builds them in one folder per user (~/.cache/torch_extensions/<python, cuda>/<op>),
    keyed by neither the checkout nor the venv. Two checkouts' venvs then rebuild the same op in
    turn (its include paths differ), and each build holds the folder's lock: a rank stopped in the
    middle of one (SIGSTOP, a debugger) keeps every other checkout's ranks waiting at start.
    Outside a venv, or where it is not writable, torch's folder is kept.
    """
    if EXTENSIONS_ENV in os.environ or sys.prefix == sys.base_prefix or not os.access(sys.prefix, os.W_OK):
        return
    os.environ[EXTENSIONS_ENV] = str(Path(sys.prefix) / "torch_extensions")


def maybe_kill_for_test(done_steps: int) -> None:
    """Fault injection for tests: SIGKILL this process after step PARAVT_TEST_KILL_AT_STEP.

    With PARAVT_TEST_KILL_ONCE_MARKER set, only the first time (the marker file is written
    before the kill), so a retried run resumes and finishes. A real kill: no cleanup runs.
    """
    import signal

    kill_at = int(os.environ.get("PARAVT_TEST_KILL_AT_STEP", "-1"))
    if done_steps != kill_at:
        return
    marker = os.environ.get("PARAVT_TEST_KILL_ONCE_MARKER")
    if marker:
        if Path(marker).exists():
            return
        Path(marker).write_text(str(done_steps))
    os.kill(os.getpid(), signal.SIGKILL)


class StepLog:
    """Plain progress lines (step, metrics, steps/s, ETA) when stdout is a pipe, not a terminal.

    The stage streams the workers' output into the Prefect log line by line, where a tqdm
    bar (carriage returns) would show nothing until the end.
    """

    def __init__(self, name: str, total: int, start: int, enabled: bool, every: int = 10):
        import time

        self.name, self.total, self.start, self.enabled, self.every = name, total, start, enabled, every
        self.t0 = time.perf_counter()

    def step(self, done: int, **metrics: float) -> None:
        import time

        if not self.enabled or (done % self.every and done != self.total):
            return
        rate = (done - self.start) / max(1e-9, time.perf_counter() - self.t0)
        eta = (self.total - done) / rate if rate > 0 else float("nan")
        values = " ".join(f"{k}={v:.4g}" for k, v in metrics.items())
        print(f"[{self.name}] step {done}/{self.total} {values} {rate:.2f} steps/s eta {eta:.0f}s", flush=True)


def init_distributed() -> tuple[int, int, str]:
    """(rank, world size, device) after initializing torch.distributed for this accelerator."""
    import deepspeed
    import torch
    import torch.distributed as dist

    own_extensions_dir()  # before DeepSpeed builds its comm op (`init_distributed` on CPU)
    on_gpu = torch.cuda.is_available()
    store_file = os.environ.get(RENDEZVOUS_FILE_ENV)
    if store_file:  # single node: no network listener (`dist.launch`'s docstring)
        deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo", init_method=f"file://{store_file}",
                                   rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    else:
        deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if on_gpu:
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        return rank, world, f"cuda:{local}"
    return rank, world, "cpu"


def shutdown_distributed() -> None:
    """Destroy the process group and DeepSpeed's module-level caches of its groups.

    DeepSpeed keeps the data-parallel and world groups it derived from the process group in
    `deepspeed.utils.groups` globals; a second run in the same process (the tests, a
    notebook) would otherwise hand the new engine groups of the destroyed process group
    ("Group ... is not registered").
    """
    import torch.distributed as dist

    if dist.is_initialized():
        rank = dist.get_rank()
        dist.destroy_process_group()
        # This rank's allreduce segment (SHM_BUFFER_PREFIX). launch_workers also removes the
        # segments of the ranks it started; a run inside a test or notebook has only this.
        release_shm_buffers(os.environ.get("MASTER_PORT", ""), addr=os.environ.get("MASTER_ADDR", ""), rank=rank)
    try:
        from deepspeed.utils import groups
    except ImportError:
        return
    for name in ("_WORLD_GROUP", "_DATA_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP", "_TENSOR_MODEL_PARALLEL_GROUP",
                 "_ZERO_PARAM_INTRA_PARALLEL_GROUP"):
        if hasattr(groups, name):
            setattr(groups, name, None)
    for name in ("_EXPERT_PARALLEL_GROUP", "_EXPERT_PARALLEL_GROUP_RANKS", "_EXPERT_DATA_PARALLEL_GROUP",
                 "_EXPERT_DATA_PARALLEL_GROUP_RANKS", "_ALL_TO_ALL_GROUP"):
        cached = getattr(groups, name, None)
        if isinstance(cached, dict):
            cached.clear()
