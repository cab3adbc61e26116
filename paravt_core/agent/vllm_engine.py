"""The `vllm` rollout backend: RL rollouts on a running vLLM server, token ids in and out.

What the server must give a rollout, and the vLLM 0.32 endpoints that give it (measured on
its CPU build with the tiny Qwen3-VL; the server tier tests each point):

- Token ids in, never re-templated, with the frames they show: `POST /inference/v1/generate`
  (`--enable-scale-out`) takes `token_ids` and `content_parts` (images as data URLs), and
  applies no chat template. It does expand every `<|image_pad|>` itself, with no check for
  pads already expanded: sending our expanded ids puts the images in the wrong places with
  status 200. So each run of pads is collapsed to one pad before sending, and the prompt
  ids the server reports back (`return_token_ids`) must equal ours, id for id, on every
  request (`VLLMTokenMismatch` otherwise, with where they part). Frames go as PNG, which is
  lossless: the server's pixels are the trainer's, and its processor resizes nothing since
  our frames already lie within its pixel bounds (a frame it resized would change the
  pad count, which the id check catches).
- Sampled token ids, the log-probability of each, the finish reason: `logprobs: 0` returns
  the sampled token's log-probability; the server must run with
  `--logprobs-mode processed_logprobs` so that it is log_softmax(logits / T), the value
  the trainer recomputes (the default, raw logits, differs by up to 0.12 at T = 0.8).
  Every sampling knob is sent explicitly and every vLLM we start has
  `--generation-config vllm` (`agent/server_launch.py`), so no default of the checkpoint's generation_config
  (top_k, penalties) changes the distribution.
- Media placeholders are never kept in a generation (a generated pad would desynchronize
  the next turn's pixels; the hf engine masks them after recording the log-probability).
  A logit bias or a banned-token list would do it, but vLLM applies both before it
  computes the processed log-probabilities, which then miss the masked mass (measured:
  0.0064 nats per token on the random tiny model), so the trainer's recomputed values
  would not match. Instead a generation holding one is drawn again (another seed), up to
  `MEDIA_RETRIES` times: the kept sample is the policy's, conditioned on holding none,
  and its log-probabilities are exactly the trainer's.
- New weights after each optimizer step: `POST /collective_rpc` with
  `reload_weights(weights_path=...)` (`VLLM_SERVER_DEV_MODE=1`) loads a safetensors
  snapshot in place; it is wrapped in `/pause?mode=wait` (drains in-flight requests and
  clears the prefix, multimodal and encoder caches) and `/resume`, because a reload alone
  leaves cached image embeddings that crash the next image request ("Encoder cache miss")
  and a prefix cache computed with the old weights. `/update_weight_version` tags outputs.
  vLLM's in-memory weight-transfer endpoints (`/init_weight_transfer_engine`,
  `/update_weights`) need NCCL or CUDA IPC and answer 500 on CPU.

`launch_vllm_rollout_server` starts a server with those flags from the serve venv
(`agent/server_launch.py`).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from paravt_core.agent.engine import Generation, GenerationRequest, SamplingParams
from paravt_core.agent.media import collapse_pads, first_difference, png_data_url
from paravt_core.agent.server_launch import launch
from paravt_core.agent.server_process import ServerProcess, server_healthy
from paravt_core.agent.weight_snapshots import SnapshotStager, WeightStream

ROLLOUT_ARGS = ("--enable-scale-out", "--logprobs-mode", "processed_logprobs")
ROLLOUT_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
MEDIA_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
MEDIA_RETRIES = 16
# What the DeepSpeed launcher sets for each training rank (torch.distributed's env:// rendezvous):
# a server that rank 0 starts is no member of that job, so it does not inherit them.
TRAINER_RANK_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class VLLMServerError(RuntimeError):
    """The server cannot be reached or refused a request; the message names the server and the call."""


class VLLMTokenMismatch(VLLMServerError):
    """The server expanded a prompt into other token ids than ours."""


def _post(url: str, payload: dict[str, Any] | None, timeout_s: float) -> Any:
    data = json.dumps(payload if payload is not None else {}).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            raw = response.read()
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:500]
        raise VLLMServerError(f"vLLM server at {url} answered {error.code}: {detail}") from error
    except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
        reason = getattr(error, "reason", error)
        raise VLLMServerError(
            f"vLLM server at {url} is unreachable ({reason}); restart it (or set rl.rollout.vllm.url to a live one) "
            "and re-run: the RL stage resumes from its latest checkpoint") from error
    return json.loads(raw) if raw.strip() else None


class VLLMEngine:
    """`RolloutEngine` over HTTP to a vLLM server started with `ROLLOUT_ARGS` / `ROLLOUT_ENV`.

    Args:
        url: the server root, e.g. "http://127.0.0.1:30000".
        model_path: the checkpoint the server loaded (config files for weight snapshots).
        staging_dir: where weight snapshots are written (a path the server can read).
        media_token_ids: {token: id} of the processor's media tokens; `<|image_pad|>` needed.
        dtype: the dtype snapshots are written in (the served model's).
        timeout_s: per-request HTTP timeout.
        max_in_flight: requests of one `generate` call sent at once (the server batches them).
        shm_dir: this run's /dev/shm folder, used instead of `staging_dir` when a snapshot fits
            there (`weight_snapshots.SnapshotStager`); only for a server on this machine.

    Raises:
        VLLMServerError: nothing healthy answers at `url`.
    """

    def __init__(self, url: str, model_path: str | Path, staging_dir: str | Path, media_token_ids: dict[str, int], *,
                 dtype: torch.dtype | None = None, timeout_s: float = 3600.0, max_in_flight: int = 64,
                 shm_dir: Path | None = None):
        self.url = url.rstrip("/")
        self.model_path, self.staging_dir = Path(model_path), Path(staging_dir)
        self.pad_id = media_token_ids["<|image_pad|>"]
        self.media_ids = frozenset(media_token_ids.values())
        self.dtype, self.timeout_s, self.max_in_flight = dtype, timeout_s, max_in_flight
        self.snapshots = SnapshotStager(self.staging_dir, shm_dir)
        if not server_healthy(self.url):
            raise VLLMServerError(f"no healthy vLLM server at {self.url} (GET /health failed); start one "
                                  "(`launch_vllm_rollout_server`) or fix rl.rollout.vllm.url")

    @classmethod
    def for_processor(cls, url: str, model_path: str | Path, staging_dir: str | Path, processor: Any,
                      **kwargs: Any) -> VLLMEngine:
        ids = {token: processor.tokenizer.convert_tokens_to_ids(token) for token in MEDIA_TOKENS}
        return cls(url, model_path, staging_dir, {t: i for t, i in ids.items() if isinstance(i, int) and i >= 0},
                   **kwargs)

    def sampling(self, params: SamplingParams) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "max_tokens": params.max_new_tokens, "temperature": params.temperature, "top_p": params.top_p,
            "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "logprobs": 0, "skip_special_tokens": False,
        }
        if params.stop_token_ids:
            payload["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            payload["seed"] = params.seed
        return payload

    def payload(self, request: GenerationRequest, params: SamplingParams) -> dict[str, Any]:
        """One `/inference/v1/generate` body: collapsed pads, the frames as PNG content parts."""
        ids, runs = collapse_pads(request.prompt_ids, self.pad_id)
        frames = request.vision.frames
        if runs != len(frames):
            raise ValueError(f"a rollout request holds {runs} image-pad runs but {len(frames)} frames; the vllm "
                             "engine needs each image's frame (VisionInputs.frames, set by ChatRenderer.encode)")
        body: dict[str, Any] = {"token_ids": ids, "sampling_params": self.sampling(params), "return_token_ids": True}
        if frames:
            body["content_parts"] = [{"type": "image_url", "url": png_data_url(frame)} for frame in frames]
        return body

    def _one(self, request: GenerationRequest, params: SamplingParams) -> Generation:
        """One request's generation, drawn again while it holds a media placeholder."""
        for attempt in range(MEDIA_RETRIES):
            tried = params if attempt == 0 or params.seed is None else replace(params, seed=params.seed + attempt)
            generation = self._draw(request, tried)
            if not self.media_ids.intersection(generation.token_ids):
                return generation
        raise VLLMServerError(f"vLLM at {self.url}: {MEDIA_RETRIES} generations in a row held a media placeholder "
                              "token; the policy puts too much mass on them to roll out")

    def _draw(self, request: GenerationRequest, params: SamplingParams) -> Generation:
        data = _post(f"{self.url}/inference/v1/generate", self.payload(request, params), self.timeout_s)
        served = data.get("prompt_token_ids")
        if served is not None and list(served) != list(request.prompt_ids):
            raise VLLMTokenMismatch(f"vLLM at {self.url} expanded a rollout prompt into other token ids than ours: "
                                    f"{first_difference(request.prompt_ids, served)}; its image processor's pixel "
                                    "bounds or chat template differ from the trainer's")
        choice = data["choices"][0]
        token_ids = [int(t) for t in choice["token_ids"]]
        logprobs = [float(entry["logprob"]) for entry in (choice.get("logprobs") or {}).get("content") or []]
        if len(logprobs) != len(token_ids):
            raise VLLMServerError(f"vLLM at {self.url} returned {len(token_ids)} tokens but {len(logprobs)} "
                                  "log-probabilities; is it started with --logprobs-mode processed_logprobs?")
        return Generation(token_ids, logprobs, "stop" if choice.get("finish_reason") == "stop" else "length")

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
        """Every request sent concurrently (the server batches them); results in request order."""
        if not requests:
            return []
        if len(requests) == 1:
            return [self._one(requests[0], params)]
        with ThreadPoolExecutor(max_workers=min(len(requests), self.max_in_flight),
                                thread_name_prefix="paravt-vllm") as pool:
            return list(pool.map(lambda request: self._one(request, params), requests))

    @property
    def weight_version(self) -> int:
        return self.snapshots.version

    def update_weights(self, state_dict: dict[str, Any] | WeightStream) -> None:
        """Write a snapshot, then pause (drain, clear caches), reload it in place, tag, resume.

        Raises:
            VLLMServerError: the server is unreachable or refused one of the calls.
        """
        version = self.weight_version + 1
        final = self.snapshots.write(self.model_path, state_dict, self.dtype)
        _post(f"{self.url}/pause?mode=wait", None, self.timeout_s)
        try:
            _post(f"{self.url}/collective_rpc", {"method": "reload_weights",
                                                 "kwargs": {"weights_path": str(final.resolve())}}, self.timeout_s)
            _post(f"{self.url}/update_weight_version", {"new_version": f"v{version}"}, self.timeout_s)
        finally:
            _post(f"{self.url}/resume", None, self.timeout_s)
        self.snapshots.loaded(final)

    def release_staged_weights(self) -> None:
        """Delete the /dev/shm snapshots (at the end of a run; the server holds its weights)."""
        self.snapshots.release()


def placement_settings(cuda_devices: Sequence[int] = (), tp_size: int = 1,
                       gpu_memory_utilization: float | None = None) -> tuple[tuple[str, ...], dict[str, str]]:
    """(extra server flags, extra environment) that put a rollout server on its GPUs.

    `cuda_devices` (split placement, `rl.rollout.vllm.gpus`) become the server's
    CUDA_VISIBLE_DEVICES, replacing the trainers' that rank 0 inherits from the DeepSpeed
    launcher (ranks 0..N-1 on GPUs 0..N-1), so the server never lands on a trainer's card.
    """
    args: list[str] = []
    if tp_size > 1:
        args += ["--tensor-parallel-size", str(tp_size)]
    if gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    env = {"CUDA_VISIBLE_DEVICES": ",".join(str(device) for device in cuda_devices)} if cuda_devices else {}
    return tuple(args), env


def launch_vllm_rollout_server(model_path: str | Path, port: int, *, python: str | None = None,
                               startup_timeout_s: float = 900.0, log_path: Path | None = None,
                               max_model_len: int | None = None, cuda_devices: Sequence[int] = (), tp_size: int = 1,
                               gpu_memory_utilization: float | None = None,
                               served_name: str = "paravt-rollout") -> ServerProcess:
    """Start vLLM on `model_path` for rollouts (`ROLLOUT_ARGS`, `ROLLOUT_ENV`) and wait for /health;
    on `cuda_devices` when given (`placement_settings`).

    Raises:
        ServeError: no interpreter with vLLM (`make install-serve`).
        ServerStartError: the server exited or never became healthy.
    """
    args, env = placement_settings(cuda_devices, tp_size, gpu_memory_utilization)
    _, server = launch(Path(model_path), served_name, port=port, server="vllm", python=python,
                       max_model_len=max_model_len, startup_timeout_s=startup_timeout_s, log_path=log_path,
                       extra=ROLLOUT_ARGS + args, extra_env={**ROLLOUT_ENV, **env}, drop_env=TRAINER_RANK_ENV)
    return server
