"""Open a video once, index its frames, and decode only the frames asked for.

Why PyAV and not decord's `get_batch` (what the release reaches through
`qwen_vl_utils.fetch_video`):
- Speed. Decoding dominates the cost and decord gives no control over it. Here each
  packet goes to the decoder with `skip_frame=NONREF` unless its frame is one we want,
  so the non-reference frames (most B-frames) between wanted frames are never decoded;
  reference frames are, so the wanted frames come out bit-exact (a unit test compares
  them with decord's). YUV->RGB and the resize are one libswscale pass at the target
  size. `bench/frames.py` measures this against decord with and without its own resize.
- Correctness. decord 0.6.0 returns wrong frames after a seek into an open GOP
  (H.264 open-gop, HEVC) and in AVI files; here a frame shown before its GOP's keyframe
  is decoded from the previous keyframe (unit-tested against a full sequential decode).

Frame i is the i-th frame in presentation order (sorted packet timestamps), the
convention decord and `qwen_vl_utils` use; its time is i / fps, which is what the
Qwen3-VL processor writes before it (SPEC §1).
"""

from __future__ import annotations

import bisect
import os
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

import av
import numpy as np
from av.video.reformatter import VideoReformatter

from paravt_core.video.errors import VideoDecodeError

# libswscale bicubic widens its kernel when shrinking, so it is antialiased like
# torchvision's `antialias=True` bicubic.
RESIZE_INTERPOLATION = "BICUBIC"
# One scaler thread: a fresh thread pool per frame cost more than the scaling itself
# (measured 2.5 ms vs 0.5 ms per 640x360 frame), and callers parallelise across videos.
SCALER_THREADS = 1
# Slice threads help on multi-slice streams and cost nothing on others; frame threads
# add latency after every seek, which sparse sampling does often.
DECODE_THREAD_TYPE = "SLICE"


class VideoInfo(NamedTuple):
    """What `probe_video` reports; duration = num_frames / fps seconds."""

    num_frames: int
    fps: float
    duration: float
    width: int
    height: int


class _FrameIndex(NamedTuple):
    pts: list[int]  # [N] packet timestamps in presentation order, frame i at pts[i]
    keyframes: list[int]  # sorted frame indices that are keyframes
    packets_read: int  # every video packet, including ones marked to discard


def _scan_frames(path: Path, container: av.container.InputContainer, stream: av.VideoStream) -> _FrameIndex:
    """Read every packet of the video stream (no decoding) to index its frames.

    Packets sharing a timestamp count as one frame, so every index has a distinct pts.
    """
    is_key_at: dict[int, bool] = {}
    packets_read = 0
    try:
        for packet in container.demux(stream):
            if packet.size == 0:
                continue
            packets_read += 1
            if packet.is_discard:
                continue
            if packet.pts is None:
                raise VideoDecodeError(path, "its video packets carry no timestamps",
                                       "Remux it into mp4 (`ffmpeg -i IN -c copy OUT.mp4`) and use that file.")
            is_key_at[packet.pts] = is_key_at.get(packet.pts, False) or packet.is_keyframe
    except av.FFmpegError as error:
        raise VideoDecodeError(path, f"its packets cannot be read ({error})") from error
    pts = sorted(is_key_at)
    keyframes = [index for index, value in enumerate(pts) if is_key_at[value]]
    return _FrameIndex(pts, keyframes, packets_read)


def _frame_rate(stream: av.VideoStream, pts: list[int]) -> float:
    rate = stream.average_rate or stream.guessed_rate
    if rate:
        return float(rate)
    span = (pts[-1] - pts[0]) * float(stream.time_base) if len(pts) > 1 else 0.0
    return (len(pts) - 1) / span if span > 0 else 1.0


