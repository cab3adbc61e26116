"""`generate_world`: the whole synthetic world, laid out as a local Hugging Face hub cache.

Under `out/` it writes:

    hub/                                     a hub cache (pass it as cache_dir)
        datasets--ParaVT--ParaVT-Parquet/    sft/paravt_sft_{shard}.parquet, rl/paravt_rl_diverse.parquet
        datasets--ParaVT--ParaVT-Source/     {root}.zip, members named by sentinel path (SPEC §8)
        datasets--lmms-lab--Video-MME/ ...   the six benchmark repos (see benchmarks.LAYOUTS)
    manifest.json                            the ground truth: every video's events, every question,
                                             the videos planted empty (`SynthConfig.empty_videos`)

Training videos (ParaVT) and evaluation videos (one fresh set per benchmark repo) are
disjoint: the held-out split is by video. The same config and seed give the same bytes
everywhere, hence the same commit hashes.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from paravt_core.atomic import atomic_write_text
from paravt_core.data.synth.archives import split_parts, tar_bytes, zip_bytes
from paravt_core.data.synth.benchmarks import (
    GENERATED_SPLITS,
    LAYOUTS,
    SCHEMAS,
    VALIDATION_SPLIT,
    BenchmarkLayout,
    EvalSplit,
    build_eval_split,
    subtitles_srt,
)
from paravt_core.data.synth.config import SynthConfig
from paravt_core.data.synth.hub import RepoSnapshot, write_dataset_repo
from paravt_core.data.synth.paravt import (
    RL_FILE,
    RL_SCHEMA,
    SENTINEL_ROOTS,
    SFT_SCHEMA,
    TrainVideo,
    parquet_bytes,
    rl_rows,
    sentinel_path,
    sft_shards,
    source_archives,
)
from paravt_core.data.synth.render import encode_mp4
from paravt_core.data.synth.world import charades_like_id, derived_rng, sample_video, youtube_like_id

PARQUET_REPO = "ParaVT/ParaVT-Parquet"
SOURCE_REPO = "ParaVT/ParaVT-Source"
HUB_DIR = "hub"
MANIFEST = "manifest.json"
TAR_PART_AA = ".part.aa"
TAR_PARTS = 3  # a split tar's videos come in this many parts, so the join is exercised


@dataclass(frozen=True)
class SynthWorld:
    """What `generate_world` wrote.

    `counts` maps each ParaVT shard (repo path) and each evaluation split name to its
    number of rows; `layouts` says where each split's annotations and videos sit.
    """

    out: Path
    hub_cache: Path
    manifest: Path
    repos: dict[str, RepoSnapshot]
    counts: dict[str, int]
    layouts: dict[str, BenchmarkLayout]
    seconds: float

    @property
    def size_bytes(self) -> int:
        return sum(r.size_bytes for r in self.repos.values())


def train_videos(cfg: SynthConfig) -> list[TrainVideo]:
    """The training videos, spread round-robin over the four sentinel roots."""
    videos = []
    for index in range(cfg.train_videos):
        rng = derived_rng(cfg.seed, "train", index)
        root = SENTINEL_ROOTS[index % len(SENTINEL_ROOTS)]
        video_id = charades_like_id(rng) if root == "museg/charades" else youtube_like_id(rng)
        videos.append(TrainVideo(sample_video(rng, cfg, video_id), sentinel_path(root, video_id)))
    return videos


def _check_disjoint(train: list[TrainVideo], splits: dict[str, EvalSplit]) -> None:
    """Every video file name is unique, so no evaluation video can pass for a training one."""
    names = Counter([v.name for v in train] + [v.file_name for s in splits.values() for v in s.videos])
    duplicates = sorted(name for name, n in names.items() if n > 1)
    if duplicates:
        raise RuntimeError(f"generated video names collide: {duplicates}; try another seed")


def render_media(cfg: SynthConfig, train: list[TrainVideo], splits: dict[str, EvalSplit], progress: bool) -> dict:
    """mp4 bytes keyed by sentinel path (training) or (split, file name) (evaluation)."""
    jobs = [(v.sentinel, v.spec) for v in train]
    jobs += [((split, v.file_name), v.spec) for split, s in splits.items() for v in s.videos]
    bar = tqdm(jobs, desc="rendering videos", unit="video", disable=not progress)
    return {key: encode_mp4(spec, cfg.codec) for key, spec in bar}


def plant_empty_videos(cfg: SynthConfig, train: list[TrainVideo], splits: dict[str, EvalSplit],
                       media: dict) -> tuple[dict, list[str]]:
    """`media` with the first video of each set in `cfg.empty_videos` emptied (0 bytes), and
    the planted files' names as they appear in the repos (sentinel path, or split/file)."""
    planted = dict(media)
    names = []
    for where in cfg.empty_videos:
        if where == "train":
            key, name = train[0].sentinel, train[0].sentinel
        else:
            video = splits[where].videos[0]
            key, name = (where, video.file_name), f"{where}/{splits[where].layout.video_member(video.file_name)}"
        planted[key] = b""
        names.append(name)
    return planted, names


def _readme(repo_id: str, cfg: SynthConfig, lines: Iterable[str]) -> bytes:
    body = "\n".join(f"- {line}" for line in lines)
    return (
        f"# {repo_id} (synthetic stand-in)\n\nGenerated by `paravt synth --seed {cfg.seed}`: generated videos "
        f"of plain backgrounds with short coloured events, in the layout of the real repo. "
        f"Not the real dataset.\n\n{body}\n"
    ).encode()


