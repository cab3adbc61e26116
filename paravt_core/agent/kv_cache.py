"""A key/value cache for `generate` that appends in place instead of concatenating (issue #45).

transformers' `DynamicCache` grows each layer's keys and values with `torch.cat` at every
decoding step, which copies the whole cache: with the tiny Qwen3-VL on CPU that copy was
the largest single cost of generation (26 % of a 16-row, 32-token `generate`, more than
the matrix products; docs/speed.md). `PreallocatedCache` allocates each layer's buffer once,
for the prompt and every token the call may generate, writes each step's states into it
and hands attention a view of the filled part.

The values attention sees are the same numbers in the same layout along the sequence
(only the batch and head strides differ), so generations are token for token and
log-prob for log-prob those of `DynamicCache` (`tests/unit/test_kv_cache.py` holds them
equal, greedy and sampled). Memory is what the DynamicCache holds at the end of the call,
allocated up front; a call that would run past its capacity grows the buffer by
concatenation, as DynamicCache does, rather than failing.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """One layer's keys and values, [B, H, capacity, D] buffers filled left to right."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            batch, heads, _, dim = key_states.shape
            size = max(self.capacity, key_states.shape[-2])
            self._key_buffer = key_states.new_empty((batch, heads, size, dim))
            self._value_buffer = value_states.new_empty((batch, heads, size, value_states.shape[-1]))
        end = self.length + key_states.shape[-2]
        if end > self._key_buffer.shape[-2]:
            # Past the planned capacity (a caller that generates more than it said): grow like DynamicCache.
            grow = end - self._key_buffer.shape[-2]
            self._key_buffer = torch.cat([self._key_buffer, self._key_buffer.new_empty(
                (*self._key_buffer.shape[:2], grow, self._key_buffer.shape[-1]))], dim=-2)
            self._value_buffer = torch.cat([self._value_buffer, self._value_buffer.new_empty(
                (*self._value_buffer.shape[:2], grow, self._value_buffer.shape[-1]))], dim=-2)
        self._key_buffer[:, :, self.length:end] = key_states
        self._value_buffer[:, :, self.length:end] = value_states
        self.length = end
        self.keys = self._key_buffer[:, :, :end]
        self.values = self._value_buffer[:, :, :end]
        return self.keys, self.values

    def reset(self) -> None:
        self.length = 0
        self._key_buffer = self._value_buffer = None
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        if self.is_initialized:
            self.length = self.keys.shape[-2]

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep the batch rows `index` names, in its order (a row may repeat): a prompt
        prefilled once becomes the cache of every request that repeats it."""
        self._key_buffer = self._key_buffer.index_select(0, index)
        self._value_buffer = self._value_buffer.index_select(0, index)
        self.keys = self._key_buffer[:, :, :self.length]
        self.values = self._value_buffer[:, :, :self.length]

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("PreallocatedCache serves one-beam generation only")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("PreallocatedCache serves one-beam generation only")


class PreallocatedCache(DynamicCache):
    """A `DynamicCache` whose layers are `PreallocatedLayer`s of `capacity` positions
    (the prompt's length plus the call's max_new_tokens)."""

    def __init__(self, num_layers: int, capacity: int):
        if num_layers < 1 or capacity < 1:
            raise ValueError(f"a preallocated cache needs at least one layer and one position; got {num_layers} "
                             f"layers, capacity {capacity}")
        super().__init__()
        self.layers = [PreallocatedLayer(capacity) for _ in range(num_layers)]
        self.layer_class_to_replicate = None

    def select_rows(self, index: torch.Tensor) -> None:
        """Every layer keeps the batch rows `index` names (`PreallocatedLayer.select_rows`)."""
        for layer in self.layers:
            layer.select_rows(index)
