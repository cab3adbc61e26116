"""Collectives refuse tensors off the rank's device, on the gloo CPU path as on NCCL."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from paravt_core.collectives import CheckedCollectives, CollectiveDeviceError
from paravt_core.sft.worker import reduce_step_statistics


@pytest.fixture()
def gloo_group(tmp_path: Path):
    """A one-rank gloo process group (file rendezvous: no port to collide on)."""
    store = dist.FileStore(str(tmp_path / "rendezvous"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_all_reduce_of_a_tensor_on_the_rank_device_runs_on_gloo(gloo_group):
    tensor = torch.tensor([1.5, 2.0])
    assert CheckedCollectives("cpu").all_reduce(tensor).tolist() == [1.5, 2.0]


def test_a_tensor_off_the_rank_device_is_refused_before_the_backend(gloo_group, monkeypatch):
    called = []
    monkeypatch.setattr(dist, "all_reduce", lambda *a, **k: called.append(a))
    with pytest.raises(CollectiveDeviceError, match=r"all_reduce: .* lives on cpu, but this rank's collectives run on meta"):
        CheckedCollectives("meta").all_reduce(torch.zeros(3))
    assert called == []


def test_sft_step_statistics_sum_over_ranks_on_gloo(gloo_group):
    assert reduce_step_statistics(CheckedCollectives("cpu"), 0.25, 100, 2) == (0.25, 100.0, 2.0)


def test_sft_step_statistics_are_built_on_the_rank_device(gloo_group, monkeypatch):
    # A rank whose device is not the CPU (meta stands in for cuda:N here): the statistics
    # tensor must be built there, which a CPU-built tensor (the NCCL crash) fails.
    seen: list[torch.device] = []

    def record(tensor, op=None):
        seen.append(tensor.device)

    monkeypatch.setattr(dist, "all_reduce", record)
    with pytest.raises(NotImplementedError, match="meta tensor"):  # meta tensors hold no values to read back
        reduce_step_statistics(CheckedCollectives("meta"), 0.25, 100, 2)
    assert seen == [torch.device("meta")]
