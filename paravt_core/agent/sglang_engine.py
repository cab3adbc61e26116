"""The `sglang` rollout backend: a client of a running SGLang server, and its launcher.

The client speaks SGLang's native HTTP API: `/generate` with our token ids and media (the
server never re-templates: SPEC §3 deltas), `/update_weights_from_disk` after each
optimizer step (`SGLangEngine.update_weights` says why that refit path), `/health`, and
`/release_memory_occupation` / `/resume_memory_occupation` for the co-located placement
(`paravt_core.config.SGLangServerConfig`). It needs no SGLang package and no GPU: CI runs
it against `tests/sglang_stub.py`, a CPU server implementing that subset with the tiny HF
model. Launching a real server (`launch_sglang_server`) needs both.

STATUS: the protocol is exercised on CPU against the stub only; not yet against a real
SGLang server (the `gpu` test `test_sglang_greedy_matches_hf` launches one on the tiny
model and compares greedy ids with the `hf` backend). Points that need that check:
- Media go as `image_data` items in SGLang's "processor_output" format (the processed
  pixels and grids of `VisionInputs`, as nested lists, since `/generate` takes JSON),
  because our prompt ids already hold the expanded `<|image_pad|>` tokens and timestamps
  (frames are timestamped images, SPEC §1). Whether the HTTP server accepts pixels in that
  form depends on the SGLang version.
- Whether the returned `output_token_logprobs` include the temperature depends on the
  SGLang version and its settings; `Generation.logprobs` must be the sampling
  distribution's (see `hf_engine.py`), and the gpu test compares them with a
  teacher-forced pass.
- The hf backend never generates media placeholder tokens (see `hf_engine.py`); this
  client does not yet stop the server from doing so.
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

from paravt_core.agent.engine import Generation, GenerationRequest, SamplingParams, VisionInputs
from paravt_core.agent.server_process import ServerProcess, server_healthy, start_server
from paravt_core.agent.weight_snapshots import drop_older_snapshots, latest_snapshot_version, write_weight_snapshot

DEFAULT_PORT = 30000


class SGLangUnavailable(RuntimeError):
    """SGLang cannot be launched here: no CUDA GPU, or the package is not installed."""


class SGLangServerError(RuntimeError):
    """The server cannot be reached or refused a request; the message names the server and the call."""


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


def vision_payload(vision: VisionInputs) -> list[dict[str, Any]]:
    """A request's media as SGLang "processor_output" items (empty for a text-only request)."""
    tensors = vision.as_kwargs()
    if not tensors:
        return []
    return [{"format": "processor_output", **{name: value.tolist() for name, value in tensors.items()}}]


def sampling_payload(params: SamplingParams) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "max_new_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": -1,
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
        dtype: the dtype snapshots are written in (the served model's; halves the bytes
            of an fp32 policy when the server runs bf16).
        timeout_s: per-request HTTP timeout.

    Raises:
        SGLangServerError: nothing healthy answers at `url`.
    """

    def __init__(self, url: str, model_path: str | Path, staging_dir: str | Path, *, dtype: torch.dtype | None = None,
                 timeout_s: float = 3600.0):
        self.url = url.rstrip("/")
        self.model_path = Path(model_path)
        self.staging_dir = Path(staging_dir)
        self.dtype = dtype
        self.timeout_s = timeout_s
        # A restarted trainer continues the numbering: the snapshot a live server loaded stays valid.
        self.weight_version = latest_snapshot_version(self.staging_dir)
        if not server_healthy(self.url):
            raise SGLangServerError(f"no healthy SGLang server at {self.url} (GET /health failed); start one or "
                                    "fix rl.rollout.sglang.url")

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
        """All requests in one `/generate` call; the server batches them itself."""
        if not requests:
            return []
        payload = {
            "input_ids": [list(request.prompt_ids) for request in requests],
            "image_data": [vision_payload(request.vision) for request in requests],
            "sampling_params": sampling_payload(params),
            "return_logprob": True,
        }
        results = _post_json(f"{self.url}/generate", payload, self.timeout_s)
        if isinstance(results, dict):
            results = [results]
        if len(results) != len(requests):
            raise SGLangServerError(f"SGLang at {self.url} returned {len(results)} results for {len(requests)} requests")
        return [parse_generation(item) for item in results]

    def update_weights(self, state_dict: dict[str, Any]) -> None:
        """Load new weights into the running server, in place, through `/update_weights_from_disk`.

        The weights are written as one safetensors snapshot beside the checkpoint's config
        (into `<staging_dir>/v<N>.partial`, renamed to `v<N>` once complete, so the server
        never reads a half-written file), the server is asked to load that folder, and the
        previous snapshot is deleted. Why disk and not SGLang's other two refit paths:
        `/update_weights_from_tensor` passes CUDA IPC handles, so trainer and server must
        share the GPUs (co-located, same node) and the tensors must stay on the GPU;
        `/update_weights_from_distributed` needs an NCCL group between the trainer ranks
        and the server's TP workers. Disk works across processes and machines with any
        placement, the snapshot is the source of truth a restarted server can load, and
        at 8B in bf16 (about 17 GB) it costs seconds per step against a ~250 s step.

        Raises:
            SGLangServerError: the server is unreachable or reports that the load failed.
        """
        version = self.weight_version + 1
        final = write_weight_snapshot(self.staging_dir, version, self.model_path, state_dict, self.dtype)
        reply = _post_json(f"{self.url}/update_weights_from_disk",
                           {"model_path": str(final), "weight_version": str(version), "flush_cache": True},
                           self.timeout_s)
        if isinstance(reply, dict) and reply.get("success") is False:
            raise SGLangServerError(f"SGLang at {self.url} could not load the weights in {final}: "
                                    f"{reply.get('message')}")
        self.weight_version = version
        drop_older_snapshots(self.staging_dir, final)

    def release_memory(self) -> None:
        """Free the server's weights and KV cache (co-located placement, before training)."""
        _post_json(f"{self.url}/release_memory_occupation", {}, self.timeout_s)

    def resume_memory(self) -> None:
        """Take the server's GPU memory back (co-located placement, before the weight update)."""
        _post_json(f"{self.url}/resume_memory_occupation", {}, self.timeout_s)


def launch_sglang_server(model_path: str | Path, port: int = DEFAULT_PORT, *, host: str = "127.0.0.1",
                         tp_size: int = 1, mem_fraction_static: float | None = None,
                         enable_memory_saver: bool = False, cuda_devices: Sequence[int] = (),
                         served_model_name: str | None = None, extra_args: Sequence[str] = (),
                         startup_timeout_s: float = 900.0) -> ServerProcess:
    """Start `python -m sglang.launch_server` on `model_path` and wait until it answers /health.

    `cuda_devices` (split placement) pins the server to those GPUs; `enable_memory_saver`
    (co-located placement) lets `release_memory` / `resume_memory` free and retake its memory.

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
