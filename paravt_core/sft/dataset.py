"""The SFT dataset over materialized ParaVT-Parquet rows, with an on-disk frame cache.

Decoded frames are cached keyed by (video content hash, sampling parameters), so a
second epoch, a resumed run or a second rank reading the same video does not decode it
again. Over-long samples are skipped or truncated per config, and counted. A sample
whose video does not decode (`VideoDecodeError`: the data contracts probe every video,
but a file can still break after them) is skipped, counted and named in
`SFTDataset.media_errors`, so one bad file never ends a long run.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from paravt_core.atomic import atomic_write_bytes
from paravt_core.sft.encode import IGNORE_INDEX, ConversationError, EncodedSample, encode_conversation
from paravt_core.video.errors import VideoDecodeError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FrameSampling:
    """How SFT samples a video: `fps` over the whole video, at most `max_frames` (SPEC §1); a
    window (a sub-agent row's crop) as the rollout samples crops: `crop_fps`, with
    `crop_min_frames` to `crop_max_frames` frames (SPEC §3, `video` config)."""

    fps: float
    max_frames: int
    min_pixels: int
    max_pixels: int
    factor: int = 32
    crop_fps: float = 1.0
    crop_min_frames: int = 1
    crop_max_frames: int = 16

    @classmethod
    def from_config(cls, video) -> FrameSampling:
        """The sampling of a `video` config section (`VideoConfig`): SFT's and the crops'."""
        return cls(fps=video.sft_fps, max_frames=video.sft_max_frames, crop_fps=video.crop_fps,
                   crop_min_frames=video.crop_min_frames, crop_max_frames=video.crop_max_frames,
                   min_pixels=video.min_pixels, max_pixels=video.max_pixels)

    def key(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)


class FrameCache:
    """Frames of (video, sampling) pairs kept as .npz files under `root`."""

    def __init__(self, root: Path, sampling: FrameSampling):
        self.root = Path(root)
        self.sampling = sampling
        self._video_hashes: dict[tuple[str, int, int], str] = {}
        self.hits = 0
        self.misses = 0

    def _video_hash(self, path: Path) -> str:
        from paravt_core.video import video_sha256

        stat = path.stat()
        memo = (str(path), stat.st_size, stat.st_mtime_ns)
        if memo not in self._video_hashes:
            self._video_hashes[memo] = video_sha256(path)
        return self._video_hashes[memo]

    def _entry(self, path: Path, window: tuple[float, float] | None, sampling: FrameSampling) -> Path:
        key = hashlib.sha256(f"{self._video_hash(path)}|{sampling.key()}|{window}".encode()).hexdigest()
        return self.root / key[:2] / f"{key}.npz"

    @staticmethod
    def _read_entry(entry: Path) -> tuple[np.ndarray, dict[str, Any]] | None:
        """(frames, metadata fields) of a cache file, or None (and the file removed) when it is
        damaged, e.g. truncated by a full disk or a killed copy: the caller decodes again."""
        import zipfile

        try:
            with np.load(entry) as z:
                return z["frames"], json.loads(str(z["meta"]))
        except (zipfile.BadZipFile, OSError, EOFError, KeyError, ValueError) as error:
            _damaged_entry_warning(entry, error)
            entry.unlink(missing_ok=True)
            return None

    def load(self, path: Path, window: tuple[float, float] | None = None, max_frames: int | None = None):
        """(frames uint8 [T, H, W, 3], transformers VideoMetadata) for one video, or for the
        window (start, end) seconds of it sampled as a crop. `max_frames` caps a whole video's
        frames below the sampling's own `max_frames` (an overview budget); crops ignore it."""
        from transformers.video_utils import VideoMetadata

        sampling = self.sampling
        if max_frames is not None and window is None:
            sampling = dataclasses.replace(sampling, max_frames=min(max_frames, sampling.max_frames))
        entry = self._entry(path, window, sampling)
        if entry.is_file():
            cached = self._read_entry(entry)
            if cached is not None:
                self.hits += 1
                return cached[0], VideoMetadata(**cached[1])
        self.misses += 1
        frames, meta = decode_video(path, sampling, window)
        buf = io.BytesIO()
        np.savez(buf, frames=frames, meta=np.array(json.dumps(meta)))
        atomic_write_bytes(entry, buf.getvalue())
        return frames, VideoMetadata(**meta)


def _damaged_entry_warning(entry: Path, error: Exception) -> None:
    log.warning("frame cache entry %s is damaged (%s: %s); decoding the video again", entry,
                type(error).__name__, error)


def decode_video(path: Path, s: FrameSampling, window: tuple[float, float] | None = None
                 ) -> tuple[np.ndarray, dict[str, Any]]:
    """Frames of a whole video at `s.fps`, at most `s.max_frames`, with their metadata fields;
    or of `window` at `s.crop_fps`, `s.crop_min_frames` to `s.crop_max_frames` (as
    `agent.dispatch` samples a sub-agent's crop)."""
    from paravt_core.video import VideoFile, sample_window_frames

    with VideoFile(path) as video:  # one open: index the file once for probe and decode
        if window is None:
            frames = sample_window_frames(
                video, 0.0, video.info.duration, fps=s.fps, min_frames=1, max_frames=s.max_frames,
                min_pixels=s.min_pixels, max_pixels=s.max_pixels, factor=s.factor,
            )
        else:
            frames = sample_window_frames(
                video, *window, fps=s.crop_fps, min_frames=s.crop_min_frames, max_frames=s.crop_max_frames,
                min_pixels=s.min_pixels, max_pixels=s.max_pixels, factor=s.factor,
            )
    _, height, width, _ = frames.array.shape
    meta = dict(total_num_frames=frames.total_frames, fps=frames.fps, width=width, height=height,
                duration=frames.duration, frames_indices=list(frames.indices))
    return frames.array, meta


def load_image(path: Path):
    from PIL import Image

    with Image.open(path) as img:
        return img.convert("RGB")


def read_sft_rows(files: Sequence[Path]) -> list[dict[str, Any]]:
    """All rows of the SFT parquet shards, `messages` decoded to Python lists."""
    import pyarrow.parquet as pq

    rows = []
    for f in files:
        for i, row in enumerate(pq.read_table(f).to_pylist()):
            messages = row.get("messages")
            if isinstance(messages, str):
                messages = json.loads(messages)
            if not messages:
                raise ConversationError(f"{f}: row {i}: empty `messages`; validate the shard with the data contracts")
            rows.append({"source": f"{Path(f).name}:{i}", "messages": messages})
    return rows


@dataclass
class OverlongPolicy:
    max_seq_len: int
    mode: str  # "skip" | "truncate"
    skipped: int = 0
    truncated: int = 0
    skipped_sources: list[str] = field(default_factory=list)


def overview_budget(source: str, choices: Sequence[int]) -> int:
    """The overview frame budget of the SFT row `source` ("<shard>:<row>"), one of `choices`
    (`video.sft_frame_choices`): a stable hash of the row, so every epoch, rank and resumed run
    gives the row the same frames (and the frame cache keeps hitting)."""
    from paravt_core.video.sampling import frame_budget_of

    return frame_budget_of(f"sft-overview|{source}", choices)


def row_budget(messages) -> int | None:
    """The overview budget a row sets itself: `nframes` on a whole-video item (the generator's
    overview-reading teacher chose K and wrote what those K frames show, `data.synth.teacher_budgets`),
    which then wins over `overview_budget`'s draw. None when no item sets one.

    Raises:
        ConversationError: `nframes` is not a positive integer, or two items set different ones.
    """
    found: set[int] = set()
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for item in content:
            value = item.get("nframes") if isinstance(item, dict) else None
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConversationError(f"video item nframes={value!r} must be a positive integer")
            found.add(value)
    if len(found) > 1:
        raise ConversationError(f"video items set different nframes {sorted(found)}: one overview budget per row")
    return found.pop() if found else None


class SFTDataset:
    """Index -> EncodedSample, encoding lazily (frames through the cache).

    A row's whole-video frames are capped at its own `row_budget` when it sets one, else, with
    `frame_choices`, at its `overview_budget`."""

    def __init__(self, rows: list[dict[str, Any]], processor, cache: FrameCache, overlong: OverlongPolicy,
                 tools: Sequence[dict[str, Any]] | None = None, frame_choices: Sequence[int] | None = None):
        self.rows = rows
        self.frame_choices = tuple(frame_choices) if frame_choices else None
        self.processor = processor
        self.cache = cache
        self.overlong = overlong
        self.tools = tools
        self.media_errors: dict[str, str] = {}  # row source -> why its video did not decode
        self._undecodable: set[int] = set()

    def __len__(self) -> int:
        return len(self.rows)

    def encode(self, index: int) -> EncodedSample | None:
        """The encoded sample, or None when it is over-long and the policy skips it, or its
        video does not decode (skipped, counted in `media_errors`, and not tried again)."""
        row = self.rows[index]
        if index in self._undecodable:
            return None
        try:
            sampling = self.cache.sampling
            load_video = self.cache.load
            budget = row_budget(row["messages"])
            if budget is None and self.frame_choices:
                budget = overview_budget(row["source"], self.frame_choices)
            if budget is not None:
                load_video = functools.partial(self.cache.load, max_frames=budget)
            sample = encode_conversation(row["messages"], self.processor, load_video, load_image, self.tools,
                                         (sampling.min_pixels, sampling.max_pixels))
        except ConversationError as err:
            raise ConversationError(f"{row['source']}: {err}") from err
        except VideoDecodeError as err:
            self._undecodable.add(index)
            self.media_errors[row["source"]] = str(err)
            log.warning("skipping %s: %s", row["source"], err)
            return None
        if sample.num_tokens <= self.overlong.max_seq_len:
            return sample
        if self.overlong.mode == "skip" or _cuts_vision(sample, self.overlong.max_seq_len):
            self.overlong.skipped += 1
            self.overlong.skipped_sources.append(row["source"])
            log.warning("skipping %s: %d tokens > max_seq_len %d", row["source"], sample.num_tokens,
                        self.overlong.max_seq_len)
            return None
        self.overlong.truncated += 1
        n = self.overlong.max_seq_len
        sample.input_ids, sample.labels = sample.input_ids[:n], sample.labels[:n]
        sample.mm_token_type_ids = sample.mm_token_type_ids[:n]
        if int((sample.labels != IGNORE_INDEX).sum()) == 0:
            self.overlong.skipped += 1
            return None
        return sample


def _cuts_vision(sample: EncodedSample, n: int) -> bool:
    """Truncating inside the vision tokens would leave patches without placeholders."""
    return bool((sample.mm_token_type_ids[n:] != 0).any())
