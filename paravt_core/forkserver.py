"""A fork server for rank processes: torch, transformers, DeepSpeed and MLflow imported once.

Each DeepSpeed rank that `dist.launch.launch_workers` starts is a fresh `python -u worker.py`, and
about 10 of its CPU seconds go to importing torch, torchvision, transformers' Qwen3-VL code,
DeepSpeed and MLflow before it trains anything (docs/speed.md, issue #45). The test suite
starts a hundred of them. This server imports those libraries once and forks a child for
each rank instead; the child runs the worker script as `python -u worker.py ...` would.

Opt-in: `launch_workers` uses a server only where the environment names its socket
(`PARAVT_RANK_FORKSERVER`, set by the test suite for its whole session); otherwise, and for
every multi-node launch, ranks are plain subprocesses.

What a forked rank gets, as a fresh interpreter would:
- its argv, environment, working folder, `sys.path` (the script's folder, then PYTHONPATH,
  then the interpreter's own entries) and bytecode setting (PYTHONDONTWRITEBYTECODE);
- stdin, stdout and stderr: the launcher's own file descriptors, passed over the socket
  (SCM_RIGHTS), so its output reaches the launcher's pipe as a subprocess's would;
- signal dispositions: defaults, SIGINT raising KeyboardInterrupt, SIGPIPE and SIGXFSZ ignored
  as CPython sets them, and the signals the launcher ignores ignored (they survive exec);
- fresh entropy for numpy's global generator (Python's `random` reseeds itself after a
  fork);
- a process group: the launcher's choice (`process_group`, as `subprocess.Popen` takes it),
  else the server's, which is a session of its own, away from any terminal;
- an exit code with `Popen.returncode`'s meaning (negative: killed by that signal); an
  uncaught KeyboardInterrupt ends the process by SIGINT, as CPython does.

Its environment must agree with the server's on every variable a preloaded library reads at
import (`import_time_env`: OpenMP and BLAS thread counts, OMP_NUM_THREADS included, Hugging
Face, torch and DeepSpeed settings, hash seeds, locale): a request that differs is started as
a plain subprocess instead (`spawn` returns None), since a fork would run with the server's
values. Variables the preloaded imports set themselves are set in each child's environment
where the request does not set them.

Lifetimes: a rank whose launcher closes its connection (the launcher died) is killed with its
process group if it leads one; when the server's stdin closes (whoever started it is gone)
or it gets SIGTERM, it kills its ranks and exits. The server is one thread: it never forks
while another thread holds a lock. Linux (SCM_RIGHTS on a Unix socket, `os.fork`).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

SOCKET_ENV = "PARAVT_RANK_FORKSERVER"
# What a rank imports before its first step (measured: 10-11 CPU s together on this machine,
# against 0.2 s for the project's own modules, which stay fresh in every rank).
DEFAULT_PRELOAD = (
    "torch", "torch.distributed", "torchvision", "numpy", "deepspeed", "transformers",
    "transformers.models.qwen3_vl.modeling_qwen3_vl", "transformers.models.qwen3_vl.processing_qwen3_vl",
    "transformers.models.qwen3_vl.video_processing_qwen3_vl",
    "transformers.models.qwen2_vl.image_processing_qwen2_vl_fast", "?mlflow", "?mlflow.tracking", "av",
    "pyarrow", "pyarrow.parquet", "pydantic", "yaml", "tqdm",
)
# A name starting with OPTIONAL is preloaded where it is installed and skipped where it is not: a
# rank that needs it imports it itself. mlflow is one: runs with `mlflow.enabled: false` never
# import it, and the GPU image lacks it (docs/gpu_check.md, 2026-11-30: every SFT launch of the gpu
# tier failed there, the server unable to start). Any other failing import still fails the launch.
OPTIONAL = "?"
# Variables a preloaded library reads once, at import: a request must agree with the server.
# Thread counts among them: OpenMP and OpenBLAS size their pools from OMP_NUM_THREADS when
# they load. PYTHONPATH, PYTHONDONTWRITEBYTECODE and PYTHONUNBUFFERED are applied in the child;
# TORCH_EXTENSIONS_DIR is read from the child's environment when an op is built, never at import
# (`dist.rank.own_extensions_dir` sets it in a process that joined a process group).
IMPORT_TIME_ENV_PREFIXES = ("OMP_", "MKL_", "OPENBLAS_", "GOTO_", "KMP_", "GOMP_", "BLIS_", "NUMEXPR_", "HF_",
                            "HUGGINGFACE_", "TRANSFORMERS_", "DS_", "DEEPSPEED_", "TORCH", "PYTORCH_", "LC_",
                            "LD_", "MALLOC_", "PYTHON")
IMPORT_TIME_ENV_NAMES = ("LANG", "LANGUAGE", "TMPDIR", "GLIBC_TUNABLES")
APPLIED_IN_CHILD = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "TORCH_EXTENSIONS_DIR")
_INHERITED_IGNORES = ("SIGINT", "SIGQUIT", "SIGHUP", "SIGTERM", "SIGUSR1", "SIGUSR2")
_HEADER = struct.Struct("!I")
SOCKET_PATH_LIMIT = 108  # sun_path on Linux, its terminating NUL included
READY_WAIT_S = 300.0  # how long `spawn` waits for a named server still importing its libraries


def failed_marker(socket_path: str | os.PathLike) -> Path:
    """Written by a server whose imports failed, with the traceback: `spawn` raises it at once
    instead of waiting READY_WAIT_S for a socket that will never appear."""
    return Path(f"{socket_path}.failed")


def import_time_env(env: dict[str, str]) -> dict[str, str]:
    """The part of `env` that preloaded libraries read at import (module docstring)."""
    return {key: value for key, value in env.items()
            if key not in APPLIED_IN_CHILD and (key.startswith(IMPORT_TIME_ENV_PREFIXES) or key in IMPORT_TIME_ENV_NAMES)}


def env_differences(env: dict[str, str], base_env: dict[str, str], set_by_imports: dict[str, str]) -> list[str]:
    """Names of the import-time variables (`import_time_env`) on which `env` disagrees with
    the server's `base_env`; one the server's imports set counts as agreeing where `env`
    lacks it."""
    wanted = import_time_env(env)
    for key, value in import_time_env(set_by_imports).items():
        wanted.setdefault(key, value)
    return sorted(key for key in set(wanted) | set(base_env) if wanted.get(key) != base_env.get(key))


# ---------------------------------------------------------------------------------- client


_forked_cpu = [0.0]


def _add_forked_cpu(seconds: float) -> None:
    _forked_cpu[0] += seconds


def forked_cpu_seconds() -> float:
    """CPU seconds (user + system) of the ranks this process had forked that have ended: they
    are the server's children, so this process's RUSAGE_CHILDREN does not hold them."""
    return _forked_cpu[0]


class ForkedProcess:
    """A rank forked by the server, with the parts of `subprocess.Popen` the launcher uses:
    `pid`, `returncode`, `poll()`, `wait()` and `send_signal()`."""

    def __init__(self, conn: socket.socket, pid: int, args: list[str]):
        import threading

        self.pid, self.args, self.returncode = pid, args, None
        self._conn, self._buffer, self._lock = conn, b"", threading.Lock()

    def _read_exit(self, timeout: float) -> None:
        """Read the exit report if it arrives within `timeout`; thread-safe (the launcher
        polls from a watcher thread while its main thread waits)."""
        import select

        with self._lock:
            if self.returncode is not None:
                return
            if not select.select([self._conn], [], [], timeout)[0]:
                return
            chunk = self._conn.recv(4096)
            if not chunk:  # the server died before reporting: the rank was killed with it
                self._finish(-signal.SIGKILL)
                return
            self._buffer += chunk
            if b"\n" in self._buffer:
                report = json.loads(self._buffer.split(b"\n", 1)[0])
                _add_forked_cpu(float(report.get("cpu_s", 0.0)))
                self._finish(int(report["returncode"]))

    def _finish(self, code: int) -> None:
        self.returncode = code
        self._conn.close()

    def poll(self) -> int | None:
        self._read_exit(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read_exit(0.2)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)


def spawn(cmd: Sequence[str], env: dict[str, str], *, stdin: int, stdout: int, stderr: int,
          process_group: int | None = None, socket_path: str | os.PathLike | None = None,
          cwd: str | os.PathLike | None = None, on_fallback: Callable[[str], None] | None = None
          ) -> ForkedProcess | None:
    """Fork `cmd` (`[python, -u, script, args...]`) from the server at `socket_path` (default:
    $PARAVT_RANK_FORKSERVER). None where no server is named, the command is not a Python
    script, or `env` differs from the server's in what its libraries read at import: start a
    subprocess then; `on_fallback` gets the reason of the last two. Raises OSError where a
    named server does not answer."""
    socket_path = socket_path or os.environ.get(SOCKET_ENV)
    if not socket_path:
        return None
    if len(cmd) < 3 or cmd[0] != sys.executable or cmd[1] != "-u" or not cmd[2].endswith(".py"):
        if on_fallback:
            on_fallback(f"not a `{sys.executable} -u script.py` command: {' '.join(cmd[:3])}")
        return None
    deadline = time.monotonic() + READY_WAIT_S
    while not os.path.exists(socket_path):  # a server started without waiting may still be importing
        if failed_marker(socket_path).exists():
            raise OSError(f"the fork server for {socket_path} failed to start:\n"
                          f"{failed_marker(socket_path).read_text()[-2000:]}")
        if time.monotonic() > deadline:
            raise OSError(f"no fork server listens on {socket_path} (${SOCKET_ENV}) after {READY_WAIT_S:.0f} s")
        time.sleep(0.1)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(socket_path))
        ignored = [name for name in _INHERITED_IGNORES if signal.getsignal(getattr(signal, name)) == signal.SIG_IGN]
        request = json.dumps({"argv": list(cmd[2:]), "env": dict(env), "cwd": str(cwd or os.getcwd()),
                              "process_group": process_group, "ignored_signals": ignored}).encode()
        socket.send_fds(conn, [_HEADER.pack(len(request)) + request], [stdin, stdout, stderr])
        reply = _read_line(conn)
    except BaseException:
        conn.close()
        raise
    if "pid" not in reply:
        conn.close()
        if reply.get("fallback"):
            if on_fallback:
                on_fallback(f"its environment differs from the fork server's in {', '.join(reply['fallback'])}")
            return None
        raise OSError(f"fork server {socket_path} refused {cmd[2]}: {reply.get('error')}")
    return ForkedProcess(conn, int(reply["pid"]), list(cmd))


def _read_line(conn: socket.socket) -> dict:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            raise OSError("the fork server closed the connection before answering")
        data += chunk
    return json.loads(data)


class Server:
    """A running fork server (`start`): its socket, and `stop()`."""

    def __init__(self, proc: subprocess.Popen, socket_path: Path):
        self.proc, self.socket_path = proc, socket_path

    def stop(self, timeout: float = 30.0) -> None:
        """End the server and its ranks: its stdin closed once it listens; before that (still
        importing, no rank yet) SIGTERM's default action."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            if not self.socket_path.exists():
                self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(OSError):
            self.proc.stdin.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start(socket_path: str | os.PathLike, preload: Sequence[str] = DEFAULT_PRELOAD, env: dict[str, str] | None = None,
          ready_timeout: float | None = READY_WAIT_S) -> Server:
    """Start a server on `socket_path` with this environment (or `env`) and wait until it has
    imported `preload` and listens (`ready_timeout` None: return at once; `spawn` waits).
    It lives until `stop()`, or until this process is gone (its stdin closes)."""
    socket_path = Path(socket_path)
    if len(os.fsencode(f"{socket_path}.tmp")) >= SOCKET_PATH_LIMIT:
        raise ValueError(f"fork server socket path {socket_path} is too long for a Unix socket "
                         f"({SOCKET_PATH_LIMIT} bytes with the '.tmp' it is bound under first): choose a shorter folder")
    proc = subprocess.Popen([sys.executable, "-u", "-m", "paravt_core.forkserver", "--socket", str(socket_path),
                             "--preload", ",".join(preload)], stdin=subprocess.PIPE, env=env,
                            stdout=subprocess.DEVNULL, start_new_session=True)
    server = Server(proc, socket_path)
    if ready_timeout is None:
        return server
    deadline = time.monotonic() + ready_timeout
    while not socket_path.exists():
        if proc.poll() is not None:
            why = failed_marker(socket_path).read_text()[-2000:] if failed_marker(socket_path).exists() else ""
            raise RuntimeError(f"the fork server exited with code {proc.returncode} before listening on "
                               f"{socket_path}\n{why}")
        if time.monotonic() > deadline:
            server.stop()
            raise TimeoutError(f"the fork server did not listen on {socket_path} within {ready_timeout:.0f} s")
        time.sleep(0.05)
    return server


