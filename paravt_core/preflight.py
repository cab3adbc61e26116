"""`paravt preflight`: what a GPU run needs of this machine, checked before any stage (#44 item 7).

A config of a real model (anything but `model.base: tiny`, which runs on CPU) is checked for:
the interpreter's Python (requirements-gpu.txt resolves for 3.11 and 3.12 only), torch's CUDA
build seeing a GPU (without one DeepSpeed falls back to its CPU accelerator without a word),
the GPU count against the ranks and the rollout server's GPUs, the NVIDIA driver against
torch's CUDA build, free disk against the checkpoints the run keeps, free shared memory
(/dev/shm) against what SFT's data workers and NCCL pass through it, the packages and servers
the config starts (DeepSpeed, SGLang, vLLM for the rollout server, the serve venv), and the memory plan
(`paravt_core/plan.py`) on the cards found. Every failure says what to do.

The facts come from `Probes`, so tests give each failure without the machine having it.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from paravt_core.agent.server_launch import SERVERS, server_python_path
from paravt_core.config import PipelineConfig
from paravt_core.plan import GB, GIB, MemoryPlan, ModelShape, PlanError, gpus_needed, memory_plan, model_shape
from paravt_core.rollout_engines import rollout_engine_spec
from paravt_core.sft.loader import PREFETCH_FACTOR

SUPPORTED_PYTHONS = ((3, 11), (3, 12))
# The oldest Linux driver each CUDA major release runs on (NVIDIA's CUDA toolkit release notes,
# "minor version compatibility": CUDA 12.x needs >= 525.60.13; CUDA 13.x needs >= 580).
MIN_DRIVER = {12: (525, 60, 13), 13: (580,)}
# One DeepSpeed checkpoint: the bf16 module weights (2 bytes per parameter) and the fp32 master
# weights with Adam's two moments (12); every `checkpoint_every` step writes one, and a stage
# keeps them all unless its `keep_last` prunes the older ones (`checkpoints_kept`).
CHECKPOINT_BYTES_PER_PARAM = 14
EXPORTED_MODELS = 3  # the base model's copy, the SFT and the RL exports, bf16 each
SHM_DIR = Path("/dev/shm")
# NCCL's shared-memory transport between a node's GPUs lives in /dev/shm; NCCL's troubleshooting
# guide asks containers for `--shm-size=1g` (or `--ipc=host`), over Docker's default 64 MB.
NCCL_SHM_BYTES = 1 << 30


class PreflightFailed(RuntimeError):
    """A GPU run refused before any stage; the message lists every failed check and what to do."""


@dataclass(frozen=True)
class CudaFacts:
    """What torch says about CUDA; `torch_version` None when torch does not import."""

    torch_version: str | None
    cuda_build: str | None  # torch.version.cuda; None for a CPU build
    device_bytes: tuple[int, ...] = ()  # total memory of each visible GPU
    error: str = ""


@dataclass(frozen=True)
class Probes:
    """The machine's facts, one callable each (tests give fakes)."""

    python_version: Callable[[], tuple[int, int, int]]
    cuda: Callable[[], CudaFacts]
    driver_version: Callable[[], str | None]  # None: no NVIDIA driver answers
    free_disk: Callable[[Path], int]  # bytes free on the file system holding the path
    has_module: Callable[[str, str], bool]  # (interpreter, module name) -> importable there
    free_shm: Callable[[], int | None]  # bytes free in /dev/shm; None: there is none


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Preflight:
    checks: tuple[Check, ...]
    plan: MemoryPlan | None = None

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    def format(self) -> str:
        width = max(len(c.name) for c in self.checks)
        lines = [f"  {'ok  ' if c.ok else 'FAIL'}  {c.name.ljust(width)}  {c.detail}" for c in self.checks]
        failed = [c for c in self.checks if not c.ok]
        if failed:
            lines += ["", f"{len(failed)} of {len(self.checks)} checks failed; to do:"]
            lines += [f"  - {c.name}: {c.fix}" for c in failed]
        if self.plan is not None:
            lines += ["", self.plan.format()]
        return "\n".join(lines)


def needs_gpu(cfg: PipelineConfig) -> bool:
    """A real checkpoint trains on GPUs; the tiny model is the CPU path and is not checked."""
    return not cfg.model.is_tiny


