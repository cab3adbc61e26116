"""The pure parts of multi-rank PARA-GRPO (SPEC §5): agreed micro-batch counts, path-independent
prompt ids, the release's KL clamp and eps, main-agent-only statistics."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from paravt_core.agent.engine import VisionInputs
from paravt_core.config import RLConfig
from paravt_core.rl.grpo import frame_budget, kl_k1
from paravt_core.rl.policy import (
    StepAdvantages,
    Trajectory,
    assign_token_advantages,
    local_advantage_moments,
    micro_batch_loss,
    micro_batches,
)


def _traj(n: int, episode: int = 0, sub: bool = False, structural: bool = False) -> Trajectory:
    mask = torch.tensor([0] * 2 + [1] * n)
    t = Trajectory(torch.arange(n + 2), mask, torch.full((n + 2,), -0.5), VisionInputs(), episode, sub,
                   prompt_length=2)
    if structural:
        t.structural = torch.ones(n + 2, dtype=torch.bool)
    return t


def test_micro_batches_pad_to_the_agreed_count_with_fillers():
    trajs = [_traj(3) for _ in range(5)]
    own = micro_batches(trajs, 2)
    assert [len(b.trajs) for b in own] == [2, 2, 1] and not any(b.filler for b in own)
    padded = micro_batches(trajs, 2, count=5)
    assert [b.filler for b in padded] == [False, False, False, True, True]
    assert all(b.trajs == trajs[:1] for b in padded[3:])
    with pytest.raises(ValueError, match="agreed on 2 micro-batches, but this rank has 3"):
        micro_batches(trajs, 2, count=2)
    with pytest.raises(ValueError, match="no trajectory"):
        micro_batches([], 2, count=1)
    assert micro_batches([], 2, count=0) == []


def test_a_filler_micro_batch_adds_nothing_to_the_gradient():
    """The filler's forward and backward run (so ZeRO-3's collectives match), its loss is 0."""

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor(0.3))

    calls = []

    def fake_logprobs(model, batch, *args, **kwargs):
        calls.append(len(batch))
        length = max(t.token_ids.numel() for t in batch)
        return model.w * torch.ones(len(batch), length) - 1.0, None

    import paravt_core.rl.policy as P

    original, P.sequence_logprobs = P.sequence_logprobs, fake_logprobs
    try:
        toy, t = Toy(), _traj(4)
        t.advantages = torch.ones(6)
        cfg = RLConfig(kl_mode="none")
        loss, stats = micro_batch_loss(toy, [t], cfg, {"pad": 0, "image": 1, "video": 2}, 4.0, "cpu", weight=0.0)
        loss.backward()
    finally:
        P.sequence_logprobs = original
    assert calls == [1] and toy.w.grad == 0 and stats["tokens"] == 0 and stats["clip_frac"] == 0


def test_the_loss_share_of_a_rank_is_scaled_by_world_over_the_global_token_count():
    import paravt_core.rl.policy as P

    def fake_logprobs(model, batch, *args, **kwargs):
        length = max(t.token_ids.numel() for t in batch)
        return torch.zeros(len(batch), length, requires_grad=True), None

    original, P.sequence_logprobs = P.sequence_logprobs, fake_logprobs
    try:
        t = _traj(4)
        t.advantages = torch.full((6,), 2.0)
        cfg = RLConfig(kl_mode="none", decoupled_ppo=False)
        one, _ = micro_batch_loss(None, [t], cfg, {"pad": 0, "image": 1, "video": 2}, 4.0, "cpu")
        share, _ = micro_batch_loss(None, [t], cfg, {"pad": 0, "image": 1, "video": 2}, 10.0, "cpu", world=2)
    finally:
        P.sequence_logprobs = original
    # ratio exp(0 - (-0.5)) = 1.65 on every token, clipped to 1.2 at advantage 2 -> per-token loss -2.4
    per_token = -min(torch.exp(torch.tensor(0.5)).item(), 1.2) * 2.0
    assert one.item() == pytest.approx(per_token)  # 4 tokens / 4 tokens
    assert share.item() == pytest.approx(per_token * 4 / 10 * 2)


def test_k1_is_clamped_as_the_release_clamps_it():
    logp, ref = torch.tensor([0.0, -1.0, -30.0]), torch.tensor([-25.0, -1.5, -2.0])
    assert kl_k1(logp, ref).tolist() == [25.0, 0.5, -28.0]
    assert kl_k1(logp, ref, 10.0).tolist() == [10.0, 0.5, -10.0]


def test_batch_moments_over_main_agent_tokens_only():
    main, sub = _traj(2), _traj(6, sub=True)
    main.advantages = torch.tensor([0, 0, 1.0, 3.0])
    sub.advantages = torch.tensor([0, 0] + [10.0] * 6)
    pooled = local_advantage_moments([main, sub])
    only_main = local_advantage_moments([main, sub], main_agent_only=True)
    assert pooled.count == 8 and only_main.count == 2
    assert only_main.mean_std()[0] == pytest.approx(2.0)


def test_token_anchoring_gives_the_format_advantage_to_main_agent_trajectories_only():
    main, sub = _traj(3, structural=True), _traj(3, sub=True, structural=True)
    adv = StepAdvantages(torch.tensor([1.0]), torch.tensor([0.5]), [], torch.zeros(1))
    assign_token_advantages([main, sub], adv, RLConfig(anchoring_mode="token", kl_mode="none"))
    assert main.advantages[2:].tolist() == [1.5] * 3
    assert sub.advantages[2:].tolist() == [1.0] * 3


def _rows(video_url: str) -> list[dict]:
    question = "<video>\nWhat colour?\nA. red\nB. blue"
    return [{"prompt": [{"role": "user", "content": question}], "videos": [{"video": video_url}],
             "extra_info": json.dumps({"answer": "A", "question_type": "mcq", "question": question})}]


def _materialized(folder: Path, video_src: Path) -> tuple[Path, Path]:
    """A run folder's media root holding the video, and an RL shard pointing at it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    media = folder / "data" / "media"
    video = media / "paravt" / "selfqa" / "clip.mp4"
    video.parent.mkdir(parents=True)
    shutil.copy(video_src, video)
    shard = folder / "data" / "validated" / "rl" / "rl.parquet"
    shard.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(_rows(video.as_uri())), shard)
    return media, shard


