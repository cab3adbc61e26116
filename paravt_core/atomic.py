"""Atomic writes: outputs appear whole under their final name or not at all; and whether an
output folder can be created at all, asked before anything is written."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def folder_problem(folder: Path) -> str | None:
    """Why `folder` cannot be used or created as a folder, or None when it can.

    Asked before anything is written (config load, command line), creating nothing, so that a
    path under a file is refused up front, not a NotADirectoryError traceback at the first
    write (issue #48 item 9)."""
    folder = folder.absolute()  # not normalized: `file/..` fails to be created, as it should here
    try:
        for place in (folder, *folder.parents):
            if place.is_dir():
                if not os.access(place, os.W_OK | os.X_OK):
                    return "is not writable" if place == folder else f"{place} is not writable"
                return None
            if os.path.lexists(place):
                kind = "a link to nothing" if place.is_symlink() and not place.exists() else "a file"
                return f"is {kind}, not a folder" if place == folder else f"{place} is {kind}, not a folder"
    except OSError as err:  # a name too long for the file system, a loop of links
        return f"cannot be checked ({err.strerror})"
    return None


def output_folder(text: str) -> Path:
    """An argparse `type` for an output folder: a folder that cannot be created is a usage error
    (exit 2, the path and why) when the command line is read, not a traceback at the first write."""
    problem = folder_problem(Path(text))
    if problem:
        raise argparse.ArgumentTypeError(f"{text}: {problem}; choose a folder that can be created")
    return Path(text)


@contextlib.contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling folder; on success it replaces `final` in one rename."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        yield tmp
        if final.exists():
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old)
        else:
            tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` through a temporary file in the same folder and os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))
