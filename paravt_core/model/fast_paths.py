"""Faster ways to run parts of a loaded Qwen3-VL on CPU (issue #45 item 3, docs/speed.md).

Three switches, each set by a `model.*` knob and applied by `load_model` wherever a stage
loads its model (RL policy, reference and hf rollout engine, `rl-replay`, the hf evaluator):

- `model.vision_dedupe` (`never`, `no_grad`, `always`): a forward whose batch holds the same
  frame more than once (the G rollouts of a prompt share its overview frames, SPEC §3;
  sub-agents given the same crop share its frames) runs the vision tower once per distinct frame
  and hands every copy the same features. Frames are matched exactly (same grid, same
  pixels, `torch.equal`), never by a hash alone. The tower works on each frame separately
  (per-patch layers, attention within the frame), so a distinct frame gets the same numbers
  as in the full batch and the forward is bit for bit the same (tested). Under autograd the
  copies' gradients are summed before the tower's backward instead of after it: the same
  gradient up to float summation order, hence `always` is a choice and `no_grad` (the
  rollout's prefills, the reference pass, evaluation) the default. (Shown on CPU; on a GPU
  a product over fewer rows may run another cuBLAS kernel, so the bits are not promised there.)
- `model.patch_embed` (`conv`, `linear`): the patch embedding is a Conv3d whose kernel
  equals its stride, i.e. one matrix product of the flattened patch with the flattened
  kernel. `linear` computes it as that product (oneDNN's Conv3d backward was 10 % of a
  sub-agent micro-batch's step on CPU); the sum runs in another order, so the result differs
  in the last bits.
- `model.prefill_attention` (`masked`, `causal_rows`): a left-padded batch without a cache
  (every teacher-forced pass, the prefill of `generate`) hands sdpa an explicit
  [B, 1, L, L] mask, and the CPU kernel then computes every block, the upper triangle too.
  `causal_rows` cuts each row's left padding off and runs the causal kernel on what is
  left (same positions, same keys: padding is never a key of a real token). The padded
  query positions get zeros (the stock path's outputs there are never read: nothing
  attends to a padding key and no log-prob is taken there). Decoding steps (one query
  against the cache) and any mask of another shape keep the stock path. Other block
  boundaries, so other rounding.
"""

from __future__ import annotations

import weakref
from types import MethodType
from typing import Any

from paravt_core.model.vision_attention import rebind_forward

VISION_DEDUPE = ("never", "no_grad", "always")
PATCH_EMBED = ("conv", "linear")
PREFILL_ATTENTION = ("masked", "causal_rows")


# --- vision dedupe ----------------------------------------------------------------------


def distinct_items(pixel_values, grid_thw) -> tuple[list[int], list[int]]:
    """(first index of each distinct item, the distinct item each item is) of a packed batch.

    `pixel_values` [N_patches, D] holds the items (frames or videos) one after the other,
    `grid_thw` [n, 3] their patch grids. Two items are the same when their grids are and
    their pixels are equal element for element; a per-item sum only narrows the candidates.
    """
    import torch

    sizes = grid_thw.prod(-1).tolist()
    chunks = torch.split(pixel_values, sizes)
    sums = torch.stack([chunk.double().sum() for chunk in chunks]).tolist() if chunks else []
    grids = [tuple(row) for row in grid_thw.tolist()]
    firsts: list[int] = []
    of: list[int] = []
    seen: dict[tuple, list[int]] = {}
    for index, chunk in enumerate(chunks):
        candidates = seen.setdefault((grids[index], sums[index]), [])
        match = next((u for u in candidates if torch.equal(chunks[firsts[u]], chunk)), None)
        if match is None:
            match = len(firsts)
            firsts.append(index)
            candidates.append(match)
        of.append(match)
    return firsts, of


