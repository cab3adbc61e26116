"""Weight snapshots a rollout server loads from disk after each optimizer step.

`<staging_dir>/v<N>/` holds the policy's tensors as one safetensors file beside the
checkpoint's config files. It is written into `v<N>.partial` and renamed once complete, so
a server never reads a half-written snapshot; the previous one is deleted after the server
has loaded the new one. Numbering continues across restarts (`latest_snapshot_version`),
so the snapshot a live server loaded stays valid when the trainer comes back.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

CONFIG_FILES = ("config.json", "generation_config.json")


def latest_snapshot_version(staging_dir: Path) -> int:
    """The highest N of the complete `v<N>` folders (0 when none)."""
    return max((int(d.name[1:]) for d in Path(staging_dir).glob("v*") if d.name[1:].isdigit()), default=0)


def write_weight_snapshot(staging_dir: Path, version: int, model_path: Path, state_dict: dict[str, Any],
                          dtype: torch.dtype | None = None) -> Path:
    """Write `state_dict` (cast to `dtype` when given) as snapshot `v<version>`; return its folder."""
    from safetensors.torch import save_file

    final = Path(staging_dir) / f"v{version}"
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name in CONFIG_FILES:
        if (Path(model_path) / name).is_file():
            shutil.copy2(Path(model_path) / name, partial / name)
    # clone(): tied weights share storage, which safetensors refuses to write twice.
    tensors = {name: value.detach().to("cpu", dtype or value.dtype).clone().contiguous()
               for name, value in state_dict.items()}
    save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    return final


def drop_older_snapshots(staging_dir: Path, keep: Path) -> None:
    """Delete every snapshot folder but `keep` (the one the server now serves)."""
    for old in Path(staging_dir).glob("v*"):
        if old != keep and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
