"""An RL run does not depend on where it writes, each step's draws are logged and replay to the
same rollouts, and a trajectory that breaks the contract never reaches the loss (SPEC §3, §5)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

from paravt_core.config import load_config
from paravt_core.dist.launch import free_port
from paravt_core.refs import ArtifactRef, content_hash

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
GATING = "[2,3,4]"


def _run_folder(root: Path, video: Path) -> ArtifactRef:
    """A run folder laid out as the data stage leaves it: the video under data/media, the RL
    shard with its file:// URL under data/validated/rl."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    media_video = root / "data" / "media" / "paravt" / "selfqa" / video.name
    media_video.parent.mkdir(parents=True)
    shutil.copy(video, media_video)
    shard_dir = root / "data" / "validated" / "rl"
    shard_dir.mkdir(parents=True)
    rows = []
    for i in range(4):
        question = f"<video>\nQuestion {i}: what colour was the square?\nA. red\nB. blue\nAnswer with the letter."
        rows.append({"prompt": [{"role": "user", "content": question}],
                     "videos": [{"video": media_video.as_uri()}],
                     "extra_info": json.dumps({"answer": "A", "question_type": "mcq", "question": question})})
    pq.write_table(pa.Table.from_pylist(rows), shard_dir / "rl.parquet")
    return ArtifactRef(kind="rl_data", path=shard_dir, sha256=content_hash(shard_dir))


def _config(root: Path, *extra: str):
    return load_config(REPO / "conf/pipeline/tiny.yaml", [
        f"run.output_dir={root}", "rl.prompts_per_step=2", "rl.group_size=2", "rl.rollout.max_turns=1",
        "rl.rollout.max_new_tokens=16", "rl.rollout.subagent_max_new_tokens=8", f"rl.gating.choices={GATING}",
        "video.nframes=4", "video.max_pixels=3072", "video.crop_max_frames=2", "rl.zero_stage=0",
        "rl.learning_rate=1e-3", *extra,
    ], rl_row=REPO / "conf/rl/paragrpo.yaml")


def _train(monkeypatch, cfg, init, rl_data):
    from paravt_core.rl import stage
    from paravt_core.rl.worker import train

    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                       "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    job = stage.make_job(cfg, init, rl_data, with_mlflow=False)
    (job.out_dir / "job.json").write_text(job.model_dump_json())
    train(job)
    return job


def _metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in rows:  # wall-clock times are the only fields two identical runs may differ in
        for key in [k for k in row if k.startswith("time_")]:
            del row[key]
    return rows


