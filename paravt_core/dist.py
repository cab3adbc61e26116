"""DeepSpeed plumbing shared by the SFT and RL trainers.

One code path from 1 CPU rank to N GPUs (`launch_workers`). On one node the ranks are
started here, directly, with the environment the DeepSpeed launcher gives them (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, CROSS_RANK/CROSS_SIZE, MASTER_ADDR/PORT, ranks 0..N-1 on
GPUs 0..N-1, `--local_rank=R` first among the script's arguments): the launcher's own two
Python processes (`deepspeed.launcher.runner`, then `.launch`) import DeepSpeed and torch
only to start them, measured at about a sixth of a tiny flow test's CPU (issue #45). A
hostfile (multi-node) still goes through the DeepSpeed runner (pdsh/ssh to each host). On
CPU the gloo backend and fp32 are used; on GPUs nccl and bf16 when the config asks for it.

Rendezvous: torch's default `env://` rendezvous starts a TCPStore on rank 0 that listens
on every interface (`*:<master_port>`) although the launcher's master address is
127.0.0.1, an unauthenticated store open to the network for the whole run. Single-node
workers therefore meet through a `FileStore` in a private temporary folder
(`init_method=file://...`) and gloo / NCCL bind their sockets to the loopback interface
(`rendezvous_env`); multi-node runs (a hostfile) keep `env://` TCP at the master address
the DeepSpeed runner documents (the first host of the hostfile).
Checkpoints are DeepSpeed's own (model, optimizer, scheduler and our client state). Each
saved tag gets a manifest of its files' sizes and sha256 (`paravt_checkpoint.json`, as
exported models get theirs in `model/integrity.py`), and only then does `latest` name it,
so an interrupted save never becomes the resume point. The manifest also names the stage
and run folder that saved the tag. A tag damaged after the fact (a truncated, corrupted or
replaced file), or saved by another stage or run, is skipped on resume for the newest intact
older one of this run (`resume`), and replay refuses it (`rl/replay.py`). A missing or damaged
`latest` is never a fresh start while a finished tag is there (#61 item 4): only deleting the
checkpoints folder starts a stage over, and with it its step logs.
With `sft/rl.keep_last`, older tags are pruned once a newer one is complete and `latest`
names it (`prune_checkpoints`; issue #44: ~105 GB per ZeRO-3 checkpoint at 8B).
"""

from __future__ import annotations

import contextlib
import json
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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paravt_core.config import DeepSpeedConfig, PipelineConfig, VideoConfig

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
        from paravt_core.device_ledger import release

        for proc in procs:  # the device ledger (rehearsals): a rank stopped by a signal wrote no release itself
            release(proc.pid)
    return failed[0] if failed else next((code for code in codes if code != 0), 0)


def _start_rank(cmd: list[str], env: dict[str, str], out_fd: int, process_group: int | None, log_line: LogLine):
    """One rank: forked from the fork server where the environment names one and it takes
    the request (`paravt_core.forkserver`: torch, transformers and DeepSpeed imported once;
    a line says why where it does not), else a subprocess. Either way its stdout and stderr
    are `out_fd` and its stdin is empty."""
    if os.environ.get("PARAVT_RANK_FORKSERVER"):
        from paravt_core import forkserver

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


def maybe_kill_for_test(done_steps: int) -> None:
    """Fault injection for tests: SIGKILL this process after step PARAVT_TEST_KILL_AT_STEP.

    With PARAVT_TEST_KILL_ONCE_MARKER set, only the first time (the marker file is written
    before the kill), so a retried run resumes and finishes. A real kill: no cleanup runs.
    """
    import signal

    kill_at = int(os.environ.get("PARAVT_TEST_KILL_AT_STEP", "-1"))
    if done_steps != kill_at:
        return
    marker = os.environ.get("PARAVT_TEST_KILL_ONCE_MARKER")
    if marker:
        if Path(marker).exists():
            return
        Path(marker).write_text(str(done_steps))
    os.kill(os.getpid(), signal.SIGKILL)


