"""Which frame indices to decode: K uniform overview frames, or fps sampling in a window;
and `frame_budget_of`, the stable draw of a frame budget K from a list.

Pure functions of the frame count and fps, so the choice of frames is testable without
a video and identical for every rollout of a group (SPEC §3).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

# Times are floats computed from user text (SPEC §2); this absorbs 10.0 * 3 == 30.000000000000004.
_TIME_EPS = 1e-6


def _spread(first: int, last: int, count: int) -> list[int]:
    """`count` distinct indices evenly spaced over [first, last], both ends included.

    Rounds half up rather than half to even, so a spacing >= 1 never maps two
    positions to the same index. One frame is the middle one, not the first.
    """
    if count == 1:
        return [(first + last) // 2]
    step = (last - first) / (count - 1)
    return [first + math.floor(k * step + 0.5) for k in range(count)]


def frame_budget_of(key: str, choices: Sequence[int]) -> int:
    """One of `choices`, uniformly, by the sha256 of `key`: the same in every process, rank and
    run (not Python's `hash()`). RL's nFrames gating (`rl.grpo.frame_budget`, SPEC §5) and SFT's
    overview budgets (`sft.dataset.overview_budget`) draw with it, each from its own key."""
    digest = hashlib.sha256(key.encode()).digest()
    return int(choices[int.from_bytes(digest[:8], "big") % len(choices)])


def overview_frame_indices(num_frames: int, nframes: int) -> list[int]:
    """Indices of `nframes` frames spread uniformly over the whole video (SPEC §3, K=64).

    The first and the last frame are included, as in the release's sampler. A video
    with fewer than `nframes` frames returns all of its frames, none repeated.
    """
    if num_frames <= 0:
        raise ValueError(f"num_frames must be positive, got {num_frames}")
    if nframes <= 0:
        raise ValueError(f"nframes must be positive, got {nframes}")
    return _spread(0, num_frames - 1, min(nframes, num_frames))


def clamp_window(start: float, end: float, duration: float) -> tuple[float, float]:
    """Clamp [start, end] to [0, duration]; raise ValueError for an empty window (SPEC §2).

    A window is valid when start < end and start < duration; end is clamped to the
    duration and a negative start to 0.
    """
    if not start < end:
        raise ValueError(f"window start {start} must be before its end {end}")
    if not start < duration:
        raise ValueError(f"window start {start} is not before the video's end ({duration:.3f} s)")
    return max(0.0, start), min(end, duration)


def window_frame_indices(
    num_frames: int,
    fps: float,
    start: float,
    end: float,
    *,
    sample_fps: float = 1.0,
    min_frames: int = 1,
    max_frames: int = 16,
) -> list[int]:
    """Indices sampled at `sample_fps` in [start, end] seconds, clamped to the video.

    The count is floor(window seconds * sample_fps), clamped to [min_frames, max_frames]
    (SPEC §3 crops: 1 fps, 1 to 16 frames) and to the source frames the window holds;
    the frames are spread evenly over the window, so a long window clamped to 16 frames
    still covers its whole span.

    Args:
        num_frames: frames in the video.
        fps: the video's frame rate; frame i is shown at i / fps seconds.
        start, end: the window in seconds.
    """
    if sample_fps <= 0:
        raise ValueError(f"sample_fps must be positive, got {sample_fps}")
    if not 1 <= min_frames <= max_frames:
        raise ValueError(f"need 1 <= min_frames <= max_frames, got {min_frames} and {max_frames}")
    start, end = clamp_window(start, end, num_frames / fps)
    first = min(num_frames - 1, math.ceil(start * fps - _TIME_EPS))
    last = min(num_frames - 1, math.ceil(end * fps - _TIME_EPS) - 1)
    if last < first:  # window shorter than one frame interval: the frame on screen at `start`
        first = last = min(num_frames - 1, math.floor(start * fps + _TIME_EPS))
    wanted = math.floor((end - start) * sample_fps + _TIME_EPS)
    count = min(max(wanted, min_frames), max_frames, last - first + 1)
    return _spread(first, last, count)
