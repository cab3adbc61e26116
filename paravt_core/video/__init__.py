"""Video I/O for every stage: probe, hash, and sample frames within a pixel budget (SPEC §3).

Departures from the release, which samples with `qwen_vl_utils.fetch_video` (SPEC §1, §3):
- Frames are decoded with PyAV, skipping the non-reference frames no sampled frame
  needs, instead of decord `get_batch`: the same pixels on ordinary files, the right
  ones where decord errs (open GOPs, AVI), about 2x faster (see `reader.py`,
  `bench/frames.py`).
- Frames stay uint8 [T, H, W, 3]; the release hands float32 [T, 3, H, W] to the processor.
  The resize is libswscale bicubic, not torchvision's antialiased bicubic.
- A video shorter than `nframes` frames gives all of its frames; the release rounds the
  count to an even number and fails below it. Crops may hold 1 frame (the release: 2).
- A crop [start, end] takes the frames shown from start up to, not including, end; the
  release also takes the frame at `end`, so a 16 s crop can differ by one frame.
"""

from paravt_core.video.errors import VideoDecodeError
from paravt_core.video.frames import Frames, sample_overview_frames, sample_window_frames
from paravt_core.video.geometry import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS, QWEN3_VL_FACTOR, smart_resize
from paravt_core.video.hashing import video_sha256
from paravt_core.video.reader import VideoFile, VideoInfo, probe_video
from paravt_core.video.sampling import clamp_window, overview_frame_indices, window_frame_indices

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_MIN_PIXELS",
    "QWEN3_VL_FACTOR",
    "Frames",
    "VideoDecodeError",
    "VideoFile",
    "VideoInfo",
    "clamp_window",
    "overview_frame_indices",
    "probe_video",
    "sample_overview_frames",
    "sample_window_frames",
    "smart_resize",
    "video_sha256",
    "window_frame_indices",
]
