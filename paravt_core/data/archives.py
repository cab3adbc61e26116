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
  marker whose files have since been deleted is redone; an empty or corrupt marker
  means "not complete" and is redone.
- Split tars: tarfile takes a bad header in mid-stream for the end of the archive, so a
  truncated middle part would otherwise extract "successfully" with members missing or
  filled with the next part's bytes. Before extraction, every part but the last must be
  non-empty and of one size (how `split -b` cuts), the last no larger, and each part
  must match the size given by the download's metadata when the caller has it. A part
  that is a hub blob (named by its sha256) is hashed as it streams and must match its
  name. After the stream, every byte past the end-of-archive header must be zero.

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
from collections.abc import Mapping, Sequence
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


def read_marker(marker: Path) -> dict | None:
    """A completion marker's record, or None when it is absent, empty or corrupt (a crash
    or a full disk can leave such a file; it means "not complete", never an error)."""
    try:
        record = json.loads(marker.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    members = record.get("members") if isinstance(record, dict) else None
    if not isinstance(record, dict) or not isinstance(record.get("sha256"), str) or not isinstance(members, list):
        return None
    return record if all(isinstance(member, str) for member in members) else None


def _current_members(marker: Path, target: Path, sha256: str) -> list[str] | None:
    """The member list of a marker that records this archive and whose files all exist."""
    record = read_marker(marker)
    if record is None or record["sha256"] != sha256:
        return None
    members = record["members"]
    return members if all((target / member).is_file() for member in members) else None


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
    done = _current_members(marker, target, sha256)
    if done is not None:
        log.info("%s already extracted into %s", archive.name, target)
        return done
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


def extract_all(archives: Sequence[Path], target: Path, progress: bool = True,
                part_sizes: Mapping[str, int] | None = None) -> dict[str, str]:
    """Extract several archives into one folder; returns archive name -> sha256.

    `part_sizes` (file name -> byte size, from the download's metadata when there is
    any) is checked against the parts of split tars before they are read.

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
        extract_tar(stem, parts, target, progress, part_sizes)
    hashes = {a.name: _written_marker(marker_path(target, a))["sha256"] for a in zips}
    return hashes | {stem: _written_marker(marker_path(target, Path(stem)))["sha256"] for stem in tars}


def _written_marker(marker: Path) -> dict:
    record = read_marker(marker)
    if record is None:
        raise ArchiveError(f"{marker}: the completion marker just written cannot be read back; check the disk "
                           "(full or failing) and re-run the unzip step")
    return record


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


def _hub_blob_sha256(part: Path) -> str | None:
    """The sha256 the hub recorded for a part: its blob name, when it is a cached LFS file."""
    blob_name = part.resolve().name
    return blob_name if part.is_symlink() and _SHA256_NAME.match(blob_name) else None


def _redownload(parts: Sequence[Path]) -> str:
    return f"Delete {', '.join(str(p) for p in parts)} (and their blobs in the hub cache) and re-run the download step"


def check_part_sizes(label: Path, parts: Sequence[Path], expected: Mapping[str, int] | None = None) -> None:
    """Refuse parts whose sizes cannot be those of one `split -b` cut: an empty part, a part
    before the last that differs from the others, a last part larger than them, or a size
    other than the download's metadata says (`expected`: file name -> bytes)."""
    sizes = {part: part.stat().st_size for part in parts}
    for part, size in sizes.items():
        if expected and part.name in expected and expected[part.name] != size:
            raise ArchiveError(f"{label}: part {part} is {size} bytes but the download's metadata says "
                               f"{expected[part.name]}; it is truncated or not the published file. {_redownload([part])}")
        if size == 0:
            raise ArchiveError(f"{label}: part {part} is empty. {_redownload([part])}")
    if len(parts) < 2:
        return
    leading = [sizes[part] for part in parts[:-1]]
    # The cut's size is the largest: a damaged part is a shorter one, and several parts can be
    # truncated alike (the most common size would then blame the intact part).
    full = max(leading)
    odd = [part for part in parts[:-1] if sizes[part] != full]
    if not odd and sizes[parts[-1]] > full:
        odd = list(parts[:-1])
    if odd:
        described = ", ".join(f"{part.name} ({sizes[part]} bytes)" for part in odd)
        raise ArchiveError(f"{label}: {described} differ from the {full} bytes of every other part before the "
                           f"last (split cuts equal parts); a part is truncated. {_redownload(odd)}")


class _JoinedParts(io.RawIOBase):
    """The parts' bytes as one read-only stream (what `cat parts > joined` would hold);
    a part with a recorded sha256 (`expected`, by index) is hashed as it is read and
    must match when its last byte has been read."""

    def __init__(self, parts: Sequence[Path], expected: Mapping[int, str] | None = None):
        self._parts, self._index, self._file = list(parts), 0, None
        self._expected = dict(expected or {})
        self._hash = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self._index < len(self._parts):
            if self._file is None:
                self._file = open(self._parts[self._index], "rb")  # noqa: SIM115 - held across reads, closed below
                self._hash = hashlib.sha256()
            count = self._file.readinto(buffer)
            if count:
                if self._index in self._expected:
                    self._hash.update(memoryview(buffer)[:count])
                return count
            self._file.close()
            self._check_hash()
            self._file, self._index = None, self._index + 1
        return 0

    def _check_hash(self) -> None:
        expected = self._expected.get(self._index)
        if expected is not None and self._hash.hexdigest() != expected:
            part = self._parts[self._index]
            raise ArchiveError(f"part {part} has sha256 {self._hash.hexdigest()} but the hub recorded {expected}; "
                               f"it is corrupt. {_redownload([part])}")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        super().close()


def _read_at(parts: Sequence[Path], offset: int, size: int) -> bytes:
    """`size` bytes (fewer at the end) of the joined parts from `offset`."""
    data = b""
    for part in parts:
        length = part.stat().st_size
        if offset >= length:
            offset -= length
            continue
        with open(part, "rb") as f:
            f.seek(offset)
            data += f.read(size - len(data))
        offset = 0
        if len(data) == size:
            break
    return data


def _part_at(parts: Sequence[Path], offset: int) -> Path:
    for part in parts:
        length = part.stat().st_size
        if offset < length:
            return part
        offset -= length
    return parts[-1]


def _check_trailing_zeros(tar: tarfile.TarFile, parts: Sequence[Path], plain: bool) -> None:
    """Everything after the end-of-archive header is zero padding. tarfile stops quietly at
    a header it cannot parse, so for a plain tar the block it stopped at is read back from
    the parts; the rest of the stream is drained (which also completes the part hashes)."""
    stop = tar.offset
    if plain and _read_at(parts, stop, tarfile.BLOCKSIZE).strip(b"\0"):
        raise tarfile.ReadError(f"an unreadable header at byte {stop} (in {_part_at(parts, stop).name}) ended the "
                                "archive early: a part before it is truncated or corrupt")
    position = stop + tarfile.BLOCKSIZE
    while chunk := tar.fileobj.read(_CHUNK):
        if chunk.strip(b"\0"):
            where = position + len(chunk) - len(chunk.lstrip(b"\0"))
            named = f" (in {_part_at(parts, where).name})" if plain else ""
            raise tarfile.ReadError(f"non-zero byte at {where}{named} after the end-of-archive header: the "
                                    "archive ended early, a part is probably truncated")
        position += len(chunk)


def extract_tar(stem: str, parts: Sequence[Path], target: Path, progress: bool = True,
                part_sizes: Mapping[str, int] | None = None) -> list[str]:
    """Extract a tar (one file, or the parts of a split one) into `target`, like `extract_archive`.

    The stream is read once: members are written into a staging folder inside `target` and
    moved into place only after the whole archive has been read and every member checked,
    so an unsafe member (absolute, `..`, a link, a device) or a truncated part leaves
    nothing of the archive behind. Part sizes (and hub-recorded sha256s) and the trailing
    zero padding are checked as the module docstring says. The completion marker `.unzipped/<stem>.json` holds the
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
    done = _current_members(marker, target, sha256)
    if done is not None:
        log.info("%s already extracted into %s", stem, target)
        return done
    marker.unlink(missing_ok=True)
    check_part_sizes(label, parts, part_sizes)
    recorded = {index: sha for index, part in enumerate(parts) if (sha := _hub_blob_sha256(part))}
    started = time.perf_counter()
    for stale in target.glob(".extracting-*"):  # left by a killed extraction
        shutil.rmtree(stale, ignore_errors=True)
    staging = target / f".extracting-{uuid.uuid4().hex}"
    files: dict[str, Path] = {}
    total = sum(p.stat().st_size for p in parts)
    try:
        with (
            io.BufferedReader(_JoinedParts(parts, recorded), _CHUNK) as stream,
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
                    _check_trailing_zeros(tar, parts, plain=stem.endswith(".tar"))
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
