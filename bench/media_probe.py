"""What the media probe costs on a one-hour video: first + last frame vs every keyframe + 64 spread frames.

`paravt_core.video.health` probes each training and evaluation video once (cached by content
hash). Its version 2 decodes every keyframe and 64 evenly spread frames, at 16x16, to catch
a damaged GOP in the middle of a file (issue #33); version 1 decoded the first and last
frame only. This writes a one-hour 640x360 clip with a keyframe every --gop-s seconds (2 s:
1,800 GOPs, a phone or streaming encoder's spacing; x264's default is 10 s at 25 fps) at
--fps frames per second, then times both probes on it, median of --repeats, one thread.

Run: .venv/bin/python bench/media_probe.py [--minutes 60] [--gop-s 2] [--fps 2]

With --videos N it measures the data stage's case instead (issue #44): N distinct clips of
--minutes each, hashed and probed by `MediaHealthCache.check_all` one at a time, by a pool of
threads and by a pool of processes (--workers each, default one per core), empty caches each time.
Run: .venv/bin/python bench/media_probe.py --videos 16 --minutes 4
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from sft_gpu import write_video

from paravt_core.video import VideoFile
from paravt_core.video.health import _PROBE_SIZE, probe_indices


def timed(path: Path, which: str) -> tuple[float, int]:
    started = time.perf_counter()
    with VideoFile(path) as video:
        n = video.info.num_frames
        indices = sorted({0, n - 1}) if which == "v1" else probe_indices(n, video.keyframes)
        video.read(indices, height=_PROBE_SIZE, width=_PROBE_SIZE)
    return time.perf_counter() - started, len(indices)


def pools(args: argparse.Namespace) -> None:
    """Serial vs thread pool vs process pool over --videos distinct clips (module docstring)."""
    from concurrent.futures import ThreadPoolExecutor

    from paravt_core.video import health

    workers = args.workers or health.default_workers()
    with tempfile.TemporaryDirectory(prefix="paravt-bench-pool-") as tmp:
        clips = [write_video(Path(tmp) / f"clip{i}.mp4", seconds=int(args.minutes * 60), fps=args.fps,
                             gop=max(1, int(round(args.gop_s * args.fps))), size=(360 + 2 * i, 640))
                 for i in range(args.videos)]  # distinct sizes: distinct contents, no shared verdict

        def fresh(run: int, name: str) -> health.MediaHealthCache:
            health._hashes.clear()
            return health.MediaHealthCache(Path(tmp) / f"cache-{name}-{run}")

        def threads(cache: health.MediaHealthCache) -> None:
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(cache.check, clips))

        ways = {"one at a time": lambda cache: cache.check_all(clips, workers=1),
                f"{workers} threads": threads,
                f"{workers} processes": lambda cache: cache.check_all(clips, workers=workers)}
        times: dict[str, list[float]] = {name: [] for name in ways}
        for run in range(args.repeats):  # interleaved, so a busy machine slows every way alike
            for name, way in ways.items():
                cache = fresh(run, name.replace(" ", "-"))
                started = time.perf_counter()
                way(cache)
                times[name].append(time.perf_counter() - started)
    print(f"{args.videos} clips of {args.minutes:g} min, {args.repeats} runs, median seconds:")
    for name, runs in times.items():
        median = statistics.median(runs)
        print(f"{name:<16} | {median:>7.2f} s | {args.videos / median:>6.2f} videos/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--gop-s", type=float, default=2.0)
    parser.add_argument("--fps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--videos", type=int, default=0, help="compare serial / threads / processes on N clips")
    parser.add_argument("--workers", type=int, default=0, help="pool size with --videos (0: one per core)")
    args = parser.parse_args()
    if args.videos:
        pools(args)
        return
    with tempfile.TemporaryDirectory(prefix="paravt-bench-probe-") as tmp:
        started = time.perf_counter()
        clip = write_video(Path(tmp) / "hour.mp4", seconds=int(args.minutes * 60), fps=args.fps,
                           gop=max(1, int(round(args.gop_s * args.fps))))
        with VideoFile(clip) as video:
            keys, frames = len(video.keyframes), video.info.num_frames
        print(f"{args.minutes:.0f} min 640x360 clip, {frames} frames, {keys} keyframes, "
              f"{clip.stat().st_size / 2**20:.0f} MiB, written in {time.perf_counter() - started:.0f} s")
        rows = {}
        for which in ("v1", "v2"):
            runs = [timed(clip, which) for _ in range(args.repeats)]
            rows[which] = (statistics.median(t for t, _ in runs), runs[0][1])
    print(f"{'probe':<40} | {'frames decoded':>14} | {'seconds':>7}")
    print(f"{'v1: first + last frame':<40} | {rows['v1'][1]:>14} | {rows['v1'][0]:>7.2f}")
    print(f"{'v2: every keyframe + 64 spread frames':<40} | {rows['v2'][1]:>14} | {rows['v2'][0]:>7.2f}")
    print(f"v2 / v1: {rows['v2'][0] / rows['v1'][0]:.1f}x")


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)
    main()
