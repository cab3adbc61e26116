"""The `sglang` rollout backend: a client of a running SGLang server (GPU only).

STATUS: written against SGLang's documented `/generate` API but NOT run in this project's
CI, which has no GPU and cannot install SGLang. `tests/integration/test_rollout.py` holds a
`gpu` test that launches a server on the tiny model and compares greedy ids with the `hf`
backend; until that test has passed on a GPU machine, treat this backend as unverified.
Points known to need that check:
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

Constructing `SGLangEngine` without CUDA or without the `sglang` package raises
`SGLangUnavailable` saying so; use `rollout.engine: hf` on a CPU machine.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from paravt_core.agent.engine import Generation, GenerationRequest, SamplingParams, VisionInputs

DEFAULT_PORT = 30000
_CONFIG_FILES = ("config.json", "generation_config.json")


class SGLangUnavailable(RuntimeError):
    """SGLang cannot run here: no CUDA GPU, or the package is not installed."""


def require_sglang() -> None:
    """Raise `SGLangUnavailable` unless SGLang is installed and a CUDA GPU is visible."""
    problems = []
    if importlib.util.find_spec("sglang") is None:
        problems.append("the `sglang` package is not installed (`pip install -e '.[gpu]'` on a CUDA machine)")
    if not torch.cuda.is_available():
        problems.append("no CUDA GPU is visible")
    if problems:
        raise SGLangUnavailable(
            "the sglang rollout backend needs a CUDA machine with SGLang: " + "; ".join(problems)
            + ". On a CPU machine use the hf backend (rollout.engine: hf).")


def _post_json(url: str, payload: dict[str, Any], timeout_s: float) -> Any:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:500]
        raise RuntimeError(f"SGLang server at {url} answered {error.code}: {detail}") from error


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
        model_path: the checkpoint the server loaded; its config files are copied next to
            new weights by `update_weights`.
        timeout_s: per-request HTTP timeout.
    """

    def __init__(self, url: str, model_path: str | Path, timeout_s: float = 3600.0):
        require_sglang()
        self.url = url.rstrip("/")
        self.model_path = Path(model_path)
        self.timeout_s = timeout_s
        self._staging = Path(tempfile.mkdtemp(prefix="paravt-sglang-weights-"))

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
            raise RuntimeError(f"SGLang returned {len(results)} results for {len(requests)} requests")
        return [parse_generation(item) for item in results]

    def update_weights(self, state_dict: dict[str, Any]) -> None:
        """Write the weights as safetensors next to the model's config, then have the server reload them."""
        from safetensors.torch import save_file

        for name in _CONFIG_FILES:
            if (self.model_path / name).is_file():
                shutil.copy2(self.model_path / name, self._staging / name)
        tensors = {name: value.detach().to("cpu").contiguous() for name, value in state_dict.items()}
        save_file(tensors, str(self._staging / "model.safetensors"))
        reply = _post_json(f"{self.url}/update_weights_from_disk", {"model_path": str(self._staging)},
                           self.timeout_s)
        if isinstance(reply, dict) and reply.get("success") is False:
            raise RuntimeError(f"SGLang could not load the new weights: {reply.get('message')}")


@dataclass
class SGLangServer:
    """A server started by `launch_sglang_server`; `stop()` ends it."""

    process: subprocess.Popen
    url: str

    def stop(self, timeout_s: float = 30.0) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def launch_sglang_server(model_path: str | Path, port: int = DEFAULT_PORT, *, host: str = "127.0.0.1",
                         tp_size: int = 1, mem_fraction_static: float | None = None,
                         extra_args: Sequence[str] = (), startup_timeout_s: float = 900.0) -> SGLangServer:
    """Start `python -m sglang.launch_server` on `model_path` and wait until it answers /health.

    Raises:
        SGLangUnavailable: no CUDA or no sglang package.
        RuntimeError: the server exited or did not become healthy within the timeout.
    """
    require_sglang()
    command = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_path),
               "--host", host, "--port", str(port), "--tp-size", str(tp_size)]
    if mem_fraction_static is not None:
        command += ["--mem-fraction-static", str(mem_fraction_static)]
    command += list(extra_args)
    process = subprocess.Popen(command)
    server = SGLangServer(process, f"http://{host}:{port}")
    deadline = time.monotonic() + startup_timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"SGLang server exited with status {process.returncode}; command: {' '.join(command)}")
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=5) as response:
                if response.status == 200:
                    return server
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(2)
    server.stop()
    raise RuntimeError(f"SGLang server on {server.url} was not healthy after {startup_timeout_s:.0f} s")
