"""PARA-GRPO on the tiny model: it learns a scripted reward; tool responses carry no loss."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from paravt_core.agent.engine import Generation
from paravt_core.config import load_config
from paravt_core.dist.launch import free_port
from paravt_core.refs import ArtifactRef, content_hash

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SYSTEM = "You answer questions about videos. Call crop_video to look closer."


def _rl_rows(video: Path, n: int) -> list[dict]:
    rows = []
    for i in range(n):
        question = f"<video>\nQuestion {i}: what colour was the square?\nA. red\nB. blue\nAnswer with the option letter only."
        rows.append({
            "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            "videos": [{"video": f"file://{video}"}],
            "extra_info": json.dumps({"answer": "A", "question_type": "mcq", "question": question}),
        })
    return rows


@pytest.fixture()
def rl_setup(tmp_path: Path, tiny_model_dir: Path, short_video: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "rl"
    data.mkdir()
    pq.write_table(pa.Table.from_pylist(_rl_rows(short_video, 4)), data / "rl.parquet")
    init = ArtifactRef(kind="sft_model", path=tiny_model_dir, sha256=content_hash(tiny_model_dir))
    rl_data = ArtifactRef(kind="rl_data", path=data, sha256=content_hash(data))
    return init, rl_data, tmp_path


def _single_rank_env(monkeypatch):
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                       "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)


REWARDED = range(100, 400)  # the scripted reward: 1 when the first generated token is one of these ids


def _first_generated(episode) -> int:
    return int(episode.token_ids[episode.loss_mask.bool()][0])


def _p_rewarded(model, processor, episodes) -> float:
    """Mean probability, over the prompts, that the first generated token is rewarded."""
    from paravt_core.agent.engine import GenerationRequest
    from paravt_core.agent.hf_engine import pad_requests

    probs = []
    with torch.no_grad():
        for e in episodes:
            first = int(e.loss_mask.bool().nonzero()[0])
            batch = pad_requests([GenerationRequest(e.token_ids[:first].tolist(), e.vision)],
                                 processor.tokenizer.pad_token_id, model.config.image_token_id,
                                 model.config.video_token_id)
            logits = model(**batch.model_inputs(torch.device("cpu"))).logits[0, -1]
            probs.append(torch.softmax(logits, -1)[list(REWARDED)].sum().item())
    return sum(probs) / len(probs)


def test_grpo_learns_a_scripted_reward(rl_setup, monkeypatch, tiny_processor):
    from paravt_core.agent.hf_engine import HFEngine
    from paravt_core.agent.rollout import run_episodes
    from paravt_core.model.loading import load_model
    from paravt_core.rl import stage
    from paravt_core.rl.data import read_rl_prompts
    from paravt_core.rewards import RewardBreakdown
    from paravt_core.rl.worker import train

    init, rl_data, tmp = rl_setup
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", [
        f"run.output_dir={tmp / 'out'}", "rl.max_steps=24", "rl.prompts_per_step=2", "rl.group_size=8",
        "rl.learning_rate=0.01", "rl.kl_mode=none", "rl.rollout.max_turns=0", "rl.rollout.max_new_tokens=1",
        "rl.rollout.think_prefix=false", "rl.gating.enabled=false", "video.nframes=2", "video.max_pixels=3072",
        "rl.temperature=1.0", "rl.checkpoint_every=100", "rl.zero_stage=0",
    ])

    def scripted(episode, prompt) -> RewardBreakdown:
        hit = float(_first_generated(episode) in REWARDED)
        return RewardBreakdown("", {"acc": hit, "format": 0.0, "tool": 0.0}, hit)

    prompts = read_rl_prompts(stage.rl_shards(rl_data))
    probe = run_episodes(HFEngine(load_model(init.path), tiny_processor), tiny_processor,
                         [p.prompt for p in prompts], cfg.rl.rollout, cfg.video, group_size=1)
    before = _p_rewarded(load_model(init.path), tiny_processor, probe)

    _single_rank_env(monkeypatch)
    job = stage.make_job(cfg, init, rl_data, with_mlflow=False)
    train(job, reward_fn=scripted)

    rows = [json.loads(line) for line in (job.out_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 24
    early = sum(r["reward"] for r in rows[:6]) / 6
    late = sum(r["reward"] for r in rows[-6:]) / 6
    assert late > early + 0.2, f"mean reward did not rise: {early:.3f} -> {late:.3f}"
    after = _p_rewarded(load_model(job.out_dir / "model"), tiny_processor, probe)
    assert after > before + 0.2, f"P(rewarded) {before:.3f} -> {after:.3f}"


class _Scripted:
    """A rollout engine that answers with fixed text (a test double for generation)."""

    def __init__(self, processor, texts: list[str]):
        self.tok, self.texts, self.calls = processor.tokenizer, texts, 0

    def generate(self, requests, params):
        text = self.texts[min(self.calls, len(self.texts) - 1)]
        self.calls += 1
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        return [Generation(list(ids), [-1.0] * len(ids), "stop") for _ in requests]

    def update_weights(self, state_dict):
        raise AssertionError("not used")


def test_no_gradient_through_tool_response_tokens(rl_setup, tiny_processor, tiny_model):
    from paravt_core.agent.rollout import run_episodes
    from paravt_core.config import RLConfig
    from paravt_core.rl import stage
    from paravt_core.rl.data import read_rl_prompts
    from paravt_core.rl.policy import StepAdvantages, assign_token_advantages, micro_batch_loss, trajectories

    init, rl_data, _ = rl_setup
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", ["video.nframes=2", "video.max_pixels=3072"])
    call = '<tool_call>{"name": "crop_video", "arguments": {"video_path": "x.mp4", "start_time": 1, "end_time": 5}}</tool_call>'
    main = _Scripted(tiny_processor, [f"look</think>{call}<|im_end|>", "seen</think><answer>A</answer><|im_end|>"])
    sub = _Scripted(tiny_processor, ["A red square appears.<|im_end|>"])
    prompt = read_rl_prompts(stage.rl_shards(rl_data))[0].prompt
    (episode,) = run_episodes(main, tiny_processor, [prompt], cfg.rl.rollout, cfg.video, subagent_engine=sub)
    assert episode.tool_calls == 1 and "<tool_response>" in episode.text("transcript")

    # Gradients at the final hidden states: the vocabulary projection runs in chunks of
    # positions (model/logprobs.py), so no [B, L, V] logits tensor exists to hook.
    captured = []
    handle = tiny_model.model.language_model.norm.register_forward_hook(lambda m, i, out: captured.append(out))
    rl_cfg = RLConfig(kl_mode="none", temperature=1.0, decoupled_ppo=False)
    adv = StepAdvantages(torch.tensor([1.0]), None, [], torch.zeros(1))
    (traj,) = trajectories([episode], train_subagents=False)
    assign_token_advantages([traj], adv, rl_cfg)
    ids = {"pad": tiny_processor.tokenizer.pad_token_id, "image": tiny_model.config.image_token_id,
           "video": tiny_model.config.video_token_id}
    loss, _ = micro_batch_loss(tiny_model, [traj], rl_cfg, ids, float(traj.loss_mask.sum()), "cpu")
    (hidden,) = captured
    hidden.retain_grad()
    loss.backward()
    handle.remove()
    grad = hidden.grad[0].abs().sum(-1)  # [L]; position t-1 predicts token t
    predicts = torch.nn.functional.pad(grad[:-1], (1, 0))
    response_text = tiny_processor.tokenizer.decode(episode.token_ids[episode.loss_mask == 0][-40:])
    assert "</tool_response>" in response_text or "<tool_response>" in tiny_processor.tokenizer.decode(episode.token_ids)
    assert (predicts[episode.loss_mask == 0] == 0).all(), "a masked (prompt/tool-response) token got a gradient"
    assert (predicts[episode.loss_mask == 1] > 0).all(), "a generated token got no gradient"


@pytest.mark.parametrize("scope", ["generated", "transcript"])
def test_sub_agent_answer_never_sets_the_main_agents_reward(rl_setup, tiny_processor, scope):
    """SPEC §4.5: a sub-agent summary holding `<answer>Z</answer>` and tags is never scored."""
    from paravt_core.agent.rollout import run_episodes
    from paravt_core.config import RLConfig, RewardConfig
    from paravt_core.rl import stage
    from paravt_core.rl.data import read_rl_prompts
    from paravt_core.rl.policy import paravt_reward

    _, rl_data, _ = rl_setup
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", ["video.nframes=2", "video.max_pixels=3072"])
    call = '<tool_call>{"name": "crop_video", "arguments": {"video_path": "x.mp4", "start_time": 1, "end_time": 5}}</tool_call>'
    main = _Scripted(tiny_processor, [f"look</think>{call}<|im_end|>", "still unsure<|im_end|>"])
    sub = _Scripted(tiny_processor, ["<think>\nthe frames show it</think><answer>Z</answer><|im_end|>"])
    prompt = read_rl_prompts(stage.rl_shards(rl_data))[0]
    (episode,) = run_episodes(main, tiny_processor, [prompt.prompt], cfg.rl.rollout, cfg.video, subagent_engine=sub)
    assert "<answer>Z</answer>" in "".join(s.text for s in episode.transcript)  # the body reached the context
    score = paravt_reward(RLConfig(reward=RewardConfig(scope=scope)))
    hijacked = score(episode, dataclasses.replace(prompt, answer="Z", question_type="oe"))
    assert hijacked.terms["acc"] == 0.0 and "Z" not in hijacked.answer
    assert "Z" not in episode.text(scope)


def test_token_anchoring_marks_every_token_of_the_answer_tags(rl_setup, tiny_processor):
    """SPEC §2/§5 on the real-style tokenizer: `<answer>` is several tokens; all are structural."""
    from paravt_core.agent.rollout import run_episodes
    from paravt_core.agent.tags import TagLocator
    from paravt_core.config import RLConfig
    from paravt_core.rl import stage
    from paravt_core.rl.data import read_rl_prompts
    from paravt_core.rl.policy import StepAdvantages, assign_token_advantages, trajectories

    _, rl_data, _ = rl_setup
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", ["video.nframes=2", "video.max_pixels=3072"])
    tok = tiny_processor.tokenizer
    assert len(tok("<answer>", add_special_tokens=False)["input_ids"]) > 1
    main = _Scripted(tiny_processor, ["the square is red</think>\n<answer>A</answer><|im_end|>"])
    prompt = read_rl_prompts(stage.rl_shards(rl_data))[0].prompt
    (episode,) = run_episodes(main, tiny_processor, [prompt], cfg.rl.rollout, cfg.video)
    (traj,) = trajectories([episode], train_subagents=False, locator=TagLocator(tok))
    generated = traj.token_ids[traj.loss_mask.bool()].tolist()
    marked = traj.structural[traj.loss_mask.bool()].tolist()
    pieces = [tok.decode([i]) for i in generated]
    text = "".join(pieces)
    for tag in ("</think>", "<answer>", "</answer>", "<|im_end|>"):
        start = text.index(tag)
        ends = [sum(len(p) for p in pieces[: k + 1]) for k in range(len(pieces))]
        covering = [k for k, end in enumerate(ends) if end > start and end - len(pieces[k]) < start + len(tag)]
        assert len(covering) >= 1 and all(marked[k] for k in covering), (tag, pieces, marked)
    assert not all(marked), "content tokens must not be structural"
    # the format advantage lands on exactly those tokens
    rl_cfg = RLConfig(anchoring_mode="token", kl_mode="none")
    assign_token_advantages([traj], StepAdvantages(torch.tensor([1.0]), torch.tensor([0.5]), [], torch.zeros(1)),
                            rl_cfg)
    trained_adv = traj.advantages[traj.loss_mask.bool()]
    assert torch.allclose(trained_adv, 1.0 + 0.5 * torch.tensor(marked, dtype=torch.float32))


def test_paragrpo_with_token_anchoring_runs_end_to_end(rl_setup, monkeypatch):
    """conf/rl/paragrpo.yaml with anchoring_mode token: real rewards, reference KL as a per-token
    reward, batch normalization and decoupled PPO, for two RL steps on the real-style tokenizer."""
    from paravt_core.rl import stage
    from paravt_core.rl.worker import train

    init, rl_data, tmp = rl_setup
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", [
        f"run.output_dir={tmp / 'out'}", "rl.max_steps=2", "rl.prompts_per_step=2", "rl.group_size=2",
        "rl.anchoring_mode=token", "rl.rollout.max_turns=1", "rl.rollout.max_new_tokens=24",
        "rl.rollout.subagent_max_new_tokens=8", "video.nframes=4", "video.max_pixels=3072",
        "rl.checkpoint_every=100", "rl.zero_stage=0", "rl.learning_rate=1e-3",
    ], rl_row=REPO / "conf/rl/paragrpo.yaml")
    assert cfg.rl.kl_mode == "token_reward" and cfg.rl.decoupled_ppo and cfg.rl.batch_norm_advantages
    _single_rank_env(monkeypatch)
    job = stage.make_job(cfg, init, rl_data, with_mlflow=False)
    train(job)
    rows = [json.loads(line) for line in (job.out_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        for key in ("f_tau", "f_tau_fixed", "f_tau_fixed_transcript", "kappa", "kl", "adv_raw_std", "adv_std",
                    "dropped_frac", "loss"):
            assert key in row and row[key] == row[key] and abs(row[key]) != float("inf"), (key, row)
        assert row["adv_mean"] == pytest.approx(0.0, abs=1e-4)  # batch-normalized over the step's tokens
    assert (job.out_dir / "model" / "config.json").exists()
    processor_config = json.loads((job.out_dir / "model" / "processor_config.json").read_text())
    assert processor_config["image_processor"]["size"] == {"shortest_edge": 784, "longest_edge": 3072}  # #44


@pytest.mark.gpu
def test_rl_steps_on_one_gpu_with_a_zero3_policy_and_reference(rl_setup, monkeypatch):
    """bf16 rollouts (cuDNN attention off), the ZeRO-3 policy and its ZeRO-3 reference engine on CUDA."""
    from paravt_core.rl import stage
    from paravt_core.rl.worker import train

    init, rl_data, tmp = rl_setup
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", [
        f"run.output_dir={tmp / 'out'}", "model.dtype=bfloat16", "rl.max_steps=3", "rl.prompts_per_step=2",
        "rl.group_size=4", "rl.kl_mode=token_reward", "rl.zero_stage=3", "rl.checkpoint_every=100", "video.nframes=2",
        "video.max_pixels=3072", "rl.rollout.max_new_tokens=32",
    ])
    _single_rank_env(monkeypatch)
    job = stage.make_job(cfg, init, rl_data, with_mlflow=False)
    train(job)
    rows = [json.loads(line) for line in (job.out_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(torch.isfinite(torch.tensor([r["loss"], r["kl"]])).all() for r in rows)
    assert (job.out_dir / "model" / "paravt_meta.json").is_file()


# --- rollouts on an SGLang server (issue 14), against the CPU stub in tests/sglang_stub.py ---------------


def _bounded_stub(model_dir: Path, **kwargs):
    """The SGLang stand-in started by hand as a user would start SGLang for `rl.rollout.sglang.url`:
    with `--mm-process-config` from the rollouts' pixel bounds (`_served_config`'s), without
    which it renders frames with the checkpoint's own bounds (Qwen3-VL's, which the tiny kit keeps)."""
    from sglang_stub import TinySGLangServer

    from paravt_core.agent.sglang_engine import mm_process_config

    video = load_config(REPO / "conf/pipeline/tiny.yaml", ["video.max_pixels=3072"]).video
    return TinySGLangServer(model_dir, mm_process_config=mm_process_config((video.min_pixels, video.max_pixels)),
                            **kwargs)


def _served_config(tmp: Path, url: str, *extra: str):
    return load_config(REPO / "conf/pipeline/tiny.yaml", [
        f"run.output_dir={tmp / 'out'}", "rl.max_steps=2", "rl.prompts_per_step=2", "rl.group_size=2",
        "rl.rollout.max_turns=1", "rl.rollout.max_new_tokens=16", "rl.rollout.subagent_max_new_tokens=8",
        "video.nframes=4", "video.max_pixels=3072", "rl.checkpoint_every=1", "rl.zero_stage=0",
        "rl.learning_rate=0.01", "rl.temperature=1.0", "rl.rollout.engine=sglang", f"rl.rollout.sglang.url={url}",
        *extra,
    ])


SERVED_DRIVER = """
import sys
from pathlib import Path
import torch
torch.set_num_threads(1)
from paravt_core.rl.job import RLJob
from paravt_core.rewards import RewardBreakdown
from paravt_core.rl.worker import train

