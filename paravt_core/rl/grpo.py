"""PARA-GRPO's pure parts (SPEC §5): frame budgets, the advantage pipeline, losses.

The release's advantage pipeline, in order (SPEC §5 steps 1-5), each a switch in
`RLConfig` so the simpler variant stays reachable as an ablation row:
1. `shaped_reward`: r -> (r - 0.2) * 10, clipped to [-20, 20] (`reward_clip`; None: no clip).
2. `group_advantages`: (x - group mean) / (group std + eps) of the task reward only.
3. `kl_mode: token_reward`: KL to the frozen reference enters as a per-token reward
   -kl_coef * k1, k1 = logp_rollout - logp_ref, on each generated token, AFTER the group
   statistics; the normalized scalar is added at the last generated token and a token's
   advantage is the sum of rewards from it to the end (`token_advantages`: discount 1,
   GAE lambda 1, no critic). So a saturated group (equal R) gets zero scalar advantage and
   only the small KL term, never a full-scale KL-driven advantage.
4. `batch_normalize`: mean and std over every trained token of the step's batch.
5. `policy_loss` with `behaviour_weight`: decoupled PPO. The ratio is taken against the
   trainer's own log-probs before the update (the proximal policy; `rl/policy.py` says why
   no extra pass computes them); the loss of a
   token is weighted by its behaviour weight pi_prox / pi_rollout, and tokens whose weight
   exceeds the cap (5) are dropped (weight 0), as AReaL's decoupled loss does.

Departures from the release and points the SPEC leaves open, decided here:
- nFrames gating draws K from a stable hash of (seed, prompt id, epoch) and K really sets
  the overview frame count (the release's default config overrides it with fps sampling);
- `anchoring_mode: token` implements the paper's wording: the format term is shaped,
  clipped and group-normalized on its own and added to the advantage of structural
  tokens only (after step 3, before step 4); every other token carries R_acc + R_tool;
- group and batch std are the unbiased sample std (as torch.std), plus eps (`rl.adv_eps`,
  the release's 1e-5);
- the reference is scored at `rl.ref_temperature` (1.0 as the release, while the policy's
  log-probs are at the rollout temperature; None scores both at the rollout temperature,
  our fix as its own row) and k1 is clamped to [-10, 10] (`rl.kl_clamp`), as the release;
- with sub-agents trained, step 4's moments are over main-agent tokens only
  (`rl.moments_main_agent_only`), and token anchoring's format advantage goes to main-agent
  trajectories only, so the main agent trains as in the release whatever the call count;
- the older variants stay as switches: `kl_mode: sequence_reward` subtracts kl_coef times
  the summed k3 = exp(ref - logp) - (ref - logp) - 1 from R before shaping (KL inside the
  group statistics: the issue the release's order avoids), `kl_mode: loss` adds kl_coef
  times the token-mean k3 to the loss, `none` drops the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from paravt_core.video.sampling import frame_budget_of

ADV_EPS = 1e-5  # the release's eps of steps 2 and 4 (SPEC §5); `rl.adv_eps`


def frame_budget(seed: int, prompt_id: str, epoch: int, choices: Sequence[int], draw_key: int = 0) -> int:
    """K ~ Uniform(choices) for one prompt, the same in every process (not Python's hash());
    `draw_key` (rl.gating.draw_key) > 0 draws another K for the same seed."""
    suffix = f"|key{draw_key}" if draw_key else ""
    return frame_budget_of(f"{seed}|{prompt_id}|{epoch}{suffix}", choices)


def shaped_reward(reward: torch.Tensor, shift: float = 0.2, scale: float = 10.0,
                  clip: float | None = None) -> torch.Tensor:
    """r -> (r - shift) * scale, then clipped to [-clip, clip] when `clip` is set (SPEC §5 step 1)."""
    shaped = (reward - shift) * scale
    return shaped if clip is None else shaped.clamp(-clip, clip)


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = ADV_EPS) -> torch.Tensor:
    """(r - group mean) / (group std + eps) for rewards laid out group after group (step 2).

    Args:
        rewards: [P * G] scalar rewards, the G rollouts of each prompt contiguous.
    Returns:
        [P * G] advantages.
    """
    grouped = rewards.view(-1, group_size)  # [P, G]
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(mean)
    return ((grouped - mean) / (std + eps)).reshape(-1)


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor, clamp: float | None = None) -> torch.Tensor:
    """k1 = logp - ref_logp per token (the release's per-token KL reward estimator, step 3),
    clamped to [-clamp, clamp] as the release does when `clamp` is set."""
    k1 = logp - ref_logp
    return k1 if clamp is None else k1.clamp(-clamp, clamp)


def token_advantages(
    scalar: torch.Tensor,  # [] the trajectory's normalized scalar advantage
    mask: torch.Tensor,  # [L] 1 on trained (generated) tokens
    kl_reward: torch.Tensor | None = None,  # [L] per-token KL reward (-kl_coef * k1), step 3
    format_advantage: torch.Tensor | None = None,  # [] token anchoring only
    structural: torch.Tensor | None = None,  # [L] bool, token anchoring only
) -> torch.Tensor:
    """A trajectory's per-token advantages [L] (SPEC §5 step 3).

    Token rewards: `kl_reward` on trained tokens, plus `scalar` at the last trained token;
    each trained token's advantage is the sum of the rewards from it to the end (reward to
    go). Without a KL reward this is `scalar` on every trained token. With token anchoring,
    `format_advantage` is added on trained structural tokens.
    """
    mask_f = mask.to(torch.float32)
    rewards = torch.zeros_like(mask_f) if kl_reward is None else kl_reward.to(torch.float32) * mask_f
    trained = torch.nonzero(mask_f, as_tuple=False)
    if trained.numel():
        rewards[int(trained[-1])] += scalar.to(torch.float32)
    to_go = torch.flip(torch.cumsum(torch.flip(rewards, [0]), 0), [0])  # [L]
    adv = to_go * mask_f
    if format_advantage is not None:
        if structural is None:
            raise ValueError("token anchoring needs the structural-token mask")
        adv = adv + format_advantage.to(torch.float32) * (structural.bool() & mask.bool())
    return adv


@dataclass(frozen=True)
class Moments:
    """Sums over the trained tokens of a batch, additive across ranks (step 4)."""

    total: float
    total_sq: float
    count: float

    def mean_std(self) -> tuple[float, float]:
        if self.count <= 0:
            return 0.0, 0.0
        mean = self.total / self.count
        var = max(self.total_sq - self.count * mean * mean, 0.0) / max(self.count - 1.0, 1.0)
        return mean, var**0.5


def masked_moments(values: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]) -> Moments:
    """Sum, sum of squares and count of `values` where `masks` is 1 (one tensor per trajectory)."""
    total = total_sq = count = 0.0
    for v, m in zip(values, masks):
        m = m.to(torch.float64)
        v = v.to(torch.float64)
        total += float((v * m).sum())
        total_sq += float((v * v * m).sum())
        count += float(m.sum())
    return Moments(total, total_sq, count)


def batch_normalize(values: Sequence[torch.Tensor], masks: Sequence[torch.Tensor], moments: Moments | None = None,
                    eps: float = ADV_EPS) -> list[torch.Tensor]:
    """(a - batch mean) / (batch std + eps) on trained tokens, 0 elsewhere (SPEC §5 step 4).

    Args:
        moments: the batch's moments when the batch spans several ranks (summed across
            them); None computes them from `values`.
    """
    mean, std = (moments or masked_moments(values, masks)).mean_std()
    return [((v - mean) / (std + eps)) * m.to(v.dtype) for v, m in zip(values, masks)]


def behaviour_weight(prox_logp: torch.Tensor, rollout_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """pi_prox / pi_rollout per token, 0 where it exceeds `cap` (dropped, SPEC §5 step 5)."""
    weight = torch.exp(prox_logp - rollout_logp)
    return torch.where(weight <= cap, weight, torch.zeros_like(weight))


def policy_loss(
    logp: torch.Tensor,  # [B, L] log-probs under the current policy
    old_logp: torch.Tensor,  # [B, L] the ratio's denominator: rollout, or recomputed (decoupled)
    advantages: torch.Tensor,  # [B, L]
    mask: torch.Tensor,  # [B, L]
    clip_eps: float = 0.2,
    weight: torch.Tensor | None = None,  # [B, L] behaviour weight (decoupled PPO), None: 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO-clip loss, token mean over the batch; returns (loss, clipped fraction)."""
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    if weight is not None:
        per_token = per_token * weight
    n = mask.sum().clamp(min=1)
    loss = (per_token * mask).sum() / n
    clip_frac = (((ratio - 1.0).abs() > clip_eps).float() * mask).sum() / n
    return loss, clip_frac.detach()


def kl_per_token(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Low-variance KL estimate k3 = exp(ref - logp) - (ref - logp) - 1 (>= 0), per token."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def sequence_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Summed k3 of each sequence [B] (`kl_mode: sequence_reward` subtracts coef times this from R)."""
    return (kl_per_token(logp, ref_logp) * mask).sum(dim=1)
