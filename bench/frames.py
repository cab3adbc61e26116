"""Frame sampling speed: paravt_core.video vs the release's `qwen_vl_utils.fetch_video`.

Two workloads on generated H.264 videos, at equal frame counts and equal pixel bounds
(factor 32 = Qwen3-VL patch 16 x merge 2, 784..50176 pixels per frame, SPEC §3):
  overview  64 frames uniform over the whole video
  crop      1 fps in a 16 s window in the middle (16 frames)
Columns, all measured side by side in one run (median wall time of --repeats calls,
each call opening the file afresh, implementations interleaved; frames/s = frames / median):
  qwen_vl_utils  fetch_video with its decord backend (FORCE_QWENVL_VIDEO_READER=decord):
                 decord get_batch at full size, then torchvision bicubic resize to float32
  decord@size    decord get_batch on our indices with the resize done inside decord
                 (VideoReader width/height): the best we found with decord alone
  ours           sample_overview_frames / sample_window_frames (PyAV, non-reference
                 frames skipped, one-pass YUV->RGB + resize)
  same idx       frame indices both pick; crops differ by a frame at the window edges
                 (fetch_video also takes the frame at the window's end time)
  cpu qwen/ours  ratio of median process CPU time per call (all threads), which shows
                 whether a side wins by doing less work or by using more cores

Needs `pip install qwen-vl-utils==0.0.14` (the `bench` extra); without it the reference
column is left out. Run: `.venv/bin/python bench/frames.py [--repeats 9]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

os.environ["FORCE_QWENVL_VIDEO_READER"] = "decord"  # read by qwen_vl_utils at import

import av
import decord
import numpy as np

from paravt_core.video import (
    DEFAULT_MAX_PIXELS,
    DEFAULT_MIN_PIXELS,
    QWEN3_VL_FACTOR,
    probe_video,
    sample_overview_frames,
    sample_window_frames,
    smart_resize,
)

try:
    from qwen_vl_utils import fetch_video
except ImportError:
    fetch_video = None

PATCH_SIZE = 16  # Qwen3-VL; fetch_video multiplies it by its merge size 2 -> factor 32
OVERVIEW_FRAMES = 64
CROP_SECONDS = 16.0
PIXELS = {"min_pixels": DEFAULT_MIN_PIXELS, "max_pixels": DEFAULT_MAX_PIXELS}


@dataclass(frozen=True)
class VideoSpec:
    width: int
    height: int
    fps: int
    seconds: int
    keyint_seconds: int | None  # None: x264's default (250 frames)
    b_frames: int = 3

    @property
    def name(self) -> str:
        gop = f"gop {self.keyint_seconds}s" if self.keyint_seconds else "gop 250f"
        return f"{self.width}x{self.height} {self.fps}fps {self.seconds}s {gop} bf{self.b_frames}"


SPECS = [
    VideoSpec(128, 96, 4, 300, None),
    VideoSpec(128, 96, 8, 120, 10),
    VideoSpec(640, 360, 4, 180, 10),
    VideoSpec(640, 360, 4, 120, 10, b_frames=0),
]


def _moving_scene(spec: VideoSpec, index: int) -> np.ndarray:
    """A drifting texture with a moving square, so the encoder sees real motion."""
    rows, cols = np.mgrid[0 : spec.height, 0 : spec.width]  # [H, W] each
    shift = 2 * index
    texture = 128 + 60 * np.sin((cols + shift) / 9.0) * np.cos((rows - shift) / 13.0)  # [H, W]
    frame = np.stack([texture, np.roll(texture, spec.width // 3, axis=1), 255 - texture], axis=-1)
    side = spec.height // 4
    top, left = (index * 3) % (spec.height - side), (index * 5) % (spec.width - side)
    frame[top : top + side, left : left + side] = (240, 40, (index * 7) % 256)
    return frame.astype(np.uint8)  # [H, W, 3]


def write_video(spec: VideoSpec, path: Path) -> Path:
    # One slice per frame, as in camera and web video; x264's sliced threads would
    # give our slice-threaded decoder an unrealistic edge.
    params = "sliced-threads=0" + (f":keyint={spec.keyint_seconds * spec.fps}" if spec.keyint_seconds else "")
    options = {"preset": "veryfast", "bf": str(spec.b_frames), "x264-params": params}
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=spec.fps, options=options)
        stream.width, stream.height, stream.pix_fmt = spec.width, spec.height, "yuv420p"
        for index in range(spec.fps * spec.seconds):
            frame = av.VideoFrame.from_ndarray(_moving_scene(spec, index), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


@dataclass
class Result:
    frames: int
    shape: tuple[int, int]  # (H, W) of each frame
    indices: list[int]


def qwen_overview(path: Path) -> Result:
    video, meta = fetch_video({"video": str(path), "nframes": OVERVIEW_FRAMES, **PIXELS},
                              image_patch_size=PATCH_SIZE, return_video_metadata=True)  # [T, 3, H, W]
    return Result(video.shape[0], tuple(video.shape[2:]), [int(i) for i in meta["frames_indices"]])


def qwen_crop(path: Path, start: float) -> Result:
    element = {"video": str(path), "video_start": start, "video_end": start + CROP_SECONDS,
               "fps": 1.0, "min_frames": 1, "max_frames": 16, **PIXELS}
    video, meta = fetch_video(element, image_patch_size=PATCH_SIZE, return_video_metadata=True)
    return Result(video.shape[0], tuple(video.shape[2:]), [int(i) for i in meta["frames_indices"]])


def ours_overview(path: Path) -> Result:
    frames = sample_overview_frames(path, OVERVIEW_FRAMES, factor=QWEN3_VL_FACTOR, **PIXELS)
    return Result(len(frames.indices), tuple(frames.array.shape[1:3]), frames.indices)


def ours_crop(path: Path, start: float) -> Result:
    frames = sample_window_frames(path, start, start + CROP_SECONDS, fps=1.0, min_frames=1, max_frames=16,
                                  factor=QWEN3_VL_FACTOR, **PIXELS)
    return Result(len(frames.indices), tuple(frames.array.shape[1:3]), frames.indices)


def decord_at_size(path: Path, indices: list[int]) -> Result:
    """decord decoding our indices with its own resize (header probed with PyAV, cheap)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        height, width = smart_resize(stream.height, stream.width, factor=QWEN3_VL_FACTOR, **PIXELS)
    batch = decord.VideoReader(str(path), width=width, height=height).get_batch(indices).asnumpy()
    return Result(batch.shape[0], tuple(batch.shape[1:3]), indices)


