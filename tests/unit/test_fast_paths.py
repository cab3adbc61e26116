"""`model.vision_dedupe`, `model.patch_embed`, `model.prefill_attention` (paravt_core/model/fast_paths.py)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from paravt_core.model import fast_paths
from paravt_core.model.fast_paths import (
    apply_patch_embed,
    apply_prefill_attention,
    apply_vision_dedupe,
    causal_rows_attention,
    distinct_items,
    left_padding_of,
)


def _frames(tiny_processor, order: list[int]):
    """Frames drawn from three distinct images in `order` (repeats allowed), processed as one batch."""
    generator = torch.Generator().manual_seed(0)
    images = [(torch.rand(3, 56, 56, generator=generator) * 255).to(torch.uint8) for _ in range(3)]
    out = tiny_processor.image_processor(images=[images[i] for i in order], return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


def test_distinct_items_match_exactly_not_by_sum():
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    b = torch.tensor([[4.0, 3.0], [2.0, 1.0]])  # same sum and grid as `a`, other pixels
    pixels = torch.cat([a, b, a, a])
    grid = torch.tensor([[1, 1, 2]] * 4)
    assert distinct_items(pixels, grid) == ([0, 1], [0, 1, 0, 0])
    other_grid = torch.tensor([[1, 1, 2], [1, 2, 1], [1, 1, 2], [1, 2, 1]])  # the last `a` has another shape
    assert distinct_items(pixels, other_grid) == ([0, 1, 3], [0, 1, 0, 2])


def test_vision_dedupe_gives_the_same_bits_and_runs_each_frame_once(tiny_model, tiny_processor, monkeypatch):
    order = [0, 1, 0, 2, 1, 0]
    pixels, grid = _frames(tiny_processor, order)
    stock = tiny_model.eval()
    assert stock.model._paravt_vision_dedupe == "no_grad"  # load_model's default
    assert not apply_vision_dedupe(stock, "never") and not hasattr(stock.model, "_paravt_vision_dedupe")
    deduped = copy.deepcopy(stock)
    assert apply_vision_dedupe(deduped, "no_grad")
    seen: list[int] = []
    visual_forward = type(deduped.model.visual).forward
    monkeypatch.setattr(type(deduped.model.visual), "forward",
                        lambda self, x, **kw: seen.append(kw["grid_thw"].shape[0]) or visual_forward(self, x, **kw))
    with torch.no_grad():
        want = stock.model.get_image_features(pixels, grid, return_dict=True)
        got = deduped.model.get_image_features(pixels, grid, return_dict=True)
    assert seen == [len(order), 3]  # the stock model saw six frames, the deduped one three
    assert len(got.pooler_output) == len(order)
    for a, b in zip(got.pooler_output, want.pooler_output):
        assert torch.equal(a, b)
    for feature_got, feature_want in zip(got.deepstack_features, want.deepstack_features):
        assert all(torch.equal(a, b) for a, b in zip(feature_got, feature_want))
    assert torch.equal(got.last_hidden_state, want.last_hidden_state)


def test_vision_dedupe_under_autograd_only_when_always(tiny_model, tiny_processor):
    pixels, grid = _frames(tiny_processor, [0, 1, 0, 1])
    stock = tiny_model.train()
    apply_vision_dedupe(stock, "never")
    no_grad, always = copy.deepcopy(stock), copy.deepcopy(stock)
    apply_vision_dedupe(no_grad, "no_grad")
    apply_vision_dedupe(always, "always")

    def grads(model):
        out = model.model.get_image_features(pixels, grid, return_dict=True)
        torch.cat(out.pooler_output).square().mean().backward()
        return {name: p.grad for name, p in model.model.visual.named_parameters() if p.grad is not None}

    want, same, close = grads(stock), grads(no_grad), grads(always)
    for name, grad in want.items():
        assert torch.equal(same[name], grad), name  # no_grad leaves the update's passes alone
        torch.testing.assert_close(close[name], grad, rtol=1e-4, atol=1e-7, msg=name)


def test_patch_embed_as_one_product(tiny_model, tiny_processor):
    pixels, grid = _frames(tiny_processor, [0, 1, 2])
    stock = tiny_model.eval()
    linear = copy.deepcopy(stock)
    assert apply_patch_embed(linear, "linear") == 1
    assert apply_patch_embed(copy.deepcopy(stock), "conv") == 0
    with torch.no_grad():
        want = stock.model.visual.patch_embed(pixels)
        got = linear.model.visual.patch_embed(pixels)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def _left_padded_mask(pads: list[int], length: int) -> torch.Tensor:
    positions = torch.arange(length)
    causal = positions[:, None] >= positions[None, :]
    real = positions[None, :] >= torch.tensor(pads)[:, None]
    return (causal[None] & real[:, None, :] & real[:, :, None])[:, None]  # [B, 1, L, L]


def test_left_padding_is_read_only_from_a_causal_left_padded_mask():
    mask = _left_padded_mask([0, 3, 5], 8)
    assert left_padding_of(mask) == [0, 3, 5]
    assert left_padding_of(mask.clone().fill_(True)) is None  # bidirectional
    shifted = mask.clone()
    shifted[1, 0, 6, 2] = True  # a padding key visible to one query
    assert left_padding_of(shifted) is None
    assert left_padding_of(mask.float()) is None  # an additive mask: not ours to read


def test_causal_rows_attention_equals_the_masked_kernel_on_real_tokens():
    generator = torch.Generator().manual_seed(0)
    pads, length = [0, 4, 9], 24
    query = torch.randn(3, 4, length, 8, generator=generator)
    key, value = (torch.randn(3, 2, length, 8, generator=generator) for _ in range(2))
    mask = _left_padded_mask(pads, length)
    want = F.scaled_dot_product_attention(query, key.repeat_interleave(2, 1), value.repeat_interleave(2, 1),
                                          attn_mask=mask, scale=0.3).transpose(1, 2)  # [B, L, H, D]
    got = causal_rows_attention(query, key, value, pads, 0.3, n_rep=2)
    assert got.shape == want.shape
    for row, pad in enumerate(pads):
        torch.testing.assert_close(got[row, pad:], want[row, pad:], rtol=1e-5, atol=1e-6)
        assert not got[row, :pad].any()
    assert not causal_rows_attention(query, key, value, [length] * 3, 0.3, n_rep=2).any()  # padding only


def test_causal_rows_teacher_forced_logprobs_match_the_masked_path(tiny_model):
    """The whole text model on a left-padded batch: every real position's log-probs within 1e-5."""
    from paravt_core.model.logprobs import teacher_forced_logprobs

    generator = torch.Generator().manual_seed(1)
    vocab = 700  # below the tiny tokenizer's special tokens
    lengths = [12, 20, 7]
    ids = torch.full((3, 20), 0, dtype=torch.long)
    attention = torch.zeros((3, 20), dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, 20 - n:] = torch.randint(0, vocab, (n,), generator=generator)
        attention[row, 20 - n:] = 1
    inputs = {"input_ids": ids, "attention_mask": attention, "mm_token_type_ids": torch.zeros_like(ids)}
    stock = tiny_model.eval()
    rows = copy.deepcopy(stock)
    assert apply_prefill_attention(rows, "causal_rows") == stock.config.text_config.num_hidden_layers
    with torch.no_grad():
        want = teacher_forced_logprobs(stock, inputs, 1.0)
        got = teacher_forced_logprobs(rows, inputs, 1.0)
    real = attention.bool()
    real[:, :-1] &= real[:, 1:]  # a prediction needs its own and the next token real
    torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("apply, knob", [(apply_vision_dedupe, "vision_dedupe"), (apply_patch_embed, "patch_embed"),
                                         (apply_prefill_attention, "prefill_attention")])
def test_unknown_modes_are_refused(tiny_model, apply, knob):
    with pytest.raises(ValueError, match=knob):
        apply(tiny_model, "fused")


def test_load_model_applies_the_switches(tiny_model_dir):
    from paravt_core.model.loading import load_model

    model = load_model(tiny_model_dir, vision_dedupe="always", patch_embed="linear", prefill_attention="causal_rows")
    assert model.model._paravt_vision_dedupe == "always"
    assert getattr(model.model.visual.patch_embed.proj.forward, "__func__", None) is fast_paths._linear_patch_embed
    attention = model.model.language_model.layers[0].self_attn
    assert getattr(attention.forward, "__func__", None) is fast_paths._causal_rows_text_forward
    plain = load_model(tiny_model_dir, vision_dedupe="never")
    assert not hasattr(plain.model, "_paravt_vision_dedupe")
