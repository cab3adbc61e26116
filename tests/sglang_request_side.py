"""SGLang's own request-side code run on request bodies, in a process of its own (issue 44).

`python tests/sglang_request_side.py JOB.json` with SGLang's wheel (and the few light
packages its modules import) on PYTHONPATH; `tests/integration/test_sglang_request_side.py`
installs them and runs this. JOB holds `model_dir` (a Qwen3-VL checkpoint, for its config
and processor) and `bodies`: a list of {"path": "/generate" | "/update_weights_from_disk"
| "/release_memory_occupation" | "/resume_memory_occupation" | "/generate response"
| "weight versions", "body": {...}}. Prints one
JSON line: per body what SGLang made of it, each stage's error (as SGLang raised it) or
its result.

Every function called here is SGLang's, unmodified, as its HTTP server calls it:
- `/generate`: the JSON contract gate (`entrypoints.api_contract.generate_contract_error`),
  FastAPI's parse into `GenerateReqInput` (pydantic, as the route declares it),
  `normalize_batch_and_arguments`, then per request `TokenizerManager._tokenize_one_request`
  (the Qwen-VL multimodal processor: loads the images, runs the checkpoint's image
  processor, expands the image pads; the sampling parameters' `normalize` and `verify`),
  and `mm_utils.hash_feature` on every image feature it built (what the scheduler hashes
  to key the prefix cache; `MultimodalDataItem.set_pad_value`).
- the weight and memory routes: the pydantic parse FastAPI does into the route's body type.
- a `/generate` answer ("/generate response"): SGLang's generated API schema decoder
  (`sglang.api.v1.api_types.GenerateResponse`), the shape its servers answer in.
- "weight versions": the labels a finished request's reply carries (`weight_versions`).

The tokenizer manager is made with `object.__new__` and given only the attributes that
`_tokenize_one_request` reads: its `__init__` opens the ZMQ sockets to a scheduler, which
this process has no use for.
"""

from __future__ import annotations

import asyncio
import importlib.machinery
import json
import sys
import traceback
import types
from pathlib import Path
from typing import Any


def _stub_notebook_display() -> None:
    """`sglang.utils` imports IPython.display (HTML, display) for notebook helpers, which no
    request path calls; IPython itself is not installed for this, so a stand-in module is."""
    for name in ("IPython", "IPython.display"):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        module.HTML = module.display = lambda *args, **kwargs: None
        sys.modules[name] = module
    sys.modules["IPython"].display = sys.modules["IPython.display"]


