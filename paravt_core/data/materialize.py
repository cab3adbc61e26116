"""Materialize step of the data stage: sentinel paths become local file URLs (SPEC §8).

ParaVT-Parquet rows name their media by sentinel-relative paths under four roots
(`longvt_source/<src>/<rel>`, `museg/charades/<id>.mp4`, `museg/et_instruct_164k/<id>.mp4`,
`selfqa/<id>.mp4`). Once every ParaVT-Source archive is unzipped into one media root,
each such path is rewritten to `file://<root>/<sentinel>`:

- SFT rows: the `url` of `video_url` / `image_url` content items in `messages` (and a
  bare `video` / `image` string item, the Qwen layout), and every entry of `videos`;
- RL rows: every entry of `videos` (`{"video": path, ...}` structs or plain strings).

Any other path (already a URL, absolute, or under another root) is left alone; text is
never touched. A sentinel path that would resolve outside the media root (`..` parts, or a
symbolic link out of it) is refused: it is left as written, so the row fails its contract
as "not a file:// URL", and it is counted and named in the report as escaping. Each referenced file is checked, and the distinct missing files are
counted per root and reported as a table (missing files are reported, not fatal: the
contracts decide what a row without its video means).

Shards are recognised by their columns (`messages`: SFT; `prompt`: RL), not by their
folder, and keep their file names; a parquet file of neither layout is skipped with a
warning. Column types (lists, structs) are kept: only the rewritten columns are rebuilt,
with their original Arrow type. A `messages` column stored as a JSON string (as some
releases do) stays a JSON string. The release's own script cannot run as published (it
imports a module it does not ship, SPEC §8); this is our implementation of its contract.

URLs are built with `Path.as_uri()`, i.e. `file://<root>/<sentinel>` percent-encoded
where a path needs it, which `urllib.parse.unquote` reverses.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict
from tqdm import tqdm

from paravt_core.atomic import atomic_dir
from paravt_core.data.synth.paravt import SENTINEL_ROOTS
from paravt_core.refs import ArtifactRef, content_hash

log = logging.getLogger(__name__)

TableKind = Literal["sft", "rl"]
MEDIA_ITEM_KEYS = ("video_url", "image_url", "video", "image")
VIDEO_ENTRY_KEYS = ("video", "url", "path")
MISSING_EXAMPLES = 5


class RootMedia(BaseModel):
    """Distinct files one sentinel root is referenced for, and how many are missing."""

    model_config = ConfigDict(frozen=True)

    referenced: int
    missing: int
    missing_examples: tuple[str, ...] = ()
    escaping: int = 0
    escaping_examples: tuple[str, ...] = ()


class Materialized(BaseModel):
    """The materialized SFT and RL folders and the per-root media report."""

    model_config = ConfigDict(frozen=True)

    sft: ArtifactRef
    rl: ArtifactRef
    media: dict[str, RootMedia]

    @property
    def missing(self) -> dict[str, int]:
        return {root: report.missing for root, report in self.media.items()}


def sentinel_root(path: str) -> str | None:
    """The SPEC §8 root a path is relative to, or None if it is not a sentinel path."""
    return next((root for root in SENTINEL_ROOTS if path.startswith(root + "/")), None)


class SentinelRewriter:
    """Maps sentinel paths to `file://` URLs under one media root, noting missing files."""

    def __init__(self, media_root: Path):
        self.media_root = Path(media_root).resolve()
        self._exists: dict[str, bool] = {}
        self._root_of: dict[str, str] = {}
        self._escaping: dict[str, str] = {}

    def __call__(self, value: str) -> str:
        root = sentinel_root(value)
        if root is None:
            return value
        path = self.media_root / value
        resolved = path.resolve()
        if self.media_root not in resolved.parents:
            if value not in self._escaping:
                log.warning("sentinel path %r resolves to %s, outside the media root %s; left as written, so its "
                            "row fails the data contract", value, resolved, self.media_root)
            self._escaping[value] = root
            return value
        if value not in self._exists:
            self._exists[value] = path.is_file()
            self._root_of[value] = root
        return path.as_uri()

    def report(self) -> dict[str, RootMedia]:
        report = {}
        for root in SENTINEL_ROOTS:
            seen = sorted(v for v, r in self._root_of.items() if r == root)
            missing = [v for v in seen if not self._exists[v]]
            escaping = sorted(v for v, r in self._escaping.items() if r == root)
            report[root] = RootMedia(referenced=len(seen), missing=len(missing),
                                     missing_examples=tuple(missing[:MISSING_EXAMPLES]), escaping=len(escaping),
                                     escaping_examples=tuple(escaping[:MISSING_EXAMPLES]))
        return report


# ----- row values ---------------------------------------------------------------------


def rewrite_content_item(item: dict[str, Any], rewrite: Callable[[str], str]) -> dict[str, Any]:
    """A `messages` content item with its media url (if any) rewritten."""
    for key in MEDIA_ITEM_KEYS:
        value = item.get(key)
        if isinstance(value, str):
            item[key] = rewrite(value)
        elif isinstance(value, dict) and isinstance(value.get("url"), str):
            value["url"] = rewrite(value["url"])
    return item


def rewrite_messages(messages: list[dict[str, Any]] | None, rewrite: Callable[[str], str]) -> list | None:
    """Chat turns with every media item's url rewritten; string contents are left alone."""
    for message in messages or []:
        content = message.get("content")
        if isinstance(content, list):
            message["content"] = [rewrite_content_item(item, rewrite) if isinstance(item, dict) else item
                                  for item in content]
    return messages


