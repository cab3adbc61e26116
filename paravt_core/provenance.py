"""What produced an artifact: git revision of this checkout, written next to every checkpoint."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# How `host_differences` names the accelerator of a record without one (trained on the CPU).
CPU_ONLY = "none (CPU)"


def git_revision() -> str:
    """`<sha>` of HEAD, with `-dirty` when tracked files have uncommitted changes; `unknown` outside git."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                             check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha}-dirty" if dirty else sha


def host_numerics(device: str | None = None) -> dict[str, object]:
    """What, beyond the config, the inputs and the code, decides this process's float results
    (docs/miniature.md, "What a build depends on"): torch's thread count (a rank's
    is its share of the host's cores, `dist.launch._launch`, unless OMP_NUM_THREADS is set), the host's
    core count, the CPU kernels torch chose for this CPU's instruction set, and torch's version.
    Two models trained from the same inputs match bit for bit only where these match. Also the
    CPU itself (`cpu_model`): two CPUs with the same instruction set may still take other
    library paths (MKL dispatches by CPU); not measured either way. Where `device` (the one the
    record is for; by default this process's: its current CUDA device once it has initialized
    CUDA, as `dist.rank.init_distributed` does wherever torch sees a card, else the CPU) is a CUDA
    device, also the card and CUDA (`accelerator_model`): there the GPU's kernels, not the CPU's,
    compute the weights."""
    import os

    import torch

    if device is None:
        device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_initialized() else "cpu"
    record: dict[str, object] = {
        "torch_threads": torch.get_num_threads(), "host_cpus": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__, "cpu": cpu_model()}
    if device.startswith("cuda"):
        record["accelerator"] = accelerator_model(device)
    return record


def accelerator_model(device: str) -> str:
    """The CUDA device `device` and the libraries its kernels come from, e.g. "NVIDIA H200 (CUDA
    13.0, cuDNN 91002)": another card, CUDA (cuBLAS comes with it) or cuDNN may pick other
    kernels and train other weights from the same inputs. Safe in the flow's own process (the
    start-of-run warning): reading the card's properties runs torch's lazy CUDA init but creates
    no context, so it holds no GPU memory (nvidia-smi lists no process after it: unsloth-zoo
    PR 1053, torch 2.10+cu130), as `device_ledger.planned_gpu_bytes` already relies on."""
    import torch

    return (f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda}, "
            f"cuDNN {torch.backends.cudnn.version()})")


def training_device() -> str:
    """The device rank 0 of a stage launched from this host trains on (`dist.rank.init_distributed`:
    the first visible CUDA device where torch sees one, else the CPU)."""
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """This host's CPU as `cpuinfo` names it, e.g. "AMD EPYC (AuthenticAMD family 23 model 1)":
    each field's first value in the file (x86 names the CPU in every processor's block; an ARM
    board names itself in a trailer after them, "Model", and ARM servers give only the
    implementer and part); the machine's architecture (`platform.machine()`) where the file is
    missing or names nothing."""
    import platform

    fields: dict[str, str] = {}
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if value.strip():
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    ids = " ".join(f"{label}{fields[key]}" for key, label in (
        ("vendor_id", ""), ("cpu family", "family "), ("model", "model "),
        ("CPU implementer", "implementer "), ("CPU part", "part ")) if key in fields)
    name = fields.get("model name") or fields.get("Model") or platform.machine() or "unknown"
    return f"{name} ({ids})" if ids else name


def foreign_models(models: Mapping[str, Mapping[str, object] | None]) -> list[str]:
    """One line per model (named by the key) whose recorded `host_numerics` came from another
    host (`host_differences`): what a run that goes on from it here should be told."""
    return [f"{what} was trained on another host ({'; '.join(differences)}): the runs that go on from it "
            "here are not what one host gives; the report's 'Trained on' line counts each host's models"
            for what, recorded in models.items() if (differences := host_differences(recorded))]


def host_differences(recorded: Mapping[str, object] | None) -> list[str]:
    """How the host whose `host_numerics` a model recorded differs from this one, threads aside
    (a rank's threads follow the stage's rank count): e.g. ["CPU kernels AVX512 there, AVX2
    here"]. Empty where they agree or nothing was recorded. A run that goes on here from such a
    model mixes two hosts' numerics (docs/miniature.md, "What a build depends on"). This host's
    side is what its stages would train on (`training_device`)."""
    if not recorded:
        return []
    here = host_numerics(training_device())
    names = {"accelerator": "accelerator", "host_cpus": "cores", "cpu": "CPU", "cpu_capability": "CPU kernels",
             "torch": "torch"}
    # A record from before the CPU was recorded is compared on what it has. One that has the CPU
    # and no accelerator was trained on the CPU (the accelerator was added after the CPU, and no
    # run on a GPU recorded its numerics in between).
    there = {**recorded, "accelerator": recorded.get("accelerator", CPU_ONLY)} if "cpu" in recorded else recorded
    here = {**here, "accelerator": here.get("accelerator", CPU_ONLY)}
    return [f"{name} {there[key]} there, {here[key]} here" for key, name in names.items()
            if key in there and there[key] != here[key]]
