"""The per-episode RL log (paravt_core.rl.episode_log): what each step trained on, per episode."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from paravt_core.rl.episode_log import episode_log_path, episode_records, read_episode_log, write_episode_log
from paravt_core.rewards import RewardBreakdown


def _traj(episode: int, sub: bool, ids: list[int], mask: list[int], adv: list[float]):
    return SimpleNamespace(episode=episode, is_subagent=sub, token_ids=torch.tensor(ids), loss_mask=torch.tensor(mask),
                           advantages=torch.tensor(adv))


def test_records_carry_each_episodes_reward_advantages_and_first_trained_tokens(tmp_path):
    prompts = [SimpleNamespace(video_key="media/a.mp4", question="What colour?")]
    episodes = [SimpleNamespace(prompt_id="p0", prompt_index=0, sample_index=i, nframes=6, tool_calls=calls,
                                end_reason="answer") for i, calls in enumerate((2, 0))]
    rewards = [RewardBreakdown("A", {"acc": 1.0, "format": 1.0, "tool": 0.6}, 1.7),
               RewardBreakdown("B", {"acc": 0.0, "format": 1.0, "tool": 0.0}, 0.1)]
    trajs = [
        # episode 0: prompt tokens 1-2 untrained, then 3 trained; one sub-agent with 2 trained tokens
        _traj(0, False, [1, 2, 30, 31, 32], [0, 0, 1, 1, 1], [0.0, 0.0, 0.9, 0.7, 0.8]),
        _traj(0, True, [5, 40, 41], [0, 1, 1], [0.0, 0.5, 0.5]),
        _traj(1, False, [1, 2, 50], [0, 0, 1], [0.0, 0.0, -0.6]),
    ]
    rows = episode_records(3, 1, episodes, prompts, rewards, torch.tensor([0.7071, -0.7071]), trajs, 42.0)
    assert [r["tool_calls"] for r in rows] == [2, 0] and rows[0]["video"] == "media/a.mp4" and rows[1]["question"] == "What colour?" and rows[0]["step"] == 3
    assert rows[0]["first_token_ids"] == [30, 31, 32] and rows[0]["first_token_advantages"] == pytest.approx([0.9, 0.7, 0.8])
    assert rows[0]["main_tokens"] == 3 and rows[0]["main_advantage_mean"] == pytest.approx(0.8)
    assert (rows[0]["subagent_tokens"], rows[0]["subagent_advantage_sum"]) == (2, pytest.approx(1.0))
    assert (rows[1]["subagent_tokens"], rows[1]["total"], rows[1]["advantage"]) == (0, 0.1, pytest.approx(-0.7071))
    assert [(r["acc"], r["format"], r["tool"]) for r in rows] == [(1.0, 1.0, 0.6), (0.0, 1.0, 0.0)]
    assert all(r["step_tokens"] == 42.0 for r in rows)

    path = write_episode_log(tmp_path, 3, 1, rows)
    assert path == episode_log_path(tmp_path, 3, 1) and read_episode_log(tmp_path) == rows

    with pytest.raises(ValueError, match="no main-agent trajectory"):
        episode_records(3, 1, episodes, prompts, rewards, torch.tensor([0.0, 0.0]), trajs[:2], 1.0)
    with pytest.raises(ValueError, match="2 episodes, 1 rewards"):
        episode_records(3, 1, episodes, prompts, rewards[:1], torch.tensor([0.0, 0.0]), trajs, 1.0)
    with pytest.raises(FileNotFoundError, match="no episode log"):
        read_episode_log(tmp_path / "elsewhere")
    path.write_text("[1]\n")
    with pytest.raises(ValueError, match="line 1: not a JSON object"):
        read_episode_log(tmp_path)


def test_records_carry_the_decision_tokens_split_where_given():
    from paravt_core.rl.decision import DecisionParts
    from paravt_core.rl.episode_log import DECISION_KEYS

    prompts = [SimpleNamespace(video_key="media/a.mp4", question="What colour?")]
    episodes = [SimpleNamespace(prompt_id="p0", prompt_index=0, sample_index=i, nframes=6, tool_calls=0,
                                end_reason="answer") for i in range(2)]
    rewards = [RewardBreakdown("A", {"acc": 1.0, "format": 1.0, "tool": 0.0}, 1.0)] * 2
    trajs = [_traj(0, False, [1, 30], [0, 1], [0.0, 0.4]), _traj(1, False, [1, 30], [0, 1], [0.0, -0.4])]
    parts = DecisionParts(position=0, token_id=30, advantage=0.4, task=0.5, kl=-0.05, format=0.0, shift=-0.05)
    rows = episode_records(1, 0, episodes, prompts, rewards, torch.tensor([0.5, -0.5]), trajs, 2.0, {0: parts},
                           [8.0, 8.0])
    assert [r["shaped"] for r in rows] == [8.0, 8.0]
    assert {k: rows[0][k] for k in DECISION_KEYS} == {"decision_position": 0, "decision_token_id": 30,
                                                       "decision_advantage": 0.4, "decision_task": 0.5,
                                                       "decision_kl": -0.05, "decision_format": 0.0,
                                                       "decision_shift": -0.05}
    assert all(rows[1][k] is None for k in DECISION_KEYS)  # an episode with no token after the prefix
    assert not {*DECISION_KEYS, "shaped"} & set(episode_records(1, 0, episodes, prompts, rewards, torch.zeros(2), trajs,
                                                                2.0)[0])
    with pytest.raises(ValueError, match="2 episodes and 1 shaped"):
        episode_records(1, 0, episodes, prompts, rewards, torch.zeros(2), trajs, 2.0, None, [1.0])
