"""Frames for the model: overview frames of a whole video and fps-sampled crops (SPEC §3).

Frames are a numpy uint8 array [T, H, W, 3] (RGB, channels last), not a torch tensor:
the Qwen3-VL video processor takes numpy videos as they are, `torch.from_numpy` wraps
one without a copy, and the data and eval stages need no torch to hold them.

Each sampler takes a path or an open `VideoFile`; pass a `VideoFile` to sample an
episode's overview and all its crops from one frame index.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from paravt_core.video.geometry import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS, QWEN3_VL_FACTOR, smart_resize
from paravt_core.video.reader import VideoFile
from paravt_core.video.sampling import overview_frame_indices, window_frame_indices

VideoSource = str | os.PathLike[str] | VideoFile


@dataclass(frozen=True, eq=False)
class Frames:
    """Decoded frames of one video with the times the model is told.

    Attributes:
        array: uint8 RGB [T, H, W, 3], H and W multiples of the model's factor.
        timestamps: seconds of each frame, indices[t] / fps.
        indices: frame index of each frame in the source video, increasing.
        fps: the source video's frame rate.
        duration: the source video's length in seconds (total_frames / fps).
        total_frames: frames in the source video.
    """

    array: np.ndarray  # [T, H, W, 3] uint8
    timestamps: list[float]
    indices: list[int]
    fps: float
    duration: float
    total_frames: int


@contextmanager
def _opened(source: VideoSource) -> Iterator[VideoFile]:
    if isinstance(source, VideoFile):
        yield source
        return
    with VideoFile(source) as video:
        yield video


def _decode_frames(video: VideoFile, pick: Callable[[int, float], list[int]], *,
                   min_pixels: int, max_pixels: int, factor: int) -> Frames:
    info = video.info
    indices = pick(info.num_frames, info.fps)
    height, width = smart_resize(info.height, info.width, factor=factor,
                                 min_pixels=min_pixels, max_pixels=max_pixels)
    array = video.read(indices, height=height, width=width)  # [T, H, W, 3]
    return Frames(array=array, timestamps=[index / info.fps for index in indices], indices=indices,
                  fps=info.fps, duration=info.duration, total_frames=info.num_frames)


def sample_overview_frames(
    video: VideoSource,
    nframes: int = 64,
    *,
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    factor: int = QWEN3_VL_FACTOR,
) -> Frames:
    """`nframes` frames uniform over the whole video, first and last included (SPEC §3).

    A video with fewer frames than `nframes` gives all of its frames. Each frame is
    resized to `smart_resize(height, width, factor, min_pixels, max_pixels)`.

    Raises:
        FileNotFoundError: no file at the path.
        VideoDecodeError: the file is unreadable, empty or truncated.
    """
    with _opened(video) as opened:
        return _decode_frames(opened, lambda num_frames, _fps: overview_frame_indices(num_frames, nframes),
                              min_pixels=min_pixels, max_pixels=max_pixels, factor=factor)


def sample_window_frames(
    video: VideoSource,
    start: float,
    end: float,
    fps: float = 1.0,
    min_frames: int = 1,
    max_frames: int = 16,
    *,
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    factor: int = QWEN3_VL_FACTOR,
) -> Frames:
    """Frames at `fps` within [start, end] seconds, clamped to the video (SPEC §3 crops).

    See `window_frame_indices` for the count rule (1 to 16 frames by default).

    Raises:
        ValueError: start >= end, or start at or past the video's end (SPEC §2).
        FileNotFoundError: no file at the path.
        VideoDecodeError: the file is unreadable, empty or truncated.
    """
    def pick(num_frames: int, video_fps: float) -> list[int]:
        return window_frame_indices(num_frames, video_fps, start, end, sample_fps=fps,
                                    min_frames=min_frames, max_frames=max_frames)

    with _opened(video) as opened:
        return _decode_frames(opened, pick, min_pixels=min_pixels, max_pixels=max_pixels, factor=factor)
