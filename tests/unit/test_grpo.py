"""SPEC §5 pure parts: gating hash, shaped rewards, group advantages, PPO-clip loss, KL."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
import torch

from paravt_core.rl.grpo import (
    Moments,
    batch_normalize,
    behaviour_weight,
    frame_budget,
    group_advantages,
    kl_per_token,
    masked_moments,
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
    # group 1: mean 0.5, unbiased std sqrt(1/3)=0.57735 -> 0.5 / (0.57735 + 1e-5) (the release's eps, SPEC §5)
    expected = 0.5 / (0.5773503 + 1e-5)
    assert adv[:4].tolist() == pytest.approx([expected, -expected, expected, -expected], abs=1e-6)
    assert group_advantages(rewards, group_size=4, eps=1e-6)[0].item() == pytest.approx(0.866025, abs=1e-5)
    # group 2: all equal -> zero advantage, no division blow-up
    assert adv[4:].tolist() == pytest.approx([0.0] * 4)


def test_token_advantages_anchor_only_structural_tokens():
    mask = torch.tensor([1, 1, 1, 0])
    structural = torch.tensor([True, False, True, True])
    adv = token_advantages(torch.tensor(2.0), mask, None, torch.tensor(0.5), structural)
    # no KL reward: every trained token carries the scalar 2; structural trained tokens 2 + 0.5;
    # the untrained (mask 0) token 0
    assert adv.tolist() == [2.5, 2.0, 2.5, 0.0]
    assert token_advantages(torch.tensor(2.0), mask).tolist() == [2.0, 2.0, 2.0, 0.0]


def test_token_advantages_are_kl_rewards_to_go_plus_the_scalar():
    # tokens: prompt, gen, gen, tool response, gen, gen (the last generated token is index 5)
    mask = torch.tensor([0, 1, 1, 0, 1, 1])
    kl_reward = torch.tensor([9.0, -0.1, -0.2, 9.0, -0.3, -0.4])  # prompt/tool values must be ignored
    adv = token_advantages(torch.tensor(1.0), mask, kl_reward)
    # rewards on trained tokens: [0, -0.1, -0.2, 0, -0.3, -0.4 + 1.0]; reward to go from each:
    # t5: 0.6; t4: 0.3; t2: 0.1; t1: 0.0; untrained tokens 0
    assert adv.tolist() == pytest.approx([0.0, 0.0, 0.1, 0.0, 0.3, 0.6], abs=1e-6)


def test_shaped_reward_clips_at_twenty():
    # (2.2 - 0.2) * 10 = 20 exactly; 3.0 -> 28 -> 20; -5 -> -52 -> -20 (SPEC §5 step 1)
    out = shaped_reward(torch.tensor([2.2, 3.0, -5.0]), clip=20.0)
    assert out.tolist() == pytest.approx([20.0, 20.0, -20.0])
    assert shaped_reward(torch.tensor([3.0])).tolist() == pytest.approx([28.0])  # no clip unless asked


def test_batch_normalize_over_trained_tokens_only():
    values = [torch.tensor([5.0, 1.0, 3.0]), torch.tensor([7.0, 100.0])]
    masks = [torch.tensor([0, 1, 1]), torch.tensor([1, 0])]
    out = batch_normalize(values, masks)
    # trained values 1, 3, 7: mean 11/3, unbiased var ((8/3)^2 + (2/3)^2 + (10/3)^2) / 2 = 28/3
    mean, std = 11 / 3, (28 / 3) ** 0.5
    assert out[0].tolist() == pytest.approx([0.0, (1 - mean) / std, (3 - mean) / std], abs=1e-5)
    assert out[1].tolist() == pytest.approx([(7 - mean) / std, 0.0], abs=1e-5)
    # moments summed across ranks give the same result as one rank holding everything
    halves = masked_moments(values[:1], masks[:1]), masked_moments(values[1:], masks[1:])
    summed = Moments(*(a + b for a, b in zip(
        (halves[0].total, halves[0].total_sq, halves[0].count), (halves[1].total, halves[1].total_sq, halves[1].count))))
    assert batch_normalize(values[1:], masks[1:], summed)[0].tolist() == pytest.approx(out[1].tolist(), abs=1e-6)


def test_behaviour_weight_drops_tokens_above_the_cap():
    prox = torch.log(torch.tensor([0.5, 0.6, 0.9]))
    rollout = torch.log(torch.tensor([0.25, 0.1, 0.9]))
    # weights 2, 6 (> 5: dropped), 1
    assert behaviour_weight(prox, rollout, cap=5.0).tolist() == pytest.approx([2.0, 0.0, 1.0], abs=1e-5)


def test_decoupled_loss_weights_tokens_by_behaviour_weight():
    logp = torch.zeros(1, 2)
    prox = torch.zeros(1, 2)
    adv = torch.tensor([[1.0, 1.0]])
    mask = torch.ones(1, 2)
    loss, _ = policy_loss(logp, prox, adv, mask, 0.2, torch.tensor([[2.0, 0.0]]))
    # ratio 1 on both tokens: per token -1 * weight -> (-2 + 0) / 2 tokens
    assert loss.item() == pytest.approx(-1.0)


def _release_pipeline(rewards, kl_sums, tokens_per_episode=4, group_size=4, kl_coef=0.01):
    """Steps 1-4 on equal-length episodes whose per-token k1 is spread evenly over their tokens."""
    scalars = group_advantages(shaped_reward(torch.tensor(rewards), clip=20.0), group_size)
    masks = [torch.ones(tokens_per_episode) for _ in rewards]
    raw = [token_advantages(s, m, -kl_coef * torch.full((tokens_per_episode,), k / tokens_per_episode))
           for s, k, m in zip(scalars, kl_sums, masks)]
    return scalars, raw, batch_normalize(raw, masks)


def test_saturated_group_kl_never_becomes_a_full_scale_advantage():
    # Group 1: four rollouts at R = 2.8 with KL sums 3..6 (the review's case); group 2 has task signal.
    rewards = [2.8, 2.8, 2.8, 2.8, 1.0, 0.0, 1.0, 0.0]
    kl_sums = [3.0, 4.0, 5.0, 6.0, 3.0, 3.0, 3.0, 3.0]
    scalars, raw, normalized = _release_pipeline(rewards, kl_sums)
    # step 2 sees the task reward only: the saturated group's scalar advantages are exactly 0
    assert scalars[:4].tolist() == pytest.approx([0.0] * 4, abs=1e-6)
    # step 3: what is left is the KL reward to go, at most kl_coef * KL sum = 0.06 in magnitude
    assert max(float(a.abs().max()) for a in raw[:4]) <= 0.06 + 1e-6
    # step 4: next to the other group's ±0.87 the saturated group stays small after batch normalization
    assert max(float(a.abs().max()) for a in normalized[:4]) < 0.1
    assert min(float(a.abs().min()) for a in normalized[4:]) > 0.8
    # the old order (KL inside the group statistics) made them full-scale: ±1.16 for the same rollouts
    old = group_advantages(shaped_reward(torch.tensor(rewards[:4]) - 0.01 * torch.tensor(kl_sums[:4])), 4)
    assert old.abs().max().item() == pytest.approx(1.1619, abs=1e-3)


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