class StepLog:
    """Plain progress lines (step, metrics, steps/s, ETA) when stdout is a pipe, not a terminal.

    The stage streams the workers' output into the Prefect log line by line, where a tqdm
    bar (carriage returns) would show nothing until the end.
    """

    def __init__(self, name: str, total: int, start: int, enabled: bool, every: int = 10):
        import time

        self.name, self.total, self.start, self.enabled, self.every = name, total, start, enabled, every
        self.t0 = time.perf_counter()

    def step(self, done: int, **metrics: float) -> None:
        import time

        if not self.enabled or (done % self.every and done != self.total):
            return
        rate = (done - self.start) / max(1e-9, time.perf_counter() - self.t0)
        eta = (self.total - done) / rate if rate > 0 else float("nan")
        values = " ".join(f"{k}={v:.4g}" for k, v in metrics.items())
        print(f"[{self.name}] step {done}/{self.total} {values} {rate:.2f} steps/s eta {eta:.0f}s", flush=True)


def run_stage_workers(out: Path, kind: str, make_job: Callable[[], Any], worker: Path, num_ranks: int,
                      hostfile: str | None, log_line: LogLine = print, threads_per_rank: int | None = None):
    """Run, or resume, a training stage's DeepSpeed workers in its run folder `out`.

    A run whose exported model is complete and whole returns at once; otherwise the job (a
    pydantic model) is written to `out/job.json` and the workers resume from the folder's
    latest checkpoint, if any (a damaged export is written again from the final checkpoint).
    Returns the exported model as an `ArtifactRef` of `kind`.
    """
    from paravt_core.atomic import atomic_write_text
    from paravt_core.model.integrity import model_dir_problem
    from paravt_core.refs import ArtifactRef, content_hash

    model_dir = out / "model"
    finished = (model_dir / "paravt_meta.json").is_file()
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


def init_distributed() -> tuple[int, int, str]:
    """(rank, world size, device) after initializing torch.distributed for this accelerator."""
    import deepspeed
    import torch
    import torch.distributed as dist

    on_gpu = torch.cuda.is_available()
    store_file = os.environ.get(RENDEZVOUS_FILE_ENV)
    if store_file:  # single node: no network listener (module docstring)
        deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo", init_method=f"file://{store_file}",
                                   rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    else:
        deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if on_gpu:
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        return rank, world, f"cuda:{local}"
    return rank, world, "cpu"


def shutdown_distributed() -> None:
    """Destroy the process group and DeepSpeed's module-level caches of its groups.

    DeepSpeed keeps the data-parallel and world groups it derived from the process group in
    `deepspeed.utils.groups` globals; a second run in the same process (the tests, a
    notebook) would otherwise hand the new engine groups of the destroyed process group
    ("Group ... is not registered").
    """
    import torch.distributed as dist

    if dist.is_initialized():
        rank = dist.get_rank()
        dist.destroy_process_group()
        # This rank's allreduce segment (SHM_BUFFER_PREFIX). launch_workers also removes the
        # segments of the ranks it started; a run inside a test or notebook has only this.
        release_shm_buffers(os.environ.get("MASTER_PORT", ""), addr=os.environ.get("MASTER_ADDR", ""), rank=rank)
    try:
        from deepspeed.utils import groups
    except ImportError:
        return
    for name in ("_WORLD_GROUP", "_DATA_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP", "_TENSOR_MODEL_PARALLEL_GROUP",
                 "_ZERO_PARAM_INTRA_PARALLEL_GROUP"):
        if hasattr(groups, name):
            setattr(groups, name, None)
    for name in ("_EXPERT_PARALLEL_GROUP", "_EXPERT_PARALLEL_GROUP_RANKS", "_EXPERT_DATA_PARALLEL_GROUP",
                 "_EXPERT_DATA_PARALLEL_GROUP_RANKS", "_ALL_TO_ALL_GROUP"):
        cached = getattr(groups, name, None)
        if isinstance(cached, dict):
            cached.clear()


