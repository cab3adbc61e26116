"""`model.vision_attention=batched`: one attention call per run of equal-sized frames, same numbers."""

from __future__ import annotations

import copy

import pytest
import torch

from paravt_core.model.vision_attention import apply_vision_attention, equal_length_runs, runs_of


def test_equal_length_runs_keep_order():
    assert equal_length_runs([4, 4, 4, 9, 4, 4]) == [(4, 3), (9, 1), (4, 2)]
    assert equal_length_runs([]) == []


def test_runs_are_read_back_once_per_boundary_tensor():
    """Every block of one forward gets the same `cu_seqlens`; reading its lengths is a host sync on a GPU."""
    cu = torch.tensor([0, 4, 8, 10], dtype=torch.int32)
    assert runs_of(cu) == [(4, 2), (2, 1)] and runs_of(cu) == [(4, 2), (2, 1)]
    other = torch.tensor([0, 3, 6], dtype=torch.int32)  # equal values or not, a new tensor is read anew
    assert runs_of(other) == [(3, 2)]
    lengths_read = []
    original = torch.Tensor.tolist
    try:
        torch.Tensor.tolist = lambda t: lengths_read.append(1) or original(t)
        fresh = torch.tensor([0, 5, 10], dtype=torch.int32)
        for _ in range(24):
            assert runs_of(fresh) == [(5, 2)]
    finally:
        torch.Tensor.tolist = original
    assert len(lengths_read) == 1


def _images(tiny_processor):
    """Five images, three patch counts in mixed order, so runs of 2, 1, 2 (and a singleton)."""
    sizes = [(56, 56), (56, 56), (84, 112), (56, 56), (56, 56)]
    generator = torch.Generator().manual_seed(0)
    images = [(torch.rand(3, h, w, generator=generator) * 255).to(torch.uint8) for h, w in sizes]
    out = tiny_processor.image_processor(images=images, return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


def _vision(model, pixel_values, grid):
    out = model.model.visual(pixel_values, grid_thw=grid)
    return out.pooler_output if hasattr(out, "pooler_output") else out[0]


def test_batched_vision_attention_matches_per_item(tiny_model, tiny_processor):
    pixel_values, grid = _images(tiny_processor)
    lengths = (grid[:, 0] * grid[:, 1] * grid[:, 2]).tolist()
    assert len(equal_length_runs(lengths)) == 3  # the batched path meets runs of several lengths
    stock = tiny_model.train()
    batched = copy.deepcopy(stock)
    assert apply_vision_attention(batched, "batched") == stock.config.vision_config.depth
    assert apply_vision_attention(copy.deepcopy(stock), "per_item") == 0

    a, b = _vision(stock, pixel_values, grid), _vision(batched, pixel_values, grid)
    assert a.shape == b.shape
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    # The same gradients reach the vision weights.
    (a.square().mean()).backward()
    (b.square().mean()).backward()
    for (name, p), (_, q) in zip(stock.model.visual.named_parameters(), batched.model.visual.named_parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_batched_really_batches(tiny_model, tiny_processor, monkeypatch):
    """A control: the stock path calls the attention once per image, the batched one once per run."""
    from transformers.models.qwen3_vl import modeling_qwen3_vl as qwen3_vl

    pixel_values, grid = _images(tiny_processor)
    calls: list[int] = []
    original = qwen3_vl.ALL_ATTENTION_FUNCTIONS.get_interface

    def counting(name, default):
        fn = original(name, default)

        def wrapped(module, q, *args, **kwargs):
            if isinstance(module, qwen3_vl.Qwen3VLVisionAttention):
                calls.append(q.shape[0])
            return fn(module, q, *args, **kwargs)
        return wrapped

    monkeypatch.setattr(qwen3_vl.ALL_ATTENTION_FUNCTIONS, "get_interface", counting)
    depth = tiny_model.config.vision_config.depth
    with torch.no_grad():
        _vision(tiny_model, pixel_values, grid)
        assert len(calls) == 5 * depth and set(calls) == {1}
        calls.clear()
        apply_vision_attention(tiny_model, "batched")
        _vision(tiny_model, pixel_values, grid)
    assert len(calls) == 3 * depth and sorted(set(calls)) == [1, 2]


def test_unknown_mode_is_refused(tiny_model):
    with pytest.raises(ValueError, match="vision_attention"):
        apply_vision_attention(tiny_model, "fused")
