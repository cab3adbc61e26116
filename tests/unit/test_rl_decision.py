"""The decision token's advantage split (paravt_core.rl.decision) and saturation on clipped rewards (#62 item 2)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from paravt_core.agent.engine import VisionInputs
from paravt_core.config import RLConfig
from paravt_core.rewards import RewardBreakdown
from paravt_core.rl.decision import decision_index, decision_metrics, decision_parts
from paravt_core.rl.policy import (
    Trajectory,
    assign_token_advantages,
    local_advantage_moments,
    normalize_token_advantages,
    step_advantages,
)

THINK = (7, 8)  # the think prefix's ids where a rollout writes it itself


def _traj(episode: int, ids: list[int], prompt: int, sub: bool = False, seed: int = 0) -> Trajectory:
    gen = torch.Generator().manual_seed(seed)
    n = len(ids)
    mask = torch.tensor([0] * prompt + [1] * (n - prompt))
    old = -torch.rand(n, generator=gen) * mask
    t = Trajectory(torch.tensor(ids), mask, old, VisionInputs(), episode, sub, prompt_length=prompt)
    t.ref_logprobs = (old - 0.5 * torch.rand(n, generator=gen)) * mask  # k1 differs per token
    return t


def _built_step(cfg: RLConfig, totals: list[float], lead: tuple[int, ...] = ()):
    """A step of two prompts x two episodes, each with a sub-agent, through the trainer's own functions."""
    episodes = [SimpleNamespace(prompt_index=i // 2) for i in range(len(totals))]
    rewards = {id(e): RewardBreakdown("A", {"acc": 1.0, "format": 0.5 + 0.1 * i, "tool": 0.0}, total)
               for i, (e, total) in enumerate(zip(episodes, totals))}
    adv = step_advantages(episodes, [None, None], cfg, lambda e, p: rewards[id(e)], torch.zeros(len(totals)))
    trajs = [_traj(i, [1, 2, *lead, 30 + i, 31, 32, 33, 34][: 2 + len(lead) + 3 + i], 2, seed=i)
             for i in range(len(totals))]
    trajs += [_traj(i, [1, 40, 41, 42], 1, sub=True, seed=10 + i) for i in range(len(totals))]
    if cfg.anchoring_mode == "token":
        for t in trajs:
            t.structural = torch.zeros(t.token_ids.numel(), dtype=torch.bool)
            t.structural[2] = True  # the decision token of a trajectory without the lead
    assign_token_advantages(trajs, adv, cfg)
    moments = None
    if cfg.batch_norm_advantages:
        moments = local_advantage_moments(trajs, cfg.moments_main_agent_only)
        normalize_token_advantages(trajs, moments, cfg.adv_eps)
    return adv, trajs, moments


@pytest.mark.parametrize("knobs", [{}, {"batch_norm_advantages": False}, {"kl_mode": "none"},
                                   {"anchoring_mode": "token"}, {"moments_main_agent_only": False}])
def test_the_parts_sum_to_the_decision_tokens_advantage(knobs):
    cfg = RLConfig(group_size=2, kl_coef=0.05, **knobs)
    adv, trajs, moments = _built_step(cfg, [1.7, 0.1, 1.2, 1.2])
    parts = decision_parts(trajs, adv.per_episode, adv.format_per_episode, cfg, moments)
    assert sorted(parts) == [0, 1, 2, 3]  # one per episode, none for a sub-agent
    for i, p in parts.items():
        assert (p.position, p.token_id) == (0, 30 + i)  # the first trained token (the prefix is in the prompt)
        assert p.advantage == float(trajs[i].advantages[2])
        assert p.task + p.kl + p.format + p.shift == pytest.approx(p.advantage, rel=1e-6, abs=1e-6)
    if cfg.anchoring_mode == "token":  # the format term is the structural decision token's own part
        assert all(p.format != 0.0 for p in parts.values())
    else:  # the second group's rewards are equal: its task part is 0, what is left is KL and the shift
        assert parts[2].task == pytest.approx(0.0, abs=1e-6) and parts[3].task == pytest.approx(0.0, abs=1e-6)
        assert all(p.format == 0.0 for p in parts.values())
    if knobs.get("kl_mode") == "none":
        assert all(p.kl == 0.0 for p in parts.values())
    else:
        assert all(p.kl != 0.0 for p in parts.values())
    if cfg.batch_norm_advantages:
        mean, std = moments.mean_std()
        assert parts[0].shift == pytest.approx(-mean / (std + cfg.adv_eps)) and parts[0].shift != 0.0
    else:
        assert all(p.shift == 0.0 for p in parts.values())
    metrics = decision_metrics(parts, moments, cfg.adv_eps)
    assert metrics["decision_task_abs"] == pytest.approx(sum(abs(p.task) for p in parts.values()) / 4)
    scale = 1.0 if moments is None else pytest.approx(1 / (moments.mean_std()[1] + 1e-5))
    assert metrics["batch_norm_scale"] == scale


def test_the_kl_part_is_the_kl_reward_to_go_from_the_decision_token():
    cfg = RLConfig(group_size=2, kl_coef=0.05, batch_norm_advantages=False)
    adv, trajs, _ = _built_step(cfg, [1.7, 0.1, 1.2, 1.2])
    t = trajs[1]  # trained tokens at 2..5
    k1 = (t.old_logprobs - t.ref_logprobs)[2:]
    parts = decision_parts(trajs, adv.per_episode, None, cfg, None)
    assert parts[1].kl == pytest.approx(float(-0.05 * k1.sum()), rel=1e-6)
    assert parts[1].task == pytest.approx(float(adv.per_episode[1]))


def test_a_rollout_that_writes_the_think_prefix_decides_on_the_token_after_it():
    cfg = RLConfig(group_size=2, kl_coef=0.05)
    adv, trajs, moments = _built_step(cfg, [1.7, 0.1, 1.2, 1.2], lead=THINK)
    parts = decision_parts(trajs, adv.per_episode, None, cfg, moments, THINK)
    assert [(p.position, p.token_id) for p in parts.values()] == [(2, 30), (2, 31), (2, 32), (2, 33)]
    for i, p in parts.items():
        assert p.advantage == float(trajs[i].advantages[4])
        assert p.task + p.kl + p.shift == pytest.approx(p.advantage, rel=1e-6, abs=1e-6)
    # the position: the lead skipped only where the trained tokens open with exactly it
    assert decision_index(torch.tensor([1, 7, 8, 9]), torch.tensor([0, 1, 1, 1]), THINK) == 3
    assert decision_index(torch.tensor([1, 7, 9, 9]), torch.tensor([0, 1, 1, 1]), THINK) == 1
    assert decision_index(torch.tensor([1, 7, 8]), torch.tensor([0, 1, 1]), THINK) is None
    assert decision_index(torch.tensor([1, 2]), torch.tensor([1, 0]), ()) == 0


def test_saturated_groups_count_the_clipped_scalars_the_advantages_use():
    from paravt_core.rl.worker import saturated_groups

    cfg = RLConfig(group_size=2)  # clip 20: every reward above 2.2 shapes to 20
    # group 1: 2.3 and 2.6 differ raw, equal once clipped; group 2: 1.0 and 0.5 differ either way
    adv, _, _ = _built_step(cfg, [2.3, 2.6, 1.0, 0.5])
    assert adv.shaped.tolist() == pytest.approx([20.0, 20.0, 8.0, 3.0])
    assert saturated_groups(adv, cfg.group_size) == 0.5
    assert adv.per_episode[:2].abs().max() < 1e-6  # no task signal in the first group: it is saturated
    unclipped = RLConfig(group_size=2, reward_clip=None)
    assert saturated_groups(_built_step(unclipped, [2.3, 2.6, 1.0, 0.5])[0], 2) == 0.0
    with pytest.raises(ValueError, match="no shaped scalars"):
        saturated_groups(SimpleNamespace(shaped=None), 2)


def test_ranks_rows_combine_over_their_decision_tokens_and_ignore_absent_means():
    """A rank with no decision token reports no `decision_*` mean: it must not pull the step's
    mean towards 0, and a rank with more decision tokens weighs more (review of #62)."""
    from paravt_core.rl.decision import combine_rank_rows

    rank0 = {"reward": 1.0, "decision_task_abs": 0.6, "decision_tokens": 3.0, "batch_norm_scale": 2.0}
    rank1 = {"reward": 0.0, "decision_task_abs": 0.2, "decision_tokens": 1.0, "batch_norm_scale": 2.0}
    empty = {"reward": 0.5, "decision_tokens": 0.0, "batch_norm_scale": 2.0}
    row = combine_rank_rows([rank0, rank1, empty])
    assert row["decision_task_abs"] == pytest.approx((3 * 0.6 + 1 * 0.2) / 4)
    assert row["decision_tokens"] == 4.0
    assert row["reward"] == pytest.approx(0.5)  # every other metric: the plain mean, as before
    assert row["batch_norm_scale"] == 2.0
    assert "decision_kl_abs" not in combine_rank_rows([empty, empty])
