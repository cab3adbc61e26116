"""Unit tests for paravt_core.video: frame choice, pixel bounds, decoding, errors (SPEC §2, §3)."""

from __future__ import annotations

import hashlib
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import av
import decord
import numpy as np
import pytest

from paravt_core.video import (
    VideoDecodeError,
    VideoFile,
    overview_frame_indices,
    probe_video,
    sample_overview_frames,
    sample_window_frames,
    smart_resize,
    video_sha256,
    window_frame_indices,
)

WIDTH, HEIGHT, FPS, SECONDS = 64, 48, 2, 30
NUM_FRAMES = FPS * SECONDS  # 60
BITS = 8  # frame i shows i in binary: column band b (8 px wide) is white when bit b is set


def _index_image(index: int) -> np.ndarray:
    bits = (index >> np.arange(BITS)) & 1  # [BITS]
    band = np.repeat(bits * 255, WIDTH // BITS).astype(np.uint8)  # [W]
    return np.broadcast_to(band[None, :, None], (HEIGHT, WIDTH, 3)).copy()  # [H, W, 3]


def _write_clip(path: Path, *, num_frames: int = NUM_FRAMES, faststart: bool = False,
                open_gop: bool = False) -> Path:
    """A 64x48 H.264 mp4 whose frames show their index; short GOPs with B-frames force seeks.

    In an open GOP the B-frames decoded right after a keyframe are shown before it and
    reference the previous GOP, which a seek to that keyframe cannot decode.
    """
    container_options = {"movflags": "faststart"} if faststart else {}
    x264_params = f"keyint=10:bframes=3:open-gop={int(open_gop)}"
    with av.open(str(path), "w", options=container_options) as container:
        stream = container.add_stream("libx264", rate=FPS, options={"x264-params": x264_params})
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        container.start_encoding()
        for index in range(num_frames):
            frame = av.VideoFrame.from_ndarray(_index_image(index), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


def _shown_indices(array: np.ndarray) -> list[int]:
    """Read back the index each frame of [T, H, W, 3] shows, at any frame size."""
    frames, _, width, _ = array.shape
    band_width = width // BITS
    gray = array.mean(axis=(1, 3))  # [T, W]
    centres = gray[:, band_width // 2 :: band_width][:, :BITS]  # [T, BITS]
    return [int(sum(1 << b for b in range(BITS) if centres[t, b] > 128)) for t in range(frames)]


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("videos")


@pytest.fixture(scope="module")
def clip(clip_dir: Path) -> Path:
    """2 fps, 30 s, 60 frames."""
    return _write_clip(clip_dir / "clip.mp4")


@pytest.fixture
def broken(tmp_path: Path, clip: Path) -> Callable[[str], Path]:
    """Files the reader must reject with VideoDecodeError, by kind."""

    def make(kind: str) -> Path:
        path = tmp_path / f"{kind}.mp4"
        if kind == "empty_file":
            path.write_bytes(b"")
        elif kind == "garbage":
            path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
        elif kind == "truncated":
            data = clip.read_bytes()
            path.write_bytes(data[: len(data) // 2])
        elif kind == "truncated_faststart":
            data = _write_clip(tmp_path / "faststart.mp4", faststart=True).read_bytes()
            path.write_bytes(data[: len(data) // 2])
        elif kind == "zero_frames":
            _write_clip(path, num_frames=0)
        return path

    return make


# --- which frames --------------------------------------------------------------------

def test_overview_indices_are_uniform_and_include_both_ends() -> None:
    assert overview_frame_indices(60, 4) == [0, 20, 39, 59]
    assert overview_frame_indices(10, 10) == list(range(10))


def test_overview_indices_never_repeat_when_asking_for_more_frames_than_exist() -> None:
    assert overview_frame_indices(5, 64) == [0, 1, 2, 3, 4]
    for num_frames in range(1, 200):
        indices = overview_frame_indices(num_frames, 64)
        assert len(set(indices)) == len(indices) == min(64, num_frames)


def test_window_samples_one_frame_per_second() -> None:
    indices = window_frame_indices(NUM_FRAMES, FPS, 10.0, 20.0)
    assert len(indices) == 10
    assert indices[0] == 20 and indices[-1] == 39


def test_window_count_is_clamped_to_max_frames_and_spans_the_window() -> None:
    indices = window_frame_indices(NUM_FRAMES, FPS, 0.0, 30.0, max_frames=16)
    assert len(indices) == 16
    assert indices[0] == 0 and indices[-1] == NUM_FRAMES - 1


def test_window_count_is_raised_to_min_frames_but_not_past_the_frames_it_holds() -> None:
    assert len(window_frame_indices(NUM_FRAMES, FPS, 10.0, 10.4)) == 1
    assert window_frame_indices(NUM_FRAMES, FPS, 10.0, 14.0, min_frames=6) == [20, 21, 23, 24, 26, 27]
    assert window_frame_indices(NUM_FRAMES, FPS, 10.0, 11.0, min_frames=4) == [20, 21]


def test_window_is_clamped_to_the_video() -> None:
    indices = window_frame_indices(NUM_FRAMES, FPS, 25.0, 100.0)
    assert len(indices) == 5 and indices[-1] == NUM_FRAMES - 1
    assert window_frame_indices(NUM_FRAMES, FPS, -5.0, 2.0) == [0, 3]


@pytest.mark.parametrize(("start", "end"), [(30.0, 40.0), (35.0, 40.0), (12.0, 12.0), (12.0, 8.0)])
def test_invalid_window_raises(start: float, end: float) -> None:
    with pytest.raises(ValueError, match="window start"):
        window_frame_indices(NUM_FRAMES, FPS, start, end)


# --- pixel bounds --------------------------------------------------------------------

@pytest.mark.parametrize("factor", [28, 32])
def test_smart_resize_respects_bounds_and_grid(factor: int) -> None:
    for height in (1, 17, 48, 96, 360, 480, 720, 1080, 2160):
        for width in (3, 64, 128, 640, 1280, 1920, 3840):
            if max(height, width) / min(height, width) > 200:
                continue
            out_h, out_w = smart_resize(height, width, factor=factor, min_pixels=784, max_pixels=50176)
            assert out_h % factor == 0 and out_w % factor == 0
            assert 784 <= out_h * out_w <= 50176


def test_smart_resize_keeps_the_aspect_ratio() -> None:
    for height, width in [(720, 1280), (1080, 1920), (480, 640), (1920, 1080), (96, 128)]:
        out_h, out_w = smart_resize(height, width)
        assert math.isclose(out_w / out_h, width / height, rel_tol=0.15)


def test_smart_resize_scales_up_to_min_pixels() -> None:
    out_h, out_w = smart_resize(48, 64, factor=16, min_pixels=20_000, max_pixels=50_176)
    assert out_h * out_w >= 20_000 and out_h % 16 == 0 and out_w % 16 == 0
    assert out_w > out_h


def test_smart_resize_rejects_extreme_aspect_ratios() -> None:
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 4000)


# --- decoding ------------------------------------------------------------------------

def test_probe_reports_frames_fps_duration_and_size(clip: Path) -> None:
    assert probe_video(clip) == (NUM_FRAMES, 2.0, 30.0, WIDTH, HEIGHT)


def test_overview_returns_the_uniform_frames_with_their_timestamps(clip: Path) -> None:
    frames = sample_overview_frames(clip, nframes=8, factor=16)
    assert frames.array.shape == (8, HEIGHT, WIDTH, 3) and frames.array.dtype == np.uint8
    assert frames.indices == overview_frame_indices(NUM_FRAMES, 8)
    assert _shown_indices(frames.array) == frames.indices
    assert frames.timestamps == [index / FPS for index in frames.indices]
    assert (frames.fps, frames.duration, frames.total_frames) == (2.0, 30.0, NUM_FRAMES)


def test_window_returns_the_frames_inside_the_window(clip: Path) -> None:
    frames = sample_window_frames(clip, 10.0, 20.0, fps=1.0, factor=16)
    assert len(frames.indices) == 10
    assert _shown_indices(frames.array) == frames.indices
    assert all(10.0 <= t < 20.0 for t in frames.timestamps)


def test_window_past_the_end_is_clamped_to_the_duration(clip: Path) -> None:
    frames = sample_window_frames(clip, 20.0, 90.0, max_frames=16)
    assert len(frames.indices) == 10 and max(frames.timestamps) < 30.0


def test_frames_obey_the_pixel_bounds(clip: Path) -> None:
    frames = sample_overview_frames(clip, nframes=4, factor=32, max_pixels=50176)
    _, height, width, _ = frames.array.shape
    assert (height, width) == smart_resize(HEIGHT, WIDTH, factor=32) == (64, 64)
    small = sample_overview_frames(clip, nframes=4, factor=16, min_pixels=256, max_pixels=1024)
    assert small.array.shape[1:3] == (16, 32)
    assert _shown_indices(small.array) == small.indices


def test_frames_equal_decord_at_native_size(clip: Path) -> None:
    """Skipping non-reference frames must not change a single decoded pixel."""
    frames = sample_overview_frames(clip, nframes=24, factor=16)
    reference = decord.VideoReader(str(clip)).get_batch(frames.indices).asnumpy()  # [T, H, W, 3]
    assert np.array_equal(frames.array, reference)


def test_open_gop_frames_equal_a_full_sequential_decode(clip_dir: Path) -> None:
    """Frames shown before a keyframe but decoded after it must come from the previous GOP."""
    path = _write_clip(clip_dir / "open_gop.mp4", open_gop=True)
    with av.open(str(path)) as container:
        decoded = sorted(((frame.pts, frame.to_ndarray(format="rgb24")) for frame in container.decode(video=0)),
                         key=lambda item: item[0])
    truth = np.stack([rgb for _, rgb in decoded])  # [N, H, W, 3] in presentation order
    with VideoFile(path) as video:
        for indices in (overview_frame_indices(NUM_FRAMES, 24), window_frame_indices(NUM_FRAMES, FPS, 8.0, 20.0)):
            assert np.array_equal(video.read(indices, height=HEIGHT, width=WIDTH), truth[indices])


def test_read_keeps_the_requested_order_and_repeats(clip: Path) -> None:
    with VideoFile(clip) as video:
        array = video.read([33, 5, 5, 0, 59], height=HEIGHT, width=WIDTH)
    assert _shown_indices(array) == [33, 5, 5, 0, 59]


def test_one_open_file_serves_overview_and_crops(clip: Path) -> None:
    with VideoFile(clip) as video:
        overview = sample_overview_frames(video, nframes=6)
        crop = sample_window_frames(video, 3.0, 9.0)
        again = sample_overview_frames(video, nframes=6)
    assert np.array_equal(overview.array, again.array)
    assert crop.indices == window_frame_indices(NUM_FRAMES, FPS, 3.0, 9.0)
    assert np.array_equal(crop.array, sample_window_frames(clip, 3.0, 9.0).array)


# --- errors and hashing --------------------------------------------------------------

@pytest.mark.parametrize("kind", ["empty_file", "garbage", "truncated", "truncated_faststart", "zero_frames"])
def test_broken_files_raise_a_clear_error(broken: Callable[[str], Path], kind: str) -> None:
    path = broken(kind)
    with pytest.raises(VideoDecodeError) as caught:
        sample_overview_frames(path, nframes=8)
    message = str(caught.value)
    assert str(path) in message and "ffmpeg" in message


def test_missing_file_raises_file_not_found(tmp_path: Path) -> None:
    missing = tmp_path / "nope.mp4"
    for call in (probe_video, video_sha256, lambda path: sample_window_frames(path, 0.0, 5.0)):
        with pytest.raises(FileNotFoundError, match="nope.mp4"):
            call(missing)


def test_sha256_is_the_hash_of_the_bytes(clip: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.mp4"
    shutil.copyfile(clip, copy)
    assert video_sha256(clip) == video_sha256(copy) == hashlib.sha256(clip.read_bytes()).hexdigest()
    copy.write_bytes(copy.read_bytes() + b"\0")
    assert video_sha256(copy) != video_sha256(clip)
