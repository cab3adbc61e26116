"""The `vllm` rollout engine's request building and its checks, on a stand-in HTTP server
(the real vLLM is in the server tier, tests/server/)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from paravt_core.agent.engine import GenerationRequest, SamplingParams, VisionInputs
from paravt_core.refs import content_hash
from tests.http_stand_in import StandIn

PAD, OTHER = 9, 5
MEDIA = {"<|image_pad|>": PAD, "<|vision_start|>": 7, "<|vision_end|>": 8}


def reply(prompt_ids, token_ids, finish="stop"):
    return {"prompt_token_ids": prompt_ids,
            "choices": [{"token_ids": token_ids, "finish_reason": finish,
                         "logprobs": {"content": [{"token_id": t, "logprob": -0.5} for t in token_ids]}}]}


def request_with_two_images() -> GenerationRequest:
    frames = tuple(np.full((32, 32, 3), value, dtype=np.uint8) for value in (10, 200))
    ids = [1, 7, PAD, PAD, PAD, 8, 2, 7, PAD, PAD, PAD, 8, 3]
    return GenerationRequest(ids, VisionInputs(pixel_values=torch.zeros(6, 4), image_grid_thw=torch.ones(2, 3),
                                               frames=frames))


def test_pads_are_collapsed_frames_sent_as_png_and_the_served_ids_checked(tmp_path):
    from paravt_core.agent.vllm_engine import VLLMEngine, VLLMTokenMismatch, collapse_pads

    assert collapse_pads([1, PAD, PAD, 2, PAD, 3, PAD, PAD], PAD) == ([1, PAD, 2, PAD, 3, PAD], 3)
    request = request_with_two_images()
    served = {"ids": request.prompt_ids}
    stand_in = StandIn(lambda path, body: reply(served["ids"], [OTHER, 4]))
    try:
        engine = VLLMEngine(stand_in.url, tmp_path, tmp_path / "w", MEDIA)
        (generation,) = engine.generate([request], SamplingParams(max_new_tokens=4, temperature=0.7, seed=1,
                                                                  stop_token_ids=(4,)))
        body = stand_in.bodies[-1]["body"]
        assert body["token_ids"] == [1, 7, PAD, 8, 2, 7, PAD, 8, 3] and body["return_token_ids"] is True
        assert [part["url"][:22] for part in body["content_parts"]] == ["data:image/png;base64,"] * 2
        sampling = body["sampling_params"]
        assert (sampling["temperature"], sampling["seed"], sampling["stop_token_ids"], sampling["logprobs"]) == (
            0.7, 1, [4], 0)
        assert sampling["top_k"] == 0 and sampling["repetition_penalty"] == 1.0 and "logit_bias" not in sampling
        assert (generation.token_ids, generation.logprobs, generation.finish_reason) == ([OTHER, 4], [-0.5, -0.5],
                                                                                         "stop")
        served["ids"] = request.prompt_ids[:-1]  # the server expanded the pads differently
        with pytest.raises(VLLMTokenMismatch, match=r"ours 13 ids, the server's 12; first difference at position 12"):
            engine.generate([request], SamplingParams(max_new_tokens=4))
    finally:
        stand_in.close()


def test_frames_must_match_the_pad_runs_and_a_generated_placeholder_is_drawn_again(tmp_path):
    from paravt_core.agent.vllm_engine import MEDIA_RETRIES, VLLMEngine, VLLMServerError

    request = request_with_two_images()
    draws = {"n": 0}

    def answer(path, body):
        draws["n"] += 1
        return reply(request.prompt_ids, [OTHER, PAD] if draws["n"] < 3 else [OTHER, 4])

    stand_in = StandIn(answer)
    try:
        engine = VLLMEngine(stand_in.url, tmp_path, tmp_path / "w", MEDIA)
        (generation,) = engine.generate([request], SamplingParams(max_new_tokens=4, seed=10))
        assert generation.token_ids == [OTHER, 4]
        assert [b["body"]["sampling_params"]["seed"] for b in stand_in.bodies] == [10, 11, 12]
        one_frame = GenerationRequest(request.prompt_ids, VisionInputs(frames=request.vision.frames[:1]))
        with pytest.raises(ValueError, match="2 image-pad runs but 1 frames"):
            engine.generate([one_frame], SamplingParams(max_new_tokens=4))
        draws["n"] = -10**6  # placeholders for ever
        with pytest.raises(VLLMServerError, match=f"{MEDIA_RETRIES} generations in a row held a media placeholder"):
            engine.generate([request], SamplingParams(max_new_tokens=4))
    finally:
        stand_in.close()


def test_a_weight_update_pauses_reloads_the_snapshot_tags_it_and_resumes(tmp_path):
    from paravt_core.agent.vllm_engine import VLLMEngine

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    stand_in = StandIn(lambda path, body: {"results": [None]} if path == "/collective_rpc" else {})
    try:
        engine = VLLMEngine(stand_in.url, tmp_path / "model", tmp_path / "weights", MEDIA)
        engine.update_weights({"w": torch.ones(2)})
        engine.update_weights({"w": torch.zeros(2)}, version=7)  # the trainer's W(7)
    finally:
        stand_in.close()
    calls = [(b["path"], b["body"].get("kwargs"), b["body"].get("new_version")) for b in stand_in.bodies]
    snapshot = str((tmp_path / "weights" / "v2").resolve())
    assert calls[2] == ("/update_weight_version", None, "v1")  # no version named: the snapshot's count
    assert calls[4:] == [("/pause?mode=wait", None, None),
                         ("/collective_rpc", {"weights_path": snapshot}, None),
                         ("/update_weight_version", None, "w7"), ("/resume", None, None)]
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v2"]
    assert (tmp_path / "weights" / "v2" / "config.json").is_file()


def test_the_weights_each_reply_names_are_counted_and_held_to_the_schedules_version(tmp_path):
    """Issue #65: vLLM labels the tokens of each reply with the weights that sampled them
    (`weight_versions` spans); a batch holding any other label than its schedule's stops the run."""
    from paravt_core.agent.vllm_engine import VLLMEngine
    from paravt_core.rl.served_policy import ServedPolicyMismatch, check_served_versions

    request = GenerationRequest([1, 2, 3])
    spans = {"now": [{"version": "w2", "start": 0, "end": 2}]}

    def answer(path, body):
        out = reply(request.prompt_ids, [OTHER, 4])
        out["choices"][0]["weight_versions"] = spans["now"]
        return out

    stand_in = StandIn(answer)
    try:
        engine = VLLMEngine(stand_in.url, tmp_path, tmp_path / "w", MEDIA)
        engine.generate([request] * 3, SamplingParams(max_new_tokens=2))
        assert engine.take_served_versions() == {"w2": 6} and engine.take_served_versions() == {}
        check_served_versions({"w2": 6}, 2, "RL step 3, rank 0", stand_in.url)
        # a push that landed mid-generation: the reply's tokens are split between two labels
        spans["now"] = [{"version": "w2", "start": 0, "end": 1}, {"version": "w3", "start": 1, "end": 2}]
        engine.generate([request], SamplingParams(max_new_tokens=2))
        served = engine.take_served_versions()
        assert served == {"w2": 1, "w3": 1}
        with pytest.raises(ServedPolicyMismatch, match=r"RL step 3, rank 0: the rollout server at \S+ sampled 1 of "
                                                       r"the batch's 2 tokens with other weights than the schedule's "
                                                       r"w2 \(W\(2\)\): \{'w3': 1\}"):
            check_served_versions(served, 2, "RL step 3, rank 0", stand_in.url)
        spans["now"] = None  # a vLLM that does not say
        engine.generate([request], SamplingParams(max_new_tokens=2))
        with pytest.raises(ServedPolicyMismatch, match="named no weight version in its replies"):
            check_served_versions(engine.take_served_versions(), 2, "RL step 3, rank 0", stand_in.url)
    finally:
        stand_in.close()


