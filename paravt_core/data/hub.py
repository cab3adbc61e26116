"""Download step of the data stage: the ParaVT release and the benchmark repos (SPEC §7, §8).

Every repo is fetched with `huggingface_hub.snapshot_download(repo_type="dataset")` into a
hub cache, restricted by `allow_patterns` to the files the pipeline reads:

- `ParaVT/ParaVT-Parquet` (`data.parquet_repo`): every parquet shard (SFT and RL, SPEC §8);
- `ParaVT/ParaVT-Source` (`data.source_repo`): the media zips;
- the benchmark repos of the SPEC §7 splits in `eval.splits` (all seven by default: six
  repos, as `videomme` and `videomme_wsub` share Video-MME), each for its annotation file,
  videos and subtitles as `paravt_core.eval.splits.LAYOUTS` places them.

Given a `LocalMirror` (a hub cache on this machine at one revision: with `data.source:
synth`, the generated world that `paravt_core.data.mirror` builds), the very same code
reads that cache alone with `local_files_only=True`, the scoped form of HF_HUB_OFFLINE=1:
nothing leaves the machine and the process environment is not touched. This module does not
know how a mirror was made.

Transient failures (connection errors, timeouts, HTTP 429 and 5xx, also when
`huggingface_hub` wraps them in a "cannot find the cached snapshot" error) are retried
`data.download_retries` times with exponential backoff; anything else fails at once with
a `DownloadError` naming the repo, the revision and what to do.

Decisions where the release or the benchmarks leave a choice:
- The ParaVT repos are fetched at `data.revision`; benchmark repos at "main" (their
  published branch) unless `data.benchmark_revisions` pins a repo to a commit, except from a
  local mirror, where every repo sits at the mirror's revision.
- Video-MME publishes its videos in numbered chunks (`videos_chunked_01.zip` ...); the
  layout names one chunk, and every `videos_chunked_*.zip` is fetched.
- LongVideoBench publishes its videos as one tar split into parts (`videos.tar.part.aa`,
  `.ab`, ...); every `videos.tar.part.*` is fetched and the unzip step reads them as one
  stream (`archives.extract_tar`).
- MLVU's videos are fetched as `video/*`, which also matches per-task folders
  (`video/1_plotQA/...`); the loader looks in both places.

Not checked against the real hub (no network here): the exact folder names inside the real
LongVideoBench tar and MLVU repo. A mismatch stops the stage with an error naming the split
and the folder it looked in (the prepare-eval check), never an evaluation on missing videos.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from paravt_core.data.archives import TAR_PART
from paravt_core.config import PipelineConfig
from paravt_core.eval.splits import EVAL_SPLITS as BENCHMARK_SPLITS
from paravt_core.eval.splits import LAYOUTS, BenchmarkLayout
from paravt_core.refs import file_hash

log = logging.getLogger(__name__)

PARQUET_PATTERNS = ("*.parquet",)
SOURCE_PATTERNS = ("*.zip",)
BENCHMARK_REVISION = "main"
MAX_BACKOFF_S = 60.0
_NUMBERED_CHUNK = re.compile(r"_chunked_\d+(\.zip)$")
_SHA256_NAME = re.compile(r"^[0-9a-f]{64}$")
_TRANSIENT_STATUS = frozenset({408, 429})


class DownloadError(RuntimeError):
    """A repo that could not be downloaded; the message says which, at what revision, and what to do."""


class RepoRequest(BaseModel):
    """One `snapshot_download` call: a dataset repo, a revision and the files wanted."""

    model_config = ConfigDict(frozen=True)

    repo_id: str
    revision: str
    allow_patterns: tuple[str, ...]


class Snapshot(BaseModel):
    """A downloaded repo snapshot.

    `sha256` is `paravt_core.refs.content_hash` of `path`, computed cheaply (see
    `snapshot_hash`); `commit` is the hub commit the revision resolved to.
    """

    model_config = ConfigDict(frozen=True)

    repo_id: str
    revision: str
    commit: str
    path: Path
    sha256: str


class Downloads(BaseModel):
    """Everything the download step fetched: the two ParaVT repos and the benchmark repos by id."""

    model_config = ConfigDict(frozen=True)

    parquet: Snapshot
    source: Snapshot
    benchmarks: dict[str, Snapshot]

    def benchmark(self, split: str) -> Snapshot:
        return self.benchmarks[LAYOUTS[split].repo_id]


# ----- what to fetch -------------------------------------------------------------------


def archive_pattern(archive: str) -> str:
    """`videos_chunked_01.zip` -> `videos_chunked_*.zip`, `videos.tar.part.aa` -> `videos.tar.part.*`;
    other names unchanged."""
    if part := TAR_PART.match(archive):
        return f"{part['stem']}.part.*"
    return _NUMBERED_CHUNK.sub(r"_chunked_*\1", archive)


def layout_patterns(layout: BenchmarkLayout) -> list[str]:
    """The repo paths one split needs: its annotation file, its videos and its subtitles."""
    patterns = [layout.annotation_file]
    if layout.video_archive:
        patterns.append(archive_pattern(layout.video_archive))
    elif layout.video_dir:
        patterns.append(f"{layout.video_dir}/*")
    else:
        patterns.append("*.mp4")  # videos sit at the repo root level (MMVU: videos/<Subject>/<n>.mp4)
    if layout.subtitle_archive:
        patterns.append(layout.subtitle_archive)
    return patterns


def benchmark_requests(revision: str, splits: tuple[str, ...] = BENCHMARK_SPLITS,
                       pins: Mapping[str, str] | None = None) -> list[RepoRequest]:
    """One request per benchmark repo, with the patterns of all its splits merged; a repo in
    `pins` (`data.benchmark_revisions`) is fetched at its pinned revision instead of `revision`."""
    pins = pins or {}
    patterns: dict[str, list[str]] = {}
    for split in splits:
        layout = LAYOUTS[split]
        merged = patterns.setdefault(layout.repo_id, [])
        merged += [p for p in layout_patterns(layout) if p not in merged]
    return [RepoRequest(repo_id=repo, revision=pins.get(repo, revision), allow_patterns=tuple(p))
            for repo, p in patterns.items()]


def release_requests(cfg: PipelineConfig) -> tuple[RepoRequest, RepoRequest]:
    """The ParaVT-Parquet and ParaVT-Source requests at `data.revision`."""
    data = cfg.data
    return (
        RepoRequest(repo_id=data.parquet_repo, revision=data.revision, allow_patterns=PARQUET_PATTERNS),
        RepoRequest(repo_id=data.source_repo, revision=data.revision, allow_patterns=SOURCE_PATTERNS),
    )


# ----- transient or permanent ---------------------------------------------------------


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection-level error classes of whichever HTTP client this huggingface_hub uses."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module, name in (("httpx2", "TransportError"), ("httpx", "TransportError"),
                         ("requests.exceptions", "ConnectionError"), ("requests.exceptions", "Timeout")):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _causes(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_transient(error: BaseException) -> bool:
    """True for failures worth retrying: connection trouble, timeouts, HTTP 408/429/5xx.

    The cause chain is followed because `snapshot_download` reports a failed Hub call as
    "cannot find the cached snapshot" raised from the original error.
    """
    from huggingface_hub import errors as hf_errors

    permanent = (
        hf_errors.OfflineModeIsEnabled,
        hf_errors.RepositoryNotFoundError,
        hf_errors.RevisionNotFoundError,
        hf_errors.GatedRepoError,
        hf_errors.RemoteEntryNotFoundError,
    )
    transport = _transport_errors()
    for cause in _causes(error):
        if isinstance(cause, permanent):
            return False
        if isinstance(cause, hf_errors.HfHubHTTPError):
            status = getattr(getattr(cause, "response", None), "status_code", None)
            return status is not None and (status in _TRANSIENT_STATUS or status >= 500)
        if isinstance(cause, transport):
            return True
    return False


def _advice(error: BaseException, request: RepoRequest, offline: bool) -> str:
    from huggingface_hub import errors as hf_errors

    if isinstance(error, hf_errors.RevisionNotFoundError):
        return f"check that revision {request.revision!r} exists (data.revision)"
    if isinstance(error, (hf_errors.RepositoryNotFoundError, hf_errors.GatedRepoError)):
        return ("check the repo id (data.parquet_repo / data.source_repo), accept the dataset's terms on the "
                "Hub if it is gated, and log in with `hf auth login`")
    if offline or any(isinstance(c, hf_errors.OfflineModeIsEnabled) for c in _causes(error)):
        return ("the local hub cache does not hold it: rebuild the local mirror (data.source=synth: delete the "
                "world folder and re-run), or unset HF_HUB_OFFLINE / point data.hub_cache_dir at a complete cache")
    if is_transient(error):
        return "the Hub kept failing; check the network and https://status.huggingface.co, then re-run"
    return "see the error above; fix it and re-run the data stage"


# ----- downloading ---------------------------------------------------------------------


def snapshot_hash(folder: Path) -> str:
    """`refs.content_hash(folder)` without reading the large files.

    A hub cache names each LFS blob by its sha256 and snapshot files link to their blob,
    so the link target's name is the file's hash; other files are hashed as usual.
    """
    digest = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        blob_name = f.resolve().name
        file_digest = blob_name if f.is_symlink() and _SHA256_NAME.match(blob_name) else file_hash(f)
        digest.update(f.relative_to(folder).as_posix().encode())
        digest.update(b"\0")
        digest.update(file_digest.encode())
    return digest.hexdigest()


def _snapshot_download(request: RepoRequest, cache_dir: Path | None, offline: bool) -> Path:
    from huggingface_hub import snapshot_download

    folder = snapshot_download(
        request.repo_id,
        repo_type="dataset",
        revision=request.revision,
        allow_patterns=list(request.allow_patterns),
        cache_dir=cache_dir,
        local_files_only=offline,
    )
    return Path(folder)


def download_repo(
    request: RepoRequest,
    *,
    cache_dir: Path | None,
    offline: bool,
    retries: int,
    backoff_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Snapshot:
    """Fetch one repo, retrying transient failures with exponential backoff.

    Args:
        cache_dir: the hub cache (None: huggingface_hub's default, HF_HOME).
        offline: read the cache only (`local_files_only=True`).
        retries: extra attempts after the first, for transient failures only.
    Raises:
        DownloadError: a permanent failure, or a transient one that outlasted the retries.
    """
    attempts = retries + 1
    for attempt in range(1, attempts + 1):
        try:
            folder = _snapshot_download(request, cache_dir, offline)
            break
        except Exception as error:
            if not is_transient(error) or attempt == attempts:
                tried = f" after {attempt} attempts" if attempt > 1 else ""
                raise DownloadError(
                    f"could not download dataset {request.repo_id} at revision {request.revision!r}{tried} "
                    f"(cache {cache_dir or 'default HF cache'}): {type(error).__name__}: {error}\n"
                    f"What to do: {_advice(error, request, offline)}"
                ) from error
            delay = min(MAX_BACKOFF_S, backoff_s * 2 ** (attempt - 1))
            log.warning("download of %s failed (%s: %s); retry %d/%d in %.1f s",
                        request.repo_id, type(error).__name__, error, attempt, retries, delay)
            sleep(delay)
    return Snapshot(repo_id=request.repo_id, revision=request.revision, commit=folder.name, path=folder,
                    sha256=snapshot_hash(folder))


class LocalMirror(BaseModel):
    """A hub cache on this machine holding every repo the pipeline reads at one revision (the
    generated world's, `paravt_core.data.mirror`; or a copy made for an offline machine)."""

    model_config = ConfigDict(frozen=True)

    hub_dir: Path
    revision: str


def download_all(cfg: PipelineConfig, progress: bool = True, mirror: LocalMirror | None = None) -> Downloads:
    """The download step: ParaVT-Parquet, ParaVT-Source and the benchmark repos, from the Hub into
    `data.hub_cache_dir`, or from `mirror` alone (offline; every repo at the mirror's revision)."""
    if cfg.data.source == "synth" and mirror is None:
        raise DownloadError("data.source=synth reads the generated world's mirror: build it first "
                            "(paravt_core.data.mirror.ensure_world) and pass it as `mirror`")
    cache_dir = mirror.hub_dir if mirror else cfg.data.hub_cache_dir
    bench_revision = mirror.revision if mirror else BENCHMARK_REVISION
    parquet_request, source_request = release_requests(cfg)

    def fetch(request: RepoRequest) -> Snapshot:
        snapshot = download_repo(request, cache_dir=cache_dir, offline=mirror is not None,
                                 retries=cfg.data.download_retries)
        log.info("downloaded %s@%s (commit %s) -> %s", request.repo_id, request.revision,
                 snapshot.commit[:12], snapshot.path)
        return snapshot

    return Downloads(
        parquet=fetch(parquet_request),
        source=fetch(source_request),
        benchmarks={r.repo_id: fetch(r)
                    for r in benchmark_requests(bench_revision, cfg.eval.splits, cfg.data.benchmark_revisions)},
    )
