"""Media health: is a video file one the pipeline can train or evaluate on?

`check_video` opens the file, indexes its frames (`VideoFile`), and decodes at a small size
its first and last frame, every keyframe (the first frame of each GOP) and 64 frames spread
evenly (the overview budget of SPEC §7), so a zero-byte file, a text file named `.mp4`, a
container without a video stream, a video with no frames or no duration, a truncated tail
and a damaged GOP in the middle are all caught before a stage depends on them. A damaged
frame inside a GOP that none of those frames needs can still pass; the stages that decode
at run time set such a sample aside (`agent.rollout.run_dropping_undecodable`, the SFT
dataset, the evaluator). Cost (`bench/media_probe.py`, 2 cores): 0.83 s for a one-hour
640x360 clip with a keyframe every 2 s (1,848 frames decoded), against 0.02 s for the first
and last frame only; its frames are flat synthetic ones, real footage decodes slower. The verdict is cached by the file's content
hash (`MediaHealthCache`, one JSON file per hash), so a video shared by many rows, or
seen again by a later run, is probed once; within a process the content hash itself is
remembered per (path, size, mtime).

`MediaHealthCache.check_all` hashes and probes many videos over a pool of processes, with a
progress bar and rate: the data stage's checks of ~10^5 videos ran one at a time (issue #44).
Processes, not threads: PyAV releases the GIL only inside its libavcodec calls, while the
reader's per-packet work (demuxing, choosing the frames to decode) is Python. A video whose
worker fails (or a pool that breaks) is probed again in the caller by `check`. Not measured
where it matters: on the shared two-core development machine nothing parallel paid (`bench/media_probe.py
--videos 8 --minutes 20`: 14.8 s one at a time, 14.6 s with two threads, 18.5 s with two
processes; two pure-Python loops ran no faster in two processes either: its CPU was taken).
A pool starts only with `MIN_VIDEOS_PER_WORKER` unknown videos per process, since each
process first imports PyAV and NumPy (~1 s). Verdicts are `check`'s, one video at a time.

The data contracts call this for every SFT, RL and evaluation video when the data stage
asks them to (`data_contracts.rules.video_health_problem`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from paravt_core.atomic import atomic_write_text
from paravt_core.video.errors import VideoDecodeError
from paravt_core.video.hashing import video_sha256
from paravt_core.video.reader import VideoFile
from paravt_core.video.sampling import overview_frame_indices

log = logging.getLogger(__name__)

# Bumped when what `check_video` checks changes, so older cached verdicts are not reused.
PROBE_VERSION = 2  # 2: every keyframe and 64 spread frames, not only the first and last
_PROBE_SIZE = 16  # pixels per side of the decoded probe frames: decoding, not looking
_PROBE_SPREAD = 64  # frames spread evenly over the video, as a 64-frame overview samples them (SPEC §3)


@dataclass(frozen=True)
class VideoHealth:
    """A probe's verdict: `problem` is None for a usable video."""

    sha256: str
    num_frames: int
    duration: float
    problem: str | None

    @property
    def ok(self) -> bool:
        return self.problem is None


def probe_indices(num_frames: int, keyframes: list[int]) -> list[int]:
    """The frames the probe decodes: every keyframe and the overview sampler's `_PROBE_SPREAD`
    frames (first and last included), the very indices a 64-frame overview reads."""
    return sorted({*keyframes, *overview_frame_indices(num_frames, _PROBE_SPREAD)})


def _probe(path: Path) -> tuple[int, float, str | None]:
    """(frames, duration, problem) of one video file."""
    import av

    if path.stat().st_size == 0:
        return 0, 0.0, "the file is empty (0 bytes)"
    try:
        with VideoFile(path) as video:
            info = video.info
            if info.num_frames < 1 or not info.duration > 0:
                return info.num_frames, info.duration, f"it has {info.num_frames} frames over {info.duration} s"
            video.read(probe_indices(info.num_frames, video.keyframes), height=_PROBE_SIZE, width=_PROBE_SIZE)
    except VideoDecodeError as error:
        return 0, 0.0, error.problem
    except (av.FFmpegError, OSError, ValueError, IndexError) as error:
        return 0, 0.0, f"it does not decode ({type(error).__name__}: {error})"
    return info.num_frames, info.duration, None


FileKey = tuple[str, int, int]  # (resolved path, size, mtime_ns): a file's content, unless rewritten in place
_hashes: dict[FileKey, str] = {}  # this process's content hashes, also those computed by `check_all`'s workers


def _file_key(path: Path) -> FileKey:
    stat = path.stat()
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


def _content_hash(key: FileKey) -> str:
    if key not in _hashes:
        _hashes[key] = video_sha256(key[0])
    return _hashes[key]


