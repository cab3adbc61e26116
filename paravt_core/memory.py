"""Per-rank memory accounting for the trainers: parameter bytes held, peak host and device memory.

Each rank writes `memory/rank<N>.json` in the run folder and prints one line, so a run that
runs out of memory shows which rank was closest, and a ZeRO-3 run shows that each rank
holds only its slice of the weights.
"""

from __future__ import annotations

import json
import resource
from pathlib import Path
from typing import Any

import torch

from paravt_core.atomic import atomic_write_text


def parameter_bytes(model: torch.nn.Module) -> tuple[int, int]:
    """(bytes of parameter storage this rank holds, bytes of the whole model's parameters).

    A ZeRO-3 parameter keeps its slice in `ds_tensor` and its full size in `ds_numel`; the
    `data` of a parameter not gathered at the moment is empty.
    """
    local = total = 0
    for param in model.parameters():
        if hasattr(param, "ds_tensor"):
            local += param.ds_tensor.numel() * param.ds_tensor.element_size() + param.data.numel() * param.element_size()
            total += param.ds_numel * param.ds_tensor.element_size()
        else:
            size = param.numel() * param.element_size()
            local += size
            total += size
    return local, total


def peak_memory(device: str) -> dict[str, int | None]:
    """Peak resident host memory of this process and peak device memory allocated by torch (None on CPU)."""
    # Linux reports ru_maxrss in KiB.
    host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    on_gpu = device.startswith("cuda")
    return {"peak_host_rss_bytes": host,
            "peak_device_bytes": int(torch.cuda.max_memory_allocated(device)) if on_gpu else None}


def record_memory(out_dir: Path, stage: str, when: str, rank: int, world: int, device: str,
                  model: torch.nn.Module, **extra: Any) -> dict[str, Any]:
    """Append this rank's figures under `when` to `out_dir/memory/rank<N>.json` and print them."""
    local, total = parameter_bytes(model)
    row = {"when": when, "rank": rank, "world": world, "device": device, "param_bytes_local": local,
           "param_bytes_total": total, **peak_memory(device), **extra}
    path = out_dir / "memory" / f"rank{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = json.loads(path.read_text()) if path.is_file() else []
    atomic_write_text(path, json.dumps([*rows, row], indent=2))
    gib = 2**30
    device_peak = row["peak_device_bytes"]
    print(f"[{stage} memory] rank {rank}/{world} {when}: parameters {local / gib:.3f} of {total / gib:.3f} GiB held, "
          f"peak host RSS {row['peak_host_rss_bytes'] / gib:.2f} GiB"
          + (f", peak device {device_peak / gib:.2f} GiB" if device_peak is not None else ""), flush=True)
    return row
