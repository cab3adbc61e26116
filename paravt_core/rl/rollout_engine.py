"""The RL stage's rollout engine, built from `rl.rollout.engine` on each rank (issue 14), by the
engine's record (`rollout_engines.py`, registered in `config.py`): its `backend` and `check`.

- `hf`: each rank generates with its own copy of the policy (`HFEngine`); every rank
  copies its new weights in after each optimizer step. With `rl.overlap: 1` that copy is in a
  process of the rank's own (`agent/hf_process.HFProcessEngine`), so it generates while the
  rank trains; the weights it gets, and when, are `rl/overlap.py`'s schedule. The rank's threads
  are then split between the two (`rl.overlap_trainer_threads`, `rl.overlap_engine_threads`).
- `sglang`: every rank sends its rollouts to ONE SGLang server, either a running one
  (`rl.rollout.sglang.url`) or one rank 0 launches (and stops at the end). The policy is
  the same on all ranks after a step, so rank 0 alone pushes it to the server (under ZeRO-3
  every rank joins each parameter's gather but only rank 0 keeps it, streamed into the
  snapshot: issue #44 item 8, `rl.weight_push.GatheredWeights`); the ranks'
  next rollouts start only after the step's metrics are gathered over all ranks, which
  rank 0 reaches after its push. With the co-located placement the server's memory is
  released once every rank's rollout is done and taken back just before the push. Each
  reply's weight labels are held to the schedule's, as on vLLM (below); `rl.overlap: 1`
  runs on the split placement only.

- `vllm`: as `sglang`, on ONE vLLM server (`rl.rollout.vllm.url`, or one rank 0 launches
  from the serve venv, on `rl.rollout.vllm.gpus` with the split placement); token ids in and
  out on `/inference/v1/generate`, new weights loaded from a snapshot after each step
  (`paravt_core/agent/vllm_engine.py`); nothing is released between phases. Runs on
  vLLM's CPU build too (the server tier trains on it). Each reply names the weights that
  sampled it (each push tags W(k) as `w<k>`): every batch's labels are held to the version
  the schedule names (`rl/served_policy.check_served_versions`) and logged in its draws. With
  `rl.overlap: 1` the server generates the next batch while the ranks train
  (`rl/overlap.py`), and the served-policy probe follows every push.

A server rank 0 launched is on its machine: its snapshots go to /dev/shm when they fit there
(`agent/weight_snapshots.SnapshotStager`); a server behind a url gets them in the run folder.

On a server (sglang, vllm), before the first request, `agent.served_model.check_served_model`
holds what it says it serves (`/v1/models`) to the RL stage's starting checkpoint, and the
trainer then pushes the policy's weights and probes the served log-probs before step 1 on
every run (`rl/served_policy.py`, issue #48): a server's name says what it was started on,
not what a previous run loaded into it since.

A config that asks for a server never falls back to `hf`: `check_rollout_engine` (called
before any worker starts) raises a `ConfigError` naming the missing piece when there is no
url to connect to and nothing to launch one with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paravt_core.agent.engine import RolloutEngine
from paravt_core.agent.hf_build import build_hf_engine
from paravt_core.agent.hf_process import HFProcessEngine
from paravt_core.agent.served_model import ServedModelMismatch, check_served_model, served_folder, served_model_name
from paravt_core.agent.server_launch import ServeError, pick_server, probe_python, server_python_path
from paravt_core.agent.sglang_engine import SGLangEngine, launch_sglang_server, sglang_installed
from paravt_core.agent.vllm_engine import VLLMEngine, launch_vllm_rollout_server
from paravt_core.agent.weight_snapshots import WeightStream, shm_staging_dir
from paravt_core.config import ConfigError, PipelineConfig
from paravt_core.device_ledger import LedgerError, declare_server, physical_gpu, release
from paravt_core.dist.launch import free_port
from paravt_core.model.loading import build_model
from paravt_core.plan import SERVER_FRACTION, VLLM_FRACTION
from paravt_core.rl.overlap import thread_share
from paravt_core.rollout_engines import rollout_engine_spec

SGLANG_MISSING = "SGLang is not installed; install the GPU profile or set rl.rollout.engine=hf"


def check_rollout_engine(cfg: PipelineConfig) -> None:
    """Raise `ConfigError` when `rl.rollout.engine` cannot run as configured here (its record's `check`)."""
    rollout_engine_spec(cfg.rl.rollout.engine).call("check", cfg)


def check_sglang(cfg: PipelineConfig) -> None:
    """`sglang` with no url to connect to needs SGLang here (rank 0 launches the server)."""
    rollout = cfg.rl.rollout
    if rollout.sglang.url is None and not sglang_installed():
        raise ConfigError(f"rl.rollout.engine is sglang with no rl.rollout.sglang.url to connect to, and "
                          f"{SGLANG_MISSING} (or set rl.rollout.sglang.url to a running server)")


def check_vllm(cfg: PipelineConfig) -> None:
    """`vllm` with no url to connect to needs a serve interpreter with vLLM (rank 0 launches the server)."""
    rollout = cfg.rl.rollout
    if rollout.vllm.url is None:
        try:
            pick_server("vllm", probe_python(server_python_path(rollout.vllm.python)))
        except ServeError as exc:
            raise ConfigError(f"rl.rollout.engine is vllm with no rl.rollout.vllm.url to connect to, and no vLLM "
                              f"to launch one: {exc} (or set rl.rollout.vllm.url to a running server, or "
                              "rl.rollout.engine=hf)") from exc


@dataclass
class RolloutBackend:
    """The engine a rank rolls out on, and what the trainer does around its weight updates."""

    engine: RolloutEngine
    pushes_weights: bool  # False on the ranks that share rank 0's server
    served: bool = False  # a server's weights: pushed and probed before step 1 (issue #48)
    url: str | None = None  # the server's, for messages
    releases_memory: bool = False  # co-located server: free its memory while training
    world: int = 1
    server: Any = None  # a `ServerProcess` (SGLang) this rank launched; stopped by `close`
    owns_engine: bool = False  # the engine runs in a process of this rank's (`HFProcessEngine`); stopped by `close`
    # (trainer, engine) torch threads when the rank's are split with its engine process (`rl/overlap.thread_share`)
    thread_share: tuple[int, int] | None = None
    reports_versions: bool = False  # the server says which weights sampled each reply (vllm, sglang)
    _released: bool = field(default=False, repr=False)

    def after_rollout(self) -> None:
        """The step's rollouts are over: a co-located server gives its GPU memory back."""
        if not self.releases_memory:
            return
        _barrier(self.world)  # SGLang refuses to release with requests in flight
        if self.pushes_weights:
            self.engine.release_memory()
            self._released = True

    def served_versions(self) -> dict[str, int] | None:
        """{weight label: tokens} the server reported sampling since the last call; None where
        the engine does not say (`hf`)."""
        return self.engine.take_served_versions() if self.reports_versions else None

    def update_weights(self, weights: dict[str, Any] | WeightStream, version: int) -> None:
        """Give the engine the policy's weights, W(`version`) (a server tags them with it:
        `agent.engine.weight_label`); a rank that does not push only iterates a stream to its end
        (its ZeRO-3 gathers are collectives every rank joins), keeping nothing."""
        if not self.pushes_weights:
            if isinstance(weights, WeightStream):
                for _ in weights:
                    pass
            return
        if self._released:
            self.engine.resume_memory()
            self._released = False
        if self.served:
            self.engine.update_weights(weights, version=version)
        else:
            self.engine.update_weights(weights)

    def close(self) -> None:
        if self.owns_engine:
            self.engine.close()
            self.owns_engine = False
        if self.served and self.pushes_weights:
            self.engine.release_staged_weights()  # the /dev/shm snapshot: host memory until deleted
        if self.server is not None:
            self.server.stop()
            release(self.server.process.pid)  # the device ledger (rehearsals): its card is free again
            self.server = None


def hold_in_ledger(server: Any, role: str, gpus: Sequence[int], fraction: float) -> None:
    """The device ledger (rehearsals, `device_ledger.py`): the server launched holds `fraction`
    of each of its cards (`gpus`; none: its `cuda:0`, rank 0's card when colocated); a claim
    the cards cannot hold stops it."""
    try:
        declare_server(role, server.process.pid, list(gpus) or [physical_gpu(0)], fraction)
    except LedgerError:
        server.stop()
        raise


def _barrier(world: int) -> None:
    import torch.distributed as dist

    if world > 1 and dist.is_initialized():
        dist.barrier()


def _shared_url(url: str | None, rank: int, world: int, checkpoint: Path, sha256: str) -> str:
    """Rank 0's server url on every rank, once rank 0 found that it serves `checkpoint`; every
    rank raises rank 0's `ServedModelMismatch`, so none is left waiting for the others."""
    import torch.distributed as dist

    problem = None
    if rank == 0:
        assert url is not None
        try:
            check_served_model(f"{url.rstrip('/')}/v1", None, checkpoint, sha256)
        except ServedModelMismatch as exc:
            problem = str(exc)
    if world > 1 and dist.is_initialized():
        box = [(url, problem) if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        url, problem = box[0]
    if problem is not None:
        raise ServedModelMismatch(f"rl.rollout: {problem}")
    assert url is not None
    return url


def build_rollout_engine(cfg: PipelineConfig, init_model: Path, processor: Any, device: str, rank: int, world: int,
                         staging_dir: Path, init_sha256: str) -> RolloutBackend:
    """This rank's rollout backend for `rl.rollout.engine` (module docstring).

    Args:
        init_model: the RL stage's starting checkpoint; `init_sha256` its content hash.

    Raises:
        ServedModelMismatch: the server serves another checkpoint (module docstring).
        ConfigError: sglang or vllm asked for without a url where the server cannot be launched.
        SGLangUnavailable: a server must be launched but there is no CUDA GPU.
        SGLangServerError: the configured server does not answer.
    """
    return rollout_engine_spec(cfg.rl.rollout.engine).call("backend", cfg, init_model, processor, device, rank, world,
                                                          staging_dir, init_sha256)


def hf_backend(cfg: PipelineConfig, init_model: Path, processor: Any, device: str, rank: int, world: int,
               staging_dir: Path, init_sha256: str) -> RolloutBackend:
    """Each rank generates with its own copy of the policy (module docstring)."""
    if cfg.rl.overlap:
        import torch

        # The rank's threads (torch's count as the launcher set it) are split with the engine process.
        share = thread_share(torch.get_num_threads(), cfg.rl.overlap_trainer_threads, cfg.rl.overlap_engine_threads)
        engine = HFProcessEngine(cfg, init_model, device, share[1])
        return RolloutBackend(engine, pushes_weights=True, world=world, owns_engine=True, thread_share=share)
    model = build_model(cfg.model, init_model, device=device).eval()
    return RolloutBackend(build_hf_engine(cfg, model, processor, "rollout"), pushes_weights=True, world=world)


def _dtype(cfg: PipelineConfig) -> Any:
    """What a server's weights are pushed in (`model.dtype`)."""
    import torch

    return torch.bfloat16 if cfg.model.dtype == "bfloat16" else torch.float32


def sglang_backend(cfg: PipelineConfig, init_model: Path, processor: Any, device: str, rank: int, world: int,
                   staging_dir: Path, init_sha256: str) -> RolloutBackend:
    """Every rank on ONE SGLang server, rank 0's or `rl.rollout.sglang.url` (module docstring)."""
    dtype = _dtype(cfg)
    server_cfg = cfg.rl.rollout.sglang
    check_rollout_engine(cfg)
    server, url = None, server_cfg.url
    colocated = server_cfg.placement == "colocated"
    if url is None and rank == 0:
        server = launch_sglang_server(
            served_folder(init_model, cfg.video, staging_dir.parent), free_port(), tp_size=server_cfg.tp_size,
            mem_fraction_static=server_cfg.mem_fraction_static, enable_memory_saver=colocated,
            cuda_devices=server_cfg.gpus, pixel_bounds=(cfg.video.min_pixels, cfg.video.max_pixels),
            served_model_name=_served_name(cfg, init_sha256), startup_timeout_s=server_cfg.startup_timeout_s)
        hold_in_ledger(server, "RL rollout server (SGLang)", server_cfg.gpus,
                       server_cfg.mem_fraction_static or SERVER_FRACTION)
        url = server.url
    url = _shared_url(url, rank, world, init_model, init_sha256)
    engine = SGLangEngine.for_processor(url, init_model, staging_dir, processor, dtype=dtype,
                                        timeout_s=server_cfg.request_timeout_s,
                                        shm_dir=shm_staging_dir(staging_dir) if server is not None else None)
    return RolloutBackend(engine, pushes_weights=rank == 0, served=True, url=url, releases_memory=colocated,
                          world=world, server=server, reports_versions=True)


def _served_name(cfg: PipelineConfig, init_sha256: str) -> str:
    """The name a launched rollout server serves under: it carries the starting checkpoint's
    sha256[:12], so the served-model check (`_shared_url`) accepts the linked copy of a base
    model that `agent.served_model.served_folder` may serve (other bytes in its processor config, same weights)."""
    return served_model_name(cfg.model.registered_name, init_sha256)


def vllm_backend(cfg: PipelineConfig, init_model: Path, processor: Any, device: str, rank: int, world: int,
                 staging_dir: Path, init_sha256: str) -> RolloutBackend:
    """Every rank on ONE vLLM server, rank 0's or `rl.rollout.vllm.url` (module docstring)."""
    dtype = _dtype(cfg)
    server_cfg = cfg.rl.rollout.vllm
    check_rollout_engine(cfg)
    server, url = None, server_cfg.url
    if url is None and rank == 0:
        server = launch_vllm_rollout_server(served_folder(init_model, cfg.video, staging_dir.parent), free_port(),
                                            python=server_cfg.python,
                                            startup_timeout_s=server_cfg.startup_timeout_s,
                                            max_model_len=server_cfg.max_model_len,
                                            log_path=staging_dir.parent / "vllm-server.log",
                                            cuda_devices=server_cfg.gpus, tp_size=server_cfg.tp_size,
                                            gpu_memory_utilization=server_cfg.gpu_memory_utilization,
                                            served_name=_served_name(cfg, init_sha256))
        hold_in_ledger(server, "RL rollout server (vLLM)", server_cfg.gpus,
                       server_cfg.gpu_memory_utilization or VLLM_FRACTION)
        url = server.url
    url = _shared_url(url, rank, world, init_model, init_sha256)
    engine = VLLMEngine.for_processor(url, init_model, staging_dir, processor, dtype=dtype,
                                      timeout_s=server_cfg.request_timeout_s,
                                      shm_dir=shm_staging_dir(staging_dir) if server is not None else None)
    return RolloutBackend(engine, pushes_weights=rank == 0, served=True, url=url, world=world, server=server,
                          reports_versions=True)