def _check_in_worker(path: str, folder: str | None) -> tuple[FileKey, VideoHealth]:
    """One video's file key and verdict, in a `check_all` worker (the verdict is stored there)."""
    key = _file_key(Path(path))
    return key, MediaHealthCache(folder).check(path)


MIN_VIDEOS_PER_WORKER = 4


def default_workers() -> int:
    """One probe process per CPU this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class MediaHealthCache:
    """Verdicts of `check_video` by content hash under `folder` (None: in memory only)."""

    def __init__(self, folder: str | os.PathLike[str] | None = None):
        self.folder = Path(folder) if folder is not None else None
        self._memory: dict[str, VideoHealth] = {}

    def check(self, path: str | os.PathLike[str]) -> VideoHealth:
        """The verdict for the video at `path` (probed only if its content was never seen).

        Raises:
            FileNotFoundError: no file at the path (existence is a separate rule).
        """
        path = Path(path)
        sha = _content_hash(_file_key(path))
        if sha in self._memory:
            return self._memory[sha]
        health = self._stored(sha)
        if health is None:
            frames, duration, problem = _probe(path)
            health = VideoHealth(sha, frames, duration, problem)
            self._store(health)
        self._memory[sha] = health
        return health

    def check_all(self, paths: Sequence[str | os.PathLike[str]], workers: int | None = None,
                  progress: bool = False) -> list[VideoHealth | None]:
        """The verdicts of many videos, in order (None for a path that is not a file); each
        distinct file not seen by this process yet is hashed and probed in one of `workers`
        processes (None: one per CPU; 1: here, one at a time; fewer when there are fewer than
        `MIN_VIDEOS_PER_WORKER` videos for each). Afterwards `check` answers for these paths
        without hashing or probing again."""
        paths = [Path(p) for p in paths]
        keys = {}
        for path in dict.fromkeys(paths):
            try:
                keys[path] = _file_key(path)
            except OSError:
                continue  # absent: not this check's to report (the existence rule is)
        todo = [path for path, key in keys.items() if _hashes.get(key) not in self._memory]
        workers = min(workers or default_workers(), len(todo) // MIN_VIDEOS_PER_WORKER)
        if workers > 1:
            self._probe_in_pool(todo, workers, progress)
        verdicts: dict[Path, VideoHealth] = {}
        for path in tqdm(keys, desc="media health", unit="video", disable=not progress or workers > 1,
                         mininterval=2.0):  # one at a time: the bar is this loop's
            try:
                verdicts[path] = self.check(path)
            except OSError:
                continue
        return [verdicts.get(path) for path in paths]

    def _probe_in_pool(self, paths: list[Path], workers: int, progress: bool) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        started = time.perf_counter()
        folder = None if self.folder is None else str(self.folder)
        # spawn: a fork of a threaded caller (a Prefect worker, a DeepSpeed launcher) can deadlock.
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        try:
            futures = [pool.submit(_check_in_worker, str(path), folder) for path in paths]
            for future in tqdm(as_completed(futures), total=len(futures), desc="media health", unit="video",
                               disable=not progress, mininterval=2.0):
                try:
                    key, health = future.result()
                except Exception:  # noqa: BLE001 - that video is probed again by `check`, which reports it
                    continue
                _hashes[key] = health.sha256
                self._memory[health.sha256] = health
        finally:
            # Interrupted (Ctrl-C, a cancelled flow): the queued probes are dropped, not run to the end.
            pool.shutdown(wait=True, cancel_futures=True)
        elapsed = time.perf_counter() - started
        log.info("media health: probed %d videos in %.0f s (%.1f videos/s, %d processes)", len(paths), elapsed,
                 len(paths) / max(elapsed, 1e-9), workers)

    def _entry(self, sha: str) -> Path | None:
        return None if self.folder is None else self.folder / f"{sha}.json"

    def _stored(self, sha: str) -> VideoHealth | None:
        entry = self._entry(sha)
        try:
            record = json.loads(entry.read_text()) if entry is not None else None
        except (OSError, ValueError):
            return None  # absent or unreadable: probe again
        if not isinstance(record, dict) or record.pop("probe_version", None) != PROBE_VERSION:
            return None
        try:
            return VideoHealth(**record)
        except TypeError:
            return None

    def _store(self, health: VideoHealth) -> None:
        entry = self._entry(health.sha256)
        if entry is not None:
            atomic_write_text(entry, json.dumps({**asdict(health), "probe_version": PROBE_VERSION}))


@functools.lru_cache(maxsize=8)
def health_cache(folder: str | None) -> MediaHealthCache:
    """One cache object per folder and process (the contract rules call this per cell)."""
    return MediaHealthCache(folder)
