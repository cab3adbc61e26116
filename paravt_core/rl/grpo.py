"""PARA-GRPO's pure parts (SPEC §5): frame budgets, shaped rewards, group advantages, losses.

Departures from the release, point by point:
- nFrames gating draws K from a stable hash of (seed, prompt id, epoch) and K really sets
  the overview frame count (the release's default config overrides it with fps sampling);
- `anchoring_mode: token` implements the paper's wording: the format term's
  group-normalized advantage lands only on structural tokens, every other token gets the
  advantage of R_acc + R_tool (the release only has the sequence mode);
- the group std is the unbiased sample std (as torch.std), plus 1e-6;
- the KL to the reference uses the non-negative k3 estimator exp(ref - logp) - (ref - logp) - 1
  per token; `kl_mode: reward` subtracts kl_coef times its sum over an episode's generated
  main-agent tokens (under the rollout's log-probs) from R before shaping, `kl_mode: loss`
  adds kl_coef times its token mean to the loss. SPEC §5 names the coefficient and the two
  modes but not the estimator.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch


def frame_budget(seed: int, prompt_id: str, epoch: int, choices: Sequence[int]) -> int:
    """K ~ Uniform(choices) for one prompt, the same in every process (not Python's hash())."""
    digest = hashlib.sha256(f"{seed}|{prompt_id}|{epoch}".encode()).digest()
    return int(choices[int.from_bytes(digest[:8], "big") % len(choices)])


def shaped_reward(reward: torch.Tensor, shift: float = 0.2, scale: float = 10.0) -> torch.Tensor:
    """r -> (r - shift) * scale (SPEC §5)."""
    return (reward - shift) * scale


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """(r - group mean) / (group std + eps) for rewards laid out group after group.

    Args:
        rewards: [P * G] scalar rewards, the G rollouts of each prompt contiguous.
    Returns:
        [P * G] advantages.
    """
    grouped = rewards.view(-1, group_size)  # [P, G]
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(mean)
    return ((grouped - mean) / (std + eps)).reshape(-1)


def token_advantages(
    seq_advantage: torch.Tensor,  # [B]
    mask: torch.Tensor,  # [B, L] 1 on trained tokens
    format_advantage: torch.Tensor | None = None,  # [B], token anchoring only
    structural: torch.Tensor | None = None,  # [B, L] bool, token anchoring only
) -> torch.Tensor:
    """Per-token advantages [B, L]: the sequence advantage on every trained token, plus
    (token anchoring) the format advantage on structural tokens."""
    adv = seq_advantage[:, None] * mask
    if format_advantage is not None:
        if structural is None:
            raise ValueError("token anchoring needs the structural-token mask")
        adv = adv + format_advantage[:, None] * (structural & mask.bool())
    return adv


def policy_loss(
    logp: torch.Tensor,  # [B, L] log-probs under the current policy
    old_logp: torch.Tensor,  # [B, L] log-probs under the rollout policy
    advantages: torch.Tensor,  # [B, L]
    mask: torch.Tensor,  # [B, L]
    clip_eps: float = 0.2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO-clip loss, token mean over the batch; returns (loss, clipped fraction)."""
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    n = mask.sum().clamp(min=1)
    loss = (per_token * mask).sum() / n
    clip_frac = (((ratio - 1.0).abs() > clip_eps).float() * mask).sum() / n
    return loss, clip_frac.detach()


def kl_per_token(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Low-variance KL estimate k3 = exp(ref - logp) - (ref - logp) - 1 (>= 0), per token."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def sequence_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Summed KL of each sequence [B] (`kl_mode: reward` subtracts coef times this from R)."""
    return (kl_per_token(logp, ref_logp) * mask).sum(dim=1)