def test_moving_the_output_folder_keeps_every_prompt_id_and_frame_budget(tmp_path):
    from paravt_core.rl.data import read_rl_prompts, video_key

    src = tmp_path / "src.mp4"
    src.write_bytes(b"not really a video, but its bytes are stable")
    media_a, shard_a = _materialized(tmp_path / "outputs" / "reproduce", src)
    media_b, shard_b = _materialized(tmp_path / "elsewhere" / "reproduce-final", src)
    (a,), (b,) = read_rl_prompts([shard_a], media_root=media_a), read_rl_prompts([shard_b], media_root=media_b)
    assert a.prompt.video_path != b.prompt.video_path
    assert a.prompt.prompt_id == b.prompt.prompt_id
    assert video_key(a.prompt.video_path, media_a) == "paravt/selfqa/clip.mp4" == a.video_key == b.video_key
    choices = (2, 3, 4, 6)
    assert [frame_budget(s, a.prompt.prompt_id, e, choices) for s in range(3) for e in range(4)] == \
        [frame_budget(s, b.prompt.prompt_id, e, choices) for s in range(3) for e in range(4)]
    # Outside the media root the file's bytes key it: still the same in both folders.
    (c,), (d,) = read_rl_prompts([shard_a]), read_rl_prompts([shard_b])
    assert c.prompt.prompt_id == d.prompt.prompt_id != a.prompt.prompt_id
    # The question still tells prompts apart.
    other = _rows(a.prompt.video_path.as_uri())
    other[0]["prompt"][0]["content"] += " (again)"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(other), tmp_path / "other.parquet")
    (e,) = read_rl_prompts([tmp_path / "other.parquet"], media_root=media_a)
    assert e.prompt.prompt_id != a.prompt.prompt_id


def test_a_video_outside_the_media_root_is_hashed_once_for_all_its_rows(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    import paravt_core.video.hashing as hashing
    from paravt_core.rl import data as rl_data
    from paravt_core.rl.data import read_rl_prompts

    video = tmp_path / "clip.mp4"
    video.write_bytes(b"bytes")
    rows = [dict(_rows(video.as_uri())[0]) for _ in range(3)]
    for i, row in enumerate(rows):
        row["prompt"] = [{"role": "user", "content": f"<video>\nQuestion {i}?\nA. red\nB. blue"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rl.parquet")
    calls = []
    real = hashing.video_sha256
    monkeypatch.setattr(rl_data, "video_sha256", lambda path: calls.append(path) or real(path))
    prompts = read_rl_prompts([tmp_path / "rl.parquet"])
    assert len(prompts) == 3 and len({p.prompt.prompt_id for p in prompts}) == 3
    assert len(calls) == 1 and {p.video_key for p in prompts} == {"sha256:" + real(video)}