@dataclass
class Timing:
    wall: float  # median wall seconds per call
    cpu: float  # median process CPU seconds per call (all threads), less hurt by busy neighbours


def median_timings(calls: dict[str, Callable[[], Result]], repeats: int) -> dict[str, Timing]:
    """Median times per call; the order of implementations rotates every repeat."""
    for call in calls.values():
        call()  # warm the page cache and lazy imports
    walls: dict[str, list[float]] = {name: [] for name in calls}
    cpus: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for repeat in range(repeats):
        for name in names[repeat % len(names):] + names[: repeat % len(names)]:
            wall, cpu = time.perf_counter(), time.process_time()
            calls[name]()
            walls[name].append(time.perf_counter() - wall)
            cpus[name].append(time.process_time() - cpu)
    return {name: Timing(statistics.median(walls[name]), statistics.median(cpus[name])) for name in calls}


def bench_video(path: Path, spec: VideoSpec, repeats: int) -> list[dict[str, object]]:
    crop_start = probe_video(path).duration / 2
    workloads = {
        "overview": (lambda: ours_overview(path), lambda: qwen_overview(path)),
        "crop": (lambda: ours_crop(path, crop_start), lambda: qwen_crop(path, crop_start)),
    }
    rows = []
    for workload, (ours, theirs) in workloads.items():
        ours_result = ours()
        calls = {"ours": ours, "decord@size": lambda: decord_at_size(path, ours_result.indices)}
        same = "n/a"
        if fetch_video is not None:
            theirs_result = theirs()
            if (theirs_result.frames, theirs_result.shape) != (ours_result.frames, ours_result.shape):
                raise SystemExit(f"unequal work on {spec.name} {workload}: {theirs_result} vs {ours_result}")
            same = f"{len(set(theirs_result.indices) & set(ours_result.indices))}/{ours_result.frames}"
            calls["qwen_vl_utils"] = theirs
        timings = median_timings(calls, repeats)
        row = {"video": spec.name, "workload": workload, "frames": ours_result.frames,
               "size": f"{ours_result.shape[0]}x{ours_result.shape[1]}", "same_idx": same,
               **{name: ours_result.frames / timing.wall for name, timing in timings.items()}}
        if "qwen_vl_utils" in timings:
            row["cpu_ratio"] = timings["qwen_vl_utils"].cpu / timings["ours"].cpu
        rows.append(row)
    return rows


COLUMNS = [  # (title, width, format of the cell)
    ("video", -38, "{video}"), ("workload", -9, "{workload}"), ("frames", 6, "{frames}"), ("HxW", 7, "{size}"),
    ("same idx", 8, "{same_idx}"), ("qwen f/s", 9, "{qwen:.1f}"), ("decord@size f/s", 15, "{decord:.1f}"),
    ("ours f/s", 9, "{ours:.1f}"), ("ours/qwen", 9, "{ratio:.2f}x"), ("cpu qwen/ours", 13, "{cpu_ratio:.2f}x"),
]


def print_table(rows: list[dict[str, object]]) -> None:
    def line(cells: list[str]) -> str:
        widths = [width for _, width, _ in COLUMNS]
        return " ".join(f"{cell:{'<' if width < 0 else '>'}{abs(width)}}" for cell, width in zip(cells, widths))

    header = line([title for title, _, _ in COLUMNS])
    print(header)
    print("-" * len(header))
    for row in rows:
        theirs = row.get("qwen_vl_utils", float("nan"))
        values = {"cpu_ratio": float("nan"), **row, "qwen": theirs, "decord": row["decord@size"],
                  "ratio": row["ours"] / theirs}
        print(line([cell.format(**values) for _, _, cell in COLUMNS]))
    for workload in ("overview", "crop"):
        ratios = [row["ours"] / row["qwen_vl_utils"] for row in rows
                  if row["workload"] == workload and "qwen_vl_utils" in row]
        cpu_ratios = [row["cpu_ratio"] for row in rows if row["workload"] == workload and "cpu_ratio" in row]
        if ratios:
            print(f"geometric mean, {workload}: wall ours/qwen {statistics.geometric_mean(ratios):.2f}x, "
                  f"cpu qwen/ours {statistics.geometric_mean(cpu_ratios):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="timed calls per implementation (median kept)")
    args = parser.parse_args()
    if fetch_video is None:
        print("qwen-vl-utils is not installed: the reference column is left out "
              "(`.venv/bin/pip install qwen-vl-utils==0.0.14`).", file=sys.stderr)
    print(f"cpus={os.cpu_count()} av={av.__version__} decord={decord.__version__} repeats={args.repeats}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_frames_") as tmp:
        for number, spec in enumerate(SPECS):
            started = time.perf_counter()
            path = write_video(spec, Path(tmp) / f"video{number}.mp4")
            print(f"wrote {spec.name} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
            rows.extend(bench_video(path, spec, args.repeats))
    print_table(rows)


if __name__ == "__main__":
    main()