def rewrite_video_entry(entry: Any, rewrite: Callable[[str], str]) -> Any:
    """A `videos` entry: a path string, or a struct whose `video` (or `url`, `path`) is one."""
    if isinstance(entry, str):
        return rewrite(entry)
    if isinstance(entry, dict):
        for key in VIDEO_ENTRY_KEYS:
            if isinstance(entry.get(key), str):
                entry[key] = rewrite(entry[key])
    return entry


def _rewrite_messages_cell(cell: Any, rewrite: Callable[[str], str]) -> Any:
    if isinstance(cell, str):  # messages kept as a JSON string: rewrite inside, stay a string
        try:
            messages = json.loads(cell)
        except ValueError:
            # Left as it is: the SFT contract (validate step) names the file and row, and sets
            # the row aside under `data.on_bad_rows: quarantine` or stops the stage under `fail`.
            return cell
        return json.dumps(rewrite_messages(messages, rewrite), ensure_ascii=False)
    return rewrite_messages(cell, rewrite)


def _rewrite_videos_cell(cell: Any, rewrite: Callable[[str], str]) -> Any:
    if cell is None:
        return None
    return [rewrite_video_entry(entry, rewrite) for entry in cell]


# ----- tables -------------------------------------------------------------------------


def table_kind(schema: pa.Schema) -> TableKind | None:
    """"sft" for `messages` rows, "rl" for `prompt` rows, None for anything else."""
    if "messages" in schema.names:
        return "sft"
    if "prompt" in schema.names:
        return "rl"
    return None


def _rebuild_column(table: pa.Table, name: str, fn: Callable[[Any], Any]) -> pa.Table:
    """Apply `fn` to every cell of one column, keeping the column's Arrow type."""
    index = table.schema.get_field_index(name)
    field = table.schema.field(index)
    values = [fn(cell) for cell in table.column(name).to_pylist()]
    return table.set_column(index, field, pa.array(values, type=field.type))


def materialize_table(table: pa.Table, kind: TableKind, rewrite: Callable[[str], str]) -> pa.Table:
    """The table with its media paths rewritten (SFT: messages and videos; RL: videos)."""
    if kind == "sft":
        table = _rebuild_column(table, "messages", lambda cell: _rewrite_messages_cell(cell, rewrite))
    if "videos" in table.schema.names:
        table = _rebuild_column(table, "videos", lambda cell: _rewrite_videos_cell(cell, rewrite))
    return table


