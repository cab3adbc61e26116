"""KL modes as objects owning their coefficient (`rl/kl.py`, SPEC §5): each acts where its
formula says, bit for bit, and nowhere else; every `rl.kl_mode` the config accepts has one."""

from __future__ import annotations

import typing

import pytest
import torch

from paravt_core.config import RLConfig
from paravt_core.rl.grpo import kl_k1, kl_per_token, sequence_kl
from paravt_core.rl.kl import KL_MODES, kl_mode

g = torch.Generator().manual_seed(3)
OLD, REF = -torch.rand(9, generator=g) * 30, -torch.rand(9, generator=g) * 30  # k1 past the clamp
MASK = (torch.rand(9, generator=g) > 0.3).float()
REWARDS, SEQ_KL = torch.rand(4, generator=g), torch.rand(4, generator=g) * 5


def test_every_configurable_mode_has_an_object():
    accepted = typing.get_args(RLConfig.model_fields["kl_mode"].annotation)
    assert sorted(accepted) == sorted(KL_MODES)
    assert all(kl_mode(RLConfig(kl_mode=name)).name == name for name in accepted)


@pytest.mark.parametrize("name", ["token_reward", "sequence_reward", "loss", "none"])
def test_each_mode_acts_where_its_formula_says(name):
    cfg = RLConfig(kl_mode=name, kl_coef=0.037, kl_clamp=3.0)
    mode = kl_mode(cfg)
    assert mode.needs_reference == (name != "none") and mode.in_loss == (name == "loss")

    token = mode.token_reward(OLD, REF)
    if name == "token_reward":  # step 3: -coef * k1, clamped
        assert torch.equal(token, -0.037 * kl_k1(OLD, REF, 3.0)) and token.abs().max() == pytest.approx(0.037 * 3)
        assert mode.token_reward(OLD, None) is None
    else:
        assert token is None

    shaped = mode.shaped_scalars(REWARDS, SEQ_KL)
    want = REWARDS - 0.037 * SEQ_KL if name == "sequence_reward" else REWARDS
    assert torch.equal(shaped, want)

    logged = torch.as_tensor(mode.episode_estimate(OLD, REF, MASK))
    if name == "token_reward":  # the logged KL is the clamped k1 the advantages carry
        assert logged == float((kl_k1(OLD, REF, 3.0) * MASK).sum())
    else:
        assert torch.equal(logged, sequence_kl(OLD[None], REF[None], MASK[None])[0])

    if name == "loss":
        assert torch.equal(mode.loss_term(OLD[None], REF[None], MASK[None]),
                           0.037 * (kl_per_token(OLD[None], REF[None]) * MASK[None]).sum())
    else:
        with pytest.raises(NotImplementedError):
            mode.loss_term(OLD[None], REF[None], MASK[None])