def local_grad_norm(engine) -> float:
    """Pre-clipping L2 norm of the full gradients (ZeRO-0 keeps them whole on every rank;
    DeepSpeed records a global norm only for its ZeRO optimizers)."""
    import torch

    grads = [p.grad.detach().float() for p in engine.module.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) if grads else 0.0


def training_dtype(model_dtype: str, on_gpu: bool) -> str:
    """The dtype ranks hold and train the weights in: the config's on GPUs, fp32 on CPU ranks."""
    return model_dtype if on_gpu else "float32"


def deepspeed_config(*, micro_batch: int, grad_accum: int, zero_stage: int, grad_clip: float,
                     bf16: bool, zero: DeepSpeedConfig | None = None) -> dict[str, Any]:
    """The DeepSpeed JSON of one training stage; `zero` holds the offload and bucket settings."""
    from paravt_core.config import DeepSpeedConfig

    zero = zero or DeepSpeedConfig()
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": grad_clip,
        "zero_optimization": _zero_section(zero_stage, zero),
        "bf16": {"enabled": bf16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if zero.offload_optimizer != "none":
        # DeepSpeed refuses a client optimizer with offload unless this is off; with its own
        # CPU Adam (`zero_optimizer`) the check passes as is (see DeepSpeedConfig).
        config["zero_force_ds_cpu_optimizer"] = zero.cpu_optimizer == "deepspeed_cpu_adam"
    return config


def _zero_section(stage: int, zero: DeepSpeedConfig) -> dict[str, Any]:
    section: dict[str, Any] = {"stage": stage}
    if stage == 0:
        return section
    section["reduce_bucket_size"] = zero.reduce_bucket_size
    if stage == 3:
        section["stage3_prefetch_bucket_size"] = zero.stage3_prefetch_bucket_size
        section["stage3_param_persistence_threshold"] = zero.stage3_param_persistence_threshold
    else:
        section["allgather_bucket_size"] = zero.allgather_bucket_size
    if zero.overlap_comm is not None:
        section["overlap_comm"] = zero.overlap_comm
    for key, device in (("offload_optimizer", zero.offload_optimizer), ("offload_param", zero.offload_param)):
        if device != "none":
            section[key] = {"device": device, "pin_memory": zero.pin_memory}
            if device == "nvme":
                section[key]["nvme_path"] = str(zero.nvme_path)
    return section


def zero_optimizer(params, *, lr: float, weight_decay: float, zero: DeepSpeedConfig):
    """AdamW for DeepSpeed: its CPU Adam when the optimizer is offloaded and asked for, else PyTorch's."""
    import torch

    if zero.offload_optimizer != "none" and zero.cpu_optimizer == "deepspeed_cpu_adam":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, lr=lr, weight_decay=weight_decay, adamw_mode=True)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def sft_deepspeed_config(cfg: PipelineConfig, on_gpu: bool) -> dict[str, Any]:
    sft = cfg.sft
    return deepspeed_config(micro_batch=sft.micro_batch_size, grad_accum=sft.grad_accum_steps,
                            zero_stage=sft.zero_stage, grad_clip=sft.grad_clip,
                            bf16=training_dtype(cfg.model.dtype, on_gpu) == "bfloat16", zero=sft.deepspeed)


def rl_deepspeed_config(cfg: PipelineConfig, on_gpu: bool) -> dict[str, Any]:
    """One optimizer step per RL step; its micro-batches are accumulated by hand (rl/worker.py)."""
    rl = cfg.rl
    return deepspeed_config(micro_batch=1, grad_accum=1, zero_stage=rl.zero_stage, grad_clip=rl.grad_clip,
                            bf16=training_dtype(cfg.model.dtype, on_gpu) == "bfloat16", zero=rl.deepspeed)


class CheckpointError(RuntimeError):
    """No intact checkpoint to resume from; the message names the folder and the fix."""