class UnreadableShardError(ValueError):
    """A release parquet file that pyarrow cannot read (truncated or damaged download)."""


def _read_parquet(path: Path, schema_only: bool = False) -> Any:
    try:
        return pq.read_schema(path) if schema_only else pq.read_table(path)
    except (OSError, pa.ArrowException) as error:
        raise UnreadableShardError(
            f"{path}: not a readable parquet file ({error}); the download is likely truncated or damaged: "
            f"delete this file and run the data stage again to fetch it anew") from None


def classify_shards(snapshot: Path) -> dict[TableKind, list[Path]]:
    """The parquet files of a ParaVT-Parquet snapshot, by layout; refuses clashing names."""
    shards: dict[TableKind, list[Path]] = {"sft": [], "rl": []}
    for path in sorted(Path(snapshot).rglob("*.parquet")):
        kind = table_kind(_read_parquet(path, schema_only=True))
        if kind is None:
            log.warning("%s has neither `messages` (SFT) nor `prompt` (RL) rows; skipped", path)
            continue
        shards[kind].append(path)
    for kind, paths in shards.items():
        if not paths:
            raise FileNotFoundError(f"no {kind.upper()} shards in {snapshot}; is it a ParaVT-Parquet snapshot?")
        names = [p.name for p in paths]
        clashes = sorted({n for n in names if names.count(n) > 1})
        if clashes:
            raise ValueError(f"{snapshot}: {kind} shards in different folders share the file names {clashes}")
    return shards


def _write_shards(
    paths: Iterable[Path], kind: TableKind, out: Path, rewrite: SentinelRewriter, progress: bool
) -> int:
    rows = 0
    for path in tqdm(list(paths), desc=f"materializing {kind} shards", unit="shard", disable=not progress):
        table = materialize_table(_read_parquet(path), kind, rewrite)
        pq.write_table(table, out / path.name, compression="zstd")
        rows += table.num_rows
    return rows


def materialize_release(snapshot: Path, media_root: Path, out: Path, progress: bool = True) -> Materialized:
    """Write `out/sft/` and `out/rl/` (each replaced in one rename) from a ParaVT-Parquet snapshot.

    Args:
        snapshot: the downloaded ParaVT-Parquet folder.
        media_root: the folder every ParaVT-Source archive was extracted into.
        out: `<output_dir>/data/materialized`.
    """
    shards = classify_shards(snapshot)
    rewrite = SentinelRewriter(media_root)
    with atomic_dir(out / "sft") as sft_tmp, atomic_dir(out / "rl") as rl_tmp:
        sft_rows = _write_shards(shards["sft"], "sft", sft_tmp, rewrite, progress)
        rl_rows = _write_shards(shards["rl"], "rl", rl_tmp, rewrite, progress)
    log.info("materialized %d SFT rows in %d shards and %d RL rows in %d shards",
             sft_rows, len(shards["sft"]), rl_rows, len(shards["rl"]))
    result = Materialized(
        sft=ArtifactRef(kind="sft_data", path=(out / "sft").resolve(), sha256=content_hash(out / "sft")),
        rl=ArtifactRef(kind="rl_data", path=(out / "rl").resolve(), sha256=content_hash(out / "rl")),
        media=rewrite.report(),
    )
    log.info("media files per sentinel root under %s:\n%s", media_root, missing_table(result.media))
    return result


def missing_table(media: dict[str, RootMedia]) -> str:
    """Referenced and missing files per sentinel root, as an aligned text table."""
    width = max(len("sentinel root"), *(len(root) for root in media)) + 2
    lines = [f"{'sentinel root':<{width}}{'referenced':>12}{'missing':>10}"]
    lines += [f"{root:<{width}}{r.referenced:>12}{r.missing:>10}" for root, r in media.items()]
    for root, r in media.items():
        if r.missing_examples:
            lines.append(f"  missing under {root}: {', '.join(r.missing_examples)}")
        if r.escaping_examples:
            lines.append(f"  refused, outside the media root ({r.escaping}): {', '.join(r.escaping_examples)}")
    return "\n".join(lines)