# ---------------------------------------------------------------------------------- server


def serve(socket_path: Path, preload: Sequence[str]) -> None:
    """The server's loop (module docstring): one thread, a selector over the listening
    socket, the rank connections, stdin and a SIGCHLD wake-up pipe."""
    import importlib

    before = dict(os.environ)
    try:
        for entry in preload:
            name = entry.removeprefix(OPTIONAL)
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as err:
                absent = (err.name or "").split(".")[0] == name.split(".")[0]
                if not (entry.startswith(OPTIONAL) and absent):
                    raise
    except BaseException:
        import traceback

        # Where a launcher waiting for the socket finds why it will never appear (`spawn`).
        failed_marker(socket_path).write_text(traceback.format_exc())
        raise
    # Variables the imports set (measured: torch's TORCHINDUCTOR_CACHE_DIR and
    # PYTORCH_NVML_BASED_CUDA_CHECK, MLflow's telemetry session): a rank's own imports would
    # have set them in its environment; a launcher that imported the same libraries has them.
    set_by_imports = {key: value for key, value in os.environ.items() if before.get(key) != value}
    base_env = import_time_env(dict(os.environ))
    base_path = [entry for entry in sys.path[1:]]  # sys.path[0]: this process's own start folder

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    tmp = socket_path.with_name(socket_path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp))
    listener.listen(64)
    os.rename(tmp, socket_path)  # the path appears once it accepts: `start` waits for it

    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
    ranks: dict[int, socket.socket] = {}  # pid -> its launcher's connection
    leaders: set[int] = set()
    unwatched: set[int] = set()  # ranks whose launcher closed its connection

    def kill_rank(pid: int) -> None:
        if pid in leaders:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)

    def reap() -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            leaders.discard(pid)
            conn = ranks.pop(pid, None)
            if conn is not None:
                if pid not in unwatched:
                    sel.unregister(conn)
                unwatched.discard(pid)
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status),
                                             "cpu_s": usage.ru_utime + usage.ru_stime}).encode() + b"\n")
                conn.close()

    try:
        while not stop:
            for key, _ in sel.select(timeout=1.0):
                if key.data == "accept":
                    conn, _ = listener.accept()
                    _handle(conn, base_env, set_by_imports, base_path, ranks, leaders, sel,
                            [listener.fileno(), wake_r, wake_w])
                elif key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_r, 4096)
                elif key.data == "parent":
                    if not os.read(sys.stdin.fileno(), 4096):
                        stop.append(True)
                else:  # a launcher's connection: readable means it was closed (the launcher is gone)
                    pid = key.data
                    sel.unregister(key.fileobj)
                    unwatched.add(pid)
                    kill_rank(pid)
            reap()
    finally:
        for pid in list(ranks):
            kill_rank(pid)
        deadline = time.monotonic() + 10
        while ranks and time.monotonic() < deadline:
            reap()
            time.sleep(0.05)
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()


