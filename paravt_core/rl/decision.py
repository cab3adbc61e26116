"""The main agent's decision token and what its advantage is made of (#62 item 2).

The decision token is the main agent's first token that chooses between cropping and answering:
its first trained token after the think prefix, as `paravt miniature opening-probe` reads it
(the first position after `<think>\\n`). A row with `rl.rollout.think_prefix` has the prefix in
its prompt, so it is the first trained token; a row without (vanilla GRPO) writes `<think>` and
the newline itself, and those trained tokens are skipped.

That token's final advantage (after SPEC §5 steps 1-4) is split into the parts that make it:

    advantage = task + kl + format + shift

- `task`: the episode's group-normalized scalar (step 2; with `kl_mode: sequence_reward` its KL
  is inside it), which `token_advantages` adds at the last trained token and every earlier one
  carries as reward to go;
- `kl`: the per-token KL reward summed from the decision token to the end (step 3,
  `kl_mode: token_reward`; 0 in the other modes);
- `format`: token anchoring's format advantage where the token is structural (0 otherwise);
- `shift`: batch normalization's -mean / (std + eps) (step 4; 0 without it).

`task`, `kl` and `format` are given as batch normalization scales them (divided by std + eps),
so the four parts add up to the advantage the loss uses. Each part is computed from the step's
inputs (the scalars, the KL rewards, the batch moments), not from the advantage itself: the
sum matching the advantage is the check that the split is the trainer's own arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from paravt_core.config import RLConfig
from paravt_core.rl.grpo import Moments
from paravt_core.rl.kl import kl_mode


def decision_index(token_ids: torch.Tensor, loss_mask: torch.Tensor, lead: Sequence[int] = ()) -> int | None:
    """The position of the decision token in a main-agent trajectory (module docstring).

    Args:
        lead: the think prefix's token ids when the rollouts write it themselves (no
            `rl.rollout.think_prefix`); skipped when the trained tokens open with exactly them.
    Returns:
        Its index in `token_ids`; None when no trained token follows the lead.
    """
    trained = torch.nonzero(loss_mask.bool(), as_tuple=False).flatten().tolist()
    skip = len(lead) if lead and [int(token_ids[i]) for i in trained[:len(lead)]] == list(lead) else 0
    return trained[skip] if skip < len(trained) else None


@dataclass(frozen=True)
class DecisionParts:
    """One episode's decision token: where it is among the trained tokens, its id, its final
    advantage and the four parts that sum to it (module docstring)."""

    position: int  # among the main agent's trained tokens, from 0
    token_id: int
    advantage: float
    task: float
    kl: float
    format: float
    shift: float

    def record(self) -> dict[str, float | int]:
        """The episode log's `decision_*` keys."""
        return {f"decision_{key}": value for key, value in asdict(self).items()}


def decision_parts(trajectories: Sequence, scalars: torch.Tensor, format_scalars: torch.Tensor | None,
                   cfg: RLConfig, moments: Moments | None, lead: Sequence[int] = ()) -> dict[int, DecisionParts]:
    """Episode index -> its decision token's parts, for every main-agent trajectory with one.

    Args:
        trajectories: the step's `rl.policy.Trajectory`s, with their final `advantages` and
            (KL to the reference) `ref_logprobs`; sub-agent trajectories are passed over.
        scalars: [E] the step's normalized scalars (`StepAdvantages.per_episode`);
            `format_scalars` [E] token anchoring's (`format_per_episode`), else None.
        moments: the batch moments step 4 normalized with (all ranks'); None: no step 4.
        lead: as `decision_index`.
    """
    mean, std = moments.mean_std() if moments is not None else (0.0, None)
    scale = 1.0 / (std + cfg.adv_eps) if std is not None else 1.0
    kl = kl_mode(cfg)
    out: dict[int, DecisionParts] = {}
    for t in trajectories:
        if t.is_subagent:
            continue
        index = decision_index(t.token_ids, t.loss_mask, lead)
        if index is None:
            continue
        mask = t.loss_mask.to(torch.float64)
        reward = kl.token_reward(t.old_logprobs, t.ref_logprobs)
        kl_to_go = float((reward.to(torch.float64) * mask)[index:].sum()) if reward is not None else 0.0
        fmt = 0.0
        if format_scalars is not None and t.structural is not None and bool(t.structural[index]):
            fmt = float(format_scalars[t.episode])
        trained_before = int(mask[:index].sum())
        out[t.episode] = DecisionParts(
            position=trained_before, token_id=int(t.token_ids[index]), advantage=float(t.advantages[index]),
            task=float(scalars[t.episode]) * scale, kl=kl_to_go * scale, format=fmt * scale, shift=-mean * scale)
    return out


def decision_metrics(parts: dict[int, DecisionParts], moments: Moments | None, eps: float) -> dict[str, float]:
    """The step metrics of the decision tokens on this rank: the mean size of each part, the
    shift, and the scale step 4 multiplied every advantage by (1 / (std + eps); 1 without it).
    A step whose groups mostly have equal rewards has a small std: its scale is large, and the
    KL part and the shift then reach the size a task scalar has in other steps."""
    scale = 1.0 / (moments.mean_std()[1] + eps) if moments is not None else 1.0
    if not parts:
        return {"batch_norm_scale": scale, DECISION_TOKENS: 0.0}
    values = list(parts.values())

    def mean_abs(name: str) -> float:
        return sum(abs(getattr(p, name)) for p in values) / len(values)

    return {"decision_task_abs": mean_abs("task"), "decision_kl_abs": mean_abs("kl"),
            "decision_format_abs": mean_abs("format"), "decision_shift": values[0].shift,
            "decision_advantage_abs": mean_abs("advantage"), "batch_norm_scale": scale,
            DECISION_TOKENS: float(len(values))}


# This rank's decision tokens: the weight of its `decision_*` means when the ranks' rows are
# combined (`combine_rank_rows`), and summed there.
DECISION_TOKENS = "decision_tokens"


def combine_rank_rows(rows: list[dict[str, float]]) -> dict[str, float]:
    """One step's metrics from every rank's row. A metric is the mean over the ranks that report
    it (a rank without decision tokens reports no `decision_*` mean, and counts as absent, not as
    0); the `decision_*` means are weighted by each rank's decision tokens, whose count is summed,
    so the step's value is the mean over all its decision tokens whatever rank holds them."""
    keys = sorted({k for row in rows for k in row})
    out = {}
    for key in keys:
        present = [row for row in rows if key in row]
        if key == DECISION_TOKENS:
            out[key] = float(sum(row[key] for row in present))
        elif key.startswith("decision_") and sum(row.get(DECISION_TOKENS, 0.0) for row in present) > 0:
            weights = [row.get(DECISION_TOKENS, 0.0) for row in present]
            out[key] = float(sum(w * row[key] for w, row in zip(weights, present)) / sum(weights))
        else:
            out[key] = float(np.mean([row[key] for row in present]))  # as before this split (#62)
    return out
