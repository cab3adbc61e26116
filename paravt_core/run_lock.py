"""One run per output directory: an exclusive lock on `<output_dir>/.paravt.lock`.

Two `paravt run` (or deployment flow runs, or `paravt eval run`) on one output directory
would train into the same folders, race on the MLflow database and append duplicate eval
lines. `hold_output_dir` takes an advisory `flock` on the lock file for the duration of a
run and writes the holder's pid, host, start time and command into it:

- a second run on the directory is refused at once with `OutputDirBusy`, naming the
  holder's pid and start time (and what to do);
- the kernel drops a `flock` when its process dies however it dies, so a lock left by a
  killed run is stale by construction: the next run takes it over and logs a warning
  naming the dead holder (pid, start time) from the record it finds;
- within one process the lock is re-entrant (a flow that calls code which also takes it
  does not lock itself out);
- the output directory itself is locked too (a `flock` on its descriptor), so deleting
  `.paravt.lock` under a running run does not let a second one in (#61): a new lock file
  would be a new inode, free to lock, but the directory is the same. Where the filesystem
  refuses a lock on a directory, the lock file alone is taken, as before.

`flock` locks are local to a host; runs sharing an output directory over NFS from several
hosts are not covered (the record's host is in the message to help see that case).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

LOCK_FILE = ".paravt.lock"

_held: dict[Path, int] = {}  # lock path -> nesting depth in this process
_held_guard = threading.Lock()


class OutputDirBusy(RuntimeError):
    """Another live run holds the output directory; the message names it."""


def _holder_text(record: dict | None) -> str:
    if not record:
        return "a process whose record could not be read"
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(record.get("started", 0)))
    return (f"pid {record.get('pid')} on {record.get('host')} (started {started}, running "
            f"{record.get('what')!r}: {record.get('command')})")


def _busy(output_dir: Path) -> OutputDirBusy:
    return OutputDirBusy(f"{output_dir} is in use by another run: {_holder_text(read_holder(output_dir))}. Wait for "
                         f"it to finish or stop it, or point this run at another run.output_dir")


def _lock_folder(folder: Path) -> int | None:
    """An open descriptor of `folder` holding an exclusive `flock`, or None where the filesystem
    refuses one on a directory (the lock file then locks alone).

    Raises:
        OutputDirBusy: another live process holds it.
    """
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _busy(folder) from None
    except OSError:
        os.close(fd)
        return None
    return fd


def read_holder(output_dir: Path) -> dict | None:
    """The record in the lock file, or None when there is none or it does not parse."""
    try:
        record = json.loads((Path(output_dir) / LOCK_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


@contextlib.contextmanager
def hold_output_dir(output_dir: Path, what: str) -> Iterator[Path]:
    """Hold `<output_dir>/.paravt.lock` exclusively while the block runs.

    Args:
        output_dir: the run's `run.output_dir` (created if absent).
        what: what the run is, for the record ("paravt run", "paravt-eval flow", ...).
    Raises:
        OutputDirBusy: another live process holds the directory.
    """
    path = (Path(output_dir) / LOCK_FILE).resolve()
    with _held_guard:
        if path in _held:
            _held[path] += 1
            reentered = True
        else:
            reentered = False
    if reentered:
        try:
            yield path
        finally:
            with _held_guard:
                _held[path] -= 1
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    folder_fd = _lock_folder(path.parent)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        if folder_fd is not None:  # the folder's lock goes with the failed attempt
            os.close(folder_fd)
        raise
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _busy(path.parent) from None
        previous = read_holder(path.parent)
        if previous and previous.get("pid") != os.getpid():
            log.warning("%s: taking over a stale lock left by %s, which is no longer running", path,
                        _holder_text(previous))
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "what": what,
                  "command": " ".join(sys.argv)}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        os.fsync(fd)
        with _held_guard:
            _held[path] = 1
        try:
            yield path
        finally:
            with _held_guard:
                del _held[path]
            os.ftruncate(fd, 0)  # a clean exit leaves no holder record behind
    finally:
        os.close(fd)  # closing the descriptors releases the flocks
        if folder_fd is not None:
            os.close(folder_fd)
