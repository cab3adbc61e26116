"""The `sglang` client's request bodies, run through SGLang's own request-side code (issue 44).

SGLang's wheel (the version `requirements-gpu.txt` pins) is installed without its
dependencies into a cache folder keyed by that version, with the few light packages its
modules import on the way to the request path (none of its GPU kernels): that is enough to
import its pure-Python modules on a CPU. `tests/sglang_request_side.py` then runs, in a
process of its own, the functions SGLang's HTTP server runs on a `/generate` body (its JSON
contract gate, the request parse, the tokenizer manager's image loading and pad expansion
with the checkpoint's processor, the sampling parameters' checks, the feature hash) and the
parse of the weight-update and memory bodies, on exactly the bodies our client sends; and
decodes the CPU stand-in server's answers (`tests/sglang_stub.py`) with SGLang's response
schema. Skipped, saying why, when the wheel cannot be installed (no package registry).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from paravt_core.agent.engine import GenerationRequest, SamplingParams
from tests.http_stand_in import StandIn

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# The packages SGLang's request-side modules import at load time beyond this project's own
# environment, at the versions SGLang pins where it pins them (its wheel metadata).
IMPORT_DEPENDENCIES = (
    "pybase64==1.5.1", "msgspec==0.22.0", "dill==0.4.1", "pyzmq==27.3.0", "uvloop==0.23.0",
    "apache-tvm-ffi==0.1.11", "openai==2.8.0", "jiter==0.19.0", "distro==1.9.0", "loguru==0.7.3",
    "partial_json_parser==0.2.1.1.post7", "sentencepiece==0.2.1", "gguf==0.19.0", "compressed-tensors==0.18.0",
)
TOP_K_ALL = 1 << 30  # what SGLang's `SamplingParams.normalize` turns our top_k = -1 into


def pinned_sglang_version() -> str:
    match = re.search(r"^sglang==(\S+)", (REPO / "requirements-gpu.txt").read_text(), re.MULTILINE)
    assert match, "requirements-gpu.txt pins no sglang version"
    return match.group(1)


@pytest.fixture(scope="session")
def sglang_packages() -> Path:
    """A folder holding SGLang's pinned wheel and its import dependencies, made once per version."""
    version = pinned_sglang_version()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "paravt" / f"sglang-{version}"
    if (cache / "sglang" / "version.py").is_file():
        return cache
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"sglang-{version}.", dir=cache.parent))
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile", "--retries", "0",
         "--timeout", "30", "--target", str(partial), f"sglang=={version}", *IMPORT_DEPENDENCIES],
        capture_output=True, text=True, timeout=900, check=False)
    if install.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        pytest.skip(f"cannot install sglang=={version} from the package registry: "
                    f"{install.stderr.strip().splitlines()[-1:] or install.stdout[-300:]}")
    try:
        partial.rename(cache)
    except OSError:  # another session finished the same install first
        shutil.rmtree(partial, ignore_errors=True)
    return cache


