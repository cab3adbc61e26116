"""Cache keys for stage tasks.

A stage is cached by the hashes of what it reads (config sections, input artifact hashes),
never by path strings alone. A cached result must only be reused while the output it
points at is still on disk, so each output folder gets an "epoch" stamp beside it: the
stamp is renewed whenever the output is missing, which changes the key and re-runs the
stage; while the output stays, the stamp (and so the key) stays the same.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paravt_core.atomic import atomic_write_text
from paravt_core.model.integrity import model_dir_problem


def output_epoch(output: Path, intact: Callable[[Path], bool] | None = None) -> str:
    """The output's current epoch; a new one when the output is missing or `intact` says it is
    damaged (a model folder that lost a weight file), so its stage runs again and mends it."""
    stamp = output.parent / f".{output.name}.epoch"
    if output.exists() and stamp.is_file() and (intact is None or intact(output)):
        return stamp.read_text().strip()
    epoch = uuid.uuid4().hex[:12]
    atomic_write_text(stamp, epoch)
    return epoch


def model_intact(folder: Path) -> bool:
    return model_dir_problem(folder) is None


def stage_key(stage: str, *parts: Any, output: Path | None = None,
              intact: Callable[[Path], bool] | None = None) -> str:
    """`stage-<hash of parts>`, tied to the current epoch of `output` and to where it lies when
    one is given: cached results hold absolute paths, so an output folder moved elsewhere (its
    epoch stamp moves with it) must be a new key, and the stage finds its finished work at the
    new place (each stage returns at once when its output is complete)."""
    items = [stage, *[str(p) for p in parts]]
    if output is not None:
        items += [output_epoch(output.resolve(), intact), str(output.resolve())]
    digest = hashlib.sha256(json.dumps(items).encode()).hexdigest()[:24]
    return f"{stage}-{digest}"