def test_a_vllm_rollout_with_nothing_to_launch_is_a_config_error(monkeypatch, tmp_path, tiny_model_dir,
                                                                   tiny_processor):
    from paravt_core.config import ConfigError, load_config
    from paravt_core.rl import rollout_engine

    monkeypatch.setenv("PARAVT_SERVE_PYTHON", sys.executable)  # the project's venv: no vLLM
    cfg = load_config("conf/pipeline/tiny.yaml", ["rl.rollout.engine=vllm"])
    with pytest.raises(ConfigError, match=r"rl.rollout.engine is vllm with no rl.rollout.vllm.url to connect to, and "
                                          r"no vLLM to launch one: neither SGLang nor vLLM|vllm is not installed"):
        rollout_engine.build_rollout_engine(cfg, tiny_model_dir, tiny_processor, "cpu", 0, 1, tmp_path,
                                                  content_hash(tiny_model_dir))
    with pytest.raises(ValueError, match="rl.rollout.vllm.url is set but rl.rollout.engine is hf"):
        load_config("conf/pipeline/tiny.yaml", ["rl.rollout.vllm.url=http://127.0.0.1:1"])


class _Launched(Exception):
    """Raised by the stand-in for `start_server`: the test needs the command, not a server."""


def test_the_8b_configs_rollout_server_is_launched_on_its_own_gpu(monkeypatch, tmp_path, tiny_model_dir,
                                                                  tiny_processor):
    """Issue #44 item 2: rank 0 of 7 trainers (GPUs 0-6, as the DeepSpeed launcher sets them) starts
    vLLM on GPU 7 alone, at the configured memory share, outside the trainers' torch.distributed job."""
    from paravt_core.agent import server_launch
    from paravt_core.config import load_config
    from paravt_core.rl import rollout_engine

    launched = {}

    def start_server(command, url, startup_timeout_s, *, env=None, **_):
        launched.update(command=list(command), env=dict(env))
        raise _Launched

    def probe_python(path):
        return server_launch.ServerPython(path, ("vllm",), cuda=True)

    monkeypatch.setattr(server_launch, "probe_python", probe_python)
    monkeypatch.setattr(rollout_engine, "probe_python", probe_python)  # imported at its top
    monkeypatch.setattr(server_launch, "start_server", start_server)
    for name, value in (("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6"), ("RANK", "0"), ("LOCAL_RANK", "0"),
                        ("WORLD_SIZE", "7"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)
    cfg = load_config("conf/pipeline/paravt_8b.yaml", [f"run.output_dir={tmp_path / 'run'}"])
    with pytest.raises(_Launched):
        rollout_engine.build_rollout_engine(cfg, tiny_model_dir, tiny_processor, "cuda:0", 0, 7, tmp_path,
                                            content_hash(tiny_model_dir))
    command, env = launched["command"], launched["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "7" and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert not {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT"} & set(env)
    flag = command.index("--gpu-memory-utilization")
    assert command[flag + 1] == str(cfg.rl.rollout.vllm.gpu_memory_utilization)
    assert "--tensor-parallel-size" not in command  # tp_size 1
    assert {"--enable-scale-out", "processed_logprobs"} <= set(command) and "--enforce-eager" not in command


def test_a_split_vllm_server_with_tensor_parallelism_gets_its_gpus_and_flags():
    from paravt_core.agent.vllm_engine import placement_settings

    assert placement_settings() == ((), {})  # colocated / CPU: what rank 0 sees, vLLM's own share
    assert placement_settings((6, 7), 2, 0.8) == (("--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.8"),
                                                  {"CUDA_VISIBLE_DEVICES": "6,7"})