def run_request_side(packages: Path, model_dir: Path, bodies: list[dict], tmp_path: Path) -> list[dict]:
    """What SGLang's request-side code makes of each {"path", "body"} (tests/sglang_request_side.py)."""
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"model_dir": str(model_dir), "bodies": bodies}))
    env = {**os.environ, "PYTHONPATH": str(packages), "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, str(REPO / "tests" / "sglang_request_side.py"), str(job)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    return json.loads(lines[-1][len("RESULTS "):])


def sglang_answer(prompts: list[list[int]]):
    """A `/generate` reply as SGLang's server gives it (its response schema checks it below),
    with these prompt ids; any other POST (weights, memory) answers success."""

    def answer(path: str, body: dict):
        if path == "/generate":
            return [{"text": "", "output_ids": [5], "prompt_token_ids": ids,
                     "meta_info": {"output_token_logprobs": [[-0.5, 5, None]],
                                   "finish_reason": {"type": "stop", "matched": 5}}} for ids in prompts]
        return {"success": True, "message": "ok"}

    return answer


# Rollout frame bounds unlike the tiny checkpoint's own image processor's (784, 50176), as
# the 8B config's (784, 50176) are unlike Qwen3-VL's (65536, ...): the 32x64 crop frames
# are upscaled by the trainer, and must be by the server too.
PIXEL_BOUNDS = (4096, 12288)


def rollout_requests(processor) -> list[GenerationRequest]:
    """A main-agent prompt over four frames, a text-only one, and a context that gained two crop
    frames in a later turn (the vision of two encodes merged), as rollouts build them."""
    from paravt_core.agent.context import ChatRenderer
    from paravt_core.agent.media import with_frames
    from paravt_core.video import Frames

    renderer = ChatRenderer(processor, think_prefix=True, pixel_bounds=PIXEL_BOUNDS)
    rng = np.random.default_rng(0)

    def clip(n: int, height: int, width: int) -> Frames:
        frames = rng.integers(0, 255, size=(n, height, width, 3), dtype=np.uint8)
        return Frames(frames, [2.0 * i for i in range(n)], list(range(0, 4 * n, 4)), 2.0, 2.0 * n, 4 * n)

    def encode(question: str, frames: Frames | None, continuation: bool):
        content = ([{"type": "video"}] if frames else []) + [{"type": "text", "text": question}]
        messages = with_frames([{"role": "user", "content": content}], [frames] if frames else [])
        return renderer.encode(renderer.prompt_text(messages, None), [frames] if frames else [],
                               continuation=continuation)

    overview = encode("What colour is the square?", clip(4, 64, 96), continuation=False)
    text_only = encode("What happens first?", None, continuation=False)
    crops = encode("The crop you asked for:", clip(2, 32, 64), continuation=True)
    later = GenerationRequest(overview.token_ids + crops.token_ids, overview.vision.merged_with(crops.vision))
    return [GenerationRequest(overview.token_ids, overview.vision), GenerationRequest(text_only.token_ids), later]


def test_sglangs_own_request_code_takes_our_bodies_and_expands_our_ids(sglang_packages, tiny_model_dir,
                                                                      tiny_processor, tmp_path):
    from sglang_stub import TinySGLangServer, expanded_request

    from paravt_core.agent.sglang_engine import SGLangEngine, mm_process_config, parse_generation

    requests = rollout_requests(tiny_processor)
    recorder = StandIn(sglang_answer([list(request.prompt_ids) for request in requests]))
    try:
        engine = SGLangEngine.for_processor(recorder.url, tiny_model_dir, tmp_path / "weights", tiny_processor)
        params = SamplingParams(max_new_tokens=12, temperature=0.8, top_p=0.95, stop_token_ids=(5, 7), seed=11)
        engine.generate(requests, params)
        engine.release_memory()
        engine.resume_memory()
        engine.update_weights({"lm_head.weight": torch.zeros(2, 2)})
    finally:
        recorder.close()
    bodies = recorder.bodies
    assert [entry["path"] for entry in bodies] == ["/generate", "/release_memory_occupation",
                                                   "/resume_memory_occupation", "/update_weights_from_disk"]
    generate, weights = bodies[0]["body"], bodies[3]["body"]
    frames = sum(len(r.vision.frames) for r in requests)
    print(f"\n/generate body: {len(json.dumps(generate.get('image_data')).encode()) / frames:.0f} bytes of "
          "image_data JSON per frame")

    # The first request's ids as the trainer holds them (each image's pads expanded), which
    # is why the client collapses them: SGLang would expand each pad of the run again.
    expanded = {**generate, "input_ids": [list(requests[0].prompt_ids)], "image_data": generate["image_data"][:1]}
    # The CPU stand-in server's answers to our body, for SGLang's response schema (asserted
    # after SGLang's verdict on the body itself, which says more when both fail).
    launch_flag = mm_process_config(PIXEL_BOUNDS)  # what launch_sglang_server passes
    with TinySGLangServer(tiny_model_dir, mm_process_config=launch_flag) as stub:
        stub_request = urllib.request.Request(f"{stub.url}/generate", data=json.dumps(generate).encode(),
                                              headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(stub_request, timeout=600) as answer:
                answers, stub_refusal = json.loads(answer.read()), None
        except urllib.error.HTTPError as error:
            answers, stub_refusal = [], error.read().decode()
    served = run_request_side(sglang_packages, tiny_model_dir, [
        {**bodies[0], "mm_process_config": launch_flag}, *bodies[1:],
        {"path": "/generate", "body": expanded, "mm_process_config": launch_flag},
        *({"path": "/generate response", "body": answer} for answer in answers),
        {**bodies[0], "mm_process_config": None}], tmp_path)

    # /generate: past the contract gate and the parse; per request SGLang's expanded ids are
    # ours id for id, one image item per frame with our grid, each feature hashed.
    assert served[0]["contract_error"] is None and "parse_error" not in served[0], served[0]
    for request, ids, images, result in zip(requests, generate["input_ids"], generate["image_data"],
                                            served[0]["requests"], strict=True):
        assert "error" not in result, result
        assert result["input_ids"] == list(request.prompt_ids)
        grids = [] if request.vision.image_grid_thw is None else request.vision.image_grid_thw.tolist()
        assert [grid[0] for grid in result["image_grids"]] == grids
        assert len(result["feature_hashes"]) == len(request.vision.frames)
        assert result["return_logprob"] is True
        assert result["sampling"] == {"max_new_tokens": 12, "temperature": 0.8, "top_p": 0.95, "top_k": TOP_K_ALL,
                                      "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
                                      "frequency_penalty": 0.0, "stop_token_ids": [5, 7],
                                      "skip_special_tokens": False, "sampling_seed": 11}
        # The CPU stand-in server of the integration tests expands a body as SGLang does.
        assert expanded_request(tiny_processor, ids, images, launch_flag).prompt_ids == result["input_ids"]
    # A server launched without our bounds resizes every frame by the checkpoint's (Qwen3-VL's
    # shipped ones, which the tiny kit keeps): other ids wherever a request holds frames (the
    # text-only one is untouched), which the client's check refuses.
    unbounded = served[-1]["requests"]
    assert [result["input_ids"] == list(request.prompt_ids) for request, result in zip(requests, unbounded)] == [
        False, True, False]

    assert "AssertionError" in served[4]["requests"][0]["error"], served[4]
    assert stub_refusal is None, stub_refusal
    for request, answer, decoded in zip(requests, answers, served[5:-1], strict=True):
        assert "decode_error" not in decoded and decoded["finish_reason"] in ("FinishStop", "FinishLength"), decoded
        assert decoded["prompt_token_ids"] == list(request.prompt_ids)
        assert [entry[1] for entry in decoded["output_token_logprobs"]] == parse_generation(answer).token_ids
        # the stub's weight labels, in the shape SGLang's schema decodes
        assert decoded["weight_versions"] == [["initial", 0, len(parse_generation(answer).token_ids)]]

    # The memory and weight bodies parse into the routes' own types, with what we sent.
    assert all("parse_error" not in result for result in served[1:4]), served[1:4]
    parsed = served[3]["parsed"]
    assert parsed["model_path"] == weights["model_path"] and Path(parsed["model_path"]).name == "v1"
    assert parsed["weight_version"] == "1" and parsed["flush_cache"] is True


def test_the_weight_labels_sglang_puts_in_a_reply_are_what_the_rollout_counts(sglang_packages, tiny_model_dir,
                                                                               tmp_path):
    """Issue #65 on SGLang: a finished request's `meta_info.weight_versions` as SGLang's own
    scheduler and tokenizer-manager code build them, counted by the engine's `ServedVersions`
    and held to the schedule's label (`rl/served_policy.check_served_versions`)."""
    from paravt_core.agent.engine import ServedVersions
    from paravt_core.rl.served_policy import ServedPolicyMismatch, check_served_versions

    steady, split = run_request_side(sglang_packages, tiny_model_dir, [
        {"path": "weight versions", "body": {"events": [], "current": "w2", "tokens": 8}},
        {"path": "weight versions", "body": {"events": [["w1", 3]], "current": "w2", "tokens": 8}},
    ], tmp_path)
    counted = ServedVersions()
    counted.add(steady["meta_info"]["weight_versions"])
    assert counted.take() == {"w2": 8}
    check_served_versions({"w2": 8}, 2, "RL step 3, rank 0", "sglang")
    # weights pushed after 3 of the request's 8 tokens (a push that landed mid-batch)
    counted.add(split["meta_info"]["weight_versions"])
    served = counted.take()
    assert served == {"w1": 3, "w2": 5}
    with pytest.raises(ServedPolicyMismatch, match=r"sampled 3 of the batch's 8 tokens with other weights"):
        check_served_versions(served, 2, "RL step 3, rank 0", "sglang")
