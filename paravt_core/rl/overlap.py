"""One-step off-policy PARA-GRPO: the next step's rollout overlapped with training (issue #65).

`rl.overlap: 0` is the synchronous step (`rl/worker.py`): step n rolls out its batch with the
weights W(n-1) (W(k): the policy after k optimizer steps, W(0) the init model), trains on it,
and pushes W(n) to the rollout engine. `rl.overlap: 1` is this module's schedule (issue #65,
Build item 1), with steps counted from 1 as metrics.jsonl and the checkpoints count them:

- While the trainer trains step n (from W(n-1) to W(n)), the engine generates step n+1's batch
  with W(n-1), the weights that step starts from, never with whatever it happens to hold.
- W(n) is pushed after step n is trained and before the generation of step n+2 begins (and
  after step n+1's generation has ended: the engine's weights change only between batches).
- So step n's batch was generated with W(max(n-2, 0)) (`behaviour_version`): steps 1 and 2
  both with the init model, then one step behind the weights the trainer starts the step
  from. The issue's "the batch generated with weights W(n-1)" holds for n = 1 only; its
  other two sentences (above) fix the rest, and this is the one schedule meeting both.

Every choice is a function of the step index alone: which weights generate which batch, and
when they are pushed, never of which side finishes first (the trainer waits for the rollout
of step n+1 before it pushes W(n); the engine waits for the push). With the draws that make
a batch (`rl/replay.py`: prompts, K, sampler seed) a run is a fixed function of its draws, so
two runs give the same weights and `paravt rl-replay` rebuilds any step's batch from the
checkpoint of its `behaviour_version`.

The loss (SPEC §5 step 5, decoupled PPO, `rl/policy.micro_batch_loss`): the behaviour
log-probs are the engine's for the weights that generated the batch (the episodes'
`old_logprobs`, W(n-2)); the proximal log-probs are the trainer's before the update, W(n-1)
(its one optimizer step per batch makes them the forward's detached log-probs); tokens whose
behaviour weight pi_prox / pi_behaviour exceeds `rl.behaviour_weight_cap` are dropped. The
config refuses `rl.overlap: 1` without `rl.decoupled_ppo`.

Resume: the checkpoint after step n is written once step n+1's batch has been generated, and
that batch (generated with W(n-1), which no checkpoint need hold) is saved beside it, per rank
(`inflight_path`); a resumed run trains step n+1 on it, so a run killed after any step ends
with the weights of one never killed.

Logged per step (beside the worker's split of the trainer's time): `behaviour_version`,
`time_rollout_s` (the wall time of generating this step's batch, whenever it ran),
`time_push_s` (the push before the next batch, with the served-policy probe on a server),
`time_trainer_idle_s` (the trainer waiting for a batch within the step) and
`time_rollout_idle_s` (the engine generating nothing within the step: waiting for the push,
or with no next batch to make).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paravt_core.atomic import atomic_write_bytes


def thread_share(rank_threads: int, trainer: int | None, engine: int | None) -> tuple[int, int]:
    """(trainer, engine) torch threads of a rank whose `rank_threads` are split with its engine
    process (`rl.overlap_trainer_threads`, `rl.overlap_engine_threads`; None: the engine half,
    rounded down, the trainer the rest; whichever is unset takes what the other leaves; each at least 1)."""
    if engine is None:
        engine = rank_threads - trainer if trainer is not None else rank_threads // 2
    engine = max(1, engine)
    return (max(1, rank_threads - engine) if trainer is None else trainer), engine


def behaviour_version(step: int, overlap: int) -> int:
    """The weight version (optimizer steps applied) that generates the batch of 0-based `step`."""
    return step if not overlap else max(step - 1, 0)


@dataclass
class Batch:
    """One step's rollout: what `rollout` returned for it, its weight version and its wall time."""

    step: int  # 0-based
    version: int
    seconds: float
    data: Any


def timed_rollout(rollout: Callable[[int], Any], step: int, overlap: int) -> Batch:
    t0 = time.perf_counter()
    data = rollout(step)
    return Batch(step, behaviour_version(step, overlap), time.perf_counter() - t0, data)


def run_overlapped(start: int, stop: int, held: int, first: Batch | None, rollout: Callable[[int], Any],
                   train: Callable[[int, Batch], dict[str, float]], push: Callable[[], None],
                   finish: Callable[[int, dict[str, float], Batch | None], None]) -> None:
    """Steps `start`..`stop - 1` (0-based) under the module's schedule.

    Args:
        held: the weight version the engine holds now.
        first: step `start`'s batch when it was saved (a resumed run), else None: it is generated
            first, and then `held` must be its version.
        rollout: the step's batch on the engine as it is (run in a background thread).
        train: one optimizer step on a batch (the trainer's weights go from W(step) to W(step + 1)),
            returning the step's metrics row.
        push: the trainer's current weights to the engine, called with their version (`step`).
        finish: after the step and the next batch's rollout: the row (with this module's fields),
            and the next step's batch (None after the last step).
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="paravt-rollout") as background:
        for step in range(start, stop):
            begun = time.perf_counter()
            busy = waited = 0.0
            batch = first
            if batch is None:
                if held != behaviour_version(step, 1):
                    raise RuntimeError(f"step {step + 1}'s batch is made with W({behaviour_version(step, 1)}), but "
                                       f"the engine holds W({held})")
                batch = timed_rollout(rollout, step, 1)
                busy = waited = batch.seconds
            pending = None
            pushed = 0.0
            if step + 1 < stop:
                if held != step:  # W(step) is the trainer's now: pushed before step + 1's batch is begun
                    t0 = time.perf_counter()
                    push(step)
                    pushed = time.perf_counter() - t0
                    held = step
                pending = background.submit(timed_rollout, rollout, step + 1, 1)
            row = train(step, batch)
            following = None
            if pending is not None:
                t0 = time.perf_counter()
                following = pending.result()
                waited += time.perf_counter() - t0
                busy += following.seconds
            row.update(behaviour_version=float(batch.version), time_rollout_s=batch.seconds, time_push_s=pushed,
                       time_trainer_idle_s=waited, time_rollout_idle_s=max(time.perf_counter() - begun - busy, 0.0))
            finish(step, row, following)
            first = following


def inflight_path(checkpoint_dir: Path, step: int, rank: int) -> Path:
    """Where the batch of 1-based `step`, generated before the checkpoint after step - 1, is saved."""
    return Path(checkpoint_dir) / "inflight" / f"step{step:07d}-rank{rank}.pt"


def save_inflight(checkpoint_dir: Path, batch: Batch, rank: int) -> None:
    """Save the next step's batch (written before its checkpoint, so a checkpoint implies it)."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save({"step": batch.step, "version": batch.version, "seconds": batch.seconds, "data": batch.data}, buffer)
    atomic_write_bytes(inflight_path(checkpoint_dir, batch.step + 1, rank), buffer.getvalue())