def graded(episode, prompt):
    value = int(episode.token_ids[episode.loss_mask.bool()][0]) / 1000.0
    return RewardBreakdown("", {"acc": value, "format": 0.0, "tool": 0.0}, value)

train(RLJob.model_validate_json(Path(sys.argv[1]).read_text()), reward_fn=graded)
"""


def _run_worker(job, tmp: Path) -> subprocess.CompletedProcess:
    """The RL worker in a process of its own, as the stage runs it (a failed one exits)."""
    import os

    (tmp / "driver.py").write_text(SERVED_DRIVER)
    job_file = tmp / "job.json"
    job_file.write_text(job.model_dump_json())
    env = {**os.environ, "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(tmp / "driver.py"), str(job_file)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600, check=False)


def _served_logprobs(url: str, model_dir: Path, prompt_ids: list[int]):
    """(tokens, log-probs) of a greedy generation on the server."""
    from paravt_core.agent.engine import GenerationRequest, SamplingParams
    from paravt_core.agent.sglang_engine import SGLangEngine
    from paravt_core.model.loading import load_processor

    engine = SGLangEngine.for_processor(url, model_dir, model_dir / "unused", load_processor(model_dir))
    (generation,) = engine.generate([GenerationRequest(prompt_ids)], SamplingParams(max_new_tokens=6))
    return generation.token_ids, torch.tensor(generation.logprobs)


def _teacher_forced(model, prompt_ids: list[int], generated: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt_ids + generated])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float()  # [L, V]
    steps = logits[len(prompt_ids) - 1 : len(prompt_ids) - 1 + len(generated)]
    return torch.log_softmax(steps, -1).gather(1, torch.tensor(generated)[:, None])[:, 0]


def test_rl_on_the_sglang_server_pushes_each_steps_weights_into_the_served_model(rl_setup, tiny_processor):
    from paravt_core.model.loading import load_model
    from paravt_core.rl import stage

    init, rl_data, tmp = rl_setup
    probe = tiny_processor.tokenizer("What colour was the square?", add_special_tokens=False)["input_ids"]
    with _bounded_stub(init.path) as server:
        tokens_before, served_before = _served_logprobs(server.url, init.path, probe)
        job = stage.make_job(_served_config(tmp, server.url), init, rl_data, with_mlflow=False)
        worker = _run_worker(job, tmp)
        assert worker.returncode == 0, worker.stderr[-3000:]
        tokens_after, served_after = _served_logprobs(server.url, init.path, probe)
        calls = [c for c in server.calls if c not in ("/health",)]

    # Before step 1 the server is checked (what it serves), given the policy and probed
    # (issue #48). Every rollout went to the server (never a silent hf engine), and each step
    # ended with a push: release after the rollouts (co-located), resume, then the new weights.
    assert calls.count("/update_weights_from_disk") == 3
    assert calls[1:4] == ["/v1/models", "/update_weights_from_disk", "/generate"]
    step_calls = calls[4:-1]  # between the policy probe and the test's last probe
    for step in range(2):
        end = step_calls.index("/update_weights_from_disk")
        head, step_calls = step_calls[: end + 1], step_calls[end + 1:]
        assert head[-3:] == ["/release_memory_occupation", "/resume_memory_occupation", "/update_weights_from_disk"]
        assert set(head[:-3]) == {"/generate"}  # one call per main turn (and per sub-agent batch)
    assert step_calls == []
    assert sorted(p.name for p in (job.out_dir / "rollout_weights").iterdir()) == ["v3"]

    # The served log-probs are the trained policy's, not the initial model's.
    trained, initial = load_model(job.out_dir / "model"), load_model(init.path)
    torch.testing.assert_close(served_after, _teacher_forced(trained, probe, tokens_after), atol=1e-4, rtol=0)
    torch.testing.assert_close(served_before, _teacher_forced(initial, probe, tokens_before), atol=1e-4, rtol=0)
    moved = (_teacher_forced(initial, probe, tokens_after) - served_after).abs().max()
    assert moved > 1e-3, f"the served log-probs did not change after two steps ({moved:.2e})"


def test_overlapped_rl_on_the_sglang_server_rolls_out_each_batch_with_the_weights_its_schedule_names(rl_setup):
    """Issue #65 on SGLang (split placement): the server generates step n+1's batch while step
    n trains; each reply's weight labels (`meta_info.weight_versions`) are the schedule's."""
    from paravt_core.rl import stage
    from paravt_core.rl.replay import read_draws

    init, rl_data, tmp = rl_setup
    with _bounded_stub(init.path) as server:
        cfg = _served_config(tmp, server.url, "rl.max_steps=3", "rl.overlap=1", "rl.rollout.sglang.placement=split")
        job = stage.make_job(cfg, init, rl_data, with_mlflow=False)
        worker = _run_worker(job, tmp)
        assert worker.returncode == 0, worker.stderr[-3000:]
        calls = [c for c in server.calls if c not in ("/health",)]
    draws = [read_draws(job.out_dir, step) for step in (1, 2, 3)]
    assert [d.weight_version for d in draws] == [0, 0, 1]
    assert [sorted(d.served_weight_versions) for d in draws] == [["w0"], ["w0"], ["w1"]]
    # the push before step 1 and the one of W(1) before step 3's batch, each followed by the probe
    assert calls.count("/update_weights_from_disk") == 2 and "/release_memory_occupation" not in calls
    assert worker.stderr.count("the rollout server serves the policy") == 2, worker.stderr[-3000:]


def test_a_killed_server_fails_the_step_clearly_and_the_run_resumes_from_its_checkpoint(rl_setup):
    from paravt_core.rl import stage

    init, rl_data, tmp = rl_setup
    # The server dies when step 2's weights are about to be pushed (its 2nd resume request).
    with _bounded_stub(init.path, crash_on=("/resume_memory_occupation", 2)) as first:
        job = stage.make_job(_served_config(tmp, first.url), init, rl_data, with_mlflow=False)
        failed = _run_worker(job, tmp)
    assert failed.returncode != 0
    assert re.search(rf"SGLangServerError: SGLang server at {first.url}/resume_memory_occupation is unreachable "
                     r".*the RL stage resumes from its latest checkpoint", failed.stderr), failed.stderr[-3000:]
    rows = [json.loads(line) for line in (job.out_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1] and not (job.out_dir / "model").exists()

    with _bounded_stub(init.path) as second:
        # Issue #44 item 9: rl.keep_last is not part of the run's identity either, and prunes.
        resumed = stage.make_job(_served_config(tmp, second.url, "rl.keep_last=1"), init, rl_data, with_mlflow=False)
        assert resumed.out_dir == job.out_dir  # the server's url is not part of the run's identity
        finished = _run_worker(resumed, tmp)
        calls = [c for c in second.calls if c != "/health"]
    assert finished.returncode == 0, finished.stderr[-3000:]
    # The fresh server is checked, gets the step-1 policy and is probed before any rollout, then step 2 runs.
    assert calls[:3] == ["/v1/models", "/update_weights_from_disk", "/generate"]
    assert calls.count("/update_weights_from_disk") == 2
    assert calls.count("/release_memory_occupation") == 1
    rows = [json.loads(line) for line in (job.out_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2] and (job.out_dir / "model" / "config.json").exists()
    assert sorted(p.name for p in (job.out_dir / "checkpoints").iterdir() if p.is_dir()) == ["step0000002"]


def test_a_server_holding_another_runs_weights_rolls_out_the_policy_from_step_1(rl_setup):
    """Issue #48 item 2: a running server still names the starting checkpoint after a previous
    run loaded its own weights into it; step 1 must still be rolled out by the policy."""
    from paravt_core.agent.sglang_engine import SGLangEngine
    from paravt_core.model.loading import load_model, load_processor
    from paravt_core.rl import stage

    init, rl_data, tmp = rl_setup
    noise = torch.Generator().manual_seed(1)  # a previous run's weights: the same shapes, moved
    previous = {name: value + 0.05 * torch.randn(value.shape, generator=noise) if value.is_floating_point() else value
                for name, value in load_model(init.path).state_dict().items()}
    with _bounded_stub(init.path) as server:
        SGLangEngine.for_processor(server.url, init.path, tmp / "previous-run-weights",
                                   load_processor(init.path)).update_weights(previous)
        job = stage.make_job(_served_config(tmp, server.url, "rl.max_steps=1"), init, rl_data, with_mlflow=False)
        worker = _run_worker(job, tmp)
    assert worker.returncode == 0, worker.stderr[-3000:]
    assert re.search(r"the rollout server serves the policy \(probe log-prob gap \S+ nats per token\)", worker.stderr)
    (row,) = [json.loads(line) for line in (job.out_dir / "metrics.jsonl").read_text().splitlines()]
    # Rollout and reference are the same weights at the same temperature: k1 is zero up to float noise
    # (the previous run's weights gave a KL of several nats, issue #48).
    assert abs(row["kl"]) < 1e-3, row["kl"]


def test_a_config_asking_for_sglang_never_gets_hf(monkeypatch, tmp_path, tiny_model_dir, tiny_processor):
    from sglang_stub import TinySGLangServer

    from paravt_core.agent.sglang_engine import SGLangEngine
    from paravt_core.config import ConfigError
    from paravt_core.rl import rollout_engine

    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", ["rl.rollout.engine=sglang"])
    monkeypatch.setattr(rollout_engine, "sglang_installed", lambda: False)
    with pytest.raises(ConfigError, match="SGLang is not installed; install the GPU profile or set "
                                          "rl.rollout.engine=hf"):
        rollout_engine.build_rollout_engine(cfg, tiny_model_dir, tiny_processor, "cpu", 0, 1, tmp_path,
                                                  content_hash(tiny_model_dir))
    with TinySGLangServer(tiny_model_dir) as server:
        served = load_config(REPO / "conf/pipeline/tiny.yaml",
                             ["rl.rollout.engine=sglang", f"rl.rollout.sglang.url={server.url}"])
        backend = rollout_engine.build_rollout_engine(served, tiny_model_dir, tiny_processor, "cpu", 0, 1, tmp_path,
                                                  content_hash(tiny_model_dir))
    assert isinstance(backend.engine, SGLangEngine) and backend.pushes_weights and backend.server is None


@pytest.mark.parametrize("shared", [False, True], ids=["per-row", "shared-prefix"])
def test_policy_gradient_checkpointing_keeps_the_steps(rl_setup, monkeypatch, shared):
    """rl.gradient_checkpointing recomputes activations in the backward: the same trained weights,
    per row and with rl.shared_prefix (whose recompute re-arms the piecewise attention)."""
    from paravt_core.model.loading import load_model
    from paravt_core.rl import shared_prefix, stage
    from paravt_core.rewards import RewardBreakdown
    from paravt_core.rl.worker import train

    def scripted(episode, prompt) -> RewardBreakdown:
        hit = float(_first_generated(episode) in REWARDED)
        return RewardBreakdown("", {"acc": hit, "format": 0.0, "tool": 0.0}, hit)

    init, rl_data, tmp = rl_setup
    rearmed, enter = [], shared_prefix._Armed.__enter__  # entered in a backward: a recompute re-armed
    monkeypatch.setattr(shared_prefix._Armed, "__enter__",
                        lambda self: rearmed.append(torch._C._current_graph_task_id() != -1) or enter(self))
    weights = {}
    for checkpointing in (False, True):
        cfg = load_config(REPO / "conf/pipeline/tiny.yaml", [
            f"run.output_dir={tmp / f'out-{checkpointing}'}", "rl.max_steps=2", "rl.prompts_per_step=2",
            "rl.group_size=8", "rl.zero_stage=0", "rl.checkpoint_every=100", "video.nframes=2",
            "video.max_pixels=3072", "rl.rollout.max_new_tokens=8", "rl.rollout.max_turns=1",
            "rl.learning_rate=0.01", "rl.temperature=1.0", f"rl.gradient_checkpointing={str(checkpointing).lower()}",
            f"rl.shared_prefix={str(shared).lower()}"])
        _single_rank_env(monkeypatch)
        job = stage.make_job(cfg, init, rl_data, with_mlflow=False)
        train(job, reward_fn=scripted)
        weights[checkpointing] = dict(load_model(job.out_dir / "model").named_parameters())
    assert any(rearmed) == shared  # the shared run's recomputes attended piecewise
    start = dict(load_model(init.path).named_parameters())
    assert any(not torch.equal(p, start[n]) for n, p in weights[False].items())  # the steps trained something
    for name, param in weights[False].items():
        torch.testing.assert_close(weights[True][name], param, rtol=1e-4, atol=1e-6, msg=name)
