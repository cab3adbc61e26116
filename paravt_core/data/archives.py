"""Unzip step of the data stage: safe, verified, resumable archive extraction (SPEC §8).

`extract_archive` unpacks one zip into a target folder; `extract_tar` does the same for a
tar, whole or split into parts (`videos.tar.part.aa`, ...: LongVideoBench), read as one
stream. Both follow the same rules:

- Safety: every member is checked before anything is written. A member whose path is
  absolute, climbs out with `..`, would land outside the target through an existing
  symlink, or is itself a symlink is refused with `UnsafeArchiveError`, and nothing of
  that archive is extracted.
- Integrity: a zip whose central directory is missing or damaged (a truncated download)
  is refused with `ArchiveError` naming it. Each member's CRC-32 is checked as it is read
  (zipfile raises at the end of a member whose CRC differs), so the archive is read once.
- Resumability: each member is written under a temporary name and renamed into place,
  and a completion marker `<target>/.unzipped/<archive name>.json` holding the archive's
  sha256 and its member list is written last. An interrupted extraction has no marker
  and is redone; a marker for a different archive hash (a new release) is redone too; a
  marker whose files have since been deleted is redone.

The archive's sha256 is taken from its hub-cache blob name when it has one (the hub
names LFS blobs by sha256), so a large archive is not read just to be recognised.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import os
import re
import shutil
import stat
import tarfile
import time
import uuid
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from tqdm import tqdm

from paravt_core.atomic import atomic_write_text
from paravt_core.refs import file_hash

log = logging.getLogger(__name__)

MARKER_DIR = ".unzipped"
_SHA256_NAME = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20


class ArchiveError(RuntimeError):
    """An archive that is not a complete, readable zip; the message names it."""


class UnsafeArchiveError(ArchiveError):
    """An archive member that would land outside the extraction folder."""


def archive_sha256(archive: Path) -> str:
    """The archive's sha256: its hub blob name when it is a cached LFS file, else computed."""
    blob_name = archive.resolve().name
    if archive.is_symlink() and _SHA256_NAME.match(blob_name):
        return blob_name
    return file_hash(archive)


def marker_path(target: Path, archive: Path) -> Path:
    return target / MARKER_DIR / f"{archive.name}.json"


# ----- safety -------------------------------------------------------------------------


def _is_symlink_member(info: zipfile.ZipInfo) -> bool:
    return info.create_system == 3 and stat.S_ISLNK(info.external_attr >> 16)


def _refusal(archive: Path | str, name: str, why: str) -> UnsafeArchiveError:
    return UnsafeArchiveError(
        f"{archive}: member {name!r} {why}; refusing to extract this archive. "
        f"Re-download it from a trusted source or delete it from the hub cache"
    )


def member_destination(target: Path, info: zipfile.ZipInfo, archive: Path) -> Path:
    """Where a zip member goes under `target`; raises UnsafeArchiveError if outside it."""
    if _is_symlink_member(info):
        raise _refusal(archive, info.filename, "is a symbolic link")
    return checked_destination(target, info.filename, archive)


def checked_destination(target: Path, name: str, archive: Path | str) -> Path:
    """Where a member named `name` goes under `target`; raises UnsafeArchiveError if outside it."""

    def refuse(why: str) -> UnsafeArchiveError:
        return _refusal(archive, name, why)

    posix = PurePosixPath(name.replace("\\", "/"))
    if posix.is_absolute() or re.match(r"^[A-Za-z]:", name):
        raise refuse("has an absolute path")
    if ".." in posix.parts:
        raise refuse("climbs out of the target folder with '..'")
    destination = target.joinpath(*posix.parts)
    root = target.resolve()
    resolved = destination.parent.resolve() / destination.name
    if resolved != root and root not in resolved.parents:
        raise refuse(f"would land outside {target} (through a symbolic link)")
    if posix.parts and posix.parts[0] == MARKER_DIR:
        raise refuse(f"collides with the completion marker folder {MARKER_DIR}/")
    return destination


def _open_zip(archive: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, EOFError, OSError) as error:
        raise ArchiveError(
            f"{archive} is not a complete zip archive ({error}); it is probably truncated. "
            f"Delete it (and its blob in the hub cache) and re-run the download step"
        ) from error


# ----- extraction ---------------------------------------------------------------------


