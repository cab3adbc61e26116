"""ZeRO-3 partitioned construction on CPU: the policy and reference loading path of the trainers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from paravt_core.config import load_config
from paravt_core.dist.rank import shutdown_distributed

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def one_rank_group(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "rendezvous"), 1), rank=0, world_size=1)
    yield
    shutdown_distributed()


def test_zero3_reference_engine_matches_the_whole_model(one_rank_group, tiny_model_dir: Path):
    import deepspeed
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    from paravt_core.dist.ds_config import rl_deepspeed_config
    from paravt_core.memory import parameter_bytes
    from paravt_core.model.loading import load_model

    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", ["rl.zero_stage=3"])
    zero3 = rl_deepspeed_config(cfg, on_gpu=False)
    built = load_model(tiny_model_dir, zero3_config=zero3)
    assert all(hasattr(p, "ds_id") for p in built.parameters()), "not constructed under zero.Init"
    assert not is_deepspeed_zero3_enabled(), "the ZeRO-3 registration leaked past loading"
    whole = load_model(tiny_model_dir).eval()
    assert not any(hasattr(p, "ds_id") for p in whole.parameters())
    assert parameter_bytes(built)[1] == parameter_bytes(whole)[1]

    # The trainer's reference under ZeRO-3: its own engine with no optimizer.
    engine, _, _, _ = deepspeed.initialize(model=built, config=zero3)
    engine.eval()
    ids = torch.tensor([[1, 5, 9, 42, 7]])
    with torch.no_grad():
        torch.testing.assert_close(engine(input_ids=ids).logits, whole(input_ids=ids).logits)
