"""Data stage: download, unzip, materialize, validate, prepare the evaluation splits.

`run(cfg) -> DataBundle` reads top to bottom; each step is also a function of its own
(the Prefect tasks in `tasks/data.py` wrap them one by one):

1. `download`: the ParaVT release and the benchmark repos into a hub cache
   (`paravt_core.data.hub`; with `data.source: synth` from a generated local mirror).
2. `unzip`: every ParaVT-Source archive into one media root, `<output_dir>/data/media/paravt`,
   and the benchmark video / subtitle archives into `<output_dir>/data/media/<repo>`
   (`paravt_core.data.archives`).
3. `materialize`: sentinel paths to `file://` URLs, into `<output_dir>/data/materialized/{sft,rl}`
   (`paravt_core.data.materialize`, SPEC §8).
4. `validate`: the data contracts (`data_contracts.validate`) on every materialized SFT
   and RL shard, and on each evaluation split's downloaded annotation rows together with
   the split's video (and subtitle) folder. Reports go to
   `<output_dir>/data/validated/reports/<kind>/`. With `data.on_bad_rows: fail` a broken
   row stops the stage (`ContractError`); every SFT, RL and evaluation video is probed
   (decodes, has frames and a duration; verdicts cached by content hash under
   `<output_dir>/data/media_health/`), so an undecodable video is a contract failure
   named with its row; with `quarantine` a contract hands back the
   table of kept rows, and a kind whose shards lost rows is rewritten whole (kept shards
   plus the untouched ones, names kept) into `<output_dir>/data/validated/<kind>/`, which
   the bundle then points at instead of the materialized folder. `data.max_quarantine_share`
   caps the share of a kind's rows (SFT, RL, each split) set aside: above it the stage stops
   (`DataStageError`) naming `reports/<kind>/quarantined.json`, which lists them.
5. `prepare_eval`: per SPEC §7 split, `<output_dir>/data/eval/<split>/` with the (kept)
   annotation rows under their original file name, a `split.json` {"split", "rows",
   "video_dir", "subtitle_dir"} of absolute paths (`paravt_core.eval.samples.load_split`'s
   arguments; `eval.prepared.load_split_file` reads one) and a `source.json` pinning the repo commit
   and archive hashes behind it. Every split is loaded once before the folder is
   published and must have no missing video.

Only the splits in `eval.splits` are fetched and prepared.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from fnmatch import fnmatch
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from paravt_core.atomic import atomic_dir, atomic_write_text
from paravt_core.config import PipelineConfig
from paravt_core.layout import data_dir, eval_dir, materialized_dir, media_dir, media_health_dir, validated_dir  # noqa: F401
from paravt_core.data.archives import extract_all
from paravt_core.data.hub import Downloads, LocalMirror, Snapshot, archive_pattern, download_all
from paravt_core.data.materialize import Materialized, materialize_release
from paravt_core.eval.splits import LAYOUTS, BenchmarkLayout
from paravt_core.refs import ArtifactRef, content_hash

log = logging.getLogger(__name__)

SPLIT_FILE = "split.json"
SOURCE_FILE = "source.json"


class DataStageError(RuntimeError):
    """A data stage step that cannot go on; the message names the step, the file and the fix."""


class SplitMedia(BaseModel):
    """Where one evaluation split's videos and subtitles lie after the unzip step."""

    model_config = ConfigDict(frozen=True)

    video_dir: Path
    subtitle_dir: Path | None = None
    archives: dict[str, str] = {}  # archive name -> sha256, of the archives behind video_dir / subtitle_dir


class Media(BaseModel):
    """The unzip step's result: the ParaVT media root and each split's media folders."""

    model_config = ConfigDict(frozen=True)

    paravt_root: Path
    paravt_archives: dict[str, str]  # archive name -> sha256
    splits: dict[str, SplitMedia]

    @property
    def paravt_digest(self) -> str:
        """A hash of the archives the ParaVT media root was extracted from."""
        return _json_digest(self.paravt_archives)


class SetAside(BaseModel):
    """Rows one data contract quarantined for one reason (`data.on_bad_rows: quarantine`).

    `problem` is the rule's verdict as the contract states it; for media it names the file
    ("video /.../x.mp4 cannot be used: the file is empty (0 bytes)").
    """

    model_config = ConfigDict(frozen=True)

    kind: str  # "sft", "rl" or "eval/<split>"
    table: Path
    rows: tuple[int, ...]  # 1-based, as the contract's failure table counts
    problem: str


class Validated(BaseModel):
    """The validate step's result: the tables to go on with, after the contracts."""

    model_config = ConfigDict(frozen=True)

    sft: ArtifactRef
    rl: ArtifactRef
    eval_rows: dict[str, ArtifactRef]  # split -> annotation rows file
    quarantined: tuple[SetAside, ...] = ()


