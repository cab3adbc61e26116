"""Which prompts an RL step draws, and their frame budgets: a pure function of the step.

Shared by the trainer (`rl/worker.py`) and replay (`rl/replay.py`), which checks a step's draws
log against it; it lives apart from both so neither imports the other.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from paravt_core.config import PipelineConfig
from paravt_core.rl.grpo import frame_budget
from paravt_core.sft.worker import sample_index


def step_prompts(prompts: list, step: int, per_step: int, rank: int, world: int, seed: int) -> tuple[list, int]:
    """This rank's prompts for `step` (a pure function of step: resumable) and the epoch."""
    orders: dict[int, np.ndarray] = {}
    if per_step % world:
        raise ValueError(f"rl.prompts_per_step ({per_step}) is not a multiple of the {world} ranks")
    per_rank = per_step // world
    first = step * per_rank * world + rank * per_rank
    picked = [prompts[sample_index(first + k, len(prompts), seed, orders)] for k in range(per_rank)]
    return picked, first // len(prompts)


def step_plan(prompts: list, cfg: PipelineConfig, step: int, rank: int, world: int) -> tuple[list, int]:
    """This rank's prompts of `step` (0-based) with their frame budget K set (nFrames gating,
    SPEC §5; None without gating), and the epoch: what the step draws before its rollout, and
    what replay checks a draws log against (`rl/replay.py`)."""
    picked, epoch = step_prompts(prompts, step, cfg.rl.prompts_per_step, rank, world, cfg.run.seed)
    gating = cfg.rl.gating
    planned = []
    for p in picked:
        k = frame_budget(cfg.run.seed, p.prompt.prompt_id, epoch, gating.choices, gating.draw_key) \
            if gating.enabled else None
        planned.append(dataclasses.replace(p, prompt=dataclasses.replace(p.prompt, nframes=k)))
    return planned, epoch