def test_two_output_folders_give_identical_gated_runs_and_steps_replay(tmp_path, monkeypatch, capsys, tiny_model_dir,
                                                                       short_video):
    from paravt_core.rl.replay import read_draws, replay_step

    init = ArtifactRef(kind="sft_model", path=tiny_model_dir, sha256=content_hash(tiny_model_dir))
    a_root, b_root = tmp_path / "outputs" / "reproduce", tmp_path / "elsewhere" / "reproduce-final"
    data_a, data_b = _run_folder(a_root, short_video), _run_folder(b_root, short_video)
    assert data_a.sha256 != data_b.sha256  # the shards differ: they hold each folder's absolute URLs
    job_a = _train(monkeypatch, _config(a_root, "rl.max_steps=2", "rl.checkpoint_every=1"), init, data_a)
    job_b = _train(monkeypatch, _config(b_root, "rl.max_steps=2", "rl.checkpoint_every=1"), init, data_b)

    draws = [[read_draws(job.out_dir, step) for step in (1, 2)] for job in (job_a, job_b)]
    for da, db in zip(*draws):
        assert da.prompts == db.prompts and da.rollout_sha256 == db.rollout_sha256
        assert all(p.nframes in (2, 3, 4) for p in da.prompts)
    assert draws[0][0].weight_version == 0 and draws[0][1].weight_version == 1
    assert _metrics(job_a.out_dir) == _metrics(job_b.out_dir)
    from paravt_core.rl.episode_log import read_episode_log

    logged = [read_episode_log(job.out_dir) for job in (job_a, job_b)]
    assert logged[0] == logged[1] and [r["step"] for r in logged[0]] == [1] * 4 + [2] * 4  # 2 prompts x 2 a step
    for step in (1, 2):
        rows = [r for r in logged[0] if r["step"] == step]
        assert [r["prompt_id"] for r in rows] == [p.prompt_id for p in draws[0][step - 1].prompts for _ in range(2)]
        assert all(r["nframes"] in (2, 3, 4) and r["main_tokens"] >= len(r["first_token_ids"]) > 0 for r in rows)
        for group in (rows[:2], rows[2:]):  # group-normalized: each group's scalar advantages sum to 0
            assert sum(r["advantage"] for r in group) == pytest.approx(0.0, abs=1e-4)
        for r in rows:  # the decision token (rl/decision.py): with the think prefix, the first trained token
            assert r["decision_position"] == 0 and r["decision_token_id"] == r["first_token_ids"][0]
            assert r["decision_advantage"] == pytest.approx(r["first_token_advantages"][0], abs=1e-5)
            parts = r["decision_task"] + r["decision_kl"] + r["decision_format"] + r["decision_shift"]
            assert parts == pytest.approx(r["decision_advantage"], rel=1e-5, abs=1e-5)
    # #62: two identical runs (same seed and thread count) train bit-identical weights
    weights = [(job.out_dir / "model" / "model.safetensors").read_bytes() for job in (job_a, job_b)]
    assert weights[0] == weights[1]

    first = replay_step(job_a.out_dir, 1)
    assert first.identical, "step 1 (the SFT weights) did not replay to the logged rollouts"
    second = replay_step(job_b.out_dir, 2)  # weights from the checkpoint after step 1
    assert second.identical, "step 2 (weights of checkpoint step0000001) did not replay to the logged rollouts"
    assert first.digest != second.digest

    from paravt_core.cli import main

    assert main(["rl-replay", "--run-dir", str(job_a.out_dir), "--step", "1"]) == 0
    assert "identical" in capsys.readouterr().out
    assert main(["rl-replay", "--run-dir", str(job_a.out_dir), "--step", "7"]) == 2
    assert "no draws log" in capsys.readouterr().err
    # #48 item 5: the checkpoint carries its manifest, and a log whose video was rewritten (it replayed
    # "identical": the logged video was never compared) is refused before anything is rolled out
    from paravt_core.dist.checkpoints import CHECKPOINT_MANIFEST, checkpoint_damage
    from paravt_core.rl.replay import draws_path

    tag = job_b.out_dir / "checkpoints" / "step0000001"
    assert (tag / CHECKPOINT_MANIFEST).is_file() and checkpoint_damage(tag) is None
    log = json.loads(draws_path(job_a.out_dir, 1, 0).read_text())
    log["prompts"][0]["video"] = "paravt/selfqa/another.mp4"
    draws_path(job_a.out_dir, 1, 0).write_text(json.dumps(log))
    assert main(["rl-replay", "--run-dir", str(job_a.out_dir), "--step", "1"]) == 2
    assert "logs video 'paravt/selfqa/another.mp4'" in capsys.readouterr().err

    # A replay that rolls out with other weights (the SFT model for step 2) differs: the check can fail.
    from paravt_core.rl import replay as R

    monkeypatch.setattr(R, "replay_weights", lambda run_dir, version, zero_stage: None)
    assert not replay_step(job_b.out_dir, 2).identical


