"""The `sglang` rollout backend: a client of a running SGLang server, and its launcher.

The client speaks SGLang's native HTTP API: `/generate` with our token ids and frames (the
server never re-templates: SPEC §3 deltas), `/update_weights_from_disk` after each
optimizer step (`SGLangEngine.update_weights` says why that refit path), `/health`, and
`/release_memory_occupation` / `/resume_memory_occupation` for the co-located placement
(`paravt_core.config.SGLangServerConfig`). It needs no SGLang package and no GPU. The
rollout engine proven end to end is `vllm` (`vllm_engine.py`); this one is a switch whose
request bodies are held to SGLang's own request-side code (below).

How frames go (SGLang 0.5.23, read from its source and run on CPU by
`tests/integration/test_sglang_request_side.py`, which feeds this client's bodies to SGLang's
contract gate, request parse, tokenizer manager and feature hash):
- Per request, `image_data` is a list of PNG data URLs, one per frame in prompt order,
  and `input_ids` holds ONE `<|image_pad|>` per image (`media.collapse_pads`). SGLang's
  Qwen-VL processor decodes the images with the checkpoint's image processor and expands
  each single pad to that image's count, keeping every other id of ours; ids with the
  runs already expanded fail there (an AssertionError in `build_input_ids`). PNG is
  lossless, so the server's pixels are the trainer's, and the server is launched with
  our per-frame pixel bounds (`mm_process_config`) so that its processor resizes as the
  trainer's did. `return_prompt_token_ids` makes the server return the expanded ids,
  which must equal ours id for id on every request (`SGLangTokenMismatch` otherwise): a
  server whose image processor resized a frame differently is refused, never trained on.
- Sent before: the processed pixels as a "processor_output" item of nested float lists.
  SGLang refuses it at its JSON contract gate (`MediaRef` rejects unknown fields), and past
  that its `hash_feature` raises `TypeError: object supporting the buffer API required` on
  a list of floats; as JSON it also cost 6.3 MB per 8B-model frame (224x224) against
  0.13-0.20 MB as a PNG data URL (docs/serving.md).

STATUS: the request bodies are checked against SGLang's own code on CPU; generations are
exercised against `tests/sglang_stub.py` (the tiny HF model), not yet against a real
SGLang server (the `gpu` test `test_sglang_greedy_matches_hf` does that). Open points:
- Whether the returned `output_token_logprobs` include the temperature depends on the
  SGLang version and its settings; `Generation.logprobs` must be the sampling
  distribution's (see `hf_engine.py`), and the gpu test compares them with a
  teacher-forced pass.
- The hf backend never generates media placeholder tokens (see `hf_engine.py`); this
  client does not yet stop the server from doing so (the vllm engine draws again).
- `Generation.token_ids` must end with the stop token when the server stopped on one;
  `parse_generation` takes the ids of `output_token_logprobs` as they come.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from paravt_core.agent.engine import Generation, GenerationRequest, SamplingParams, ServedVersions, weight_label
from paravt_core.agent.media import collapse_pads, first_difference, png_data_url
from paravt_core.agent.server_process import ServerProcess, server_healthy, start_server
from paravt_core.agent.weight_snapshots import SnapshotStager, WeightStream

DEFAULT_PORT = 30000


class SGLangUnavailable(RuntimeError):
    """SGLang cannot be launched here: no CUDA GPU, or the package is not installed."""


class SGLangServerError(RuntimeError):
    """The server cannot be reached or refused a request; the message names the server and the call."""


class SGLangTokenMismatch(SGLangServerError):
    """The server expanded a prompt into other token ids than ours."""


def sglang_installed() -> bool:
    return importlib.util.find_spec("sglang") is not None


def require_sglang() -> None:
    """Raise `SGLangUnavailable` unless SGLang is installed and a CUDA GPU is visible."""
    problems = []
    if not sglang_installed():
        problems.append("SGLang is not installed (install the GPU profile: `pip install -e '.[gpu]'`)")
    if not torch.cuda.is_available():
        problems.append("no CUDA GPU is visible")
    if problems:
        raise SGLangUnavailable(
            "launching an SGLang server needs a CUDA machine with SGLang: " + "; ".join(problems)
            + ". Point at a running server (rl.rollout.sglang.url) or set rl.rollout.engine=hf.")


def _post_json(url: str, payload: dict[str, Any], timeout_s: float) -> Any:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:500]
        raise SGLangServerError(f"SGLang server at {url} answered {error.code}: {detail}") from error
    except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
        reason = getattr(error, "reason", error)
        raise SGLangServerError(
            f"SGLang server at {url} is unreachable ({reason}); restart it (or set rl.rollout.sglang.url to a "
            "live one) and re-run: the RL stage resumes from its latest checkpoint") from error


def request_images(request: GenerationRequest, pad_id: int) -> tuple[list[int], list[str]]:
    """(`input_ids`, `image_data`) of one request as SGLang takes them (module docstring).

    Raises:
        ValueError: the image-pad runs and the frames do not pair up one to one.
    """
    ids, runs = collapse_pads(request.prompt_ids, pad_id)
    frames = request.vision.frames
    if runs != len(frames) or request.vision.pixel_values_videos is not None:
        raise ValueError(f"a rollout request holds {runs} image-pad runs and {len(frames)} frames"
                         f"{' and video pixels' if request.vision.pixel_values_videos is not None else ''}; the "
                         "sglang engine sends each image's frame (VisionInputs.frames, set by ChatRenderer.encode) "
                         "and no video items (frames are images, SPEC §1)")
    return ids, [png_data_url(frame) for frame in frames]


def sampling_payload(params: SamplingParams) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "max_new_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": -1,  # SGLang's "whole vocabulary"; every knob is sent so no server default moves the distribution
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "skip_special_tokens": False,
    }
    if params.stop_token_ids:
        payload["stop_token_ids"] = list(params.stop_token_ids)
    if params.seed is not None:  # per-request seeding needs an SGLang with deterministic sampling
        payload["sampling_seed"] = params.seed
    return payload


def parse_generation(item: dict[str, Any]) -> Generation:
    """A `Generation` from one `/generate` result (`output_ids`, `meta_info`)."""
    meta = item["meta_info"]
    token_logprobs = meta["output_token_logprobs"]  # [[logprob, token_id, text], ...]
    token_ids = [int(entry[1]) for entry in token_logprobs]
    finish = meta.get("finish_reason") or {}
    return Generation(token_ids=token_ids, logprobs=[float(entry[0]) for entry in token_logprobs],
                      finish_reason="stop" if finish.get("type") == "stop" else "length")


class SGLangEngine:
    """`RolloutEngine` over HTTP to an SGLang server (see the module docstring's STATUS).

    Args:
        url: the server, e.g. "http://127.0.0.1:30000".
        model_path: the checkpoint the server loaded; its config files go next to each
            weight snapshot `update_weights` writes.
        staging_dir: where weight snapshots are written (a path the server can read).
        media_token_ids: {token: id} of the processor's media tokens; `<|image_pad|>` needed.
        dtype: the dtype snapshots are written in (the served model's; halves the bytes
            of an fp32 policy when the server runs bf16).
        timeout_s: per-request HTTP timeout.
        shm_dir: this run's /dev/shm folder, used instead of `staging_dir` when a snapshot fits
            there (`weight_snapshots.SnapshotStager`); only for a server on this machine.

    Raises:
        SGLangServerError: nothing healthy answers at `url`.
    """

    def __init__(self, url: str, model_path: str | Path, staging_dir: str | Path, media_token_ids: dict[str, int], *,
                 dtype: torch.dtype | None = None, timeout_s: float = 3600.0, shm_dir: Path | None = None):
        self.url = url.rstrip("/")
        self.model_path = Path(model_path)
        self.staging_dir = Path(staging_dir)
        self.pad_id = media_token_ids["<|image_pad|>"]
        self.dtype = dtype
        self.timeout_s = timeout_s
        # A restarted trainer continues the numbering: the snapshot a live server loaded stays valid.
        self.snapshots = SnapshotStager(self.staging_dir, shm_dir)
        self.served_versions = ServedVersions()  # each reply's `meta_info.weight_versions` (`take_served_versions`)
        if not server_healthy(self.url):
            raise SGLangServerError(f"no healthy SGLang server at {self.url} (GET /health failed); start one or "
                                    "fix rl.rollout.sglang.url")

    @classmethod
    def for_processor(cls, url: str, model_path: str | Path, staging_dir: str | Path, processor: Any,
                      **kwargs: Any) -> SGLangEngine:
        pad = "<|image_pad|>"
        return cls(url, model_path, staging_dir, {pad: processor.tokenizer.convert_tokens_to_ids(pad)}, **kwargs)

    def payload(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> dict[str, Any]:
        """The `/generate` body of a batch: per request collapsed ids and its frames as PNG."""
        input_ids, image_data = zip(*(request_images(request, self.pad_id) for request in requests))
        body: dict[str, Any] = {"input_ids": list(input_ids), "sampling_params": sampling_payload(params),
                                "return_logprob": True, "return_prompt_token_ids": True}
        if any(image_data):  # a text-only request has [] (SGLang reads it as no images)
            body["image_data"] = list(image_data)
        return body

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
        """All requests in one `/generate` call (the server batches them); results in request order.

        Raises:
            SGLangTokenMismatch: the server expanded a prompt into other ids than ours.
            SGLangServerError: the server is unreachable or refused the call.
        """
        if not requests:
            return []
        results = _post_json(f"{self.url}/generate", self.payload(requests, params), self.timeout_s)
        if isinstance(results, dict):
            results = [results]
        if len(results) != len(requests):
            raise SGLangServerError(f"SGLang at {self.url} returned {len(results)} results for {len(requests)} requests")
        for request, item in zip(requests, results):
            served = item.get("prompt_token_ids")
            if served is not None and list(served) != list(request.prompt_ids):
                raise SGLangTokenMismatch(
                    f"SGLang at {self.url} expanded a rollout prompt into other token ids than ours: "
                    f"{first_difference(request.prompt_ids, served)}; its image processor's pixel bounds or the "
                    "checkpoint's processor differ from the trainer's (a server not launched by the pipeline needs "
                    "--mm-process-config with video.min_pixels / video.max_pixels, see sglang_engine.mm_process_config)")
        for item in results:
            self.served_versions.add(item["meta_info"].get("weight_versions"))
        return [parse_generation(item) for item in results]

    @property
    def weight_version(self) -> int:
        return self.snapshots.version

    def take_served_versions(self) -> dict[str, int]:
        """{weight label: tokens} the server reported sampling since the last call: SGLang labels a
        finished request's output tokens with the weights that sampled them (`meta_info.weight_versions`)."""
        return self.served_versions.take()

    def update_weights(self, state_dict: dict[str, Any] | WeightStream, version: int | None = None) -> None:
        """Load new weights into the running server, in place, through `/update_weights_from_disk`,
        tagged with the trainer's weight version (`agent.engine.weight_label`; None: the snapshot's count).

        The weights are written as one safetensors snapshot beside the checkpoint's config
        (into `<staging_dir>/v<N>.partial`, or this run's /dev/shm folder when it fits there,
        renamed to `v<N>` once complete, so the server never reads a half-written file; see
        `weight_snapshots.SnapshotStager`), the server is asked to load that folder, and the
        previous snapshot is deleted. Why disk and not SGLang's other two refit paths:
        `/update_weights_from_tensor` passes CUDA IPC handles, so trainer and server must
        share the GPUs (co-located, same node) and the tensors must stay on the GPU;
        `/update_weights_from_distributed` needs an NCCL group between the trainer ranks
        and the server's TP workers. Disk works across processes and machines with any
        placement, and the snapshot is the source of truth a restarted server can load; at
        8B in bf16 (17.5 GB) writing it would take 20-32 s per step at the rate measured on a
        loaded 2-core CPU host (`bench/weight_push.py`, docs/scale.md), against a ~250 s step.

        Raises:
            SGLangServerError: the server is unreachable or reports that the load failed.
        """
        label = weight_label(version) if version is not None else str(self.weight_version + 1)
        final = self.snapshots.write(self.model_path, state_dict, self.dtype)
        reply = _post_json(f"{self.url}/update_weights_from_disk",
                           {"model_path": str(final), "weight_version": label, "flush_cache": True},
                           self.timeout_s)
        if isinstance(reply, dict) and reply.get("success") is False:
            raise SGLangServerError(f"SGLang at {self.url} could not load the weights in {final}: "
                                    f"{reply.get('message')}")
        self.snapshots.loaded(final)

    def release_staged_weights(self) -> None:
        """Delete the /dev/shm snapshots (at the end of a run; the server holds its weights)."""
        self.snapshots.release()

    def release_memory(self) -> None:
        """Free the server's weights and KV cache (co-located placement, before training)."""
        _post_json(f"{self.url}/release_memory_occupation", {}, self.timeout_s)

    def resume_memory(self) -> None:
        """Take the server's GPU memory back (co-located placement, before the weight update)."""
        _post_json(f"{self.url}/resume_memory_occupation", {}, self.timeout_s)


def mm_process_config(pixel_bounds: tuple[int, int]) -> dict[str, Any]:
    """SGLang's `--mm-process-config`: its image processor's per-image (min, max) pixels.

    The rollout renders frames with our bounds (SPEC §3, `ChatRenderer`); SGLang runs the
    checkpoint's image processor with the checkpoint's own (Qwen3-VL's shortest_edge is
    65536, so a 50176-pixel frame would be upscaled into more pads) unless this flag hands it
    ours: then it expands each image to our count (`tests/integration/test_sglang_request_side.py`).
    """
    return {"image": {"size": {"shortest_edge": pixel_bounds[0], "longest_edge": pixel_bounds[1]}}}


def launch_sglang_server(model_path: str | Path, port: int = DEFAULT_PORT, *, host: str = "127.0.0.1",
                         tp_size: int = 1, mem_fraction_static: float | None = None,
                         enable_memory_saver: bool = False, cuda_devices: Sequence[int] = (),
                         pixel_bounds: tuple[int, int] | None = None, served_model_name: str | None = None,
                         extra_args: Sequence[str] = (), startup_timeout_s: float = 900.0) -> ServerProcess:
    """Start `python -m sglang.launch_server` on `model_path` and wait until it answers /health.

    `cuda_devices` (split placement) pins the server to those GPUs; `enable_memory_saver`
    (co-located placement) lets `release_memory` / `resume_memory` free and retake its memory;
    `pixel_bounds` (the rollouts' per-frame pixels) goes to its image processor
    (`mm_process_config`).

    Raises:
        SGLangUnavailable: no CUDA or no sglang package.
        ServerStartError: the server exited or did not become healthy within the timeout.
    """
    require_sglang()
    command = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_path),
               "--host", host, "--port", str(port), "--tp-size", str(tp_size)]
    if mem_fraction_static is not None:
        command += ["--mem-fraction-static", str(mem_fraction_static)]
    if enable_memory_saver:
        command.append("--enable-memory-saver")
    if pixel_bounds is not None:
        command += ["--mm-process-config", json.dumps(mm_process_config(pixel_bounds))]
    if served_model_name:
        command += ["--served-model-name", served_model_name]
    command += list(extra_args)
    return wait_until_healthy(command, f"http://{host}:{port}", startup_timeout_s, cuda_devices)


def wait_until_healthy(command: Sequence[str], url: str, startup_timeout_s: float,
                       cuda_devices: Sequence[int] = ()) -> ServerProcess:
    """Start a server `command` (in its own process group) and return once `url`/health answers 200.

    Raises:
        ServerStartError: the process exited, or was not healthy within the timeout (then stopped).
    """
    env = dict(os.environ)
    if cuda_devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(device) for device in cuda_devices)
    return start_server(command, url, startup_timeout_s, env=env)
