"""Main-agent and sub-agent prompts (SPEC §3, §7, §8) and the sglang backend's guard."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from paravt_core.agent.engine import GenerationRequest, SamplingParams, VisionInputs
from paravt_core.agent.prompts import (
    EpisodePrompt,
    format_clock,
    messages_from_rl_prompt,
    question_prompt,
    subagent_instruction,
    subagent_messages,
)
from tests.http_stand_in import StandIn


@pytest.mark.parametrize(("seconds", "clock"), [(0, "00:00"), (9.99, "00:09"), (75, "01:15"), (3725.5, "62:05")])
def test_format_clock(seconds, clock):
    assert format_clock(seconds) == clock


def test_subagent_prompt_states_window_duration_and_asks_for_a_summary_in_order():
    text = subagent_instruction(65.0, 80.5)
    assert "01:05 to 01:20" in text
    assert "15.5 seconds" in text
    assert "concise, factual summary" in text and "temporal order" in text
    (message,) = subagent_messages(65.0, 80.5)
    assert [item["type"] for item in message["content"]] == ["video", "text"]


def test_question_prompt_has_one_video_and_the_video_path_line():
    prompt = question_prompt("id-1", "/data/videos/clip.mp4", "What happens?", nframes=8)
    (message,) = prompt.messages
    assert message["content"][0] == {"type": "video"}
    assert message["content"][1]["text"].endswith("The video path for this video is: clip.mp4")
    assert "multiple <tool_call> blocks in one turn" in message["content"][1]["text"]
    assert prompt.nframes == 8 and prompt.tools[0]["function"]["name"] == "crop_video"


def test_rl_prompt_video_marker_becomes_the_video_item():
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "<video>\nWhat colour?"}]
    messages = messages_from_rl_prompt(turns)
    assert messages[0] == {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}
    assert messages[1]["content"] == [{"type": "video"}, {"type": "text", "text": "\nWhat colour?"}]
    EpisodePrompt("row-3", Path("v.mp4"), messages)


@pytest.mark.parametrize("content", ["no video here", "<video> and <video>"])
def test_episode_prompt_needs_exactly_one_video(content):
    with pytest.raises(ValueError, match="exactly one video item"):
        EpisodePrompt("row-9", Path("v.mp4"), messages_from_rl_prompt([{"role": "user", "content": content}]))


PAD = 9


def two_frame_request() -> GenerationRequest:
    frames = tuple(np.full((32, 32, 3), value, dtype=np.uint8) for value in (10, 200))
    ids = [1, 7, PAD, PAD, PAD, 8, 2, 7, PAD, PAD, PAD, 8, 3]
    return GenerationRequest(ids, VisionInputs(pixel_values=torch.zeros(6, 4), image_grid_thw=torch.ones(2, 3),
                                               frames=frames))


def test_sglang_payloads_and_parsing():
    from paravt_core.agent.sglang_engine import parse_generation, request_images, sampling_payload

    ids, images = request_images(two_frame_request(), PAD)
    assert ids == [1, 7, PAD, 8, 2, 7, PAD, 8, 3]  # one pad per image: SGLang expands it itself
    assert [image[:22] for image in images] == ["data:image/png;base64,"] * 2
    assert request_images(GenerationRequest([1, 2]), PAD) == ([1, 2], [])
    with pytest.raises(ValueError, match="2 image-pad runs and 1 frames"):
        request = two_frame_request()
        request_images(GenerationRequest(request.prompt_ids, VisionInputs(frames=request.vision.frames[:1])), PAD)
    payload = sampling_payload(SamplingParams(max_new_tokens=7, temperature=0.7, stop_token_ids=(5,), seed=3))
    assert payload["max_new_tokens"] == 7 and payload["stop_token_ids"] == [5] and payload["top_k"] == -1
    result = {"meta_info": {"output_token_logprobs": [[-0.1, 11, None], [-0.2, 5, None]],
                            "finish_reason": {"type": "stop", "matched": 5}}}
    generation = parse_generation(result)
    assert generation.token_ids == [11, 5] and generation.logprobs == [-0.1, -0.2]
    assert generation.finish_reason == "stop"


def test_the_sglang_client_refuses_prompt_ids_the_server_expanded_otherwise(tmp_path):
    from paravt_core.agent.sglang_engine import SGLangEngine, SGLangTokenMismatch

    request = two_frame_request()
    served = {"ids": list(request.prompt_ids)}

    def reply(path, body):
        return [{"output_ids": [5], "prompt_token_ids": served["ids"],
                 "meta_info": {"output_token_logprobs": [[-0.5, 5, None]], "finish_reason": {"type": "stop", "matched": 5}}}]

    with StandIn(reply) as stand_in:
        engine = SGLangEngine(stand_in.url, tmp_path, tmp_path / "w", {"<|image_pad|>": PAD})
        (generation,) = engine.generate([request], SamplingParams(max_new_tokens=4))
        assert generation.token_ids == [5]
        sent = stand_in.bodies[-1]["body"]
        assert sent["input_ids"] == [[1, 7, PAD, 8, 2, 7, PAD, 8, 3]]
        assert sent["return_prompt_token_ids"] is True and len(sent["image_data"][0]) == 2
        served["ids"] = request.prompt_ids[:3] + [PAD] + request.prompt_ids[3:]  # a frame resized larger
        with pytest.raises(SGLangTokenMismatch, match="first difference at position 5"):
            engine.generate([request], SamplingParams(max_new_tokens=4))


@pytest.mark.skipif(torch.cuda.is_available() and importlib.util.find_spec("sglang") is not None,
                    reason="SGLang can run here")
def test_launching_sglang_without_cuda_or_sglang_names_the_missing_piece():
    from paravt_core.agent.sglang_engine import SGLangUnavailable, launch_sglang_server

    with pytest.raises(SGLangUnavailable, match="needs a CUDA machine with SGLang") as raised:
        launch_sglang_server("model-dir")
    message = str(raised.value)
    assert ("SGLang is not installed" in message) or ("no CUDA GPU" in message)
    assert "rl.rollout.engine=hf" in message


def test_the_sglang_client_refuses_a_url_where_no_server_answers():
    from paravt_core.agent.sglang_engine import SGLangEngine, SGLangServerError
    from paravt_core.dist.launch import free_port

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(SGLangServerError, match=f"no healthy SGLang server at {url}"):
        SGLangEngine(url, "model-dir", "staging", {"<|image_pad|>": PAD})


def test_the_pipelines_sglang_server_gets_the_rollouts_pixel_bounds(monkeypatch, tmp_path, tiny_model_dir):
    """Without `--mm-process-config` SGLang resizes frames by the checkpoint's own bounds, so
    its pad counts would differ from the trainer's (tests/integration/test_sglang_request_side.py)."""
    from paravt_core.agent import sglang_engine
    from paravt_core.config import load_config
    from paravt_core.rl import rollout_engine

    launched = {}

    def record_command(command, url, startup_timeout_s, cuda_devices=()):
        launched["command"] = list(command)
        raise RuntimeError("recorded")

    monkeypatch.setattr(sglang_engine, "require_sglang", lambda: None)
    monkeypatch.setattr(sglang_engine, "wait_until_healthy", record_command)
    monkeypatch.setattr(rollout_engine, "sglang_installed", lambda: True)
    cfg = load_config(Path(__file__).resolve().parents[2] / "conf/pipeline/tiny.yaml",
                      ["rl.rollout.engine=sglang", "video.min_pixels=1024", "video.max_pixels=8192"])
    with pytest.raises(RuntimeError, match="recorded"):
        rollout_engine.build_rollout_engine(cfg, tiny_model_dir, None, "cpu", 0, 1, tmp_path / "rl" / "weights",
                                            "0" * 64)
    flag = launched["command"][launched["command"].index("--mm-process-config") + 1]
    assert json.loads(flag) == {"image": {"size": {"shortest_edge": 1024, "longest_edge": 8192}}}
