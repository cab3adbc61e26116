"""Evaluator throughput on the hf backend with the tiny Qwen3-VL (SPEC §7).

Setup: the data stage on a small synthetic world (the Video-MME split with --samples rows,
30-40 s videos) and the tiny random-weight model built into a temporary folder. Settings
are the embedded default's (conf/pipeline/tiny.yaml: 16 overview frames, max 12288
pixels per frame) with --max-new-tokens per generation, greedy. Each measurement
evaluates the whole split into a fresh results folder (nothing is resumed) through
`paravt_core.eval.stage.evaluate_prepared_split`, so it includes prompt building, frame
decoding, generation, scoring and the fsynced result log; median of --repeats runs.

1. Concurrency: samples/min with 1 vs N samples per batched `run_episodes` call
   (`eval.concurrency`), prompt mode agentic_general, tool mode frames. The random model
   never calls a tool, so each sample is one main-agent generation.
2. Dispatch (SPEC §7, Table 2 block C): the same three crop windows per sample, asked for
   in one turn (parallel: three calls in turn 0, then the answer) or one per turn
   (sequential: a call in each of turns 0-2, then the forced answer). The tool-call turns
   are scripted (the random model writes none); the sub-agents (tool mode subagent) and
   the final answer run on the model. Reported as seconds per sample at concurrency 1 and N.

3. Served vs hf: the same split, agentic_general / frames, through the `openai` engine
   against a real vLLM (its CPU build from .venv-serve, `make install-serve`, started by
   `paravt_core.agent.server_launch.launch`: float32, eager) and through the `hf` engine, both at
   concurrency 1 and N, torch on every core for this table (vLLM uses them all). The served
   run starts with the rendering check (token ids equal to ours). Frames travel as JPEG
   data URLs. Skipped, with the reason, without .venv-serve.

Torch runs single-threaded by default (--threads), as in bench/dispatch.py: on a small
shared CPU a second thread made `generate` times erratic.

Run: `.venv/bin/python bench/eval.py [--samples 8] [--concurrency 4] [--repeats 3] [--only served]`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from paravt_core.agent.engine import Generation, GenerationRequest, SamplingParams
from paravt_core.config import PipelineConfig
from paravt_core.eval import stage as eval_stage
from paravt_core.eval.evaluator import EvalSettings, HFSampleRunner
from paravt_core.refs import ArtifactRef, content_hash

SPLIT = "videomme"
WINDOWS = ((2, 8), (12, 18), (22, 28))
SUBAGENT_MARK = "concise, factual summary"


def bench_config(output_dir: Path, samples: int, max_new_tokens: int, **eval_fields) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "run": {"output_dir": str(output_dir)},
        "data": {"synth": {"train_videos": 4, "eval_videos_per_split": 2, "eval_rows_per_split": samples,
                           "max_duration_s": 40, "no_tool_share": 0.0}},
        "video": {"nframes": 16, "max_pixels": 12288, "crop_max_frames": 8},
        "rl": {"rollout": {"subagent_max_new_tokens": max_new_tokens}},
        "eval": {"splits": [SPLIT], "nframes": 16, "max_new_tokens": max_new_tokens, **eval_fields},
    })


def crop_turn(*windows: tuple[float, float]) -> str:
    calls = "".join(f'<tool_call>{{"name": "crop_video", "arguments": {{"video_path": "v.mp4", "start_time": {s}, '
                    f'"end_time": {e}}}}}</tool_call>' for s, e in windows)
    return "I should look at these moments.\n</think>\n" + calls


class ScriptedCropTurns:
    """Main-agent turn k < len(turns) answers turns[k] (the random model never calls a tool);
    every other request (sub-agents, the final answer) goes to the model."""

    def __init__(self, model_engine, processor, turns: Sequence[str]):
        self.model_engine, self.tokenizer = model_engine, processor.tokenizer
        end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.turn_ids = [self.tokenizer(text, add_special_tokens=False)["input_ids"] + [end] for text in turns]

    def _scripted_turn(self, request: GenerationRequest) -> int | None:
        prompt = self.tokenizer.decode(request.prompt_ids)
        turn = prompt.count("<|im_start|>assistant") - 1
        return None if SUBAGENT_MARK in prompt or turn >= len(self.turn_ids) else turn

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
        turns = [self._scripted_turn(request) for request in requests]
        if all(turn is None for turn in turns):
            return self.model_engine.generate(requests, params)
        assert None not in turns, "episodes of a batch are in lock step"
        return [Generation(list(self.turn_ids[t]), [0.0] * len(self.turn_ids[t]), "stop") for t in turns]

    def update_weights(self, state_dict) -> None:
        self.model_engine.update_weights(state_dict)


def timed_split(cfg: PipelineConfig, model: ArtifactRef, data: ArtifactRef, runner) -> tuple[float, int, dict]:
    """(seconds, samples, summary) of one split evaluated from scratch."""
    started = time.perf_counter()
    run = eval_stage.evaluate_prepared_split(cfg, model, data, SPLIT, runner=runner, progress=False)
    elapsed = time.perf_counter() - started
    assert run.evaluated == run.summary["n"], "a bench run must not resume"
    return elapsed, run.evaluated, run.summary


def concurrency_table(root: Path, model: ArtifactRef, data: ArtifactRef, args, levels: Sequence[int]) -> None:
    print(f"\n1. Throughput, agentic_general / frames, {args.samples} samples, max_new_tokens {args.max_new_tokens}, "
          f"median of {args.repeats}")
    print(f"{'concurrency':>11} | {'s/split':>8} | {'samples/min':>11} | {'speed-up':>8}")
    base_rate = None
    for level in levels:
        times = []
        for repeat in range(args.repeats):
            cfg = bench_config(root / f"c{level}-{repeat}", args.samples, args.max_new_tokens, concurrency=level)
            seconds, _, _ = timed_split(cfg, model, data, eval_stage.open_runner(cfg, model))
            times.append(seconds)
        seconds = statistics.median(times)
        rate = 60 * args.samples / seconds
        base_rate = base_rate or rate
        print(f"{level:>11} | {seconds:>8.2f} | {rate:>11.1f} | {rate / base_rate:>7.2f}x")


def dispatch_table(root: Path, model: ArtifactRef, data: ArtifactRef, args, levels: Sequence[int]) -> None:
    scripts = {"parallel": [crop_turn(*WINDOWS)], "sequential": [crop_turn(w) for w in WINDOWS]}
    print(f"\n2. Dispatch, 3 crop windows per sample, tool mode subagent, {args.samples} samples, "
          f"median of {args.repeats}")
    print(f"{'concurrency':>11} | {'dispatch':>10} | {'s/sample':>8} | {'turns':>5} | {'calls':>5}")
    for level in levels:
        for dispatch in ("parallel", "sequential"):
            times, summary = [], {}
            for repeat in range(args.repeats):
                cfg = bench_config(root / f"d{dispatch}-{level}-{repeat}", args.samples, args.max_new_tokens,
                                   concurrency=level, dispatch=dispatch, tool_mode="subagent")
                engine, processor = eval_stage.hf_engine(cfg, model)
                scripted = ScriptedCropTurns(engine, processor, scripts[dispatch])
                runner = HFSampleRunner(scripted, processor, EvalSettings.from_pipeline(cfg))
                seconds, count, summary = timed_split(cfg, model, data, runner)
                times.append(seconds / count)
            print(f"{level:>11} | {dispatch:>10} | {statistics.median(times):>8.3f} | {summary['avg_turns']:>5.1f} | "
                  f"{summary['avg_tool_calls']:>5.1f}")


def served_table(root: Path, model: ArtifactRef, data: ArtifactRef, args, levels: Sequence[int]) -> None:
    from paravt_core.agent.served_model import served_folder
    from paravt_core.agent.server_launch import ServeError, launch, pick_server, probe_python, server_python_path

    print(f"\n3. Served (vLLM, CPU build) vs hf, agentic_general / frames, {args.samples} samples, max_new_tokens "
          f"{args.max_new_tokens}, torch threads {os.cpu_count()}, median of {args.repeats}")
    try:
        pick_server("vllm", probe_python(server_python_path()))
    except ServeError as exc:
        print(f"   skipped: {exc}")
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    name, port = "paravt-bench", 30555
    started = time.perf_counter()
    # with the configuration's pixel bounds, as the evaluation serves a checkpoint (eval/served.py)
    folder = served_folder(model.path, bench_config(root, args.samples, args.max_new_tokens).video, root)
    _, server = launch(folder, name, port=port, server="vllm", log_path=root / "vllm.log")
    print(f"   vLLM healthy after {time.perf_counter() - started:.0f} s (log {root / 'vllm.log'})")
    try:
        print(f"{'concurrency':>11} | {'engine':>6} | {'s/split':>8} | {'samples/min':>11} | {'served/hf':>9} | "
              f"{'mean chars':>10}")
        for level in levels:
            rates = {}
            for engine in ("hf", "openai"):
                times, chars = [], []
                for repeat in range(args.repeats):
                    served = {"engine": "openai", "endpoint": f"http://127.0.0.1:{port}/v1",
                              "served_model_name": name} if engine == "openai" else {}
                    cfg = bench_config(root / f"s{engine}-{level}-{repeat}", args.samples, args.max_new_tokens,
                                       concurrency=level, **served)
                    seconds, _, summary = timed_split(cfg, model, data, eval_stage.open_runner(cfg, model))
                    times.append(seconds)
                    records = json.loads(next((root / f"s{engine}-{level}-{repeat}").rglob(f"{SPLIT}.json"))
                                         .read_text())["samples"]
                    chars.append(statistics.mean(len(r["response"]) for r in records))
                rates[engine] = 60 * args.samples / statistics.median(times)
                ratio = f"{rates[engine] / rates['hf']:.2f}x" if engine == "openai" else ""
                print(f"{level:>11} | {engine:>6} | {statistics.median(times):>8.2f} | {rates[engine]:>11.1f} | "
                      f"{ratio:>9} | {statistics.mean(chars):>10.0f}")
    finally:
        server.stop()
        torch.set_num_threads(threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4, help="N of the 1 vs N comparison")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", choices=("concurrency", "dispatch", "served"), default=None,
                        help="run one table only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING)
    from paravt_core.data import stage as data_stage
    from paravt_core.model.tiny import TinyModelSpec, build_tiny_model

    with tempfile.TemporaryDirectory(prefix="paravt-bench-eval-") as tmp:
        root = Path(tmp)
        data = data_stage.run(bench_config(root / "world", args.samples, args.max_new_tokens), progress=False).eval
        model_dir = build_tiny_model(TinyModelSpec(), root / "tiny")
        model = ArtifactRef(kind="model", path=model_dir, sha256=content_hash(model_dir))
        print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f} on "
              f"{os.cpu_count()} CPUs")
        warm = bench_config(root / "warm-up", args.samples, args.max_new_tokens, max_samples_per_split=1)
        timed_split(warm, model, data, eval_stage.open_runner(warm, model))
        levels = [1, args.concurrency]
        tables = {"concurrency": concurrency_table, "dispatch": dispatch_table, "served": served_table}
        for name, table in tables.items():
            if args.only in (None, name):
                table(root, model, data, args, levels)


if __name__ == "__main__":
    main()
