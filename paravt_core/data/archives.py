"""Unzip step of the data stage: safe, verified, resumable zip extraction (SPEC §8).

`extract_archive` unpacks one zip into a target folder:

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

import json
import logging
import os
import re
import shutil
import stat
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


def member_destination(target: Path, info: zipfile.ZipInfo, archive: Path) -> Path:
    """Where a member goes under `target`; raises UnsafeArchiveError if outside it."""
    name = info.filename

    def refuse(why: str) -> UnsafeArchiveError:
        return UnsafeArchiveError(
            f"{archive}: member {name!r} {why}; refusing to extract this archive. "
            f"Re-download it from a trusted source or delete it from the hub cache"
        )

    if _is_symlink_member(info):
        raise refuse("is a symbolic link")
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
    """Extract several archives into one folder; returns archive name -> sha256."""
    names = [Path(a).name for a in archives]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ArchiveError(f"archives share a name {duplicates}; their completion markers in {target} would clash")
    for archive in archives:
        extract_archive(Path(archive), target, progress)
    return {Path(a).name: json.loads(marker_path(target, Path(a)).read_text())["sha256"] for a in archives}