def _handle(conn: socket.socket, base_env: dict[str, str], set_by_imports: dict[str, str], base_path: list[str],
            ranks: dict[int, socket.socket], leaders: set[int], sel: selectors.BaseSelector,
            server_fds: list[int]) -> None:
    conn.settimeout(30.0)
    fds: list[int] = []
    try:
        header, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 3)
        (length,) = _HEADER.unpack(header)
        body = b""
        while len(body) < length:
            chunk = conn.recv(length - len(body))
            if not chunk:
                raise OSError("connection closed mid-request")
            body += chunk
        request = json.loads(body)
        if len(fds) != 3:
            raise OSError(f"expected 3 file descriptors, got {len(fds)}")
        differ = env_differences(request["env"], base_env, set_by_imports)
        if differ:
            conn.sendall(json.dumps({"fallback": differ}).encode() + b"\n")
            conn.close()
            return
        request["env"] = {**set_by_imports, **request["env"]}
        pid = os.fork()
        if pid == 0:
            _child(request, fds, server_fds + [key.fd for key in sel.get_map().values()]
                   + [other.fileno() for other in ranks.values()] + [conn.fileno()], base_path)
        group = request.get("process_group")
        if group is not None:  # here as well as in the child, as subprocess does: no window without it
            with contextlib.suppress(OSError):
                os.setpgid(pid, group or pid)
        if group == 0:
            leaders.add(pid)
        ranks[pid] = conn
        conn.settimeout(None)
        sel.register(conn, selectors.EVENT_READ, pid)
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    except Exception as exc:  # a bad request ends its connection, not the server
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode() + b"\n")
        conn.close()
    finally:
        for fd in fds:
            os.close(fd)


