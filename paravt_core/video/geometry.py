"""Frame size under a pixel budget (SPEC §3: 784 to 50176 pixels per frame).

Qwen3-VL cuts a frame into `patch_size` x `patch_size` patches and merges
`spatial_merge_size` x `spatial_merge_size` of them into one token, so both sides of a
frame must be multiples of `factor = patch_size * spatial_merge_size` (16 * 2 = 32).
"""

from __future__ import annotations

import math

QWEN3_VL_FACTOR = 32
DEFAULT_MIN_PIXELS = 784
DEFAULT_MAX_PIXELS = 50176
MAX_ASPECT_RATIO = 200


def _round_to(value: float, factor: int) -> int:
    return max(factor, math.floor(value / factor + 0.5) * factor)


def _floor_to(value: float, factor: int) -> int:
    return max(factor, math.floor(value / factor) * factor)


def _ceil_to(value: float, factor: int) -> int:
    return max(factor, math.ceil(value / factor) * factor)


def _check_bounds(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> None:
    if height <= 0 or width <= 0:
        raise ValueError(f"frame size must be positive, got {height}x{width}")
    if factor <= 0:
        raise ValueError(f"factor must be positive, got {factor}")
    if not 0 < min_pixels <= max_pixels:
        raise ValueError(f"need 0 < min_pixels <= max_pixels, got {min_pixels} and {max_pixels}")
    if max_pixels < factor * factor:
        raise ValueError(f"max_pixels={max_pixels} is below one {factor}x{factor} block")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"aspect ratio of {height}x{width} exceeds {MAX_ASPECT_RATIO}:1")


def smart_resize(
    height: int,
    width: int,
    *,
    factor: int = QWEN3_VL_FACTOR,
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> tuple[int, int]:
    """Target (height, width) for a frame, keeping its aspect ratio as far as the grid allows.

    Both sides are rounded to the nearest multiple of `factor`; if that exceeds
    `max_pixels` the frame is scaled down by sqrt(area / max_pixels) with sides floored to
    the grid, if it falls below `min_pixels` it is scaled up with sides ceiled. The
    maximum wins when the two bounds cannot both hold on the grid: the pixel budget is
    what bounds the model's sequence length.

    Returns:
        (height, width), both multiples of `factor`, with height * width <= max_pixels.
    """
    _check_bounds(height, width, factor, min_pixels, max_pixels)
    target_h, target_w = _round_to(height, factor), _round_to(width, factor)
    if target_h * target_w > max_pixels:
        shrink = math.sqrt(height * width / max_pixels)
        target_h, target_w = _floor_to(height / shrink, factor), _floor_to(width / shrink, factor)
    elif target_h * target_w < min_pixels:
        grow = math.sqrt(min_pixels / (height * width))
        target_h, target_w = _ceil_to(height * grow, factor), _ceil_to(width * grow, factor)
    return _fit_budget(target_h, target_w, factor, max_pixels)


def _fit_budget(height: int, width: int, factor: int, max_pixels: int) -> tuple[int, int]:
    """Shrink the longer side when the one-block minimum on the shorter side broke the budget."""
    if height * width <= max_pixels:
        return height, width
    if height >= width:
        return _floor_to(max_pixels / width, factor), width
    return height, _floor_to(max_pixels / height, factor)