class DataBundle(BaseModel):
    """What the data stage hands on (STYLE §3): typed, hashed references.

    `sft` and `rl` are folders of materialized parquet shards, `eval` is
    `<output_dir>/data/eval` (one folder per split), each with `refs.content_hash` of its
    content; `missing` counts the missing media files per sentinel root (SPEC §8);
    `quarantined` lists the rows the contracts set aside, by reason.
    """

    model_config = ConfigDict(frozen=True)

    sft: ArtifactRef
    rl: ArtifactRef
    eval: ArtifactRef
    missing: dict[str, int]
    quarantined: tuple[SetAside, ...] = ()


def _json_digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


# ----- 1. download --------------------------------------------------------------------


def download(cfg: PipelineConfig, progress: bool = True, mirror: LocalMirror | None = None) -> Downloads:
    """Step 1 (see `paravt_core.data.hub.download_all`); with `data.source: synth` and no `mirror`
    given, the generated world is built first (the flows build it as a task of its own)."""
    if cfg.data.source == "synth" and mirror is None:
        from paravt_core.data.mirror import ensure_world

        mirror = ensure_world(cfg, progress)
    return download_all(cfg, progress, mirror)


# ----- 2. unzip -----------------------------------------------------------------------


def _matching_files(snapshot: Snapshot, pattern: str) -> list[Path]:
    """Files of a snapshot whose repo path matches a pattern (as `allow_patterns` does)."""
    files = sorted(p for p in snapshot.path.rglob("*") if p.is_file())
    return [p for p in files if fnmatch(p.relative_to(snapshot.path).as_posix(), pattern)]


def _archives_of(snapshot: Snapshot, name: str, what: str) -> list[Path]:
    archives = _matching_files(snapshot, archive_pattern(name))
    if not archives:
        raise DataStageError(
            f"unzip: {snapshot.repo_id} (commit {snapshot.commit[:12]}, {snapshot.path}) has no {what} archive "
            f"matching {archive_pattern(name)!r}; re-run the download step or check the repo layout"
        )
    return archives


def split_media(cfg: PipelineConfig, layout: BenchmarkLayout, snapshot: Snapshot, progress: bool) -> SplitMedia:
    """Extract one split's video and subtitle archives (if it has any); loose videos stay put."""
    target = media_dir(cfg) / layout.repo_id.replace("/", "--")
    archives: dict[str, str] = {}
    if layout.video_archive:
        archives |= extract_all(_archives_of(snapshot, layout.video_archive, "video"), target, progress)
        video_dir = target / layout.video_dir
    else:
        video_dir = snapshot.path / layout.video_dir if layout.video_dir else snapshot.path
    subtitle_dir = None
    if layout.subtitle_archive:
        archives |= extract_all(_archives_of(snapshot, layout.subtitle_archive, "subtitle"), target, progress)
        subtitle_dir = target / (layout.subtitle_dir or "")
    return SplitMedia(video_dir=video_dir.resolve(), subtitle_dir=subtitle_dir and subtitle_dir.resolve(),
                      archives=archives)


def unzip(cfg: PipelineConfig, downloads: Downloads, progress: bool = True) -> Media:
    """Step 2: ParaVT-Source into one media root, benchmark archives per repo."""
    source_archives = _matching_files(downloads.source, "*.zip")
    if not source_archives:
        raise DataStageError(f"unzip: no zip archives in {downloads.source.repo_id} at {downloads.source.path}; "
                             f"re-run the download step")
    root = media_dir(cfg) / "paravt"
    paravt_archives = extract_all(source_archives, root, progress)
    splits = {
        split: split_media(cfg, LAYOUTS[split], downloads.benchmark(split), progress) for split in cfg.eval.splits
    }
    return Media(paravt_root=root.resolve(), paravt_archives=paravt_archives, splits=splits)


# ----- 3. materialize -----------------------------------------------------------------


def materialize(cfg: PipelineConfig, downloads: Downloads, media: Media, progress: bool = True) -> Materialized:
    """Step 3 (SPEC §8; see `paravt_core.data.materialize`)."""
    return materialize_release(downloads.parquet.path, media.paravt_root, materialized_dir(cfg), progress)


# ----- 4. validate --------------------------------------------------------------------


def contracts_version() -> str:
    """A hash of the data contracts' source, so changed contracts re-validate cached tables."""
    import data_contracts

    package = Path(data_contracts.__file__).parent
    files = sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return _json_digest({p.relative_to(package).as_posix(): content_hash(p) for p in files})


