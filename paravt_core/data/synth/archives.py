"""Deterministic zip archives: the same members give the same bytes.

Members are stored uncompressed (mp4 and srt gain little from deflate at these sizes)
with a fixed timestamp and permissions, in sorted order.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping

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