def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class RequestSide:
    """SGLang's request-side objects for one checkpoint (module docstring)."""

    def __init__(self, model_dir: str, mm_process_config: dict[str, Any] | None):
        from transformers import AutoConfig, AutoProcessor

        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
        from sglang.srt.managers.tokenizer_manager import TokenizerManager
        from sglang.srt.multimodal.processors.qwen_vl import QwenVLImageProcessor
        from sglang.srt.runtime_context import publish
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import ServerArgs

        server_args = ServerArgs(model_path=model_dir, device="cpu", mm_process_config=mm_process_config)
        publish(server_args, role="tokenizer")
        processor = AutoProcessor.from_pretrained(model_dir)
        hf_config = AutoConfig.from_pretrained(model_dir)
        manager = object.__new__(TokenizerManager)
        manager.server_args = server_args
        manager.model_config = ModelConfig.from_server_args(server_args)
        manager.context_len = manager.model_config.context_len
        manager.max_req_input_len = None
        manager.num_reserved_tokens = 0
        manager.allow_auto_truncate = False
        manager.validate_total_tokens = True
        manager.preferred_sampling_params = None
        manager.processor = processor
        manager.tokenizer = processor.tokenizer
        manager.mm_processor = QwenVLImageProcessor(hf_config, server_args, processor, None)
        manager.sampling_params_class = SamplingParams
        manager.tokenized_generate_req_type = TokenizedGenerateReqInput
        manager.rid_to_state = _TimeStatsOnly()
        self.manager = manager

    def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        from pydantic import TypeAdapter

        from sglang.srt.entrypoints.api_contract import generate_contract_error
        from sglang.srt.managers.io_struct import GenerateReqInput

        result: dict[str, Any] = {"contract_error": generate_contract_error(body)}
        try:
            obj = TypeAdapter(GenerateReqInput).validate_python(body)
            obj.normalize_batch_and_arguments()
        except Exception as error:  # what SGLang raised is the result
            result["parse_error"] = _error(error)
            return result
        singles = [obj] if obj.is_single else [obj[i] for i in range(obj.batch_size)]
        result["requests"] = [self._one(single) for single in singles]
        return result

    def _one(self, obj: Any) -> dict[str, Any]:
        from sglang.srt.managers.mm_utils import hash_feature

        try:
            tokenized = asyncio.run(self.manager._tokenize_one_request(obj))
        except Exception as error:
            return {"error": _error(error), "where": traceback.format_exc(limit=-4)}
        items = tokenized.mm_inputs.mm_items if tokenized.mm_inputs else []
        hashes = []
        for item in items:
            try:
                hashes.append(hash_feature(item.feature))
            except Exception as error:
                return {"error": _error(error), "where": "hash_feature"}
        params = tokenized.sampling_params
        return {
            "input_ids": list(tokenized.input_ids),
            "image_grids": [item.model_specific_data["image_grid_thw"].tolist() for item in items],
            "feature_hashes": hashes,
            "sampling": {name: _plain(getattr(params, name)) for name in (
                "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                "presence_penalty", "frequency_penalty", "stop_token_ids", "skip_special_tokens", "sampling_seed")},
            "return_logprob": tokenized.return_logprob,
        }


def _plain(value: Any) -> Any:
    return sorted(value) if isinstance(value, set) else value


class _TimeStatsOnly(dict):
    """The manager's request states, of which `_tokenize_one_request` only stamps time stats."""

    def __missing__(self, rid: str) -> Any:
        from sglang.srt.observability.req_time_stats import APIServerReqTimeStats

        state = types.SimpleNamespace(time_stats=APIServerReqTimeStats())
        self[rid] = state
        return state


def parse_body(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The route's body type parsed as FastAPI does (pydantic), or SGLang's error."""
    from pydantic import TypeAdapter

    from sglang.srt.managers import io_struct

    route_types = {"/update_weights_from_disk": io_struct.UpdateWeightFromDiskReqInput,
                   "/release_memory_occupation": io_struct.ReleaseMemoryOccupationReqInput,
                   "/resume_memory_occupation": io_struct.ResumeMemoryOccupationReqInput}
    try:
        parsed = TypeAdapter(route_types[path]).validate_python(body)
    except Exception as error:
        return {"parse_error": _error(error)}
    import msgspec

    return {"parsed": msgspec.structs.asdict(parsed)}


def decode_response(body: dict[str, Any]) -> dict[str, Any]:
    """A `/generate` answer decoded with SGLang's generated API schema (`GenerateResponse`)."""
    from sglang.api.v1.api_types import GenerateResponse

    try:
        response = GenerateResponse.from_json_value(body)
    except Exception as error:
        return {"decode_error": _error(error)}
    meta = response.meta_info
    return {"finish_reason": type(meta.finish_reason).__name__,
            "output_token_logprobs": [[entry.logprob, entry.token_id] for entry in meta.output_token_logprobs or []],
            "prompt_token_ids": response.prompt_token_ids,
            "weight_versions": [[span.version, span.start, span.end] for span in meta.weight_versions]}


def weight_versions(body: dict[str, Any]) -> dict[str, Any]:
    """A finished request's `meta_info` weight labels as SGLang makes them: the scheduler's
    spans over its version-change events (`compute_weight_version_spans`; body: `events`
    [[old version, output tokens at the change], ...], `current`, `tokens`), added to the
    reply by the tokenizer manager's `add_weight_versions_to_meta_info`."""
    from sglang.srt.utils.weight_versions import (
        WeightVersionEvent,
        add_weight_versions_to_meta_info,
        compute_weight_version_spans,
    )

    events = [WeightVersionEvent(old_version=version, num_output_tokens=n) for version, n in body["events"]]
    spans = compute_weight_version_spans(events, current_version=body["current"], num_output_tokens=body["tokens"])
    meta: dict[str, Any] = {}
    add_weight_versions_to_meta_info(meta, spans, num_output_tokens=body["tokens"])
    return {"meta_info": meta}


def main(job_path: str) -> None:
    _stub_notebook_display()
    job = json.loads(Path(job_path).read_text())
    sides: dict[str, RequestSide] = {}  # one per server launch flag `--mm-process-config`
    results = []
    for entry in job["bodies"]:
        if entry["path"] == "/generate":
            flag = entry.get("mm_process_config")
            key = json.dumps(flag, sort_keys=True)
            if key not in sides:
                sides[key] = RequestSide(job["model_dir"], flag)
            results.append(sides[key].generate(entry["body"]))
        elif entry["path"] == "/generate response":
            results.append(decode_response(entry["body"]))
        elif entry["path"] == "weight versions":
            results.append(weight_versions(entry["body"]))
        else:
            results.append(parse_body(entry["path"], entry["body"]))
    print("RESULTS " + json.dumps(results, default=str), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
