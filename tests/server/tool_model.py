"""A tiny Qwen3-VL that calls tools: taught, by teacher forcing, the episodes of a script.

A random-weight model never writes a `<tool_call>`, so a server test on it never reaches a
tool round. This module makes one that does, through the code the evaluator really runs:

1. `record_requests` plays the evaluation episodes with the real `OpenAISampleRunner`
   against a scripted client (no model): main turn k of an MCQ or grounding sample gets
   the script's k-th reply (two crop calls, then one, then the answer), every sub-agent
   request gets `SUMMARY`. Each request's messages (frames as the JPEG data URLs the
   server will get) and reply are kept.
2. `teach` renders each request as a server does (the checkpoint's chat template with
   `continue_final_message` when the think prefix is continued, the JPEG frames decoded
   to pixels) and trains the tiny model on the reply tokens plus `<|im_end|>` until greedy
   decoding gives every reply (checked with transformers), then saves the folder.

Served by vLLM, the model then plays those same episodes greedily, because each request it
gets is one it learnt: turn one calls two crops, the sub-agents summarize, turn two calls
one more, the forced turn answers.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import io
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SUMMARY = "A red square on green."
SUBAGENT_MARK = "concise, factual summary"


def calls(*windows: tuple[float, float]) -> str:
    blocks = [f'<tool_call>{{"name": "crop_video", "arguments": {{"video_path": "clip.mp4", "start_time": {s}, '
              f'"end_time": {e}}}}}</tool_call>' for s, e in windows]
    return "\n".join(blocks)


SCRIPTS = {
    "mcq": ["I need a closer look.\n</think>\n" + calls((0, 4), (4, 8)),
            "One more window.\n</think>\n" + calls((8, 12)),
            "<answer>B</answer>"],
    "grounding": ["I need a closer look.\n</think>\n" + calls((0, 6), (6, 12)),
                  "One more window.\n</think>\n" + calls((2, 4)),
                  "The event happens in the 1.0 - 3.0 seconds."],
}


@dataclass
class Request:
    messages: list[dict[str, Any]]
    continue_final_message: bool
    reply: str
    subagent: bool


def _texts(messages: Sequence[dict[str, Any]]) -> list[str]:
    out = []
    for message in messages:
        content = message["content"]
        out += [content] if isinstance(content, str) else [i["text"] for i in content if i["type"] == "text"]
    return out


class ScriptedClient:
    """Stands in for `OpenAIChatClient`: answers from `SCRIPTS` and records every request."""

    url = "scripted://"

    def __init__(self):
        self.requests: list[Request] = []
        self._lock = threading.Lock()

    def complete(self, messages, *, max_tokens: int, tools=(), continue_final_message: bool = False,
                 return_token_ids: bool = False):
        from paravt_core.eval.openai_engine import ChatReply

        texts = _texts(messages)
        subagent = any(SUBAGENT_MARK in text for text in texts)
        if subagent:
            reply = SUMMARY
        else:
            script = SCRIPTS["mcq" if any("Options:" in text for text in texts) else "grounding"]
            turn = sum(m["role"] == "assistant" for m in messages) - int(continue_final_message)
            reply = script[min(turn, len(script) - 1)]
        with self._lock:
            self.requests.append(Request(copy.deepcopy(list(messages)), continue_final_message, reply, subagent))
        return ChatReply(reply, "stop")


def record_requests(runner_factory, splits: dict[str, list]) -> list[Request]:
    """Every request the evaluator sends while playing `splits` ({split: samples}) on the script."""
    client = ScriptedClient()
    runner = runner_factory(client)
    for samples in splits.values():
        for _ in runner.outcomes(samples):
            pass
    return client.requests


def _decoded(url: str) -> np.ndarray:
    from PIL import Image

    payload = url.split(",", 1)[1]
    return np.array(Image.open(io.BytesIO(base64.b64decode(payload))).convert("RGB"))


def _as_embedded(messages: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[np.ndarray]]:
    """Messages with image placeholders, and the frames (decoded from their data URLs) in order."""
    frames: list[np.ndarray] = []
    out = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            items = []
            for item in content:
                if item["type"] == "image_url":
                    frames.append(_decoded(item["image_url"]["url"]))
                    items.append({"type": "image"})
                else:
                    items.append(dict(item))
            content = items
        out.append({**message, "content": content})
    return out, frames


@dataclass
class Example:
    prompt_ids: list[int]
    target_ids: list[int]
    token_types: list[int]  # the prompt's mm_token_type_ids (0 text, 1 image)
    vision: dict[str, Any]


def examples(requests: Sequence[Request], processor) -> list[Example]:
    """Each distinct request rendered as the server renders it, with its reply as the target."""
    tokenizer = processor.tokenizer
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    seen, out = set(), []
    for request in requests:
        messages, frames = _as_embedded(request.messages)
        if request.continue_final_message:
            text = processor.apply_chat_template(messages, tokenize=False, continue_final_message=True,
                                                 add_generation_prompt=False)
        else:
            text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        key = hashlib.sha256(text.encode() + request.reply.encode()
                             + b"".join(frame.tobytes() for frame in frames)).hexdigest()
        if key in seen:
            continue
        seen.add(key)
        encoded = processor(text=[text], images=frames or None, return_tensors="pt")
        target = tokenizer(request.reply, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(target) == request.reply, f"the tiny tokenizer does not round-trip {request.reply!r}"
        vision = {k: encoded[k] for k in ("pixel_values", "image_grid_thw") if k in encoded}
        types = encoded["mm_token_type_ids"][0].tolist() if "mm_token_type_ids" in encoded else []
        out.append(Example(encoded["input_ids"][0].tolist(), [*target, end], types, vision))
    return out


def _media(example: Example, extra: int) -> dict[str, Any]:
    """The example's pixels and token types, the types padded with text for `extra` more tokens."""
    import torch

    if not example.vision:
        return {}
    return {**example.vision, "mm_token_type_ids": torch.tensor([example.token_types + [0] * extra])}