class VideoFile:
    """An open video: its frame index and a decoder that seeks to the frames asked for.

    Open it once to sample the overview and every crop of one episode (SPEC §3); use it
    as a context manager or call `close()`. One instance holds one decoder: it is not
    thread-safe, so crops decoded in parallel each open their own.

    Raises:
        FileNotFoundError: the path is not a file.
        VideoDecodeError: the file is unreadable, has no video frames, or is truncated.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"video file not found: {self.path}")
        self._container = self._open_container()
        try:
            self._stream = self._container.streams.video[0]
            self._index = _scan_frames(self.path, self._container, self._stream)
            self._check_complete()
        except BaseException:
            self._container.close()
            raise
        self._index_of_pts = {pts: index for index, pts in enumerate(self._index.pts)}
        # Reused so libswscale keeps its scaler; `VideoFrame.to_ndarray` builds one per frame.
        self._reformatter = VideoReformatter()
        self._stream.thread_type = DECODE_THREAD_TYPE
        fps = _frame_rate(self._stream, self._index.pts)
        num_frames = len(self._index.pts)
        self.info = VideoInfo(num_frames, fps, num_frames / fps, self._stream.width, self._stream.height)

    @property
    def keyframes(self) -> list[int]:
        """Indices of the keyframes (the first frame of each GOP), in order."""
        return list(self._index.keyframes)

    def _open_container(self) -> av.container.InputContainer:
        try:
            container = av.open(str(self.path))
        except (av.FFmpegError, OSError, UnicodeDecodeError) as error:
            raise VideoDecodeError(self.path, f"it is not a readable media file ({error})") from error
        if not container.streams.video:
            container.close()
            raise VideoDecodeError(self.path, "it contains no video frames (no video stream)")
        return container

    def _check_complete(self) -> None:
        if not self._index.pts:
            raise VideoDecodeError(self.path, "it contains no video frames")
        declared = self._stream.frames
        if declared and self._index.packets_read < declared:
            raise VideoDecodeError(
                self.path, f"it is truncated: the header declares {declared} frames, the data holds "
                f"{self._index.packets_read}")

    def __enter__(self) -> VideoFile:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._container.close()

    def read(self, indices: Sequence[int], *, height: int, width: int) -> np.ndarray:
        """Decode the frames at `indices` (any order, repeats allowed) as RGB at height x width.

        Returns:
            uint8 array [len(indices), height, width, 3].
        """
        num_frames = self.info.num_frames
        if not indices:
            raise ValueError("no frame indices to read")
        if bad := [i for i in indices if not 0 <= i < num_frames]:
            raise IndexError(f"frame indices {bad[:5]} out of range for {num_frames} frames of {self.path}")
        frames = np.empty((len(indices), height, width, 3), dtype=np.uint8)  # [T, H, W, 3]
        rows_of: dict[int, list[int]] = {}
        for row, index in enumerate(indices):
            rows_of.setdefault(index, []).append(row)
        for index, frame in self._decode(sorted(rows_of)):
            rgb = self._reformatter.reformat(frame, width=width, height=height, format="rgb24",
                                             interpolation=RESIZE_INTERPOLATION, threads=SCALER_THREADS)
            frames[rows_of[index]] = rgb.to_ndarray()  # [H, W, 3]
        return frames

    def _keyframe_before(self, index: int) -> int:
        position = bisect.bisect_right(self._index.keyframes, index) - 1
        return self._index.keyframes[position] if position >= 0 else 0

    def _decode(self, wanted: list[int]) -> Iterator[tuple[int, av.VideoFrame]]:
        """Yield (index, frame) once for each wanted index (sorted, distinct).

        A run starts with a seek to the keyframe before the first pending frame and
        decodes on while the next pending frame lies in the same GOP; when it lies past
        a keyframe not yet reached, seeking there is cheaper than decoding up to it.
        """
        pending = deque(wanted)
        wanted_pts = {self._index.pts[i] for i in wanted}
        while pending:
            run_key = self._keyframe_before(pending[0])
            for index, frame in self._frames_from(run_key, wanted_pts):
                if index == pending[0]:
                    pending.popleft()
                    yield index, frame
                if not pending:
                    return
                next_key = self._keyframe_before(pending[0])
                if next_key > run_key and next_key > index:
                    break
            else:
                raise VideoDecodeError(self.path, f"frame {pending[0]} of {self.info.num_frames} did not decode "
                                       "(the file is truncated or corrupt)")

    def _frames_from(self, key_index: int, wanted_pts: set[int]) -> Iterator[tuple[int, av.VideoFrame]]:
        """Seek to a keyframe and yield (index, frame) in presentation order until the end."""
        context = self._stream.codec_context
        try:
            self._container.seek(self._index.pts[key_index], stream=self._stream, backward=True)
            for packet in self._container.demux(self._stream):
                context.skip_frame = "DEFAULT" if packet.pts is None or packet.pts in wanted_pts else "NONREF"
                for frame in context.decode(packet):
                    index = self._index_of_pts.get(frame.pts)
                    if index is not None:
                        yield index, frame
        except av.FFmpegError as error:
            raise VideoDecodeError(self.path, f"decoding failed near frame {key_index} ({error})") from error


def probe_video(path: str | os.PathLike[str]) -> VideoInfo:
    """(num_frames, fps, duration, width, height) of a video, from its frame index.

    The frame count is that of the index the samplers use, not the container header's
    estimate, so it is exact and equal to what `VideoFile` will decode.
    """
    with VideoFile(path) as video:
        return video.info
