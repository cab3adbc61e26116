"""Weight snapshots a rollout server loads from disk after each optimizer step.

`<root>/v<N>/` holds the policy's tensors as one safetensors file beside the checkpoint's
config files. It is written into `v<N>.partial` and renamed once complete, so a server never
reads a half-written snapshot; the previous one is deleted after the server has loaded the
new one. Numbering continues across restarts (`latest_snapshot_version`), so the snapshot a
live server loaded stays valid when the trainer comes back.

Issue #44 item 8 (the 8B weight push, 17.5 GB in bf16 per step):
- The file is written tensor by tensor as the tensors arrive (`write_weight_snapshot` takes a
  `WeightStream`: the names, shapes and dtypes up front, for the safetensors header, then the
  tensors one at a time), so the writer never holds the model (safetensors' own `save_file`
  takes every tensor at once, and the writer used to clone each for it: tied weights share
  storage, which `save_file` refuses).
  Under ZeRO-3 the trainer streams each parameter straight out of its gather (`dist.GatheredWeights`).
- `SnapshotStager` puts a snapshot in `/dev/shm` (memory, no disk write) when both its free
  space and the host's available memory hold it with a margin, else in the run's folder. Only
  a server this run launched on this machine is given a /dev/shm path (a server behind a url
  may be another machine or container, with a /dev/shm of its own). The /dev/shm folder is
  removed when the trainer closes its backend, and by the RL stage after its workers exit
  however they ended (`release_shm_staging`), so no snapshot outlives its run in memory.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import struct
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

CONFIG_FILES = ("config.json", "generation_config.json")
SHM_DIR = Path("/dev/shm")
SHM_MARGIN_BYTES = 1 << 30  # left free in /dev/shm and host memory beside a staged snapshot ...
SHM_MARGIN_SHARE = 0.05  # ... or this share of the snapshot, the larger
# The safetensors format's dtype names (its README), for the dtypes a policy's tensors take.
SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                      torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                      torch.uint8: "U8", torch.bool: "BOOL"}


@dataclass(frozen=True)
class TensorSpec:
    """What the safetensors header says of one tensor, known before the tensor itself."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    def nbytes(self, dtype: torch.dtype | None = None) -> int:
        return math.prod(self.shape) * (dtype or self.dtype).itemsize


@runtime_checkable
class WeightStream(Protocol):
    """A model's tensors one at a time: `specs` up front, then (name, tensor) pairs in their order.

    Iterating may run collectives (a ZeRO-3 gather): every rank iterates to the end, and a rank
    that keeps nothing yields nothing."""

    specs: list[TensorSpec]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]: ...


class MappingStream:
    """A whole state dict as a `WeightStream`, the widest dtypes first (each tensor then starts
    at an offset its dtype divides, as safetensors' own writer arranges it)."""

    def __init__(self, state_dict: Mapping[str, torch.Tensor]):
        self.state_dict = state_dict
        names = sorted(state_dict, key=lambda name: -state_dict[name].dtype.itemsize)  # stable
        self.specs = [TensorSpec(n, tuple(state_dict[n].shape), state_dict[n].dtype) for n in names]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return ((spec.name, self.state_dict[spec.name]) for spec in self.specs)


def as_stream(weights: Mapping[str, torch.Tensor] | WeightStream) -> WeightStream:
    return weights if isinstance(weights, WeightStream) else MappingStream(weights)


def snapshot_bytes(weights: Mapping[str, torch.Tensor] | WeightStream, dtype: torch.dtype | None = None) -> int:
    """The tensor bytes of the snapshot of `weights` written in `dtype` (its own when None)."""
    return sum(spec.nbytes(dtype) for spec in as_stream(weights).specs)


def latest_snapshot_version(staging_dir: Path) -> int:
    """The highest N of the complete `v<N>` folders (0 when none)."""
    return max((int(d.name[1:]) for d in Path(staging_dir).glob("v*") if d.name[1:].isdigit()), default=0)


def write_weight_snapshot(staging_dir: Path, version: int, model_path: Path,
                          weights: Mapping[str, torch.Tensor] | WeightStream, dtype: torch.dtype | None = None) -> Path:
    """Write `weights` (cast to `dtype` when given) as snapshot `v<version>`; return its folder.

    Raises:
        OSError: the file could not be written (a stream is still iterated to its end first,
            so the other ranks' gathers are all joined).
        ValueError: a stream's tensors are not the ones its specs announced.
    """
    final = Path(staging_dir) / f"v{version}"
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name in CONFIG_FILES:
        if (Path(model_path) / name).is_file():
            shutil.copy2(Path(model_path) / name, partial / name)
    write_safetensors(partial / "model.safetensors", as_stream(weights), dtype)
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    return final