CHECKPOINT_MANIFEST = "paravt_checkpoint.json"


def _tag_files(tag_dir: Path) -> dict[str, Path]:
    """Every file of a saved tag but its manifest (DeepSpeed's .pt files, NVMe-offloaded
    tensors), by path relative to the tag, sorted."""
    files = sorted(p for p in tag_dir.rglob("*") if p.is_file() and p.name != CHECKPOINT_MANIFEST)
    return {f.relative_to(tag_dir).as_posix(): f for f in files}


def checkpoint_owner(checkpoint_dir: Path, stage: str) -> dict[str, str]:
    """Who saves into `checkpoint_dir`: the stage and its run folder's name (the folder that
    holds `checkpoints/`), as recorded in each tag's manifest."""
    return {"stage": stage, "run": Path(checkpoint_dir).resolve().parent.name}


def write_checkpoint_manifest(tag_dir: Path, owner: dict[str, str] | None = None) -> None:
    """Record every file of a finished tag (size, sha256) in its `paravt_checkpoint.json`,
    with `owner` (`checkpoint_owner`) when given.

    Collective: every rank hashes its share of the files (the tag folder is shared, as the
    ZeRO-3 consolidation on rank 0 already needs) and rank 0 writes the manifest."""
    from paravt_core.atomic import atomic_write_text
    from paravt_core.refs import file_hash

    rank, world = _rank(), _world()
    names = list(_tag_files(tag_dir).items())
    entries = {name: {"bytes": f.stat().st_size, "sha256": file_hash(f)} for name, f in names[rank::world]}
    if world > 1:
        import torch.distributed as dist

        shares: list[Any] = [None] * world
        dist.all_gather_object(shares, entries)
        entries = {name: entry for share in shares for name, entry in share.items()}
    if rank == 0:
        record = {**(owner or {}), "files": dict(sorted(entries.items()))}
        atomic_write_text(tag_dir / CHECKPOINT_MANIFEST, json.dumps(record, indent=1) + "\n")


