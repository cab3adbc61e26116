"""A CPU stand-in for an SGLang server: the subset of its HTTP API this project uses,
answered by the tiny HF model through `HFEngine` (issue 14).

Native API (what `paravt_core/agent/sglang_engine.py` sends):
- `POST /generate`: `input_ids` (one list, or a list of lists) holding one `<|image_pad|>`
  per image, `image_data` (per request a list of PNG/JPEG data URLs, one per pad),
  `sampling_params` (`max_new_tokens`, `temperature`, `top_p`, `stop_token_ids`,
  `sampling_seed`), `return_logprob`, `return_prompt_token_ids`. Each pad is expanded to
  its image's count from the checkpoint's image processor, as SGLang's Qwen-VL processor
  does; that this stand-in expands a body exactly as SGLang 0.5.23 does (and that SGLang
  takes the body at all) is not this file's word: `tests/integration/test_sglang_request_side.py`
  runs SGLang's own request-side code on the client's bodies and compares, and decodes
  this stub's answers with SGLang's generated response schema. Answers per
  request `text`, `output_ids`, `prompt_token_ids` (when asked) and `meta_info` with
  `output_token_logprobs` ([logprob, token id, null] per token), `finish_reason`
  ({"type": "stop", "matched": id} or {"type": "length", "length": n}), token counts and
  `weight_version` and `weight_versions` (the spans SGLang 0.5.23 labels a finished request's
  output tokens with). A batch answers a list, a single request an object, as SGLang does.
- `POST /update_weights_from_disk`: `model_path`, a folder with config.json and
  *.safetensors; loaded in place (every model key must be there); answers `success`,
  `message`, `num_paused_requests`, with HTTP 400 on failure, as SGLang does.
- `POST /release_memory_occupation` / `/resume_memory_occupation`: while released,
  generating or loading weights is refused (SGLang has neither KV cache nor weights then).
- `GET /health`, `GET /get_model_info` (`weight_version`).

OpenAI API (what `paravt_core/eval/openai_engine.py` sends): `POST /v1/chat/completions`
with `messages` (text and base64 `image_url` items), `tools`, `max_tokens`, greedy
decoding, `continue_final_message` / `add_generation_prompt`; the server renders the
messages with the checkpoint's own chat template and processor, as SGLang and vLLM do, and
answers `choices[0].message.content`, `finish_reason` and `usage`; `POST /v1/completions`
with a prompt of token ids, answered with the sampled tokens and their log-probabilities.

Every request's path is appended to `calls`, so tests can check the order of operations.
`stop()` closes the socket: later requests are refused, as by a killed server.
`crash_on=(path, n)` makes the server die when the n-th request to `path` arrives: that
request gets no answer (the connection is dropped) and the socket is closed.
"""

from __future__ import annotations

import base64
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch

from paravt_core.agent.engine import GenerationRequest, SamplingParams, VisionInputs
from paravt_core.agent.hf_engine import HFEngine


class StubRequestError(ValueError):
    """A request the stub refuses (answered with HTTP 400 and this message)."""


