"""Starting a training stage's ranks: one code path from 1 CPU rank to N GPUs (`launch_workers`).

On one node the ranks are started here, directly, with the environment the DeepSpeed launcher
gives them (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, CROSS_RANK/CROSS_SIZE, MASTER_ADDR/PORT,
ranks 0..N-1 on GPUs 0..N-1, `--local_rank=R` first among the script's arguments): the
launcher's own two Python processes (`deepspeed.launcher.runner`, then `.launch`) import
DeepSpeed and torch only to start them, measured at about a sixth of a tiny flow test's CPU
(issue #45). A hostfile (multi-node) still goes through the DeepSpeed runner (pdsh/ssh to each
host). On CPU the gloo backend and fp32 are used; on GPUs nccl and bf16 when the config asks
for it.

Rendezvous: torch's default `env://` rendezvous starts a TCPStore on rank 0 that listens
on every interface (`*:<master_port>`) although the launcher's master address is
127.0.0.1, an unauthenticated store open to the network for the whole run. Single-node
workers therefore meet through a `FileStore` in a private temporary folder
(`init_method=file://...`) and gloo / NCCL bind their sockets to the loopback interface
(`rendezvous_env`); multi-node runs (a hostfile) keep `env://` TCP at the master address
the DeepSpeed runner documents (the first host of the hostfile). The ranks join it in
`dist.rank.init_distributed`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from paravt_core import forkserver
from paravt_core.atomic import atomic_write_text
from paravt_core.device_ledger import release
from paravt_core.dist.weights import MODEL_META
from paravt_core.model.integrity import model_dir_problem
from paravt_core.refs import ArtifactRef, content_hash

LogLine = Callable[[str], None]
RENDEZVOUS_FILE_ENV = "PARAVT_RENDEZVOUS_FILE"
# DeepSpeed's CPU backend gives every rank a 66 MiB shared-memory segment for its allreduce,
# named `<prefix>_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>` (ops/csrc/cpu/comm/shm.cpp), and
# never unlinks it: on a tmpfs /dev/shm each training run leaves that much RAM taken until
# reboot (measured: 273 segments, 18 GB, after a day of tests and runs on a 24 GiB machine).
SHM_BUFFER_PREFIX = "deepspeed_allreduce_buffer"
SHM_DIR = Path("/dev/shm")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Master ports of the launches running in this process. Rows fanned out over threads
# (run.fanout) launch at once, and a port names a launch's shared-memory segments
# (SHM_BUFFER_PREFIX) and which ones its cleanup unlinks: two launches on one port would
# share, then delete, each other's segments.
_launch_ports: set[int] = set()
_launch_ports_guard = threading.Lock()


def _claim_launch_port() -> int:
    with _launch_ports_guard:
        while (port := free_port()) in _launch_ports:
            pass
        _launch_ports.add(port)
        return port


def launch_workers(script: Path, args: Sequence[str], num_ranks: int, hostfile: str | None = None,
                   log_line: LogLine = print, env: dict[str, str] | None = None,
                   timeout_s: float | None = None, threads_per_rank: int | None = None) -> None:
    """Run `script` on `num_ranks` ranks (or the hostfile's) and stream their output line by line.

    One node: the ranks are this process's children (module docstring); when one exits
    with an error the others are stopped, as the DeepSpeed launcher does. A hostfile: the
    DeepSpeed runner.

    Args:
        timeout_s: kill every rank (their own process group) after this long, e.g. ranks
            blocked in a collective that the others never join; None waits.
        threads_per_rank: each rank's OMP_NUM_THREADS (torch's CPU threads), over what the
            environment says; None: OMP_NUM_THREADS where set, else this host's cores shared
            by the ranks.
    Raises:
        RuntimeError: naming the exit code and the last lines of output.
        TimeoutError: `timeout_s` passed; the message holds the last lines of output.
    """
    port = _claim_launch_port()
    try:
        _launch(script, args, num_ranks, hostfile, log_line, env, timeout_s, threads_per_rank, port)
    finally:
        with _launch_ports_guard:
            _launch_ports.discard(port)


def _launch(script: Path, args: Sequence[str], num_ranks: int, hostfile: str | None, log_line: LogLine,
            env: dict[str, str] | None, timeout_s: float | None, threads_per_rank: int | None, port: int) -> None:
    # Ranks on one CPU host share its cores: give each its share, not all of them each.
    threads = str(max(1, (os.cpu_count() or 1) // max(1, num_ranks)))
    rendezvous_dir = None if hostfile else Path(tempfile.mkdtemp(prefix="paravt-rendezvous-"))
    budget = {"OMP_NUM_THREADS": str(threads_per_rank)} if threads_per_rank else {}
    child_env = {"OMP_NUM_THREADS": threads, **rendezvous_env(rendezvous_dir), **os.environ, "PYTHONUNBUFFERED": "1",
                 "TOKENIZERS_PARALLELISM": "false", **budget, **(env or {})}
    if rendezvous_dir is not None:
        child_env[RENDEZVOUS_FILE_ENV] = str(rendezvous_dir / "store")
    else:
        child_env.pop(RENDEZVOUS_FILE_ENV, None)
    if hostfile:
        cmd = [sys.executable, "-u", "-m", "deepspeed.launcher.runner", "--master_port", str(port),
               "--hostfile", hostfile, str(script), *args]
        commands = [(cmd, child_env)]
    else:
        commands = local_rank_commands(script, args, num_ranks, port, child_env)
    tail: list[str] = []
    expired = threading.Event()
    try:
        code = _run_ranks(commands, timeout_s, expired, log_line, tail)
    finally:
        if rendezvous_dir is not None:
            shutil.rmtree(rendezvous_dir, ignore_errors=True)
        # Whatever the workers did (a crash or a SIGKILL skips their own cleanup): this
        # host's segments of this launch, found by its port.
        release_shm_buffers(port)
    if expired.is_set():
        raise TimeoutError(f"{script.name} ran past {timeout_s:.0f} s and was killed with its workers; last "
                           f"output:\n" + "\n".join(tail))
    if code != 0:
        how = f" (killed by {signal.Signals(-code).name})" if code < 0 and -code in signal.valid_signals() else ""
        raise RuntimeError(f"{script.name} exited with code {code}{how}; last output:\n" + "\n".join(tail))


def local_rank_commands(script: Path, args: Sequence[str], num_ranks: int, port: int,
                        env: dict[str, str]) -> list[tuple[list[str], dict[str, str]]]:
    """(command, environment) of each rank of a one-node run, as `deepspeed.launcher.launch`
    builds them (its `main`): the same variables, `--local_rank=R` before the script's own
    arguments, and the working folder on PYTHONPATH as the runner puts it."""
    cwd = os.path.abspath(".")
    base = {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(num_ranks),
            "LOCAL_SIZE": str(num_ranks), "CROSS_RANK": "0", "CROSS_SIZE": "1",
            "CUDA_VISIBLE_DEVICES": ",".join(str(rank) for rank in range(num_ranks)),
            "PYTHONPATH": f"{cwd}:{env['PYTHONPATH']}" if env.get("PYTHONPATH") else cwd}
    return [([sys.executable, "-u", str(script), f"--local_rank={rank}", *args],
             {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}) for rank in range(num_ranks)]


def _run_ranks(commands: list[tuple[list[str], dict[str, str]]], timeout_s: float | None, expired: threading.Event,
               log_line: LogLine, tail: list[str]) -> int:
    """Start every command with its output on one pipe, stream it, and return the exit code:
    the first failing rank's (the others are then stopped), else 0.

    With `timeout_s` the ranks get a process group of their own, killed whole on expiry or
    when this function is left early; without, they stay in the caller's group, so a
    terminal's Ctrl-C reaches them as it reaches the caller.
    """
    read_fd, write_fd = os.pipe()
    procs: list[subprocess.Popen] = []
    own_group = timeout_s is not None
    failed: list[int] = []
    done = threading.Event()

    def kill_group(sig: int) -> None:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    if own_group:
                        os.killpg(procs[0].pid, sig)
                    else:
                        proc.send_signal(sig)

    def watch() -> None:
        # A rank that fails leaves the others blocked in their next collective: stop them,
        # politely first (their own cleanup releases shared memory and files), then for good.
        while not done.wait(0.2):
            codes = [proc.poll() for proc in procs]
            bad = next((code for code in codes if code not in (None, 0)), None)
            if bad is not None:
                failed.append(bad)
                kill_group(signal.SIGTERM)
                if not done.wait(10.0):
                    kill_group(signal.SIGKILL)
                return
            if all(code is not None for code in codes):
                return

    def kill_all() -> None:
        if any(proc.poll() is None for proc in procs):  # a launch that just finished is not a timeout
            expired.set()
            kill_group(signal.SIGKILL)

    watchdog = threading.Timer(timeout_s, kill_all) if timeout_s is not None else None
    reader = open(read_fd, encoding="utf-8", errors="replace")
    try:
        try:
            for cmd, env in commands:
                group = {}
                if own_group:
                    group = {"process_group": procs[0].pid if procs else 0}  # rank 0 leads it
                procs.append(_start_rank(cmd, env, write_fd, group.get("process_group"), log_line))
        finally:
            os.close(write_fd)  # the ranks hold the pipe now: it ends when the last of them exits
        if watchdog is not None:
            watchdog.start()
        threading.Thread(target=watch, daemon=True).start()
        for line in reader:
            line = line.rstrip("\n")
            log_line(line)
            tail[:] = (tail + [line])[-30:]
        codes = [proc.wait() for proc in procs]
    finally:
        done.set()
        reader.close()
        if watchdog is not None:
            watchdog.cancel()
        if any(proc.poll() is None for proc in procs):  # left early (an error, Ctrl-C): take the ranks down too
            kill_group(signal.SIGKILL)
            for proc in procs:
                proc.wait()

        for proc in procs:  # the device ledger (rehearsals): a rank stopped by a signal wrote no release itself
            release(proc.pid)
    return failed[0] if failed else next((code for code in codes if code != 0), 0)


def _start_rank(cmd: list[str], env: dict[str, str], out_fd: int, process_group: int | None, log_line: LogLine):
    """One rank: forked from the fork server where the environment names one and it takes
    the request (`paravt_core.forkserver`: torch, transformers and DeepSpeed imported once;
    a line says why where it does not), else a subprocess. Either way its stdout and stderr
    are `out_fd` and its stdin is empty."""
    if os.environ.get("PARAVT_RANK_FORKSERVER"):
        def fallback(reason: str) -> None:
            log_line(f"rank started as a subprocess, not forked: {reason}")

        with open(os.devnull, "rb") as devnull:
            forked = forkserver.spawn(cmd, env, stdin=devnull.fileno(), stdout=out_fd, stderr=out_fd,
                                      process_group=process_group, on_fallback=fallback)
        if forked is not None:
            return forked
    group = {} if process_group is None else {"process_group": process_group}
    return subprocess.Popen(cmd, stdout=out_fd, stderr=out_fd, stdin=subprocess.DEVNULL, env=env, **group)


def release_shm_buffers(port: int | str, *, addr: str = "*", rank: int | str = "*",
                        shm_dir: Path = SHM_DIR) -> list[Path]:
    """Unlink DeepSpeed's CPU allreduce segments of one rendezvous (SHM_BUFFER_PREFIX) on this
    host: every rank's by default, or one `addr`/`rank`'s. Unlinking never disturbs a process
    that still maps a segment; it only frees the memory once the last mapping goes.
    Returns the paths removed."""
    import glob

    pattern = f"{SHM_BUFFER_PREFIX}_{os.getuid()}_{glob.escape(str(addr)) if addr != '*' else '*'}_{port}_{rank}"
    removed = []
    for path in sorted(Path(shm_dir).glob(pattern)):
        try:
            path.unlink()
        except FileNotFoundError:  # another rank's cleanup got there first
            continue
        removed.append(path)
    return removed


def rendezvous_env(single_node_dir: Path | None) -> dict[str, str]:
    """Worker environment for the rendezvous (module docstring): for a single-node run
    (a private folder given), the FileStore path and loopback-only gloo / NCCL sockets
    (an interface already chosen in the caller's environment wins); {} for multi-node."""
    if single_node_dir is None:
        return {}
    return {RENDEZVOUS_FILE_ENV: str(Path(single_node_dir) / "store"), "GLOO_SOCKET_IFNAME": "lo",
            "NCCL_SOCKET_IFNAME": "lo"}


def run_stage_workers(out: Path, kind: str, make_job: Callable[[], Any], worker: Path, num_ranks: int,
                      hostfile: str | None, log_line: LogLine = print, threads_per_rank: int | None = None):
    """Run, or resume, a training stage's DeepSpeed workers in its run folder `out`.

    A run whose exported model is complete and whole returns at once; otherwise the job (a
    pydantic model) is written to `out/job.json` and the workers resume from the folder's
    latest checkpoint, if any (a damaged export is written again from the final checkpoint).
    Returns the exported model as an `ArtifactRef` of `kind`.
    """
    model_dir = out / "model"
    finished = (model_dir / MODEL_META).is_file()
    problem = model_dir_problem(model_dir) if finished else None
    if problem:
        # The exported folder lost or changed a weight file since: the run's last checkpoint
        # (the finished step) is resumed, no step runs, and the model is exported again.
        log_line(f"warning: {problem}; exporting it again from {out / 'checkpoints'}")
    if not finished or problem:
        out.mkdir(parents=True, exist_ok=True)
        job_file = atomic_write_text(out / "job.json", make_job().model_dump_json(indent=2))
        launch_workers(worker, ["--job", str(job_file)], num_ranks, hostfile, log_line,
                       threads_per_rank=threads_per_rank)
    return ArtifactRef(kind=kind, path=model_dir.resolve(), sha256=content_hash(model_dir))
