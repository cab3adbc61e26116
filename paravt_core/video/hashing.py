"""Content hash of a video file, the cache key later stages use (STYLE §3)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def video_sha256(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of the file's bytes, read in chunks so long videos never sit in memory.

    Raises:
        FileNotFoundError: no file at the path.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"video file not found: {path}")
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()
