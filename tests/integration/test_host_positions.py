"""`sft.host_positions` (model/positions.py): the batch's position tensors computed on the host are the
ones the forward would build, and the forward then builds none."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers.models.qwen3_vl.modeling_qwen3_vl as qwen3_vl

from paravt_core.model.loading import load_model
from paravt_core.model.positions import HostPositions
from paravt_core.sft.encode import model_batch
from paravt_core.sft.loss import micro_batch_loss

from test_sft_packing import samples  # noqa: F401  (a fixture: two samples, 4 and 2 frames of other sizes)

pytestmark = pytest.mark.integration


def _loss_and_grads(model_dir: Path, batch: dict, impl: str, forbid_own_positions: bool, monkeypatch):
    model = load_model(model_dir)
    model.train()
    with monkeypatch.context() as m:
        if forbid_own_positions:
            def refuse(*args, **kwargs):
                raise AssertionError("the forward computed positions it was given")

            m.setattr(model.model, "get_rope_index", refuse)
            for name in ("get_vision_position_ids", "get_vision_interpolation_indices_and_weights",
                         "get_vision_attention_seqlens"):
                original = getattr(qwen3_vl, name)

                def given_only(*args, _original=original, _name=name, **kwargs):
                    keys = {"get_vision_position_ids": ["position_ids"], "get_vision_attention_seqlens": ["cu_seqlens"],
                            "get_vision_interpolation_indices_and_weights": ["interp_indices", "interp_weights"]}[_name]
                    assert all(k in (kwargs.get("kwargs") or {}) for k in keys), f"{_name} computed {keys} itself"
                    return _original(*args, **kwargs)

                m.setattr(qwen3_vl, name, given_only)
        loss = micro_batch_loss(model, batch, impl, chunk_size=7)
        loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("impl", ["logits", "chunked"])
def test_host_positions_keep_loss_and_gradients(tiny_model_dir: Path, tiny_processor, samples, packing: bool,
                                                impl: str, monkeypatch):
    pad = tiny_processor.tokenizer.pad_token_id
    model = load_model(tiny_model_dir)
    rope_index = model.model.get_rope_index
    plain = model_batch(samples, pad_id=pad, rope_index=rope_index, packing=packing, positions=None)
    hosted = model_batch(samples, pad_id=pad, rope_index=rope_index, packing=packing,
                         positions=HostPositions.of(model))
    added = set(hosted) - set(plain)
    assert {"image_position_ids", "image_interp_indices", "image_interp_weights", "image_cu_seqlens"} <= added
    assert ("position_ids" in added) == (not packing)  # a packed batch already carries its own
    assert all(v.device.type == "cpu" for v in hosted.values())
    loss, grads = _loss_and_grads(tiny_model_dir, plain, impl, False, monkeypatch)
    hosted_loss, hosted_grads = _loss_and_grads(tiny_model_dir, hosted, impl, True, monkeypatch)
    assert hosted_loss == pytest.approx(loss, abs=1e-6)
    assert set(grads) == set(hosted_grads)
    for name, grad in grads.items():
        torch.testing.assert_close(hosted_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_the_forward_reads_the_given_vision_tables(tiny_model, tiny_processor, samples):
    """The control: other interpolation weights than the true ones change the output, so the
    forward uses the given tensors rather than silently computing its own."""
    tiny_model.eval()
    pad = tiny_processor.tokenizer.pad_token_id
    batch = model_batch(samples, pad_id=pad, rope_index=tiny_model.model.get_rope_index, packing=False,
                        positions=HostPositions.of(tiny_model))
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        true = tiny_model(**inputs, use_cache=False).logits
        inputs["image_interp_weights"] = torch.full_like(inputs["image_interp_weights"], 0.25)
        flat = tiny_model(**inputs, use_cache=False).logits
    assert (true - flat).abs().max() > 1e-4


def test_host_positions_refuse_another_layout():
    with pytest.raises(TypeError, match="sft.host_positions=false"):
        HostPositions.of(torch.nn.Linear(2, 2))