def _python(probes: Probes) -> Check:
    version = probes.python_version()
    ok = tuple(version[:2]) in SUPPORTED_PYTHONS
    return Check("python", ok, ".".join(map(str, version)),
                 "requirements-gpu.txt resolves for Python 3.11 and 3.12 only: make the GPU venv with one "
                 "(make install-gpu GPU_PYTHON=python3.11; on Ubuntu 22.04, whose python3 is 3.10, install "
                 "python3.11 and python3.11-venv, e.g. from the deadsnakes PPA)")


def _cuda(facts: CudaFacts) -> Check:
    if facts.torch_version is None:
        return Check("cuda", False, f"torch does not import ({facts.error})", "install the GPU profile: make install-gpu")
    if facts.cuda_build is None:
        return Check("cuda", False, f"torch {facts.torch_version} is a CPU build",
                     "install the GPU profile (make install-gpu), whose torch is built for CUDA")
    if not facts.device_bytes:
        why = f": {facts.error}" if facts.error else ""
        return Check("cuda", False, f"torch {facts.torch_version} (CUDA {facts.cuda_build}) sees no GPU{why}",
                     "check `nvidia-smi` lists the GPUs, the driver (below) and CUDA_VISIBLE_DEVICES")
    return Check("cuda", True, f"torch {facts.torch_version}, CUDA {facts.cuda_build}, {len(facts.device_bytes)} "
                               f"GPU(s) of {min(facts.device_bytes) / GIB:.1f} GiB")


def _gpu_count(cfg: PipelineConfig, facts: CudaFacts) -> Check:
    needed, found = gpus_needed(cfg), len(facts.device_bytes)
    if cfg.sft.hostfile or cfg.rl.hostfile:
        return Check("gpu count", True, f"{found} here; a hostfile places the ranks (check each node)")
    return Check("gpu count", found >= needed,
                 f"{found} visible, {needed} needed (sft.num_ranks {cfg.sft.num_ranks}, rl.num_ranks "
                 f"{cfg.rl.num_ranks} + rollout server GPUs)",
                 f"run on a machine with {needed} GPUs, or lower sft.num_ranks / rl.num_ranks (and move "
                 f"rl.rollout.{cfg.rl.rollout.engine}.gpus)")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def _driver(facts: CudaFacts, driver: str | None) -> Check:
    if driver is None:
        return Check("driver", False, "no NVIDIA driver answers (nvidia-smi not found or failing)",
                     "install the NVIDIA driver (>= 580 for CUDA 13 builds of torch) and check `nvidia-smi`")
    if not facts.cuda_build:
        return Check("driver", True, f"{driver} (no CUDA build of torch to match)")
    major = _version(facts.cuda_build)[0]
    needed = MIN_DRIVER.get(major)
    if needed is None:
        return Check("driver", True, f"{driver}; no minimum known for CUDA {facts.cuda_build}")
    ok = _version(driver) >= needed
    need = ".".join(map(str, needed))
    return Check("driver", ok, f"{driver}, torch built for CUDA {facts.cuda_build} (needs >= {need})",
                 f"upgrade the NVIDIA driver to >= {need}, or install a torch built for an older CUDA; with an "
                 "older driver torch sees no GPU and DeepSpeed falls back to the CPU")


def checkpoints_kept(max_steps: int, checkpoint_every: int, keep_last: int | None) -> int:
    """The most checkpoints one stage holds at once: every save, or with `keep_last` that many
    plus the newest, which is written whole before the oldest is pruned (`dist.checkpoints.prune_checkpoints`)."""
    saves = math.ceil(max_steps / checkpoint_every)
    return saves if keep_last is None else min(saves, keep_last + 1)


def checkpoint_bytes(cfg: PipelineConfig, params: int) -> int:
    """Bytes of the checkpoints and exports a run leaves in `run.output_dir` at its peak (the SFT
    stage's checkpoints stay while RL writes its own)."""
    kept = sum(checkpoints_kept(stage.max_steps, stage.checkpoint_every, stage.keep_last)
               for stage in (cfg.sft, cfg.rl))
    return kept * CHECKPOINT_BYTES_PER_PARAM * params + EXPORTED_MODELS * 2 * params


