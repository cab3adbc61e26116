"""Deterministic archives: the same members give the same bytes.

Zip members are stored uncompressed (mp4 and srt gain little from deflate at these sizes)
with a fixed timestamp and permissions, in sorted order. Tars (POSIX ustar/pax, same
fixed fields) can be split into `split`-style parts, as LongVideoBench publishes its videos.
"""

from __future__ import annotations

import io
import tarfile
import zipfile
from collections.abc import Mapping

from paravt_core.data.archives import part_suffix

FIXED_DATE_TIME = (1980, 1, 1, 0, 0, 0)


def zip_bytes(members: Mapping[str, bytes]) -> bytes:
    """A zip holding `members` (archive path -> content), sorted by path."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, mode="w", compression=zipfile.ZIP_STORED) as archive:
        for name in sorted(members):
            info = zipfile.ZipInfo(name, date_time=FIXED_DATE_TIME)
            info.external_attr = 0o100644 << 16
            info.create_system = 3
            archive.writestr(info, members[name])
    return buffer.getvalue()


def tar_bytes(members: Mapping[str, bytes]) -> bytes:
    """An uncompressed tar holding `members`, sorted by path, with fixed owner and times."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name in sorted(members):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(members[name]), 0o644, 0
            archive.addfile(info, io.BytesIO(members[name]))
    return buffer.getvalue()


def split_parts(stem: str, data: bytes, parts: int) -> dict[str, bytes]:
    """`data` cut into `parts` near-equal pieces named `<stem>.part.aa`, `.ab`, ... (as `split` names them)."""
    if not 1 <= parts <= 26 * 26:
        raise ValueError(f"parts must be 1..676, got {parts}")
    size = -(-len(data) // parts)
    names = (f"{stem}.part.{part_suffix(i)}" for i in range(parts))
    return {name: data[i * size:(i + 1) * size] for i, name in enumerate(names)}