def check_contract(
    cfg: PipelineConfig, kind: str, table: Path, report_dir: Path, split: str | None = None,
    media: SplitMedia | None = None, media_root: Path | None = None, progress: bool = False,
) -> tuple[Path, list[SetAside], int]:
    """Run one data contract; returns the table to go on with (the kept rows on quarantine),
    the quarantined rows grouped by reason (none unless rows were quarantined) and the
    table's row count.

    `data_contracts.validate` raises `ContractError` (naming the table, the failing rows and
    the report) when `data.on_bad_rows` is "fail" and a row breaks the contract. Evaluation
    rows are checked with their split's media, so a row whose video is absent fails too;
    SFT and RL rows with the media root, outside which no row may point.
    """
    from data_contracts import validate as validate_contract

    media_dirs: dict = {"media_root": media_root} if media_root is not None else {}
    if media is not None:
        subtitle_dir = media.subtitle_dir if split == "videomme_wsub" else None
        media_dirs = {"video_dir": media.video_dir, "subtitle_dir": subtitle_dir}
    media_dirs["media_health"] = media_health_dir(cfg)
    result = validate_contract(kind, table, split=split, on_bad_rows=cfg.data.on_bad_rows, report_dir=report_dir,
                               probe_workers=cfg.data.probe_workers, progress=progress, **media_dirs)
    if result.quarantine_path is None:
        return Path(result.kept_path), [], result.n_rows
    by_problem: dict[str, set[int]] = {}
    for failure in result.failures:
        by_problem.setdefault(failure.value, set()).add(failure.row)
    where = kind if split is None else f"{kind}/{split}"
    return Path(result.kept_path), [SetAside(kind=where, table=Path(table).absolute(), rows=tuple(sorted(rows)),
                                             problem=problem) for problem, rows in by_problem.items()], result.n_rows


QUARANTINE_LISTING = "quarantined.json"


def check_quarantine_ceiling(cfg: PipelineConfig, where: str, rows: int, set_aside: list[SetAside],
                             report_dir: Path) -> None:
    """Refuse a quarantine that set aside more than `data.max_quarantine_share` of `rows`.

    What was set aside is listed in `<report_dir>/quarantined.json` (table, rows, why) whenever
    anything was, so the refusal can name one file however many shards the rows came from.

    Raises:
        DataStageError: naming the count, the share, the ceiling and the listing.
    """
    count = len({(aside.table, row) for aside in set_aside for row in aside.rows})  # a row may break two rules
    if not count:
        return
    listing = atomic_write_text(report_dir / QUARANTINE_LISTING,
                                json.dumps([aside.model_dump(mode="json") for aside in set_aside], indent=1) + "\n")
    ceiling = cfg.data.max_quarantine_share
    if ceiling is not None and count > ceiling * rows:
        raise DataStageError(
            f"validate: the {where} contracts set aside {count} of {rows} rows ({count / rows:.2%}), more than "
            f"data.max_quarantine_share allows ({ceiling:.2%}); each is listed with why in {listing}. Fix or replace "
            f"the files they name and run again, or raise data.max_quarantine_share if training without them is "
            f"acceptable"
        )


def _validated_folder(cfg: PipelineConfig, kind: str, ref: ArtifactRef, media_root: Path,
                      progress: bool) -> tuple[ArtifactRef, list[SetAside]]:
    """Check every shard of one kind; if any lost rows, write the kept shards to validated/<kind>/."""
    reports = validated_dir(cfg) / "reports" / kind
    shards = sorted(Path(ref.path).glob("*.parquet"))
    checked = {shard: check_contract(cfg, kind, shard, reports, media_root=media_root, progress=progress)
               for shard in shards}
    quarantined = [rows for _, set_aside, _ in checked.values() for rows in set_aside]
    check_quarantine_ceiling(cfg, kind, sum(n for _, _, n in checked.values()), quarantined, reports)
    out = validated_dir(cfg) / kind
    if all(table == shard for shard, (table, _, _) in checked.items()):
        shutil.rmtree(out, ignore_errors=True)  # a quarantine of an earlier run no longer applies
        return ref, quarantined
    with atomic_dir(out) as tmp:
        for shard, (table, _, _) in checked.items():
            shutil.copyfile(table, tmp / shard.name)
    log.warning("%s shards lost rows to their contracts (quarantined); continuing with %s", kind, out)
    return ArtifactRef(kind=ref.kind, path=out.resolve(), sha256=content_hash(out)), quarantined


def _validated_eval_rows(cfg: PipelineConfig, split: str, downloads: Downloads, media: Media,
                         progress: bool) -> tuple[ArtifactRef, list[SetAside]]:
    rows = downloads.benchmark(split).path / LAYOUTS[split].annotation_file
    if not rows.is_file():
        raise DataStageError(f"validate: {split} annotation rows {rows} are missing; re-run the download step")
    reports = validated_dir(cfg) / "reports" / "eval" / split
    kept, quarantined, count = check_contract(cfg, "eval", rows, reports, split=split, media=media.splits[split],
                                              progress=progress)
    check_quarantine_ceiling(cfg, f"eval/{split}", count, quarantined, reports)
    return ArtifactRef(kind=f"eval_rows_{split}", path=kept.absolute(), sha256=content_hash(kept)), quarantined


