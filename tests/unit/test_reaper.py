"""A hard-killed command leaves no processes behind (`paravt_core.reaper`, issue #33 item 7)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from paravt_core.reaper import _stat

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="the reaper reads /proc (Linux)")

COMMAND = """
import subprocess, sys, time
from paravt_core.reaper import start_reaper
reaper = start_reaper()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
grandchild = subprocess.Popen([sys.executable, "-c",
    "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
    "print(p.pid, flush=True); time.sleep(300)"], stdout=subprocess.PIPE, text=True)
print(child.pid, grandchild.pid, grandchild.stdout.readline().strip(), flush=True)
if sys.argv[1] == "exit":
    reaper.stop()
    print("stopped", flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and Path(f"/proc/{pid}/status").read_text().find("State:\tZ") < 0


def _start(mode: str) -> tuple[subprocess.Popen, list[int]]:
    command = subprocess.Popen([sys.executable, "-c", COMMAND, mode], stdout=subprocess.PIPE, text=True,
                               cwd=Path(__file__).resolve().parents[2])
    pids = [int(p) for p in command.stdout.readline().split()]
    time.sleep(2.5)  # the watcher records the descendants once a second
    return command, pids


def test_the_descendants_of_a_killed_command_are_ended():
    command, pids = _start("kill")
    assert len(pids) == 3 and all(_alive(p) for p in pids)
    os.kill(command.pid, signal.SIGKILL)
    command.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids), "orphans left behind"


def test_a_stopped_watcher_ends_nothing():
    command, pids = _start("exit")
    assert command.stdout.readline().strip() == "stopped"
    os.kill(command.pid, signal.SIGKILL)
    command.wait()
    time.sleep(3)
    try:
        assert all(_alive(p) for p in pids)  # the watcher was stopped: nothing was reaped
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