def write_safetensors(path: Path, stream: WeightStream, dtype: torch.dtype | None = None) -> None:
    """One safetensors file from a stream, each tensor written as it arrives and then dropped.

    The format (safetensors' README): an 8-byte little-endian header length, a JSON header
    giving each tensor's dtype, shape and [start, end) byte offsets into the data that
    follows, padded with spaces so the data starts 8-byte aligned, then the tensors' bytes,
    contiguous and in offset order."""
    if sys.byteorder != "little":  # the format's bytes are little-endian; a tensor's are the host's
        raise RuntimeError("weight snapshots are written on little-endian hosts only")
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for spec in stream.specs:
        target = dtype or spec.dtype
        if target not in SAFETENSORS_DTYPES:
            raise ValueError(f"weight snapshot: {spec.name} has dtype {target}, which safetensors cannot hold")
        size = spec.nbytes(dtype)
        header[spec.name] = {"dtype": SAFETENSORS_DTYPES[target], "shape": list(spec.shape),
                             "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    tensors = iter(stream)
    try:
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for spec in stream.specs:
                name, tensor = next(tensors, (None, None))
                if tensor is None or name != spec.name or tuple(tensor.shape) != spec.shape:
                    got = "nothing" if tensor is None else f"{name} {tuple(tensor.shape)}"
                    raise ValueError(f"weight snapshot {path}: expected {spec.name} {spec.shape} next, got {got}")
                # The cast the snapshots always had (no copy for a CPU tensor already in `dtype`); the
                # uint8 view hands the tensor's own bytes to the file, not a copy of them.
                data = tensor.detach().to("cpu", dtype or tensor.dtype).contiguous().reshape(-1)
                f.write(data.view(torch.uint8).numpy())
                del data
            if next(tensors, None) is not None:
                raise ValueError(f"weight snapshot {path}: the stream holds more tensors than its specs announced")
    except Exception:
        for _ in tensors:  # join the remaining gathers, so no other rank is left blocked in one
            pass
        raise


def drop_older_snapshots(staging_dir: Path, keep: Path) -> None:
    """Delete every snapshot folder but `keep` (the one the server now serves)."""
    for old in Path(staging_dir).glob("v*"):
        if old != keep and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)


def shm_staging_dir(run_dir: Path, shm_dir: Path = SHM_DIR) -> Path:
    """The /dev/shm folder of one run's snapshots: named after the run folder (the RL stage
    finds it after its workers exit, a resumed run reuses it) and the user."""
    digest = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]
    return Path(shm_dir) / f"paravt-rollout-weights-{os.getuid()}-{digest}"


def release_shm_staging(run_dir: Path, shm_dir: Path = SHM_DIR) -> None:
    """Delete one run's /dev/shm snapshots (tmpfs holds them in memory until deleted)."""
    shutil.rmtree(shm_staging_dir(run_dir, shm_dir), ignore_errors=True)


def shm_free_bytes(shm_dir: Path) -> int:
    """Free bytes of the file system holding `shm_dir` (0 when it is not a writable folder)."""
    if not (shm_dir.is_dir() and os.access(shm_dir, os.W_OK | os.X_OK)):
        return 0
    return shutil.disk_usage(shm_dir).free


def mem_available_bytes() -> int:
    """The kernel's estimate of memory available without swapping (`MemAvailable`): a tmpfs
    page is host memory, whatever the tmpfs size limit says."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def shm_margin(nbytes: int) -> int:
    return max(SHM_MARGIN_BYTES, int(SHM_MARGIN_SHARE * nbytes))


class SnapshotStager:
    """Writes each snapshot to /dev/shm when it fits there (module docstring), else `staging_dir`.

    Args:
        staging_dir: the run's folder for snapshots, the one used when /dev/shm is short.
        shm_dir: this run's /dev/shm folder (`shm_staging_dir`), or None for a server that
            may not see this machine's /dev/shm (one behind a url).
        log: where each push's line goes (where, bytes, seconds, rate).
    """

    def __init__(self, staging_dir: Path, shm_dir: Path | None = None,
                 log: Callable[[str], None] | None = None):
        self.staging_dir, self.shm_dir = Path(staging_dir), shm_dir
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.version = max(latest_snapshot_version(root) for root in self.roots)

    @property
    def roots(self) -> list[Path]:
        return [self.staging_dir] + ([self.shm_dir] if self.shm_dir is not None else [])

    def choose(self, nbytes: int) -> tuple[Path, str]:
        """(folder for a snapshot of `nbytes`, why there)."""
        if self.shm_dir is None:
            return self.staging_dir, "the server may not share this machine's /dev/shm"
        need = nbytes + shm_margin(nbytes)
        free, available = shm_free_bytes(self.shm_dir.parent), mem_available_bytes()
        if free >= need and available >= need:
            return self.shm_dir, f"/dev/shm has {free / 1e9:.1f} GB free"
        return self.staging_dir, (f"/dev/shm has {free / 1e9:.1f} GB free and the host {available / 1e9:.1f} GB "
                                  f"available, {need / 1e9:.1f} GB needed")

    def write(self, model_path: Path, weights: Mapping[str, torch.Tensor] | WeightStream,
              dtype: torch.dtype | None = None) -> Path:
        """Write the next snapshot (`v<version + 1>`); its folder."""
        nbytes = snapshot_bytes(weights, dtype)
        root, why = self.choose(nbytes)
        t0 = time.perf_counter()
        final = write_weight_snapshot(root, self.version + 1, model_path, weights, dtype)
        seconds = time.perf_counter() - t0
        self.log(f"rollout weights {final.name}: {nbytes / 1e9:.2f} GB gathered and written to {final} in "
                 f"{seconds:.1f} s ({nbytes / 1e9 / max(seconds, 1e-9):.2f} GB/s); {why}")
        return final

    def loaded(self, final: Path) -> None:
        """The server has loaded `final`: it becomes the current version, every other one goes."""
        self.version = int(final.name[1:])
        for root in self.roots:
            drop_older_snapshots(root, final)

    def release(self) -> None:
        """Delete the /dev/shm snapshots (the run is over; the server holds the weights in memory)."""
        if self.shm_dir is not None:
            shutil.rmtree(self.shm_dir, ignore_errors=True)
