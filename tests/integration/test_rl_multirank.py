"""PARA-GRPO on two CPU ranks (SPEC §5): uneven trajectory counts never leave a rank blocked
under ZeRO-3, and the loss is ONE token mean over the step's batch on every rank."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from paravt_core.config import load_config
from paravt_core.dist.launch import launch_workers
from paravt_core.refs import ArtifactRef, content_hash

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("rl_rank_worker.py")
# Two ranks load the tiny model, build ZeRO-3 engines and run two steps in about a minute on
# two cores; a rank blocked in a gather the other never joins would wait for gloo's 30 minutes.
UNEVEN_TIMEOUT_S = 420

sys.path.insert(0, str(Path(__file__).parent))
import rl_rank_worker  # noqa: E402  (the ranks' own module: the test builds the same episodes)


def _rl_data(tmp: Path, video: Path) -> ArtifactRef:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp / "rl"
    data.mkdir()
    rows = []
    for i in range(2):
        question = f"<video>\nQuestion {i}: what colour was the square?\nA. red\nB. blue\nAnswer with the letter."
        rows.append({"prompt": [{"role": "user", "content": question}], "videos": [{"video": f"file://{video}"}],
                     "extra_info": json.dumps({"answer": "A", "question_type": "mcq", "question": question})})
    pq.write_table(pa.Table.from_pylist(rows), data / "rl.parquet")
    return ArtifactRef(kind="rl_data", path=data, sha256=content_hash(data))


@pytest.mark.parametrize(("shared", "checkpointing", "micro", "count", "fillers"),
                         [(False, False, 1, 8, 6 / 2), (True, False, 2, 4, 3 / 2), (True, True, 2, 4, 3 / 2)],
                         ids=["per-row", "shared-prefix", "shared-prefix-checkpointed"])
def test_two_ranks_with_uneven_trajectories_stay_in_step_under_zero3(tmp_path, tiny_model_dir, short_video, shared,
                                                                     checkpointing, micro, count, fillers):
    """Per row, and with `rl.shared_prefix` (#64: each micro-batch one packed forward, groups of 2
    sharing their prompt), also under activation checkpointing as at 8B (each layer's recompute
    gathers its shards again and attends piecewise): the ranks agree on the micro-batch count and
    none is left in a gather."""
    from paravt_core.rl import stage

    init = ArtifactRef(kind="sft_model", path=tiny_model_dir, sha256=content_hash(tiny_model_dir))
    rl_data = _rl_data(tmp_path, short_video)
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", [
        f"run.output_dir={tmp_path / 'out'}", "rl.num_ranks=2", "rl.zero_stage=3", "rl.max_steps=2",
        "rl.prompts_per_step=2", "rl.group_size=2", f"rl.micro_batch_size={micro}", "rl.kl_mode=token_reward",
        f"rl.shared_prefix={str(shared).lower()}", f"rl.gradient_checkpointing={str(checkpointing).lower()}",
        "rl.rollout.max_turns=1", "rl.checkpoint_every=100", "rl.learning_rate=1e-3", "rl.gating.enabled=false",
        "video.nframes=2", "video.max_pixels=3072", "video.crop_max_frames=2",
        # Every parameter partitioned and gathered per call, as at 8B: with the default threshold
        # (100k) the tiny model's small layers would stay whole and their calls run no collective.
        "rl.deepspeed.stage3_param_persistence_threshold=0",
    ])
    job = stage.make_job(cfg, init, rl_data, with_mlflow=False)
    job_file = job.out_dir / "job.json"
    job_file.write_text(job.model_dump_json())
    report = tmp_path / "report"
    report.mkdir()
    lines: list[str] = []
    try:
        launch_workers(WORKER, ["--mode", "uneven", "--input", str(job_file), "--out", str(report)], 2,
                       log_line=lines.append, timeout_s=UNEVEN_TIMEOUT_S)
    except TimeoutError as err:
        pytest.fail(f"two RL ranks with uneven trajectory counts did not finish (a rank left blocked): {err}")

    ranks = [json.loads((report / f"rank{r}.json").read_text()) for r in (0, 1)]
    # Rank 0's episodes called three crops each, rank 1's none: 8 trajectories against 2.
    assert ranks[0]["subagent_requests"] == 2 * 2 * 3 and ranks[1]["subagent_requests"] == 0
    rows = [json.loads(line) for line in (job.out_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert row["trajectories"] == pytest.approx((8 + 2) / 2)  # the ranks' mean
        assert row["micro_batches"] == count and row["filler_micro_batches"] == pytest.approx(fillers)
        assert torch.isfinite(torch.tensor(row["loss"]))
    # Every step's weights reached both ranks' rollout engines (under ZeRO-3 both gather the same
    # shards, so equal digests show the push ran on every rank), and the weights moved.
    assert ranks[0]["pushed"] == ranks[1]["pushed"] and len(ranks[0]["pushed"]) == 2
    assert ranks[0]["pushed"][0] != ranks[0]["pushed"][1]
    assert (job.out_dir / "model" / "config.json").is_file()
    # Each rank logs its own episodes; the loss's token denominator is the step's over both ranks.
    from paravt_core.rl.episode_log import read_episode_log

    logged = read_episode_log(job.out_dir)
    assert sorted({(r["step"], r["rank"]) for r in logged}) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    for step in (1, 2):
        mine = {rank: [r for r in logged if r["step"] == step and r["rank"] == rank] for rank in (0, 1)}
        assert all(r["subagent_tokens"] > 0 for r in mine[0]) and all(r["subagent_tokens"] == 0 for r in mine[1])
        assert len({r["step_tokens"] for r in mine[0] + mine[1]}) == 1
        assert mine[0][0]["step_tokens"] == sum(r["main_tokens"] + r["subagent_tokens"] for r in mine[0] + mine[1])


def test_two_ranks_give_the_gradient_of_one_rank_holding_both(tmp_path, tiny_model_dir, short_video):
    """SPEC §5: one token mean over every trained token of the step on every rank. Rank 0
    holds a three-crop episode (four trajectories, many tokens), rank 1 a direct answer."""
    spec = {"model": str(tiny_model_dir), "video": str(short_video), "episodes": ["crops", "answer"],
            "advantages": [1.0, -0.7]}
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    launch_workers(WORKER, ["--mode", "grad", "--input", str(spec_file), "--out", str(tmp_path)], 2,
                   log_line=lambda line: None, timeout_s=300)
    two_ranks = torch.load(tmp_path / "grads.pt")

    from paravt_core.rl.policy import micro_batch_loss

    model, trajs, cfg, ids, total = rl_rank_worker.rank_trajectories(spec, None)
    assert [t.is_subagent for t in trajs] == [False, True, True, True, False]
    counts = [sum(float(t.loss_mask.sum()) for t in share) for share in (trajs[:4], trajs[4:])]
    assert counts[0] > 2 * counts[1], counts  # the ranks' token counts really differ
    loss, _ = micro_batch_loss(model, trajs, cfg, ids, total, "cpu")
    loss.backward()
    one_rank = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert set(one_rank) == set(two_ranks)
    scale = max(float(g.abs().max()) for g in one_rank.values())
    for name, grad in one_rank.items():
        assert torch.allclose(two_ranks[name], grad, atol=1e-5 * scale, rtol=1e-4), name