def test_a_broken_loss_mask_fails_the_trajectory_contract(tmp_path, tiny_model_dir, tiny_processor, tiny_model,
                                                          short_video):
    from paravt_core.agent.rollout import run_episodes
    from paravt_core.rl import stage
    from paravt_core.rl.contracts import TokenLayout, TrajectoryContractError, check_trajectories
    from paravt_core.rl.data import read_rl_prompts
    from paravt_core.rl.policy import trajectories
    from rl_rank_worker import ScriptedEngine

    rl_data = _run_folder(tmp_path / "out", short_video)
    cfg = _config(tmp_path / "out")
    prompts = read_rl_prompts(stage.rl_shards(rl_data))[:1]
    prompts = [dataclasses.replace(p, prompt=dataclasses.replace(p.prompt, nframes=3)) for p in prompts]
    engine = ScriptedEngine(tiny_processor.tokenizer, calls_crops=True)
    episodes = run_episodes(engine, tiny_processor, [p.prompt for p in prompts], cfg.rl.rollout, cfg.video)
    layout = TokenLayout.of(tiny_model.config, tiny_processor.tokenizer, tiny_processor.image_processor.merge_size)
    choices = cfg.rl.gating.choices

    def check(trajs):
        check_trajectories(trajs, episodes, prompts, layout, choices, "RL step 3, rank 1")

    good = trajectories(episodes, train_subagents=True)
    assert len(good) == 4 and episodes[0].tool_calls == 3
    check(good)  # the real assembly passes

    main = good[0]
    on_prompt = main.loss_mask.clone()
    on_prompt[main.prompt_length - 1] = 1
    with pytest.raises(TrajectoryContractError, match=r"RL step 3, rank 1: trajectory 0 \(the main agent of episode "
                                                      r"0 of prompt .*video .*selfqa.*loss mask is 1 at token"):
        check([dataclasses.replace(main, loss_mask=on_prompt), *good[1:]])
    response = [i for i, s in enumerate(main.token_ids.tolist()) if s == tiny_processor.tokenizer.convert_tokens_to_ids(
        "<tool_response>")]
    on_tool_response = main.loss_mask.clone()
    on_tool_response[response[0]] = 1
    with pytest.raises(TrajectoryContractError, match="loss mask is 1 at token"):
        check([dataclasses.replace(main, loss_mask=on_tool_response), *good[1:]])
    sub = good[2]
    sub_on_prompt = sub.loss_mask.clone()
    sub_on_prompt[0] = 1
    with pytest.raises(TrajectoryContractError, match="trajectory 2 \\(a sub-agent"):
        check([*good[:2], dataclasses.replace(sub, loss_mask=sub_on_prompt), good[3]])
    with pytest.raises(TrajectoryContractError, match="outside the vocabulary"):
        check([dataclasses.replace(main, token_ids=main.token_ids + layout.vocab_size), *good[1:]])
    image = int((main.token_ids == layout.image_id).nonzero()[0])
    fewer_pads = main.token_ids.clone()
    fewer_pads[image] = 0
    with pytest.raises(TrajectoryContractError, match="image placeholder tokens, but its frames' grid needs"):
        check([dataclasses.replace(main, token_ids=fewer_pads), *good[1:]])
    with pytest.raises(TrajectoryContractError, match="K=5 outside rl.gating.choices"):
        check_trajectories(good, [dataclasses.replace(episodes[0], nframes=5)], prompts, layout, choices, "step")
    nan_logp = main.old_logprobs.clone()
    nan_logp[main.loss_mask.bool().nonzero()[0]] = torch.nan
    with pytest.raises(TrajectoryContractError, match="log-probs"):
        check([dataclasses.replace(main, old_logprobs=nan_logp), *good[1:]])


def test_a_step_replays_with_the_rounding_speed_switches_on(tmp_path, monkeypatch, tiny_model_dir, short_video):
    """Replay loads the rollout model with the run's `model.*` speed options: `prefill_attention` and
    `patch_embed` change the engine's log-probs in their last bits (docs/speed.md), so a replay on
    the stock paths would not give the logged digest."""
    from paravt_core.rl.replay import replay_step

    init = ArtifactRef(kind="sft_model", path=tiny_model_dir, sha256=content_hash(tiny_model_dir))
    root = tmp_path / "outputs" / "fast"
    job = _train(monkeypatch, _config(root, "rl.max_steps=1", "rl.checkpoint_every=1",
                                      "model.prefill_attention=causal_rows", "model.patch_embed=linear"),
                 init, _run_folder(root, short_video))
    assert replay_step(job.out_dir, 1).identical