def _manifest_damage(tag_dir: Path, checksums: bool, share: tuple[int, int]) -> str | None:
    """Why the tag's files are not the ones its manifest recorded at save, or None (also for a
    tag saved before manifests were written: the CRC checks alone apply to it)."""
    from paravt_core.refs import file_hash

    path = tag_dir / CHECKPOINT_MANIFEST
    if not path.is_file():
        return None
    try:
        files_recorded = json.loads(path.read_text())["files"]
        recorded = {name: (int(e["bytes"]), str(e["sha256"])) for name, e in files_recorded.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return f"{path} is not a readable checkpoint manifest ({error!r})"
    files = _tag_files(tag_dir)
    if set(files) != set(recorded):
        missing, extra = sorted(set(recorded) - set(files)), sorted(set(files) - set(recorded))
        return (f"{tag_dir} does not hold the files saved there ({CHECKPOINT_MANIFEST}): "
                f"missing {missing or 'none'}, not saved there {extra or 'none'}")
    rank, world = share
    for i, (name, f) in enumerate(files.items()):
        size, sha256 = recorded[name]
        if f.stat().st_size != size or (checksums and i % world == rank and file_hash(f) != sha256):
            return f"{f} changed since it was saved (its size or sha256 differs from {CHECKPOINT_MANIFEST})"
    return None


def checkpoint_damage(tag_dir: Path, checksums: bool = True, share: tuple[int, int] = (0, 1)) -> str | None:
    """Why a DeepSpeed checkpoint folder cannot be loaded, or None when it looks intact.

    Every `.pt` file is a torch zip archive whose members carry CRC-32s: they are checked
    without unpickling anything, so a truncated or bit-flipped file ("PytorchStreamReader
    failed ... corrupted") is found before the engine touches it. A folder without model
    states was never finished. Where the tag has a manifest (`write_checkpoint_manifest`),
    its files must be the ones saved: same names, sizes and (with `checksums`) sha256, which
    also catches a whole file replaced by another valid one. `share=(rank, world)`: hash only
    this rank's share of the files (`resume` combines the ranks' verdicts).
    """
    import zipfile

    if not tag_dir.is_dir():
        return f"{tag_dir} does not exist"
    files = sorted(tag_dir.glob("*.pt"))
    if not any(f.name.endswith("model_states.pt") for f in files):
        return f"{tag_dir} holds no *model_states.pt file"
    for file in files:
        try:
            with zipfile.ZipFile(file) as archive:
                bad = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as error:
            return f"{file} is not a complete torch file ({error})"
        if bad is not None:
            return f"{file} is corrupted (member {bad} fails its CRC check)"
    return _manifest_damage(tag_dir, checksums, share)


def _owner_problem(tag_dir: Path, owner: dict[str, str] | None) -> str | None:
    """Why the tag was not saved by `owner` (its manifest names another stage or run), or None
    (also for a tag whose manifest predates owners, or that has none: the checks stay as they were)."""
    try:
        saved = json.loads((tag_dir / CHECKPOINT_MANIFEST).read_text())
    except (OSError, ValueError):
        return None  # no manifest, or a damaged one: `checkpoint_damage` says so
    if owner is None or not isinstance(saved, dict) or "stage" not in saved:
        return None
    if {key: saved.get(key) for key in owner} == owner:
        return None
    return (f"{tag_dir} was saved by stage {saved.get('stage')!r} of run folder {saved.get('run')!r} "
            f"({CHECKPOINT_MANIFEST}), not by this {owner['stage']} run ({owner['run']!r}); it cannot resume it")


def _latest_tag(checkpoint_dir: Path) -> str | None:
    """The tag `latest` names, or None when the file is missing, empty, unreadable or names
    no step folder (a run killed while DeepSpeed rewrote it)."""
    try:
        latest = (checkpoint_dir / "latest").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return latest if latest.startswith("step") and (checkpoint_dir / latest).is_dir() else None


def resume_candidates(checkpoint_dir: Path) -> list[str]:
    """The tags to try, newest first: the one `latest` names, then older `step*` tags
    (never a newer one: DeepSpeed writes `latest` only after a tag is complete). When
    `latest` is damaged, every `step*` tag, newest first (each is checked before use)."""
    steps = sorted((p.name for p in checkpoint_dir.glob("step*") if p.is_dir()), reverse=True)
    latest = _latest_tag(checkpoint_dir)
    if latest is None:
        return steps
    return [latest, *(tag for tag in steps if tag < latest)]


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _intact_on_every_rank(intact: bool) -> bool:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return intact
    verdicts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(verdicts, intact)
    return all(verdicts)


def resume(engine, checkpoint_dir: Path, warn: LogLine = print, stage: str | None = None) -> dict[str, Any]:
    """Load the newest intact checkpoint of this run if there is one; returns its client state
    ({} when no save ever finished: a fresh start).

    A damaged tag (see `checkpoint_damage`), or with `stage` one whose manifest names another
    stage or run folder (`checkpoint_owner`), is skipped with a warning naming it, and the next
    older one is tried; every rank must find a tag intact for it to be used, so all ranks
    resume from the same step. Without `latest` (deleted, or a save killed before naming its
    tag), only tags with a manifest are candidates: a finished save writes it before `latest`.

    Raises:
        CheckpointError: finished checkpoints exist but none is intact and of this run.
    """
    owner = checkpoint_owner(checkpoint_dir, stage) if stage else None
    damaged = []
    if not (checkpoint_dir / "latest").is_file():
        finished = [tag for tag in resume_candidates(checkpoint_dir)
                    if (checkpoint_dir / tag / CHECKPOINT_MANIFEST).is_file()]
        if not finished:
            return {}  # no save ever finished (the manifest, then `latest`, are written last)
        damaged.append(f"{checkpoint_dir / 'latest'} (missing)")
        candidates = finished
    else:
        if _latest_tag(checkpoint_dir) is None:
            damaged.append(f"{checkpoint_dir / 'latest'} (empty, unreadable or naming no step folder)")
        candidates = resume_candidates(checkpoint_dir)
    for tag in candidates:
        problem = (_owner_problem(checkpoint_dir / tag, owner)
                   or checkpoint_damage(checkpoint_dir / tag, share=(_rank(), _world())))
        if _intact_on_every_rank(problem is None):
            if damaged:
                warn(f"warning: resuming from {checkpoint_dir / tag}, the newest intact checkpoint; skipped the "
                     f"damaged {'; '.join(damaged)}")
            _, client_state = engine.load_checkpoint(str(checkpoint_dir), tag=tag)
            if damaged and _rank() == 0:
                # `latest` names what later reads (ZeRO-3 consolidation, replay) use: the tag resumed from
                from paravt_core.atomic import atomic_write_text

                atomic_write_text(checkpoint_dir / "latest", tag)
            return client_state or {}
        damaged.append(problem or f"{checkpoint_dir / tag} (damaged on another rank)")
    raise CheckpointError(
        f"no intact checkpoint in {checkpoint_dir} to resume from: {'; '.join(damaged)}. Delete "
        f"{checkpoint_dir} to start this stage over (its finished steps and their logs are lost), or restore an "
        f"intact step folder from a backup"
    )


def trim_step_log(path: Path, resumed_step: int) -> None:
    """Keep only the rows of a per-step JSON-lines log (`{"step": N, ...}`) up to the step a
    run resumes from, so the steps it runs again are not logged twice; a torn last line (a
    kill mid-write) goes too. Rank 0 calls it, before its first new row."""
    from paravt_core.atomic import atomic_write_text

    if not path.is_file():
        return
    kept = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= resumed_step:
            kept.append(line)
    atomic_write_text(path, "".join(f"{line}\n" for line in kept))


def save(engine, checkpoint_dir: Path, step: int, client_state: dict[str, Any], keep_last: int | None = None,
         warn: LogLine = print, stage: str | None = None) -> None:
    """Save tag `step<N>`, its manifest (naming `stage` and the run folder when given), then point
    `latest` at it (collective: every rank calls it); with `keep_last`, rank 0 then prunes the
    older tags (`prune_checkpoints`)."""
    import torch.distributed as dist

    from paravt_core.atomic import atomic_write_text

    tag = f"step{step:07d}"
    # `latest` is ours to write: a tag becomes the resume point only once its manifest exists
    engine.save_checkpoint(str(checkpoint_dir), tag=tag, client_state=client_state, save_latest=False)
    write_checkpoint_manifest(Path(checkpoint_dir) / tag, checkpoint_owner(checkpoint_dir, stage) if stage else None)
    if _rank() == 0:
        atomic_write_text(Path(checkpoint_dir) / "latest", tag)
    if _world() > 1:
        dist.barrier()  # every rank's files and the manifest are written before anything is pruned
    if keep_last is not None and _rank() == 0:
        prune_checkpoints(Path(checkpoint_dir), keep_last, saved=tag, warn=warn)


PRUNING_PREFIX = ".pruning-"


def prune_checkpoints(checkpoint_dir: Path, keep_last: int, saved: str, warn: LogLine = print) -> list[str]:
    """Delete all but the newest `keep_last` step folders up to the one `latest` names.

    Nothing is deleted unless `latest` names `saved`, the tag just written (so the newest
    complete checkpoint is never among the doomed), and tags newer than `latest` (an
    interrupted save's leftovers, which the run overwrites when it gets there) are left alone.
    Crash safety: each doomed folder is first renamed to `.pruning-<tag>` in one atomic rename,
    so it stops being a resume candidate whole, and only then deleted; a kill mid-delete
    leaves a partial `.pruning-*` folder that `resume` never looks at, never a partial `step*`
    one, and the next prune deletes it. Returns the tags pruned, oldest first.
    """
    import shutil

    latest = _latest_tag(checkpoint_dir)
    if latest != saved:
        warn(f"warning: not pruning {checkpoint_dir}: `latest` names {latest or 'no step folder'}, not the tag "
             f"just saved ({saved}); every checkpoint is kept")
        return []
    finished = sorted(p.name for p in checkpoint_dir.glob("step*") if p.is_dir() and p.name <= latest)
    doomed = finished[:-keep_last]
    for tag in doomed:
        (checkpoint_dir / tag).rename(checkpoint_dir / f"{PRUNING_PREFIX}{tag}")
    for leftover in sorted(checkpoint_dir.glob(f"{PRUNING_PREFIX}*")):
        try:
            shutil.rmtree(leftover)
        except OSError as error:  # disk kept, training goes on; the next prune tries again
            warn(f"warning: could not delete the pruned checkpoint {leftover} ({error}); delete it by hand")
    return doomed


def full_state_dict(engine, checkpoint_dir: Path, zero_stage: int) -> dict[str, Any] | None:
    """The whole model's weights on rank 0 (None elsewhere), consolidated from ZeRO-3 shards."""
    import torch.distributed as dist

    if zero_stage == 3:
        dist.barrier()
        if dist.get_rank() != 0:
            return None
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return get_fp32_state_dict_from_zero_checkpoint(str(checkpoint_dir))
    if dist.get_rank() != 0:
        return None
    return {k: v.detach().cpu() for k, v in engine.module.state_dict().items()}


def checkpoint_state_dict(checkpoint_dir: Path, tag: str, zero_stage: int) -> dict[str, Any]:
    """The fp32 model weights of one saved tag, read offline (no engine, no process group)."""
    import torch

    if zero_stage == 0:
        states = torch.load(Path(checkpoint_dir) / tag / "mp_rank_00_model_states.pt", map_location="cpu",
                            weights_only=False)
        return {k: v.float() if v.is_floating_point() else v for k, v in states["module"].items()}
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(checkpoint_dir), tag=tag)


