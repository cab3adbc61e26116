"""What produced an artifact: git revision of this checkout, written next to every checkpoint."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


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


def host_numerics() -> dict[str, object]:
    """What, beyond the config, the inputs and the code, decides this process's CPU float results
    (docs/miniature.md, "What a build depends on"): torch's thread count (a rank's
    is its share of the host's cores, `dist.launch._launch`, unless OMP_NUM_THREADS is set), the host's
    core count, the CPU kernels torch chose for this CPU's instruction set, and torch's version.
    Two models trained from the same inputs match bit for bit only where these match."""
    import os

    import torch

    return {"torch_threads": torch.get_num_threads(), "host_cpus": os.cpu_count(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}


def host_differences(recorded: Mapping[str, object] | None) -> list[str]:
    """How the host whose `host_numerics` a model recorded differs from this one, threads aside
    (a rank's threads follow the stage's rank count): e.g. ["CPU kernels AVX512 there, AVX2
    here"]. Empty where they agree or nothing was recorded. A run that goes on here from such a
    model mixes two hosts' numerics (docs/miniature.md, "What a build depends on")."""
    if not recorded:
        return []
    here = host_numerics()
    names = {"host_cpus": "cores", "cpu_capability": "CPU kernels", "torch": "torch"}
    return [f"{name} {recorded.get(key)} there, {here[key]} here" for key, name in names.items()
            if recorded.get(key) != here[key]]
