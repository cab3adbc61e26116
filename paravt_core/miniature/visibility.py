"""Which overview budgets K show a generated video's events: a pure function of the world's manifest.

PARA-GRPO's nFrames gating (SPEC §5) only has something to act on when a smaller overview
shows less. Whether that holds in a generated world is a property of where its events lie
against the K frames the overview takes (`video.sampling.overview_frame_indices`, the same
indices for evaluation, SFT and RL overviews), so it is counted here from the ground truth
(`manifest.json`: each video's `n_frames` and events, visible on frames
`start_frame <= i < end_frame`), without rendering or decoding a frame.

`paravt miniature visibility --config C` prints, for the training videos and each evaluation
split, the share of videos with at least one event on an overview frame, per K. With `--eval
FILE` (an evaluation's per-question `<split>.jsonl`) it also splits that evaluation's accuracy and
crop calls by whether the K frames of each question's video show its event (`records_by_shown`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paravt_core.video.sampling import overview_frame_indices


def event_visible(video: Mapping[str, Any], k: int) -> bool:
    """Whether one of the video's events lies on one of its K overview frames."""
    frames = overview_frame_indices(int(video["n_frames"]), k)
    return any(event["start_frame"] <= i < event["end_frame"] for event in video.get("events", ()) for i in frames)


def visible_share(videos: Sequence[Mapping[str, Any]], k: int) -> float:
    """The share of `videos` with an event on their K overview frames."""
    if not videos:
        raise ValueError("no videos to count")
    return sum(event_visible(video, k) for video in videos) / len(videos)


def manifest_video_sets(manifest: Mapping[str, Any]) -> dict[str, list[Mapping[str, Any]]]:
    """{"train": the training videos, <split>: that split's videos} from a world's manifest."""
    sets = {"train": [entry["video"] for entry in manifest.get("train", ())]}
    for split, block in manifest.get("eval", {}).items():
        sets[split] = [entry["video"] for entry in block.get("videos", ())]
    return {name: videos for name, videos in sets.items() if videos}


@dataclass(frozen=True)
class VisibilityRow:
    videos: str  # "train" or an evaluation split
    n: int
    shares: dict[int, float]  # K -> share of the videos with an event on the K overview frames


def visibility_table(manifest: Mapping[str, Any], budgets: Iterable[int]) -> list[VisibilityRow]:
    """One row per video set of the manifest, a share per K in `budgets`."""
    ks = sorted(set(budgets))
    return [VisibilityRow(name, len(videos), {k: visible_share(videos, k) for k in ks})
            for name, videos in manifest_video_sets(manifest).items()]


def table_markdown(rows: Sequence[VisibilityRow]) -> str:
    ks = sorted({k for row in rows for k in row.shares})
    lines = ["| videos | n | " + " | ".join(f"K={k}" for k in ks) + " |", "|---|---:|" + "---:|" * len(ks)]
    for row in rows:
        lines.append(f"| {row.videos} | {row.n} | " + " | ".join(f"{100 * row.shares[k]:.1f} %" for k in ks) + " |")
    return "\n".join(lines)


@dataclass(frozen=True)
class ShownRow:
    shown: bool  # the question's video has its event on its K overview frames
    questions: int
    accuracy: float
    calls: float  # crop calls per question


def records_by_shown(records: Sequence[Mapping[str, Any]], video_of: Mapping[str, Mapping[str, Any]],
                     k: int) -> list[ShownRow]:
    """An evaluation's per-question records (`id`, `correct`, `tool_calls`) split by whether the K
    overview frames of the question's video (`video_of[id]`, a manifest video) show its event.

    Raises:
        ValueError: a record's question has no video in `video_of`.
    """
    missing = sorted({r["id"] for r in records} - set(video_of))
    if missing:
        raise ValueError(f"questions without a video in the world's manifest: {missing[:3]}")
    rows = []
    for flag in (True, False):
        part = [r for r in records if event_visible(video_of[r["id"]], k) == flag]
        if part:
            rows.append(ShownRow(flag, len(part), sum(bool(r["correct"]) for r in part) / len(part),
                                 sum(r["tool_calls"] for r in part) / len(part)))
    return rows


def shown_markdown(rows: Sequence[ShownRow], k: int) -> str:
    lines = [f"| event on the K={k} frames | questions | accuracy (%) | crop calls per question |", "|---|---:|---:|---:|"]
    lines += [f"| {'yes' if r.shown else 'no'} | {r.questions} | {100 * r.accuracy:.1f} | {r.calls:.2f} |" for r in rows]
    return "\n".join(lines)


def videos_of_samples(manifest: Mapping[str, Any], split: str, samples: Iterable) -> dict[str, Mapping[str, Any]]:
    """Sample id -> the manifest video of a prepared evaluation split's sample (matched by file name).

    Raises:
        ValueError: the manifest has no such split, or a sample's video is not among its videos.
    """
    block = manifest.get("eval", {}).get(split)
    if block is None:
        raise ValueError(f"the world's manifest has no evaluation split {split!r}: was the split generated with it?")
    videos = {entry["file_name"]: entry["video"] for entry in block.get("videos", ())}
    samples = list(samples)
    missing = sorted({Path(s.video_path).name for s in samples} - set(videos))
    if missing:
        raise ValueError(f"videos of split {split} not in the world's manifest: {missing[:3]}")
    return {s.id: videos[Path(s.video_path).name] for s in samples}
