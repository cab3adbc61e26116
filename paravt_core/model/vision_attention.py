"""The vision tower's attention over equal-sized frames in one batched call (`model.vision_attention`).

Qwen3-VL's vision blocks attend within each image (frame) only. Without flash-attn's
variable-length kernel, transformers splits the packed patch sequence at every image boundary
and calls the attention once per image: a 64-frame sample is 64 attention calls of about 200
patches per block and direction, each a separate small kernel launch with its Python overhead.
`batched` takes each run of consecutive images of the same patch count (every frame of a
video sampled at one resolution: the whole run) as one batch [images, heads, patches, dim]
and calls the same attention function once. The arithmetic is the same per image (no mask,
no padding), so outputs agree with `per_item` up to floating-point summation order
(tests/unit/test_vision_attention.py).

The switch rebinds `forward` on each vision attention module of a loaded model: nothing
global is patched, and the module's own weights, rotary function and configured attention
implementation (sdpa, eager) are used. With flash_attention_2 the stock varlen path already
makes one call, so the module keeps it.
"""

from __future__ import annotations

import weakref
from itertools import groupby
from types import MethodType

VISION_ATTENTION = ("per_item", "batched")


def equal_length_runs(lengths: list[int]) -> list[tuple[int, int]]:
    """(length, count) of each run of consecutive equal lengths, in order."""
    return [(length, sum(1 for _ in run)) for length, run in groupby(lengths)]


# The runs of the last `cu_seqlens` tensor seen: every block of one forward gets the same tensor, and
# reading its lengths back is a host synchronisation (once per forward instead of once per block).
_last_runs: tuple[weakref.ref, list[tuple[int, int]]] | None = None


def runs_of(cu_seqlens) -> list[tuple[int, int]]:
    """`equal_length_runs` of the image lengths in `cu_seqlens`, read back once per tensor."""
    global _last_runs
    last = _last_runs  # read once: another thread may replace it between two reads
    if last is not None and last[0]() is cu_seqlens:
        return last[1]
    runs = equal_length_runs((cu_seqlens[1:] - cu_seqlens[:-1]).tolist())
    _last_runs = (weakref.ref(cu_seqlens), runs)
    return runs


def _batched_forward(self, hidden_states, cu_seqlens, position_embeddings=None, max_seqlen=None, **kwargs):
    import torch
    from transformers.models.qwen3_vl import modeling_qwen3_vl as qwen3_vl

    seq_length = hidden_states.shape[0]
    q, k, v = self.qkv(hidden_states).reshape(seq_length, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
    cos, sin = position_embeddings
    # Looked up at call time: a kernel library (Liger) may have replaced the module's rotary function.
    q, k = qwen3_vl.apply_rotary_pos_emb_vision(q, k, cos, sin)
    attention = qwen3_vl.ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                               qwen3_vl.eager_attention_forward)
    outputs, start = [], 0
    for length, count in runs_of(cu_seqlens):
        end = start + length * count
        # [patches, heads, dim] -> [images, heads, length, dim]
        q_run, k_run, v_run = (t[start:end].reshape(count, length, self.num_heads, -1).transpose(1, 2)
                               for t in (q, k, v))
        out, _ = attention(self, q_run, k_run, v_run, attention_mask=None, scaling=self.scaling,
                           dropout=0.0 if not self.training else self.attention_dropout, is_causal=False, **kwargs)
        outputs.append(out.reshape(end - start, -1))  # the interface returns [images, length, heads, dim]
        start = end
    attn_output = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=0)
    return self.proj(attn_output.contiguous())


def apply_vision_attention(model, mode: str) -> int:
    """Set the vision tower's attention to `mode` (one of VISION_ATTENTION); returns how many modules
    were rebound (0 for `per_item`, or when the model runs flash_attention_2 or has no Qwen3-VL
    vision attention)."""
    if mode not in VISION_ATTENTION:
        raise ValueError(f"model.vision_attention={mode!r} is not one of {VISION_ATTENTION}")
    if mode == "per_item":
        return 0
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionAttention
    from transformers.utils.generic import is_flash_attention_requested

    return rebind_forward(model, Qwen3VLVisionAttention, _batched_forward,
                          lambda module: not is_flash_attention_requested(module.config))


def rebind_forward(model, module_type: type, forward, applies=lambda module: True) -> int:
    """Bind `forward` as the own `forward` of every `module_type` module of `model` that `applies`
    to; returns how many. The module's forward is rebound, not bypassed: calling the module (what
    ZeRO-3's hooks gather the partitioned weights on) still runs it."""
    rebound = 0
    for module in model.modules():
        if isinstance(module, module_type) and applies(module):
            module.forward = MethodType(forward, module)
            rebound += 1
    return rebound