def _deduped_image_features(self, pixel_values, image_grid_thw=None, **kwargs):
    import torch

    stock = self._paravt_stock_image_features
    precomputed = any(isinstance(value, torch.Tensor) for value in kwargs.values())
    wanted = self._paravt_vision_dedupe == "always" or not torch.is_grad_enabled()
    if image_grid_thw is None or precomputed or not wanted or image_grid_thw.shape[0] < 2:
        return stock(pixel_values, image_grid_thw, **kwargs)
    firsts, of = distinct_items(pixel_values, image_grid_thw)
    if len(firsts) == len(of):
        return stock(pixel_values, image_grid_thw, **kwargs)
    sizes = image_grid_thw.prod(-1).tolist()
    starts = [0]
    for size in sizes:
        starts.append(starts[-1] + size)
    distinct = torch.cat([pixel_values[starts[i]:starts[i + 1]] for i in firsts])
    out = stock(distinct, image_grid_thw[firsts], **kwargs)
    # pooler_output and deepstack_features are per-item tuples (get_image_features splits
    # them): each item takes its distinct item's tensor; the model concatenates them.
    out.pooler_output = tuple(out.pooler_output[u] for u in of)
    out.deepstack_features = [tuple(feature[u] for u in of) for feature in out.deepstack_features]
    if getattr(out, "last_hidden_state", None) is not None:
        per_item = torch.split(out.last_hidden_state, [sizes[i] for i in firsts])
        out.last_hidden_state = torch.cat([per_item[u] for u in of])
    return out


def apply_vision_dedupe(model, mode: str) -> bool:
    """Set `model.vision_dedupe` (VISION_DEDUPE) on a Qwen3-VL; returns whether it was applied."""
    if mode not in VISION_DEDUPE:
        raise ValueError(f"model.vision_dedupe={mode!r} is not one of {VISION_DEDUPE}")
    inner = getattr(model, "model", None)
    if mode == "never" and inner is not None and hasattr(inner, "_paravt_stock_image_features"):
        del inner.get_image_features, inner._paravt_stock_image_features, inner._paravt_vision_dedupe
    if mode == "never" or inner is None or not hasattr(inner, "get_image_features") or not hasattr(inner, "visual"):
        return False
    if not hasattr(inner, "_paravt_stock_image_features"):
        inner._paravt_stock_image_features = inner.get_image_features
        # get_video_features calls self.get_image_features: both go through the instance's.
        inner.get_image_features = MethodType(_deduped_image_features, inner)
    inner._paravt_vision_dedupe = mode
    return True


# --- patch embedding as one matrix product ----------------------------------------------


def _linear_patch_embed(self, patches):
    import torch.nn.functional as F

    # [N, C, T, P, P] -> [N, C*T*P*P] @ [E, C*T*P*P]^T: the kernel covers the whole patch.
    flat = patches.reshape(patches.shape[0], -1)
    out = F.linear(flat, self.weight.reshape(self.weight.shape[0], -1), self.bias)
    return out.reshape(out.shape[0], out.shape[1], 1, 1, 1)


def apply_patch_embed(model, mode: str) -> int:
    """Set `model.patch_embed` (PATCH_EMBED); returns how many Conv3d modules compute as a product.

    The Conv3d module's own forward is rebound (not bypassed): under ZeRO-3 calling the module
    is what gathers its partitioned weight."""
    if mode not in PATCH_EMBED:
        raise ValueError(f"model.patch_embed={mode!r} is not one of {PATCH_EMBED}")
    if mode == "conv":
        return 0
    from torch import nn
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionPatchEmbed

    def one_product_per_patch(conv) -> bool:  # else keep the convolution
        return tuple(conv.kernel_size) == tuple(conv.stride) and not any(conv.padding) and conv.groups == 1

    patch_convs = {id(m.proj) for m in model.modules() if isinstance(m, Qwen3VLVisionPatchEmbed)}
    return rebind_forward(model, nn.Conv3d, _linear_patch_embed,
                          lambda conv: id(conv) in patch_convs and one_product_per_patch(conv))


# --- causal attention on each row's unpadded part ----------------------------------------

# The left padding read from the last 4-D mask seen (every layer of a forward gets the same
# tensor): None when the mask is not causal-with-left-padding.
_last_padding: tuple[weakref.ref, list[int] | None] | None = None