def validate(cfg: PipelineConfig, tables: Materialized, downloads: Downloads, media: Media,
             progress: bool = True) -> Validated:
    """Step 4: the contracts of every SFT and RL shard and of each split's annotation rows (their
    videos probed by `data.probe_workers` processes)."""
    validated_dir(cfg).mkdir(parents=True, exist_ok=True)
    sft, sft_aside = _validated_folder(cfg, "sft", tables.sft, media.paravt_root, progress)
    rl, rl_aside = _validated_folder(cfg, "rl", tables.rl, media.paravt_root, progress)
    eval_rows = {split: _validated_eval_rows(cfg, split, downloads, media, progress) for split in cfg.eval.splits}
    eval_aside = [rows for _, set_aside in eval_rows.values() for rows in set_aside]
    return Validated(sft=sft, rl=rl, eval_rows={split: ref for split, (ref, _) in eval_rows.items()},
                     quarantined=(*sft_aside, *rl_aside, *eval_aside))


# ----- 5. evaluation splits -----------------------------------------------------------


def split_record(split: str, rows: Path, media: SplitMedia) -> dict[str, str | None]:
    """The `split.json` content: `load_split`'s arguments, absolute paths as strings."""
    return {
        "split": split,
        "rows": str(rows),
        "video_dir": str(media.video_dir),
        "subtitle_dir": str(media.subtitle_dir) if split == "videomme_wsub" and media.subtitle_dir else None,
    }


def check_split_loads(split: str, rows: Path, media: SplitMedia) -> int:
    """Load a split through `load_split`; raises unless every sample's video is there."""
    from paravt_core.eval.samples import load_split, missing_videos

    samples = load_split(split, rows, media.video_dir, media.subtitle_dir if split == "videomme_wsub" else None)
    missing = missing_videos(samples)
    if missing:
        examples = ", ".join(str(s.video_path) for s in missing[:3])
        raise DataStageError(
            f"prepare_eval: split {split}: {len(missing)} of {len(samples)} samples have no video under "
            f"{media.video_dir} (e.g. {examples}); check the unzip step's output and the repo layout"
        )
    return len(samples)


def _write_split(tmp: Path, final: Path, split: str, rows: ArtifactRef, media: SplitMedia, snapshot: Snapshot) -> int:
    """One split folder under the temporary eval folder; paths in split.json are the final ones."""
    name = Path(LAYOUTS[split].annotation_file).name
    (tmp / split).mkdir()
    shutil.copyfile(rows.path, tmp / split / name)
    count = check_split_loads(split, tmp / split / name, media)
    record = split_record(split, (final / split / name).resolve(), media)
    (tmp / split / SPLIT_FILE).write_text(json.dumps(record, indent=1))
    source = {"repo_id": snapshot.repo_id, "revision": snapshot.revision, "commit": snapshot.commit,
              "snapshot_sha256": snapshot.sha256, "rows_sha256": rows.sha256, "archives": media.archives}
    (tmp / split / SOURCE_FILE).write_text(json.dumps(source, indent=1))
    return count


def prepare_eval(cfg: PipelineConfig, downloads: Downloads, media: Media, checked: Validated) -> ArtifactRef:
    """Step 5: `<output_dir>/data/eval/<split>/`, published in one rename."""
    final = eval_dir(cfg)
    with atomic_dir(final) as tmp:
        for split in cfg.eval.splits:
            count = _write_split(tmp, final, split, checked.eval_rows[split], media.splits[split],
                                 downloads.benchmark(split))
            log.info("eval split %s: %d samples, every video present", split, count)
    return ArtifactRef(kind="eval_data", path=final.resolve(), sha256=content_hash(final))


# ----- the stage ----------------------------------------------------------------------


def bundle(tables: Materialized, checked: Validated, eval_ref: ArtifactRef) -> DataBundle:
    return DataBundle(sft=checked.sft, rl=checked.rl, eval=eval_ref, missing=tables.missing,
                      quarantined=checked.quarantined)


def run(cfg: PipelineConfig, progress: bool = True) -> DataBundle:
    """The whole data stage, steps 1 to 5 in order."""
    downloads = download(cfg, progress)
    media = unzip(cfg, downloads, progress)
    tables = materialize(cfg, downloads, media, progress)
    checked = validate(cfg, tables, downloads, media, progress)
    eval_ref = prepare_eval(cfg, downloads, media, checked)
    return bundle(tables, checked, eval_ref)
