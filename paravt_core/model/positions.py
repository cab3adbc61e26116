"""A batch's position tensors computed where it is encoded, not inside the forward (`sft.host_positions`).

Qwen3-VL's forward derives four things from the token ids and each image's grid before any
layer runs: the text model's 3-D M-RoPE positions (`get_rope_index`), and for the vision tower
the patch positions of its rotary embedding, the bilinear taps that resample its learned
position table, and the per-image sequence boundaries. transformers builds them with a
Python loop over images; with the batch on a GPU, a 64-frame sample makes about 3,400 small
kernel launches and 256 host synchronisations (`get_rope_index` reads grid sizes and positions
back one image at a time), counted on the CPU with the 2B benchmark's sample. While the host
waits on those, the GPU has nothing queued. On CPU tensors the same functions are cheap and
synchronise nothing, and in a DataLoader worker they also overlap the training step.

transformers accepts all four precomputed: `position_ids` is a forward argument, and the
vision helpers (`transformers.vision_utils`) pop `cu_seqlens`, `position_ids`,
`interp_indices` and `interp_weights` from the vision tower's keyword arguments when given,
which the model forwards from `image_*` / `video_*` keywords of its own forward. The values are
computed by those same functions (and the model's own `get_rope_index`), so the forward sees the
tensors it would have built itself (tests/unit/test_positions.py: equal losses and gradients,
and no rope index or vision position loop left in the forward).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

# (input_ids [B, L], mm_token_type_ids [B, L], image_grid_thw, video_grid_thw, attention_mask) ->
# (3-D rope positions [3, B, L], deltas): the model's `get_rope_index`.
RopeIndex = Callable[..., tuple[torch.Tensor, torch.Tensor]]

# The keyword prefix under which the model hands each grid's precomputed tensors to its vision tower.
GRID_PREFIX = {"image_grid_thw": "image_", "video_grid_thw": "video_"}


@dataclass(frozen=True)
class HostPositions:
    """What computing a Qwen3-VL batch's positions needs from the model: its rope index (a method
    that reads only the config) and the vision tower's interpolation settings."""

    rope_index: RopeIndex
    spatial_merge_size: int
    num_grid_per_side: int
    interpolation_mode: str
    align_corners: bool

    @classmethod
    def of(cls, model) -> HostPositions:
        """From a loaded Qwen3-VL model (`ForConditionalGeneration`); a clear error for another layout."""
        base = getattr(model, "model", None)
        visual = getattr(base, "visual", None)
        needed = ("spatial_merge_size", "num_grid_per_side", "interpolation_mode", "interpolation_align_corners")
        if visual is None or not hasattr(base, "get_rope_index") or not all(hasattr(visual, n) for n in needed):
            raise TypeError(f"sft.host_positions needs a Qwen3-VL model (model.visual with {needed} and "
                            f"model.get_rope_index); {type(model).__name__} has another layout: set "
                            "sft.host_positions=false")
        return cls(base.get_rope_index, int(visual.spatial_merge_size), int(visual.num_grid_per_side),
                   str(visual.interpolation_mode), bool(visual.interpolation_align_corners))

    def vision(self, grid_thw: torch.Tensor, prefix: str) -> dict[str, torch.Tensor]:
        """The vision tower's four precomputed tensors for `grid_thw`, under the model's keyword names."""
        from transformers import vision_utils

        indices, weights = vision_utils.get_vision_interpolation_indices_and_weights(
            grid_thw, num_grid_per_side=self.num_grid_per_side, mode=self.interpolation_mode,
            align_corners=self.align_corners, spatial_merge_size=self.spatial_merge_size)
        return {
            f"{prefix}interp_indices": indices,
            f"{prefix}interp_weights": weights,
            f"{prefix}position_ids": vision_utils.get_vision_position_ids(grid_thw, self.spatial_merge_size),
            f"{prefix}cu_seqlens": vision_utils.get_vision_cu_seqlens(grid_thw),
        }

    def add_to(self, batch: dict[str, Any]) -> dict[str, Any]:
        """`batch` (CPU tensors, collated or packed) with the positions added; a packed batch keeps its
        own 4-row `position_ids` (encode.pack), a padded one gets the rope index's 3 rows."""
        out = dict(batch)
        if "position_ids" not in out:
            out["position_ids"], _ = self.rope_index(
                out["input_ids"], out["mm_token_type_ids"], image_grid_thw=out.get("image_grid_thw"),
                video_grid_thw=out.get("video_grid_thw"), attention_mask=out.get("attention_mask"))
        for grid, prefix in GRID_PREFIX.items():
            if out.get(grid) is not None:
                out.update(self.vision(out[grid], prefix))
        return out