def _greedy(model, example: Example) -> list[int]:
    import torch

    ids = torch.tensor([example.prompt_ids])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **_media(example, 0),
                             max_new_tokens=len(example.target_ids) + 2, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def teach(base_dir: Path, out_dir: Path, examples_: Sequence[Example], video, *, max_epochs: int = 300,
          check_every: int = 20, lr: float = 2e-3, seed: int = 0) -> Path:
    """Train `base_dir`'s model on the examples until greedy decoding gives every target; export
    it as the SFT and RL stages do (`export_hf_model`, with `video`'s pixel bounds).

    Raises:
        AssertionError: some target is still not reproduced after `max_epochs`.
    """
    import torch

    from paravt_core.dist.weights import export_hf_model
    from paravt_core.model.loading import load_model

    torch.manual_seed(seed)
    model = load_model(base_dir)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    wrong: list[int] = list(range(len(examples_)))
    for epoch in range(1, max_epochs + 1):
        model.train()
        for index in rng.permutation(len(examples_)):
            example = examples_[index]
            ids = torch.tensor([example.prompt_ids + example.target_ids])
            labels = torch.full_like(ids, -100)
            labels[0, len(example.prompt_ids):] = torch.tensor(example.target_ids)
            loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels,
                         **_media(example, len(example.target_ids))).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if epoch % check_every == 0:
            model.eval()
            wrong = [i for i, ex in enumerate(examples_) if _greedy(model, ex)[:len(ex.target_ids)] != ex.target_ids]
            if not wrong:
                break
    assert not wrong, f"{len(wrong)} of {len(examples_)} scripted replies not learnt after {max_epochs} epochs"
    return export_hf_model(model.state_dict(), base_dir, out_dir, "float32", {"stage": "tests/server tool model"},
                           video)