def _child(request: dict, fds: list[int], close: list[int], base_path: list[str]) -> None:
    """In the forked child: become `python -u <script> <args>` (module docstring) and exit."""
    code = 1
    interrupted = False
    try:
        signal.set_wakeup_fd(-1)
        for fd in set(close):
            with contextlib.suppress(OSError):
                os.close(fd)
        for sig in signal.valid_signals():
            if sig not in (signal.SIGKILL, signal.SIGSTOP):
                with contextlib.suppress(OSError, ValueError):
                    signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        for name in request.get("ignored_signals", []):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
        group = request.get("process_group")
        if group is not None:
            os.setpgid(0, group)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        env = request["env"]
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(env)
        script, *args = request["argv"]
        sys.argv = [script, *args]
        python_path = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
        sys.path[:] = [os.path.dirname(os.path.abspath(script))] + python_path + \
            [entry for entry in base_path if entry not in python_path]
        sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        if "torch" in sys.modules and env.get("OMP_NUM_THREADS", "").isdigit():  # as the server's
            sys.modules["torch"].set_num_threads(int(env["OMP_NUM_THREADS"]))
        import runpy

        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc.code)
        except KeyboardInterrupt:
            _print_script_traceback(script)
            interrupted = True
        except BaseException:
            _print_script_traceback(script)
            code = 1
        import atexit
        import threading

        with contextlib.suppress(BaseException):
            threading._shutdown()  # non-daemon threads are joined, as at interpreter exit
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        if interrupted:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
    finally:
        os._exit(code & 0xFF)


def _print_script_traceback(script: str) -> None:
    """The current exception's traceback from the script's own frames on, as the interpreter
    prints it for `python script.py` (no runpy or fork-server frames above them)."""
    kind, value, tb = sys.exc_info()
    first = tb
    while first is not None and os.path.abspath(first.tb_frame.f_code.co_filename) != os.path.abspath(script):
        first = first.tb_next
    # no frame of the script: it did not compile, and the interpreter shows no frame either
    sys.excepthook(kind, value.with_traceback(first), first)


def _exit_code(value) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--preload", default=",".join(DEFAULT_PRELOAD))
    args = parser.parse_args(argv)
    serve(args.socket, [name for name in args.preload.split(",") if name])
    return 0


if __name__ == "__main__":
    sys.exit(main())