def _copy_member(archive_file: zipfile.ZipFile, info: zipfile.ZipInfo, destination: Path, archive: Path) -> None:
    """Write one member under a temporary name, checking its CRC, then rename it into place."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    tmp = destination.with_name(f".{destination.name}.{uuid.uuid4().hex}.part")
    try:
        with archive_file.open(info) as source, open(tmp, "wb") as sink:
            shutil.copyfileobj(source, sink, _CHUNK)
        os.replace(tmp, destination)
    except (zipfile.BadZipFile, zlib.error, EOFError) as error:
        raise ArchiveError(
            f"{archive}: member {info.filename!r} is damaged ({error}); the archive is incomplete or corrupt. "
            f"Delete it (and its blob in the hub cache) and re-run the download step"
        ) from error
    finally:
        tmp.unlink(missing_ok=True)


def _marker_is_current(marker: Path, target: Path, sha256: str) -> bool:
    if not marker.is_file():
        return False
    record = json.loads(marker.read_text())
    if record.get("sha256") != sha256:
        return False
    return all((target / member).is_file() for member in record.get("members", []))


def extract_archive(archive: Path, target: Path, progress: bool = True) -> list[str]:
    """Extract `archive` into `target` unless its completion marker says it is done.

    Returns:
        The archive's file members (posix paths relative to `target`).
    Raises:
        UnsafeArchiveError: a member would land outside `target` or is a symlink.
        ArchiveError: the archive is truncated or a member fails its CRC check.
    """
    archive, target = Path(archive), Path(target)
    target.mkdir(parents=True, exist_ok=True)
    sha256 = archive_sha256(archive)
    marker = marker_path(target, archive)
    if _marker_is_current(marker, target, sha256):
        log.info("%s already extracted into %s", archive.name, target)
        return json.loads(marker.read_text())["members"]
    marker.unlink(missing_ok=True)
    started = time.perf_counter()
    with _open_zip(archive) as archive_file:
        infos = archive_file.infolist()
        plan = [(info, member_destination(target, info, archive)) for info in infos]
        files = [(info, dest) for info, dest in plan if not info.is_dir()]
        for info, dest in plan:
            if info.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
        bar = tqdm(files, desc=f"unzipping {archive.name}", unit="file", disable=not progress)
        for info, dest in bar:
            _copy_member(archive_file, info, dest, archive)
    members = [dest.relative_to(target).as_posix() for _, dest in files]
    record = {"archive": archive.name, "sha256": sha256, "members": members}
    atomic_write_text(marker, json.dumps(record, indent=1))
    seconds = time.perf_counter() - started
    log.info("extracted %d files of %s in %.1f s (%.1f files/s)", len(files), archive.name, seconds,
             len(files) / max(seconds, 1e-9))
    return members


def extract_all(archives: Sequence[Path], target: Path, progress: bool = True) -> dict[str, str]:
    """Extract several archives into one folder; returns archive name -> sha256.

    Zips are extracted one by one; the parts of a split tar (`videos.tar.part.aa`, `.ab`,
    ...: LongVideoBench's layout) are read as ONE tar stream, named by their stem
    (`videos.tar`), without first writing the joined tar to disk; a lone `.tar` is a
    one-part group.
    """
    zips, tars = [], {}
    for archive in map(Path, archives):
        part = TAR_PART.match(archive.name)
        if part:
            tars.setdefault(part["stem"], []).append(archive)
        elif archive.name.endswith(_TAR_SUFFIXES):
            tars.setdefault(archive.name, []).append(archive)
        else:
            zips.append(archive)
    names = [a.name for a in zips]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ArchiveError(f"archives share a name {duplicates}; their completion markers in {target} would clash")
    for archive in zips:
        extract_archive(archive, target, progress)
    for stem, parts in tars.items():
        extract_tar(stem, parts, target, progress)
    hashes = {a.name: json.loads(marker_path(target, a).read_text())["sha256"] for a in zips}
    return hashes | {stem: json.loads(marker_path(target, Path(stem)).read_text())["sha256"] for stem in tars}


# ----- tar archives (in parts) ---------------------------------------------------------

TAR_PART = re.compile(r"^(?P<stem>.+\.tar)\.part\.(?P<suffix>[a-z]+)$")
_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")


def ordered_parts(stem: str, parts: Sequence[Path]) -> list[Path]:
    """The parts of `stem` in `split` order (aa, ab, ..., az, ba, ...); a gap is an error."""
    if len(parts) == 1 and not TAR_PART.match(Path(parts[0]).name):
        return [Path(parts[0])]
    suffixes = {}
    for part in map(Path, parts):
        match = TAR_PART.match(part.name)
        if match is None or match["suffix"] in suffixes:
            raise ArchiveError(f"{stem}: both a whole tar and parts, or one part twice, in "
                               f"{sorted(str(p) for p in parts)}; keep one copy")
        suffixes[match["suffix"]] = part
    widths = {len(s) for s in suffixes}
    if len(widths) != 1:
        raise ArchiveError(f"{stem}: parts {sorted(p.name for p in parts)} mix suffix lengths; re-download them")
    width = widths.pop()
    ordered = sorted(suffixes)
    expected = [part_suffix(i, width) for i in range(len(ordered))]
    if ordered != expected:
        missing = sorted(set(expected) - set(ordered)) or [expected[len(ordered) - 1]]
        raise ArchiveError(
            f"{stem}: {len(ordered)} parts but part(s) {', '.join(f'{stem}.part.{m}' for m in missing)} "
            f"are missing (found {', '.join(ordered[:6])}{' ...' if len(ordered) > 6 else ''}); "
            f"re-run the download step"
        )
    return [suffixes[s] for s in ordered]


def part_suffix(index: int, width: int = 2) -> str:
    """The `split` suffix of part `index`: 0 -> "aa", 1 -> "ab", 26 -> "ba" (width 2)."""
    letters = []
    for _ in range(width):
        index, rest = divmod(index, 26)
        letters.append(chr(ord("a") + rest))
    return "".join(reversed(letters))


class _JoinedParts(io.RawIOBase):
    """The parts' bytes as one read-only stream (what `cat parts > joined` would hold)."""

    def __init__(self, parts: Sequence[Path]):
        self._parts, self._index, self._file = list(parts), 0, None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self._index < len(self._parts):
            if self._file is None:
                self._file = open(self._parts[self._index], "rb")  # noqa: SIM115 - held across reads, closed below
            count = self._file.readinto(buffer)
            if count:
                return count
            self._file.close()
            self._file, self._index = None, self._index + 1
        return 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        super().close()


def extract_tar(stem: str, parts: Sequence[Path], target: Path, progress: bool = True) -> list[str]:
    """Extract a tar (one file, or the parts of a split one) into `target`, like `extract_archive`.

    The stream is read once: members are written into a staging folder inside `target` and
    moved into place only after the whole archive has been read and every member checked,
    so an unsafe member (absolute, `..`, a link, a device) or a truncated part leaves
    nothing of the archive behind. The completion marker `.unzipped/<stem>.json` holds the
    hash of the part hashes (hub blob names) and the member list.

    Returns:
        The archive's file members (posix paths relative to `target`).
    """
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    parts = ordered_parts(stem, parts)
    label = parts[0].parent / (stem if len(parts) > 1 else parts[0].name)
    part_hashes = [archive_sha256(p) for p in parts]
    sha256 = part_hashes[0] if len(parts) == 1 else hashlib.sha256("|".join(part_hashes).encode()).hexdigest()
    marker = marker_path(target, Path(stem))
    if _marker_is_current(marker, target, sha256):
        log.info("%s already extracted into %s", stem, target)
        return json.loads(marker.read_text())["members"]
    marker.unlink(missing_ok=True)
    started = time.perf_counter()
    for stale in target.glob(".extracting-*"):  # left by a killed extraction
        shutil.rmtree(stale, ignore_errors=True)
    staging = target / f".extracting-{uuid.uuid4().hex}"
    files: dict[str, Path] = {}
    total = sum(p.stat().st_size for p in parts)
    try:
        with (
            io.BufferedReader(_JoinedParts(parts), _CHUNK) as stream,
            tqdm(total=total, desc=f"extracting {stem}", unit="B", unit_scale=True, disable=not progress) as bar,
        ):
            try:
                with tarfile.open(fileobj=stream, mode="r|*") as tar:
                    for member in tar:
                        destination = _tar_destination(target, member, label)
                        if destination is None:
                            continue
                        relative = destination.relative_to(target).as_posix()
                        staged = staging / relative
                        staged.parent.mkdir(parents=True, exist_ok=True)
                        source = tar.extractfile(member)
                        with open(staged, "wb") as sink:
                            shutil.copyfileobj(source, sink, _CHUNK)
                        files[relative] = destination
                        bar.update(member.size)
                    # An uncompressed tar ends with two zero blocks after its last member; a
                    # stream that stops before them lost its tail (a short or missing last part).
                    if stem.endswith(".tar") and total - tar.offset < 2 * tarfile.BLOCKSIZE:
                        raise tarfile.ReadError(f"no end-of-archive blocks after byte {tar.offset} of {total}")
            except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as error:
                raise ArchiveError(
                    f"{label} ({len(parts)} part(s)) is not a complete tar archive ({error}); a part is probably "
                    f"truncated or the last part missing. Delete the part(s) (and their blobs in the hub cache) "
                    f"and re-run the download step"
                ) from error
        for relative, destination in files.items():
            destination.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / relative, destination)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    members = sorted(files)
    atomic_write_text(marker, json.dumps({"archive": stem, "parts": [p.name for p in parts], "sha256": sha256,
                                          "members": members}, indent=1))
    seconds = time.perf_counter() - started
    log.info("extracted %d files of %s (%d part(s), %.0f MB) in %.1f s (%.1f MB/s)", len(members), stem, len(parts),
             total / 1e6, seconds, total / 1e6 / max(seconds, 1e-9))
    return members


def _tar_destination(target: Path, member: tarfile.TarInfo, archive: Path) -> Path | None:
    """Where a tar member goes (None for a folder); links, devices and fifos are refused."""
    if member.issym() or member.islnk():
        raise _refusal(archive, member.name, "is a link")
    if not (member.isfile() or member.isdir()):
        raise _refusal(archive, member.name, "is not a regular file or folder (a device or fifo)")
    destination = checked_destination(target, member.name, archive)
    if member.isdir():
        destination.mkdir(parents=True, exist_ok=True)
        return None
    return destination