def prune_inflight(checkpoint_dir: Path, rank: int) -> None:
    """Delete this rank's saved batches whose checkpoint (the step before theirs) is gone."""
    for path in (Path(checkpoint_dir) / "inflight").glob(f"step*-rank{rank}.pt"):
        step = int(path.name[4:11])
        if not (Path(checkpoint_dir) / f"step{step - 1:07d}").is_dir():
            path.unlink(missing_ok=True)


def load_inflight(checkpoint_dir: Path, step: int, rank: int) -> Batch:
    """The saved batch of 0-based `step` (a run resumed from the checkpoint after `step` steps).

    Raises:
        FileNotFoundError: none saved (the message says what to do).
    """
    import torch

    path = inflight_path(checkpoint_dir, step + 1, rank)
    if not path.is_file():
        raise FileNotFoundError(f"rl.overlap: 1 resumes from the checkpoint after step {step} with step {step + 1}'s "
                                f"batch saved beside it, and {path} is missing: delete the run folder's checkpoints "
                                "to start the stage over, or restore the file")
    saved = torch.load(path, map_location="cpu", weights_only=False)
    if saved["step"] != step or saved["version"] != behaviour_version(step, 1):
        raise ValueError(f"{path} holds step {saved['step'] + 1}'s batch of W({saved['version']}), not step "
                         f"{step + 1}'s: restore the file or delete the run folder's checkpoints")
    return Batch(step, saved["version"], saved["seconds"], saved["data"])


@dataclass(frozen=True)
class StepSplit:
    """Median seconds of a synchronous run's steps (its `metrics.jsonl`), by phase."""

    rollout: float
    reference: float
    train: float  # policy pass and update
    push: float
    steps: tuple[int, int]  # the first and last step the medians are over

    @property
    def synchronous(self) -> float:
        """`rl.overlap: 0`: every phase in turn."""
        return self.rollout + self.reference + self.train + self.push

    @property
    def overlapped(self) -> float:
        """`rl.overlap: 1` (this module's schedule): the push, then the next batch's rollout beside
        the step's passes. A floor where both sides share hardware: they then slow each other."""
        return max(self.rollout, self.reference + self.train) + self.push


SPLIT_KEYS = ("time_rollout_s", "time_reference_s", "time_train_s", "time_push_s")


def step_split(rows: Sequence[dict], source: str) -> StepSplit:
    """The phases of a synchronous run's step log rows (step 1, which warms up, left out when there
    are more); `source` names the log in errors.

    Raises:
        ValueError: no rows, a row without the phases (a log written before `time_push_s`), or
            rows of an overlapped run (their phases ran side by side).
    """
    if not rows:
        raise ValueError(f"{source} holds no RL steps")
    for row in rows:
        missing = [key for key in SPLIT_KEYS if key not in row]
        if missing:
            raise ValueError(f"{source}: step {row.get('step')} has no {missing}; the estimate needs a step log "
                             "written by this version of the RL stage")
        if row.get("behaviour_version", row["step"] - 1) != row["step"] - 1:
            raise ValueError(f"{source}: step {row['step']} was rolled out by W({int(row['behaviour_version'])}), "
                             "an overlapped run's; the estimate needs a synchronous run's (rl.overlap: 0)")
    used = [row for row in rows if row["step"] > 1] or list(rows)
    medians = [statistics.median(float(row[key]) for row in used) for key in SPLIT_KEYS]
    return StepSplit(*medians, steps=(used[0]["step"], used[-1]["step"]))


def read_step_split(path: Path) -> StepSplit:
    """`step_split` of a run's `metrics.jsonl` at `path`."""
    try:
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read the step log {path}: {error}") from None
    return step_split(rows, str(path))


def format_estimate(split: StepSplit, source: str) -> list[str]:
    """The plan's lines for `rl.overlap` from a synchronous run's measured split."""
    first, last = split.steps
    return [f"RL step without and with rl.overlap (measured phases: medians of steps {first}-{last} of the "
            f"synchronous run {source}; the overlapped step is max(rollout, reference + policy) + push, a floor "
            "where rollout and trainer share hardware)",
            "| rollout s | reference s | policy and update s | push s | rl.overlap 0 s | rl.overlap 1 s | ratio |",
            "|---:|---:|---:|---:|---:|---:|---:|",
            f"| {split.rollout:.2f} | {split.reference:.2f} | {split.train:.2f} | {split.push:.2f} | "
            f"{split.synchronous:.2f} | {split.overlapped:.2f} | {split.overlapped / split.synchronous:.2f}x |"]