def gathered_state_dict(engine, zero_stage: int) -> dict[str, Any]:
    """The full weights on every rank (ZeRO-3 shards gathered), for the `hf` rollout engine's
    copy on each rank; a rollout server gets `rl.weight_push.GatheredWeights` instead."""
    import torch

    module = engine.module
    if zero_stage != 3:
        return {k: v.detach() for k, v in module.state_dict().items()}
    import deepspeed

    state = {}
    with torch.no_grad():
        for name, param in module.named_parameters():
            with deepspeed.zero.GatheredParameters([param]):
                state[name] = param.detach().clone().cpu()
        for name, buf in module.named_buffers():
            state[name] = buf.detach().clone().cpu()
    return state


def export_hf_model(state_dict: dict[str, Any], base_model_dir: Path, out_dir: Path, dtype: str,
                    metadata: dict[str, Any], video: VideoConfig) -> Path:
    """Write a Hugging Face model directory (weights, processor, provenance) atomically.

    The processor is the base's with `video`'s pixel bounds, the ones the trainer rendered
    frames with (`model.loading.pixel_bounded`): a server renders with the folder's own.
    """
    from paravt_core.atomic import atomic_dir
    from paravt_core.model.integrity import write_manifest
    from paravt_core.model.loading import load_export_model, load_processor, pixel_bounded

    # Built in the export dtype: load_state_dict casts the fp32 weights in, so rank 0 never holds
    # a second full fp32 copy beside the consolidated state.
    model = load_export_model(base_model_dir, dtype)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"exported weights do not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        pixel_bounded(load_processor(base_model_dir), video).save_pretrained(tmp)
        write_manifest(tmp)  # sizes and sha256 of the weights, checked at registration and load
        (tmp / "paravt_meta.json").write_text(json.dumps(metadata, indent=2, default=str))
    return out_dir
