"""No orphans after a hard kill: a watcher that ends a dead command's leftover processes.

`paravt run` starts processes of its own: Prefect's temporary API server (uvicorn), the
DeepSpeed launcher and its ranks. Killed with SIGKILL it cannot stop them, and they live on
(the Prefect server held its port and database, issue #33). `start_reaper()` starts a small
watcher in its own session that, once a second, records the command's descendants (from
/proc, with each process's start time so a reused pid is never touched) and, when the
command is gone, sends them SIGTERM, then SIGKILL to those still alive after 5 s. On a
normal exit the command stops the watcher (`Reaper.stop`) after it has ended its children
itself. Linux only (/proc); elsewhere `start_reaper` returns None.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE_S = 5.0


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of a live process, from /proc/<pid>/stat."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), fields[19]  # ppid, starttime (clock ticks since boot)


def descendants(root: int) -> dict[int, str]:
    """pid -> start time of every live descendant of `root`."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            children.setdefault(stat[0], []).append(int(entry))
    found: dict[int, str] = {}
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        stat = _stat(pid)
        if stat is not None and pid not in found:
            found[pid] = stat[1]
            stack += children.get(pid, [])
    return found


def _signal_survivors(known: dict[int, str], sig: int) -> list[int]:
    alive = []
    for pid, started in known.items():
        stat = _stat(pid)
        if stat is not None and stat[1] == started:  # the same process, not a reused pid
            try:
                os.kill(pid, sig)
                alive.append(pid)
            except OSError:
                pass
    return alive


def end_descendants(grace_s: float = GRACE_S, exclude: tuple[int, ...] = ()) -> list[int]:
    """End this process's descendants now (SIGTERM, then SIGKILL after `grace_s`): for a command
    about to leave through `os._exit`, which stops no child. Returns the pids signalled."""
    known = {pid: started for pid, started in descendants(os.getpid()).items() if pid not in exclude}
    signalled = _signal_survivors(known, signal.SIGTERM)
    if signalled:
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_stat(p) for p in known):
            time.sleep(0.1)
        _signal_survivors(known, signal.SIGKILL)
    return signalled


def watch(command_pid: int, own_pid: int, interval_s: float = 1.0) -> None:
    """The watcher's loop (run as `python -m paravt_core.reaper PID`)."""
    known: dict[int, str] = {}
    command = _stat(command_pid)
    if command is None:
        return
    while (stat := _stat(command_pid)) is not None and stat[1] == command[1]:
        current = descendants(command_pid)
        current.pop(own_pid, None)
        known = {**{p: s for p, s in known.items() if _stat(p) is not None}, **current}
        time.sleep(interval_s)
    if _signal_survivors(known, signal.SIGTERM):
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and any(_stat(p) for p in known):
            time.sleep(0.2)
        _signal_survivors(known, signal.SIGKILL)


class Reaper:
    """A running watcher; `stop()` ends it (the command exits normally)."""

    def __init__(self, process: subprocess.Popen):
        self.process = process

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()


def start_reaper() -> Reaper | None:
    """Watch this process; its descendants are ended if it dies without stopping the watcher."""
    if not Path("/proc/self/stat").is_file():
        return None
    process = subprocess.Popen([sys.executable, "-m", "paravt_core.reaper", str(os.getpid())],
                               start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    return Reaper(process)


if __name__ == "__main__":
    watch(int(sys.argv[1]), os.getpid())
