"""torch.profiler's table of one training step, read as: where does the step's wall time go?

(Not named profile.py: the worker runs as a script from this folder, where that name would
shadow the standard library's `profile`, which cProfile and so torch._dynamo import.)

The header says how much of the wall time the device's kernels ran (on a CPU run: the
operators' own CPU time) and how many aten operator calls the step made: a step whose kernels
run for a small share of its wall time is waiting on the host (launches, copies, syncs), not
on arithmetic (docs/gpu_check.md's profiles). Used by the SFT worker (`SFTJob.profile_to`) and
by bench/sft_gpu.py's stock micro-step.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def profiled(fn: Callable[[], object], on_gpu: bool, rows: int = 25) -> str:
    """Run `fn` once under torch.profiler; its table sorted by own device (else CPU) time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        if on_gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if on_gpu:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    averages = prof.key_averages()
    key = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    # Kernels only: an operator's row repeats the device time of the kernels it launched.
    kernels = [e for e in averages if e.device_type == (DeviceType.CUDA if on_gpu else DeviceType.CPU)]
    busy_s = sum(getattr(e, key, 0) for e in kernels) / 1e6
    operators = sum(e.count for e in averages if e.device_type == DeviceType.CPU and e.key.startswith("aten::"))
    head = (f"one call under the profiler: wall {wall:.3f} s, {'device' if on_gpu else 'CPU operators'} busy "
            f"{busy_s:.3f} s ({100 * busy_s / wall:.0f} % of wall), {operators} aten operator calls\n")
    return head + averages.table(sort_by=key, row_limit=rows)
