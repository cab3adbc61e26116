"""KL to the frozen reference, one object per `rl.kl_mode`, each owning its coefficient (SPEC §5).

- `token_reward` (the release, step 3): -kl_coef * k1 per generated token, k1 clamped to
  [-kl_clamp, kl_clamp], added to the token advantages AFTER the group statistics.
- `sequence_reward` (older variant): kl_coef times the episode's summed k3 subtracted from its
  scalar reward BEFORE the group statistics.
- `loss` (older variant): kl_coef times the summed k3 of the trained tokens added to the loss.
- `none`: no reference model is loaded and nothing is added.

The trainer asks the configured mode (`kl_mode(cfg)`) at each of the four places KL can
enter (`rl/policy.py`); a mode that does not act at a place returns its input or None (the
loss term: `in_loss` false). A new
mode is a class here registered in `KL_MODES` and its name in `RLConfig.kl_mode`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from paravt_core.config import RLConfig
from paravt_core.rl.grpo import kl_k1, kl_per_token, sequence_kl


@dataclass(frozen=True)
class KLMode:
    """No KL (`kl_mode: none`); the base of the other modes, which override where they act."""

    coef: float
    clamp: float | None = None
    name: ClassVar[str] = "none"
    needs_reference: ClassVar[bool] = False  # the trainer loads the frozen reference model
    in_loss: ClassVar[bool] = False  # `loss_term` adds to the micro-batch loss

    def episode_estimate(self, old_logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                         mask: torch.Tensor) -> torch.Tensor | float:
        """The KL estimate summed over one episode's generated tokens (logged as `kl`); k3 under
        the rollout's log-probs unless the mode says otherwise. `mask` [L] float."""
        return sequence_kl(old_logprobs[None], ref_logprobs[None], mask[None])[0]

    def shaped_scalars(self, rewards: torch.Tensor, seq_kl: torch.Tensor) -> torch.Tensor:
        """The episodes' scalar rewards [E] before the group statistics."""
        return rewards

    def token_reward(self, old_logprobs: torch.Tensor, ref_logprobs: torch.Tensor | None) -> torch.Tensor | None:
        """A per-token reward [L] added to the token advantages after the group statistics."""
        return None

    def loss_term(self, logp: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The term `in_loss` adds to the micro-batch loss before its token-mean scale (`logp`,
        `ref_logprobs`, `mask`: [B, L] left-padded)."""
        raise NotImplementedError(f"kl_mode {self.name} adds nothing to the loss")


@dataclass(frozen=True)
class TokenRewardKL(KLMode):
    name: ClassVar[str] = "token_reward"
    needs_reference: ClassVar[bool] = True

    def episode_estimate(self, old_logprobs, ref_logprobs, mask):
        # k1, clamped as the token reward is: the logged KL is the one the advantages carry
        return float((kl_k1(old_logprobs, ref_logprobs, self.clamp) * mask).sum())

    def token_reward(self, old_logprobs, ref_logprobs):
        if ref_logprobs is None:
            return None
        return -self.coef * kl_k1(old_logprobs, ref_logprobs, self.clamp)


@dataclass(frozen=True)
class SequenceRewardKL(KLMode):
    name: ClassVar[str] = "sequence_reward"
    needs_reference: ClassVar[bool] = True

    def shaped_scalars(self, rewards, seq_kl):
        return rewards - self.coef * seq_kl


@dataclass(frozen=True)
class LossKL(KLMode):
    name: ClassVar[str] = "loss"
    needs_reference: ClassVar[bool] = True
    in_loss: ClassVar[bool] = True

    def loss_term(self, logp, ref_logprobs, mask):
        return self.coef * (kl_per_token(logp, ref_logprobs) * mask).sum()


KL_MODES: dict[str, type[KLMode]] = {mode.name: mode for mode in (TokenRewardKL, SequenceRewardKL, LossKL, KLMode)}


def kl_mode(cfg: RLConfig) -> KLMode:
    """The configured mode with its coefficient (and k1 clamp)."""
    return KL_MODES[cfg.kl_mode](cfg.kl_coef, cfg.kl_clamp)