def paravt_parquet_files(cfg: SynthConfig, train: list[TrainVideo]) -> tuple[dict[str, bytes], dict[str, int]]:
    """ParaVT-Parquet repo files and rows per shard."""
    shards = sft_shards(cfg, train)
    rl = rl_rows(cfg, train)
    files = {path: parquet_bytes(rows, SFT_SCHEMA) for path, rows in shards.items()}
    files[RL_FILE] = parquet_bytes(rl, RL_SCHEMA)
    counts = {path: len(rows) for path, rows in shards.items()} | {RL_FILE: len(rl)}
    files["README.md"] = _readme(PARQUET_REPO, cfg, (f"{path}: {n} rows" for path, n in counts.items()))
    return files, counts


def benchmark_repo_files(cfg: SynthConfig, splits: dict[str, EvalSplit], media: dict) -> dict[str, dict[str, bytes]]:
    """Repo id -> files: annotation parquet, videos (loose or zipped), Video-MME subtitles."""
    repos: dict[str, dict[str, bytes]] = {}
    for split, data in splits.items():
        layout = data.layout
        files = repos.setdefault(layout.repo_id, {})
        files[layout.annotation_file] = parquet_bytes(data.rows, SCHEMAS[split])
        videos = {layout.video_member(v.file_name): media[(split, v.file_name)] for v in data.videos}
        if layout.video_archive and layout.video_archive.endswith(TAR_PART_AA):
            stem = layout.video_archive.removesuffix(TAR_PART_AA)
            files.update(split_parts(stem, tar_bytes(videos), TAR_PARTS))
        elif layout.video_archive:
            files[layout.video_archive] = zip_bytes(videos)
        else:
            files.update(videos)
        if split == "videomme":
            wsub = LAYOUTS["videomme_wsub"]
            subtitles = {
                f"{wsub.subtitle_dir}/{v.ids['videoID']}.srt": subtitles_srt(v.spec).encode() for v in data.videos
            }
            files[wsub.subtitle_archive] = zip_bytes(subtitles)
        notes = [f"{layout.annotation_file}: {len(data.rows)} rows of split {split}"]
        files["README.md"] = _readme(layout.repo_id, cfg, notes)
    return repos


def _spec_record(spec) -> dict:
    record = dataclasses.asdict(spec)
    for event, source in zip(record["events"], spec.events, strict=True):
        event["start_s"], event["end_s"] = source.start_s, source.end_s
    record["duration_s"] = spec.duration_s
    return record


def manifest_record(
    cfg: SynthConfig, train: list[TrainVideo], splits: dict[str, EvalSplit], repos: dict[str, RepoSnapshot],
    empty_videos: list[str],
) -> dict:
    """The ground truth of the world, JSON-ready (paths relative to `out`)."""
    return {
        "config": cfg.model_dump(),
        "hub_cache": HUB_DIR,
        "empty_videos": empty_videos,
        "repos": {
            r.repo_id: {"revision": r.revision, "commit": r.commit, "files": list(r.files)} for r in repos.values()
        },
        "train": [{"sentinel": v.sentinel, "video": _spec_record(v.spec)} for v in train],
        "eval": {
            split: {
                "layout": dataclasses.asdict(data.layout),
                "videos": [
                    {"file_name": v.file_name, "ids": v.ids, "video": _spec_record(v.spec)} for v in data.videos
                ],
                "questions": [dataclasses.asdict(q) for q in data.questions],
            }
            for split, data in splits.items()
        },
    }


def generate_world(cfg: SynthConfig, out: str | Path, progress: bool = True) -> SynthWorld:
    """Generate the world of `cfg` under `out` (see the module docstring for the layout)."""
    started = time.perf_counter()
    out, hub = Path(out), Path(out) / HUB_DIR
    train = train_videos(cfg)
    # The validation split comes last, so drawing it moves no byte of the others.
    drawn = GENERATED_SPLITS + ((VALIDATION_SPLIT,) if cfg.validation else ())
    splits = {split: build_eval_split(cfg, split) for split in drawn}
    _check_disjoint(train, splits)
    media, empty_videos = plant_empty_videos(cfg, train, splits, render_media(cfg, train, splits, progress))
    parquet_files, counts = paravt_parquet_files(cfg, train)
    source_files = source_archives(train, media)
    source_files["README.md"] = _readme(SOURCE_REPO, cfg, sorted(source_files))
    repo_files = {PARQUET_REPO: parquet_files, SOURCE_REPO: source_files} | benchmark_repo_files(cfg, splits, media)
    repos = {repo_id: write_dataset_repo(hub, repo_id, files, cfg.revision) for repo_id, files in repo_files.items()}
    counts |= {split: len(splits["videomme" if split == "videomme_wsub" else split].rows) for split in LAYOUTS
               if split == "videomme_wsub" or split in splits}
    record = manifest_record(cfg, train, splits, repos, empty_videos)
    manifest = atomic_write_text(out / MANIFEST, json.dumps(record, indent=1))
    return SynthWorld(out, hub, manifest, repos, counts, dict(LAYOUTS), time.perf_counter() - started)