def _existing(path: Path) -> Path:
    path = path.resolve()
    while not path.exists():
        path = path.parent
    return path


def _disk(cfg: PipelineConfig, params: int, probes: Probes) -> Check:
    where = _existing(cfg.run.output_dir)
    needed, free = checkpoint_bytes(cfg, params), probes.free_disk(where)
    return Check("disk", free >= needed,
                 f"{free / GB:.0f} GB free at {where}, the run keeps {needed / GB:.0f} GB (DeepSpeed checkpoints every "
                 f"sft/rl.checkpoint_every steps, at most sft/rl.keep_last + 1 at once, "
                 f"{CHECKPOINT_BYTES_PER_PARAM * params / GB:.0f} GB each, and 3 models)",
                 f"free {(needed - free) / GB:.0f} GB there, point run.output_dir at a larger disk, lower "
                 "sft.keep_last / rl.keep_last, or raise sft.checkpoint_every / rl.checkpoint_every")


def sft_shm_bytes(cfg: PipelineConfig) -> int:
    """Bytes of /dev/shm SFT's data workers hold at once on one node: each of `sft.num_ranks`
    ranks' `sft.data_workers` workers keeps `loader.PREFETCH_FACTOR` micro-batches ready, and a
    worker's tensors reach its rank through shared memory. Counted: the pixel values, `micro_batch_size`
    samples of the most frames a sample has (as the memory plan counts them), `video.max_pixels`
    pixels x 3 channels each, in `sft.host_pixel_dtype`; token ids and positions are far smaller."""
    sft = cfg.sft
    frames = max(cfg.video.sft_max_frames, cfg.video.crop_max_frames)
    sample = frames * cfg.video.max_pixels * 3 * (2 if sft.host_pixel_dtype == "bfloat16" else 4)
    return sft.num_ranks * sft.data_workers * PREFETCH_FACTOR * sft.micro_batch_size * sample


def _shm(cfg: PipelineConfig, probes: Probes) -> Check:
    workers = sft_shm_bytes(cfg)
    nccl = NCCL_SHM_BYTES if max(cfg.sft.num_ranks, cfg.rl.num_ranks) > 1 else 0
    needed, free = workers + nccl, probes.free_shm()
    size = f"{math.ceil((needed + (64 << 20)) / GIB)}g"  # with room for everything else there
    fix = (f"give the container more shared memory: `docker run --shm-size={size}` (or `--ipc=host`; Kubernetes: an "
           f"emptyDir of medium Memory mounted at {SHM_DIR}), or lower sft.data_workers")
    if free is None:
        return Check("shared memory", False, f"no {SHM_DIR} on this machine", fix)
    return Check("shared memory", free >= needed,
                 f"{free / 1e6:.0f} MB free in {SHM_DIR}, {needed / 1e6:.0f} MB needed (SFT's data workers: "
                 f"{cfg.sft.num_ranks} ranks x {cfg.sft.data_workers} workers x {PREFETCH_FACTOR} ready micro-"
                 f"batches, {workers / 1e6:.0f} MB of pixels; NCCL between the GPUs: {nccl / 1e6:.0f} MB)", fix)


def _local(url: str | None) -> bool:
    return url is not None and urlparse(url).hostname in ("127.0.0.1", "localhost", "::1")


def sglang_checks(cfg: PipelineConfig, probes: Probes) -> list[Check]:
    """`sglang` with no url: rank 0 launches the server with this interpreter."""
    here = sys.executable
    if cfg.rl.rollout.sglang.url is not None:
        return []
    return [Check("sglang", probes.has_module(here, "sglang"), f"rank 0 launches the rollout server with {here}",
                  "install the GPU profile (make install-gpu brings SGLang), or give "
                  "rl.rollout.sglang.url of a running server")]


def vllm_checks(cfg: PipelineConfig, probes: Probes) -> list[Check]:
    """`vllm` with no url: rank 0 launches the server with the serve interpreter."""
    vl = cfg.rl.rollout.vllm
    if vl.url is not None:
        return []
    python = server_python_path(vl.python)
    return [Check("rollout server", probes.has_module(python, "vllm"), f"vLLM for {python}",
                  "make install-serve, or name an interpreter with vLLM in rl.rollout.vllm.python")]