def expanded_request(processor: Any, input_ids: list[int], images: list[str] | None,
                     mm_process_config: dict[str, Any] | None = None) -> GenerationRequest:
    """One request's ids with each `<|image_pad|>` expanded to its image's count, and its pixels.

    `mm_process_config` is SGLang's launch flag of that name: its "image" entry goes to the
    image processor as keywords (the pixel bounds, `sglang_engine.mm_process_config`).
    """
    images = list(images or [])
    pad_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    if input_ids.count(pad_id) != len(images):
        raise StubRequestError(f"prompt has {input_ids.count(pad_id)} image placeholder token(s) but "
                               f"{len(images)} image(s) were provided")
    if not images:
        return GenerationRequest(list(input_ids))
    image_processor = processor.image_processor
    batch = image_processor(images=[_decoded_image(url) for url in images], return_tensors="pt",
                            **(mm_process_config or {}).get("image", {}))
    counts = iter((batch["image_grid_thw"].prod(-1) // image_processor.merge_size**2).tolist())
    expanded: list[int] = []
    for token in input_ids:
        expanded += [pad_id] * next(counts) if token == pad_id else [token]
    return GenerationRequest(expanded, VisionInputs(pixel_values=batch["pixel_values"],
                                                    image_grid_thw=batch["image_grid_thw"]))


def _decoded_image(url: str):
    import numpy as np
    from PIL import Image

    if not url.startswith("data:image/"):
        raise StubRequestError(f"image_url {url[:40]!r} is not a data URL")
    data = base64.b64decode(url.split(",", 1)[1])
    return np.array(Image.open(io.BytesIO(data)).convert("RGB"))


class TinySGLangServer:
    """The stub server on 127.0.0.1 (module docstring); a context manager.

    Args:
        model_dir: the checkpoint to serve (loaded on the CPU in float32).
        served_model_name: the name the OpenAI API answers to (default: the folder path).
        crash_on: (path, n): die on the n-th request to `path` (module docstring).
        mm_process_config: SGLang's launch flag of that name (`expanded_request`).
    """

    def __init__(self, model_dir: str | Path, served_model_name: str | None = None,
                 crash_on: tuple[str, int] | None = None, mm_process_config: dict[str, Any] | None = None):
        from paravt_core.model.loading import load_model, load_processor

        self.model_dir = Path(model_dir)
        self.processor = load_processor(self.model_dir)
        self.engine = HFEngine(load_model(self.model_dir).eval(), self.processor)
        self.served_model_name = served_model_name or str(self.model_dir)
        self.calls: list[str] = []
        self.weight_version = "initial"
        self.released = False
        self.crash_on = crash_on
        self.mm_process_config = mm_process_config
        self._model_lock = threading.Lock()  # one generation or weight load at a time
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> TinySGLangServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> TinySGLangServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- endpoints -----------------------------------------------------------------------

    def generate(self, body: dict[str, Any]) -> Any:
        if self.released:
            raise StubRequestError("memory is released (release_memory_occupation); resume it before generating")
        single = bool(body["input_ids"]) and isinstance(body["input_ids"][0], int)
        prompts = [body["input_ids"]] if single else body["input_ids"]
        images = body.get("image_data") or [None] * len(prompts)
        images = [images] if single and body.get("image_data") else images
        if len(images) != len(prompts):
            raise StubRequestError(f"{len(images)} image_data entries for {len(prompts)} prompts")
        sampling = body.get("sampling_params") or {}
        params = SamplingParams(max_new_tokens=int(sampling.get("max_new_tokens", 128)),
                                temperature=float(sampling.get("temperature", 1.0)),
                                top_p=float(sampling.get("top_p", 1.0)),
                                stop_token_ids=tuple(sampling.get("stop_token_ids") or ()),
                                seed=sampling.get("sampling_seed"))
        requests = [expanded_request(self.processor, list(ids), items, self.mm_process_config)
                    for ids, items in zip(prompts, images)]
        with self._model_lock:
            generations = self.engine.generate(requests, params)
            version = self.weight_version  # the weights these generations were sampled with
        results = []
        for request, generation in zip(requests, generations):
            ids = generation.token_ids
            finish = ({"type": "stop", "matched": ids[-1]} if generation.finish_reason == "stop"
                      else {"type": "length", "length": len(ids)})
            # a generation holds the model lock: all its tokens are the weights' it began with
            meta = {"finish_reason": finish, "prompt_tokens": len(request.prompt_ids), "completion_tokens": len(ids),
                    "weight_version": version, "weight_versions": [{"version": version, "start": 0, "end": len(ids)}]}
            if body.get("return_logprob"):
                meta["output_token_logprobs"] = [[lp, token, None] for lp, token in zip(generation.logprobs, ids)]
            result = {"text": self.processor.tokenizer.decode(ids), "output_ids": ids, "meta_info": meta}
            if body.get("return_prompt_token_ids"):
                result["prompt_token_ids"] = request.prompt_ids
            results.append(result)
        return results[0] if single else results

    def update_weights_from_disk(self, body: dict[str, Any]) -> dict[str, Any]:
        from safetensors.torch import load_file

        if self.released:
            raise StubRequestError("memory is released (release_memory_occupation); resume it before loading weights")
        folder = Path(body["model_path"])
        files = sorted(folder.glob("*.safetensors"))
        if not (folder / "config.json").is_file() or not files:
            raise StubRequestError(f"{folder} has no config.json and *.safetensors to load")
        state: dict[str, torch.Tensor] = {}
        for file in files:
            state.update(load_file(str(file)))
        with self._model_lock:
            try:
                self.engine.update_weights(state)
            except KeyError as error:
                raise StubRequestError(f"weights in {folder} do not fit the model: {error}") from error
            self.weight_version = body.get("weight_version") or str(folder)
        return {"success": True, "message": f"Succeeded to update model weights from {folder}.",
                "num_paused_requests": 0}

    def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.released:
            raise StubRequestError("memory is released; resume it before generating")
        images, messages = [], []
        for message in body["messages"]:
            content = message["content"]
            if isinstance(content, list):
                items = []
                for item in content:
                    if item["type"] == "image_url":
                        images.append(_decoded_image(item["image_url"]["url"]))
                        items.append({"type": "image"})
                    else:
                        items.append(item)
                content = items
            messages.append({**message, "content": content})
        continuing = bool(body.get("continue_final_message"))
        text = self.processor.apply_chat_template(
            messages, tools=body.get("tools") or None, tokenize=False, continue_final_message=continuing,
            add_generation_prompt=bool(body.get("add_generation_prompt", not continuing)))
        encoded = self.processor(text=[text], images=images or None, return_tensors="pt")
        vision = VisionInputs(pixel_values=encoded.get("pixel_values"), image_grid_thw=encoded.get("image_grid_thw"))
        request = GenerationRequest(encoded["input_ids"][0].tolist(), vision)
        params = SamplingParams(max_new_tokens=int(body.get("max_tokens") or 128), temperature=0.0)
        with self._model_lock:
            (generation,) = self.engine.generate([request], params)
        ids = generation.token_ids
        stopped = generation.finish_reason == "stop"
        reply = self.processor.tokenizer.decode(ids[:-1] if stopped else ids, skip_special_tokens=True)
        return {"id": f"chatcmpl-{len(self.calls)}", "object": "chat.completion", "model": self.served_model_name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                             "finish_reason": "stop" if stopped else "length"}],
                "usage": {"prompt_tokens": len(request.prompt_ids), "completion_tokens": len(ids),
                          "total_tokens": len(request.prompt_ids) + len(ids)}}

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """The OpenAI completions endpoint for a prompt of token ids, with the sampled tokens'
        log-probabilities, in the fields vLLM answers (`token_ids` with `return_token_ids`,
        `logprobs.token_logprobs`): what the evaluation's log-probability probe reads
        (`agent/policy_probe.py`). That SGLang answers the probe so is not this file's word."""
        params = SamplingParams(max_new_tokens=int(body.get("max_tokens") or 16),
                                temperature=float(body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)),
                                seed=body.get("seed"))
        with self._model_lock:
            (generation,) = self.engine.generate([GenerationRequest([int(i) for i in body["prompt"]])], params)
        ids = generation.token_ids
        choice = {"index": 0, "text": self.processor.tokenizer.decode(ids),
                  "finish_reason": "stop" if generation.finish_reason == "stop" else "length",
                  "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": list(generation.logprobs)}}
        if body.get("return_token_ids"):
            choice["token_ids"] = ids
        return {"id": f"cmpl-{len(self.calls)}", "object": "text_completion", "model": self.served_model_name,
                "choices": [choice]}

    def _set_released(self, released: bool) -> dict[str, Any]:
        self.released = released
        return {"success": True}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self
        posts = {
            "/generate": server.generate,
            "/update_weights_from_disk": server.update_weights_from_disk,
            "/release_memory_occupation": lambda body: server._set_released(True),
            "/resume_memory_occupation": lambda body: server._set_released(False),
            "/v1/chat/completions": server.chat_completion,
            "/v1/completions": server.completion,
        }
        gets = {
            "/health": lambda: None,
            "/get_model_info": lambda: {"model_path": str(server.model_dir), "weight_version": server.weight_version},
            # As SGLang answers: root is the served name too (vLLM's is the folder it loaded).
            "/v1/models": lambda: {"object": "list", "data": [{"id": server.served_model_name, "object": "model",
                                                               "root": server.served_model_name}]},
        }

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the name http.server calls
                server.calls.append(self.path)
                if self.path not in gets:
                    self._answer(404, {"error": f"no GET {self.path}"})
                    return
                self._answer(200, gets[self.path]())

            def do_POST(self) -> None:  # the name http.server calls
                server.calls.append(self.path)
                if server.crash_on and server.calls.count(server.crash_on[0]) == server.crash_on[1]:
                    self.close_connection = True  # no answer, as from a process that died mid-request
                    threading.Thread(target=server.stop, daemon=True).start()
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                if self.path not in posts:
                    self._answer(404, {"error": f"no POST {self.path}"})
                    return
                try:
                    self._answer(200, posts[self.path](body))
                except (StubRequestError, KeyError, TypeError, ValueError) as error:
                    self._answer(400, {"success": False, "message": f"{type(error).__name__}: {error}"})

            def _answer(self, status: int, payload: Any) -> None:
                data = b"" if payload is None else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args) -> None:
                pass

        return Handler
