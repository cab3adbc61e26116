"""A model server (vLLM, SGLang) in a child process: started, watched until healthy, stopped whole.

Servers fork workers of their own (vLLM's engine core, SGLang's scheduler and detokenizer),
so stopping only the process we started can leave them running and holding the port and
memory. `start_server` therefore starts the command as the leader of a new process group
and `ServerProcess.stop` signals the whole group: SIGTERM, then SIGKILL to whatever is left
after the grace period. On Linux the leader also gets SIGTERM if the process that started
it dies (PR_SET_PDEATHSIG), so a killed `paravt` does not leave a server behind.

While it waits for `/health` it reports progress (elapsed seconds and the last line the
server logged) through a callback, and a server that exits during start-up raises with
the tail of its log.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1


class ServerStartError(RuntimeError):
    """The server exited, or was not healthy in time; the message holds its log's tail."""


def server_healthy(url: str, timeout_s: float = 5.0) -> bool:
    """Whether GET `url`/health answers 200."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except OSError:
            pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tail(path: Path | None, lines: int) -> str:
    if path is None or not path.is_file():
        return ""
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


@dataclass
class ServerProcess:
    """A started server: its process (leader of its own group), URL and log file."""

    process: subprocess.Popen
    url: str
    log_path: Path | None = None

    @property
    def pgid(self) -> int:
        return self.process.pid  # the leader of a new session: its pid is the group id

    def log_tail(self, lines: int = 30) -> str:
        return _tail(self.log_path, lines)

    def alive(self) -> bool:
        """Whether any process of the server's group is still running."""
        return self.process.poll() is None or _group_alive(self.pgid)

    def kill(self) -> None:
        """SIGKILL the whole group at once (a crash, as tests simulate one)."""
        self._signal(signal.SIGKILL)
        self.process.wait()
        self._wait_group(10.0)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the group, wait up to `timeout_s`, then SIGKILL what is left; idempotent."""
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.process.wait()
        if not self._wait_group(min(timeout_s, 10.0)):
            self._signal(signal.SIGKILL)
            self._wait_group(10.0)

    def _signal(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            pass

    def _wait_group(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while _group_alive(self.pgid):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True


def start_server(command: Sequence[str], url: str, startup_timeout_s: float, *, env: Mapping[str, str] | None = None,
                 log_path: Path | None = None, progress: Callable[[str], None] | None = None,
                 progress_every_s: float = 15.0, cwd: Path | None = None) -> ServerProcess:
    """Start `command` in a new process group and return once `url`/health answers 200.

    Args:
        env: the child's environment (default: this process's).
        log_path: where the server's stdout and stderr go (default: inherited).
        progress: called every `progress_every_s` while waiting, with a line naming the
            elapsed time and the server log's last line.

    Raises:
        ServerStartError: the process exited during start-up, or was not healthy within
            `startup_timeout_s` (it is then stopped); the message holds the log's tail.
    """
    log = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = log_path.open("ab")
    try:
        process = subprocess.Popen(list(command), env=dict(env) if env is not None else None, stdout=log,
                                   stderr=subprocess.STDOUT if log is not None else None, start_new_session=True,
                                   preexec_fn=_die_with_parent, cwd=cwd)
    finally:
        if log is not None:
            log.close()
    server = ServerProcess(process, url.rstrip("/"), log_path)
    try:
        _wait_healthy(server, command, startup_timeout_s, progress, progress_every_s)
    except BaseException:  # also Ctrl-C or SIGTERM while waiting: no server is left behind
        server.stop(timeout_s=10.0)
        raise
    return server


def _wait_healthy(server: ServerProcess, command: Sequence[str], startup_timeout_s: float,
                  progress: Callable[[str], None] | None, progress_every_s: float) -> None:
    started = last_report = time.monotonic()
    while time.monotonic() - started < startup_timeout_s:
        if server.process.poll() is not None:
            raise ServerStartError(f"the server exited with status {server.process.returncode} during start-up; "
                                   f"command: {' '.join(command)}\n{server.log_tail()}")
        if server_healthy(server.url, timeout_s=2.0):
            return
        now = time.monotonic()
        if progress is not None and now - last_report >= progress_every_s:
            last = server.log_tail(1).strip()
            progress(f"waiting for {server.url}/health: {now - started:.0f} s" + (f" (server: {last[-160:]})"
                                                                                   if last else ""))
            last_report = now
        time.sleep(1.0)
    raise ServerStartError(f"the server on {server.url} was not healthy after {startup_timeout_s:.0f} s; command: "
                           f"{' '.join(command)}\n{server.log_tail()}")
