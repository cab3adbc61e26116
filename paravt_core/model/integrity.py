"""Is a model folder whole? Checked before a model is registered, aliased or loaded.

A Hugging Face model folder can lose its weights (a deleted `model.safetensors`, a shard
missing from a sharded index) or hold a damaged file (a zero-filled or truncated
safetensors of the right name) and still have a `config.json`: the registry would record a
version with no weights and evaluation would fail much later, or a zero-filled file would
load as nothing and score 0. So:

- `write_manifest` records, at write time (the stages' export, the tiny kit), the sha256 and
  size of every weight file in `paravt_weights.json`;
- `verify_model_dir` checks that `config.json` and every weight file the folder needs are
  there, that each safetensors header parses and names tensors (no weights are read), and,
  where a manifest exists, that every weight file still has its recorded size and sha256.
  It raises `ModelFolderError` naming the folder, the file and what to do.

Folders without a manifest (a base model from the hub) get the structural checks only.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from pathlib import Path

from paravt_core.atomic import atomic_write_text
from paravt_core.refs import file_hash

MANIFEST = "paravt_weights.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
_MAX_HEADER = 100 * 2**20  # a safetensors header is JSON; 100 MB is far past any real one


class ModelFolderError(ValueError):
    """A model folder that is not whole; the message names the folder, the file and the fix."""


def weight_files(model_dir: Path) -> list[Path]:
    """The weight files the folder's layout needs (single file, or every shard of the index).

    Raises:
        ModelFolderError: no weights, or an index that does not parse.
    """
    model_dir = Path(model_dir)
    if (model_dir / INDEX).is_file():
        try:
            shards = sorted(set(json.loads((model_dir / INDEX).read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ModelFolderError(f"{model_dir / INDEX}: not a readable shard index ({error}); "
                                   f"export or download the model again") from None
        return [model_dir / shard for shard in shards]
    if (model_dir / SINGLE).is_file():
        return [model_dir / SINGLE]
    raise ModelFolderError(f"{model_dir}: no weights ({SINGLE} or {INDEX} with its shards); the folder is "
                           "incomplete: export or download the model again")


def _header_problem(path: Path) -> str | None:
    """Why a safetensors file's header does not parse to at least one tensor, or None."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                return f"it is {size} bytes, shorter than a safetensors header"
            (length,) = struct.unpack("<Q", raw)
            if not 2 <= length <= min(_MAX_HEADER, size - 8):
                return f"its header length field reads {length} (the file is {size} bytes): zero-filled or damaged"
            header = json.loads(f.read(length))
    except (OSError, ValueError) as error:
        return f"its header does not parse ({error})"
    tensors = {k: v for k, v in header.items() if k != "__metadata__"} if isinstance(header, dict) else {}
    if not tensors:
        return "its header names no tensors"
    end = max(int(v["data_offsets"][1]) for v in tensors.values())
    if 8 + length + end > size:
        return f"it is truncated: the header needs {8 + length + end} bytes, the file has {size}"
    return None


@functools.lru_cache(maxsize=1024)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a weight file, once per process for an unchanged file: an RL worker loads the
    same checkpoint as policy, reference and rollout copy (16 GB for the 8B model)."""
    return file_hash(Path(path))


def _sha256(path: Path) -> str:
    stat = path.stat()
    return _file_sha256(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


def write_manifest(model_dir: Path) -> Path:
    """Record every weight file's size and sha256 in `paravt_weights.json` (call it on a finished folder)."""
    model_dir = Path(model_dir)
    files = {f.name: {"bytes": f.stat().st_size, "sha256": _sha256(f)} for f in weight_files(model_dir)}
    return atomic_write_text(model_dir / MANIFEST, json.dumps({"weights": files}, indent=1) + "\n")


def model_dir_problem(model_dir: str | os.PathLike[str], checksums: bool = False) -> str | None:
    """Why the folder is not a whole model (`verify_model_dir`'s message), or None. Without
    checksums it reads only file sizes and safetensors headers: cheap enough for every cache
    lookup of a stage whose output is a model."""
    try:
        verify_model_dir(model_dir, checksums=checksums)
    except ModelFolderError as error:
        return str(error)
    return None


def verify_model_dir(model_dir: str | os.PathLike[str], checksums: bool = True) -> None:
    """Raise `ModelFolderError` unless the folder holds a config and whole weights (module docstring).

    `checksums=False` skips the sha256 of the manifest (sizes are still compared).
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelFolderError(f"{model_dir}: no such model folder")
    if not (model_dir / "config.json").is_file():
        raise ModelFolderError(f"{model_dir}: no config.json; the folder is incomplete: export or download it again")
    files = weight_files(model_dir)
    for f in files:
        if not f.is_file():
            raise ModelFolderError(f"{model_dir}: weight shard {f.name} named by {INDEX} is missing; "
                                   "export or download the model again")
        problem = _header_problem(f)
        if problem:
            raise ModelFolderError(f"{f}: not a loadable safetensors file: {problem}; export or download the model "
                                   "again")
    manifest_path = model_dir / MANIFEST
    if not manifest_path.is_file():
        return
    try:
        recorded = json.loads(manifest_path.read_text())["weights"]
    except (ValueError, KeyError, TypeError) as error:
        raise ModelFolderError(f"{manifest_path}: not a readable weights manifest ({error})") from None
    names = {f.name for f in files}
    if set(recorded) != names:
        raise ModelFolderError(f"{model_dir}: the weight files {sorted(names)} are not the ones recorded when it was "
                               f"written {sorted(recorded)}; export the model again")
    for f in files:
        entry = recorded[f.name]
        if f.stat().st_size != entry["bytes"] or (checksums and _sha256(f) != entry["sha256"]):
            raise ModelFolderError(f"{f}: changed since it was written (size or sha256 differs from {MANIFEST}); "
                                   "the weights are damaged: export the model again")
