"""Training checkpoints: save, resume, prune.

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

import json
from pathlib import Path
from typing import Any

from paravt_core.atomic import atomic_write_text
from paravt_core.dist.launch import LogLine
from paravt_core.refs import file_hash


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
