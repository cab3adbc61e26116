"""SPEC §5 pure parts: gating hash, shaped rewards, group advantages, PPO-clip loss, KL."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
import torch

from paravt_core.rl.grpo import (
    frame_budget,
    group_advantages,
    kl_per_token,
    policy_loss,
    sequence_kl,
    shaped_reward,
    token_advantages,
)

CHOICES = (4, 8, 16, 32, 64)


def test_frame_budget_is_stable_across_processes():
    here = [frame_budget(7, f"p{i}", 0, CHOICES) for i in range(20)]
    code = "from paravt_core.rl.grpo import frame_budget; print([frame_budget(7, f'p{i}', 0, (4, 8, 16, 32, 64)) for i in range(20)])"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert str(here) == other.strip()


def test_frame_budget_covers_choices_uniformly_and_varies_by_epoch():
    counts = Counter(frame_budget(0, f"prompt-{i}", 0, CHOICES) for i in range(5000))
    assert set(counts) == set(CHOICES)
    assert all(abs(c / 5000 - 0.2) < 0.03 for c in counts.values())
    changed = sum(frame_budget(0, f"p{i}", 0, CHOICES) != frame_budget(0, f"p{i}", 1, CHOICES) for i in range(200))
    assert changed > 100  # a new epoch redraws K (4 of 5 draws differ on average)


def test_shaped_reward():
    # (1.0 - 0.2) * 10 = 8; (0 - 0.2) * 10 = -2
    assert shaped_reward(torch.tensor([1.0, 0.0])).tolist() == pytest.approx([8.0, -2.0])


def test_group_advantages_normalize_within_groups():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 5.0, 5.0, 5.0, 5.0])
    adv = group_advantages(rewards, group_size=4)
    # group 1: mean 0.5, unbiased std sqrt(1/3)=0.57735 -> +-0.866025
    assert adv[:4].tolist() == pytest.approx([0.866025, -0.866025, 0.866025, -0.866025], abs=1e-5)
    # group 2: all equal -> zero advantage, no division blow-up
    assert adv[4:].tolist() == pytest.approx([0.0] * 4)


def test_token_advantages_anchor_only_structural_tokens():
    mask = torch.tensor([[1, 1, 1, 0]])
    structural = torch.tensor([[True, False, True, True]])
    adv = token_advantages(torch.tensor([2.0]), mask, torch.tensor([0.5]), structural)
    # trained tokens get 2; structural trained tokens 2 + 0.5; the untrained (mask 0) token 0
    assert adv.tolist() == [[2.5, 2.0, 2.5, 0.0]]
    assert token_advantages(torch.tensor([2.0]), mask).tolist() == [[2.0, 2.0, 2.0, 0.0]]


def test_policy_loss_clips_and_averages_tokens():
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.0, 1.5, 0.5]]))  # ratios 1, 1.5, 0.5
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0]])
    loss, frac = policy_loss(logp, old, adv, mask, clip_eps=0.2)
    # per token: -min(1,1)=-1; -min(1.5, 1.2)=-1.2; -min(-0.5, -0.8)=0.8 -> mean -1.4/3
    assert loss.item() == pytest.approx(-1.4 / 3, abs=1e-6)
    assert frac.item() == pytest.approx(2 / 3)


def test_policy_loss_ignores_masked_tokens_and_gradients_flow():
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros(1, 2), torch.tensor([[1.0, 100.0]]), torch.tensor([[1.0, 0.0]]))
    loss.backward()
    assert logp.grad.tolist() == [[-1.0, 0.0]]


def test_kl_is_zero_at_reference_and_positive_elsewhere():
    logp = torch.log(torch.tensor([[0.5, 0.25]]))
    assert kl_per_token(logp, logp).abs().max().item() == 0.0
    ref = torch.log(torch.tensor([[0.25, 0.25]]))
    # delta = ln(0.5) on token 0: exp(delta) - delta - 1 = 0.5 + 0.693147 - 1 = 0.193147
    assert kl_per_token(logp, ref)[0, 0].item() == pytest.approx(0.193147, abs=1e-5)
    assert sequence_kl(logp, ref, torch.tensor([[1.0, 1.0]])).item() == pytest.approx(0.193147, abs=1e-5)
