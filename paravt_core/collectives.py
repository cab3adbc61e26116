"""Collectives that refuse tensors off the rank's device.

NCCL reduces only CUDA tensors and gloo only CPU ones, so a tensor built on the wrong
device fails on the GPU path alone ("No backend type associated with device type cpu")
while every CPU test passes. Our trainers hand their tensors to collectives through
`CheckedCollectives`, which names the collective, the tensor's device and the rank's
device before the backend sees the tensor: the same mistake then fails on the gloo CPU
path too (`tests/unit/test_collectives.py`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class CollectiveDeviceError(RuntimeError):
    """A tensor handed to a collective does not live on the rank's device."""


class CheckedCollectives:
    """The collectives the trainers call, on one rank whose tensors live on `device`."""

    def __init__(self, device: str | torch.device):
        self.device = torch.device(device)

    def require_on_device(self, collective: str, tensor: torch.Tensor) -> None:
        if not _same_device(tensor.device, self.device):
            raise CollectiveDeviceError(
                f"{collective}: a tensor of shape {tuple(tensor.shape)} lives on {tensor.device}, but this rank's "
                f"collectives run on {self.device}; build it with device=... (or .to(device)) first")

    def all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
        """In-place sum (or `op`) over ranks; returns `tensor`."""
        self.require_on_device("all_reduce", tensor)
        dist.all_reduce(tensor, op=op)
        return tensor


def _same_device(actual: torch.device, expected: torch.device) -> bool:
    if actual.type != expected.type:
        return False
    # "cuda" (no index) means the current device, which init_distributed set to the rank's.
    if actual.type == "cuda" and (actual.index is None or expected.index is None):
        current = torch.cuda.current_device()
        return (actual.index if actual.index is not None else current) == (
            expected.index if expected.index is not None else current)
    return actual.index == expected.index