def left_padding_of(mask) -> list[int] | None:
    """Each row's count of left padding when `mask` [B, 1, L, L] (True = attend) is exactly the
    causal mask of a left-padded batch (padded queries attend nothing); else None."""
    import torch

    global _last_padding
    last = _last_padding
    if last is not None and last[0]() is mask:
        return last[1]
    padding: list[int] | None = None
    if mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == mask.shape[3]:
        length = mask.shape[-1]
        pads = (~mask[:, 0, -1, :]).sum(-1)  # [B]: keys the last (real) query may not see
        positions = torch.arange(length, device=mask.device)
        causal = positions[:, None] >= positions[None, :]  # [L, L]
        real = positions[None, :] >= pads[:, None]  # [B, L]
        expected = causal[None] & real[:, None, :] & real[:, :, None]
        if torch.equal(expected, mask[:, 0]):
            padding = pads.tolist()
    _last_padding = (weakref.ref(mask), padding)
    return padding


def causal_rows_attention(query, key, value, padding: list[int], scaling: float, n_rep: int):
    """[B, H, L, D] attention of a left-padded batch, each row causal over its unpadded part;
    zeros at padded queries. Returns [B, L, H, D] as transformers' attention functions do."""
    import torch
    import torch.nn.functional as F

    batch, heads, length, dim = query.shape
    if n_rep > 1:  # grouped-query attention: each key/value head serves n_rep query heads
        key = key.repeat_interleave(n_rep, dim=1)
        value = value.repeat_interleave(n_rep, dim=1)
    rows = []
    for row, pad in enumerate(padding):
        if pad >= length:  # a row of padding only: nothing to attend to
            rows.append(query.new_zeros((1, heads, length, dim)))
            continue
        out = F.scaled_dot_product_attention(query[row:row + 1, :, pad:], key[row:row + 1, :, pad:],
                                             value[row:row + 1, :, pad:], is_causal=True, scale=scaling)
        if pad:
            out = torch.cat([out.new_zeros((1, heads, pad, dim)), out], dim=2)
        rows.append(out)
    return torch.cat(rows).transpose(1, 2).contiguous()


def _causal_rows_text_forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None,
                              **kwargs):
    from transformers.models.qwen3_vl import modeling_qwen3_vl as qwen3_vl

    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    query = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
    key = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
    value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    query, key = qwen3_vl.apply_rotary_pos_emb(query, key, cos, sin)
    if past_key_values is not None:
        key, value = past_key_values.update(key, value, self.layer_idx)
    padding = None
    # Only a fresh prefill (as many queries as keys) of a causal, left-padded batch.
    if attention_mask is not None and query.shape[2] == key.shape[2] and not (self.training and self.attention_dropout):
        padding = left_padding_of(attention_mask)
    if padding is not None:
        out = causal_rows_attention(query, key, value, padding, self.scaling, self.num_key_value_groups)
        weights = None
    else:
        attention = qwen3_vl.ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                                   qwen3_vl.eager_attention_forward)
        out, weights = attention(self, query, key, value, attention_mask,
                                 dropout=0.0 if not self.training else self.attention_dropout,
                                 scaling=self.scaling, **kwargs)
    return self.o_proj(out.reshape(*input_shape, -1).contiguous()), weights


def apply_prefill_attention(model, mode: str) -> int:
    """Set `model.prefill_attention` (PREFILL_ATTENTION); returns how many text attention modules
    were rebound (0 for `masked`, and for any attention implementation other than sdpa)."""
    if mode not in PREFILL_ATTENTION:
        raise ValueError(f"model.prefill_attention={mode!r} is not one of {PREFILL_ATTENTION}")
    if mode == "masked":
        return 0
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextAttention

    return rebind_forward(model, Qwen3VLTextAttention, _causal_rows_text_forward,
                          lambda module: module.config._attn_implementation == "sdpa")


def apply_fast_paths(model: Any, vision_dedupe: str = "no_grad", patch_embed: str = "conv",
                     prefill_attention: str = "masked") -> Any:
    """All three switches on a loaded model (module docstring); returns the model."""
    apply_vision_dedupe(model, vision_dedupe)
    apply_patch_embed(model, patch_embed)
    apply_prefill_attention(model, prefill_attention)
    return model
