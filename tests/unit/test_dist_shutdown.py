"""Two DeepSpeed runs in one process (tests, notebooks): the second must not inherit the
first one's destroyed process groups from DeepSpeed's module-level caches."""

from __future__ import annotations

import pytest
import torch

from paravt_core.dist.ds_config import deepspeed_config
from paravt_core.dist.launch import free_port
from paravt_core.dist.rank import init_distributed, shutdown_distributed


@pytest.fixture()
def single_rank_env(monkeypatch):
    for key, value in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("PARAVT_RENDEZVOUS_FILE", raising=False)


def test_a_second_deepspeed_engine_in_the_same_process_after_shutdown(single_rank_env, monkeypatch):
    import deepspeed

    for _ in range(2):
        monkeypatch.setenv("MASTER_PORT", str(free_port()))
        try:
            init_distributed()
            model = torch.nn.Linear(4, 2)
            config = deepspeed_config(micro_batch=1, grad_accum=1, zero_stage=0, grad_clip=1.0, bf16=False)
            engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                              config=config)
            loss = engine(torch.ones(1, 4)).sum()
            engine.backward(loss)
            engine.step()
        finally:
            shutdown_distributed()
    assert not torch.distributed.is_initialized()