def _packages(cfg: PipelineConfig, probes: Probes) -> list[Check]:
    here = sys.executable
    checks = [Check("deepspeed", probes.has_module(here, "deepspeed"), f"for {here}",
                    "install the GPU profile: make install-gpu")]
    checks += rollout_engine_spec(cfg.rl.rollout.engine).call("preflight", cfg, probes)  # its record's
    if cfg.eval.engine == "openai" and (cfg.eval.endpoint is None or _local(cfg.eval.endpoint)):
        python = server_python_path(None, cfg.eval.server_python)
        found = [name for name in SERVERS if probes.has_module(python, name)]
        serves = (f"`paravt eval serve` serves {cfg.eval.endpoint}" if cfg.eval.endpoint else
                  "the evaluation serves each checkpoint")
        if cfg.eval.server != "auto":
            serves += f" ({cfg.eval.server} asked)"
        wanted = found if cfg.eval.server == "auto" else [name for name in found if name == cfg.eval.server]
        checks.append(Check("serve venv", bool(wanted),
                            f"{serves} with {python}"
                            + (f" ({', '.join(found)})" if found else ": neither SGLang nor vLLM there"),
                            "make install-serve (.venv-serve), or name an interpreter with SGLang or vLLM in "
                            "eval.server_python"))
    return checks


def _memory(cfg: PipelineConfig, shape: ModelShape, facts: CudaFacts) -> tuple[Check, MemoryPlan | None]:
    if not facts.device_bytes:
        return Check("memory plan", False, "no GPU to plan for",
                     "see `cuda`; `paravt plan --gpus N --gpu-memory-gib M` prints the plan for given cards"), None
    plan = memory_plan(cfg, shape, len(facts.device_bytes), min(facts.device_bytes))
    over = plan.refusals
    return Check("memory plan", not over, "every stage fits" if not over else f"{len(over)} stage(s) over budget",
                 "; ".join(over)), plan


def run_preflight(cfg: PipelineConfig, probes: Probes) -> Preflight:
    """Every check (none is skipped after a failure, so one run lists all that is missing)."""
    facts = probes.cuda()
    checks = [_python(probes), _cuda(facts), _gpu_count(cfg, facts), _driver(facts, probes.driver_version())]
    try:
        shape = model_shape(cfg.model.base)
    except PlanError as err:
        checks.append(Check("model shape", False, str(err), "give model.base as a local model folder"))
        return Preflight((*checks, *_packages(cfg, probes)))
    checks += [_disk(cfg, shape.params, probes), _shm(cfg, probes), *_packages(cfg, probes)]
    memory, plan = _memory(cfg, shape, facts)
    return Preflight((*checks, memory), plan)


# --- the real machine ------------------------------------------------------------------------

def _torch_facts() -> CudaFacts:
    try:
        import torch
    except Exception as err:  # an import that fails for any reason is the finding itself
        return CudaFacts(None, None, error=f"{type(err).__name__}: {err}")
    build = torch.version.cuda
    try:
        count = torch.cuda.device_count() if build and torch.cuda.is_available() else 0
        sizes = tuple(torch.cuda.get_device_properties(i).total_memory for i in range(count))
    except Exception as err:  # torch raises RuntimeError for a driver it cannot use
        return CudaFacts(torch.__version__, build, error=f"{type(err).__name__}: {err}")
    return CudaFacts(torch.__version__, build, sizes)


def _nvidia_driver() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.split()
    return lines[0] if done.returncode == 0 and lines else None


def _has_module(python: str, name: str) -> bool:
    if python == sys.executable:
        return importlib.util.find_spec(name) is not None
    try:
        done = subprocess.run([python, "-c", f"import importlib.util, sys; sys.exit(importlib.util.find_spec({name!r}) "
                                             "is None)"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def system_probes() -> Probes:
    return Probes(python_version=lambda: tuple(sys.version_info[:3]), cuda=_torch_facts, driver_version=_nvidia_driver,
                  free_disk=lambda path: shutil.disk_usage(path).free, has_module=_has_module,
                  free_shm=lambda: shutil.disk_usage(SHM_DIR).free if SHM_DIR.is_dir() else None)
