"""Where a decoding step of the `hf` rollout goes: `HFEngine.generate` against the model's own
forward calls in a bare loop, side by side in one process (issue #64).

Both decode the same rows greedily from the same prompts on the tiny random-weight Qwen3-VL
(`TinyModelSpec(seed=0)`) with the engine's `PreallocatedCache`:
- `engine`: `HFEngine.generate` as the rollout calls it (transformers' `generate`, the engine's
  log-prob recorder and media-token mask);
- `bare`: one forward of the prompt, then one forward per token (argmax, explicit positions and
  mask), nothing else: what any decoding loop has to compute, the floor a leaner loop than
  `generate` could reach.

A decoding step's time is (time for N new tokens - time for 1) / (N - 1), so the prompt's
prefill drops out. The bare loop must give the engine's tokens (the bench stops with status 1
when it does not); its step time over the engine's is the share of a decoding step that is the
model's forward. Repeats interleave the two; medians are printed.

The model is built as the rollout builds it (`build_model` with conf/pipeline/reproduce.yaml's
`model` section). `--kernels`: one more engine call (prefill and --new tokens) under
torch.profiler, its CPU split into matrix products, attention and the rest (`rl_step.KernelSplit`).

Run: `.venv/bin/python bench/decode.py [--rows 16] [--prompt 680] [--new 64] [--repeats 5] [--threads 1]
[--kernels]` (the defaults: the RL bench's 16 rollouts, a prompt of the reproduction's RL prompts' length).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from paravt_core.agent.engine import GenerationRequest, SamplingParams
from paravt_core.agent.hf_engine import HFEngine
from paravt_core.agent.kv_cache import PreallocatedCache
from paravt_core.config import load_config
from paravt_core.model.loading import build_model, load_processor
from paravt_core.model.tiny import TinyModelSpec, build_tiny_model
from rl_step import KernelSplit

REPO = Path(__file__).resolve().parents[1]


def prompts(tokenizer, rows: int, length: int, seed: int = 0) -> list[list[int]]:
    """`rows` prompts of `length` ordinary token ids (no special tokens), one draw per row."""
    special = set(tokenizer.all_special_ids)
    ordinary = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    drawn = torch.Generator().manual_seed(seed)
    return [ordinary[torch.randint(len(ordinary), (length,), generator=drawn)].tolist() for _ in range(rows)]


def engine_tokens(engine: HFEngine, ids: list[list[int]], new: int, stop: int) -> tuple[float, list[list[int]]]:
    params = SamplingParams(max_new_tokens=new, temperature=0.0, stop_token_ids=[stop])
    start = time.perf_counter()
    out = engine.generate([GenerationRequest(list(row)) for row in ids], params)
    return time.perf_counter() - start, [g.token_ids for g in out]


@torch.no_grad()
def bare_tokens(model, ids: list[list[int]], new: int, layers: int, masked: list[int]) -> tuple[float, list[list[int]]]:
    """Prefill, then one forward a token: the same rows, positions and cache as the engine's, and
    its mask on the media tokens (`masked`: never generated)."""
    start = time.perf_counter()
    prompt = torch.tensor(ids)
    rows, length = prompt.shape
    cache = PreallocatedCache(layers, length + new)
    mask = torch.ones((rows, length + new), dtype=torch.long)
    positions = torch.arange(length)[None, None].expand(3, rows, -1)
    logits = model(input_ids=prompt, attention_mask=mask[:, :length], position_ids=positions,
                   past_key_values=cache, use_cache=True, logits_to_keep=1).logits
    def pick(last):
        last = last.clone()
        last[:, masked] = float("-inf")
        return last.argmax(-1)

    chosen = [pick(logits[:, -1])]
    for step in range(1, new):
        at = length + step - 1
        logits = model(input_ids=chosen[-1][:, None], attention_mask=mask[:, :at + 1],
                       position_ids=torch.full((3, rows, 1), at), past_key_values=cache, use_cache=True,
                       cache_position=torch.tensor([at])).logits
        chosen.append(pick(logits[:, -1]))
    return time.perf_counter() - start, torch.stack(chosen, 1).tolist()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=680)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kernels", action="store_true", help="split one more engine call's CPU by kernel")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_tiny_model(TinyModelSpec(seed=0), Path(tmp) / "tiny")
        model = build_model(load_config(REPO / "conf/pipeline/reproduce.yaml").model, folder).eval()
        processor = load_processor(folder)
    engine = HFEngine(model, processor)
    layers = model.config.get_text_config().num_hidden_layers
    ids = prompts(processor.tokenizer, args.rows, args.prompt)
    # A stop token the rows never reach: every row decodes --new tokens (checked below).
    stop = processor.tokenizer.pad_token_id if processor.tokenizer.pad_token_id is not None else 0

    times: dict[tuple[str, int], list[float]] = {}
    for new in (1, args.new):  # warm-up, both lengths
        engine_tokens(engine, ids, new, stop), bare_tokens(model, ids, new, layers, engine.media_token_ids)
    for repeat in range(args.repeats):
        for new in (1, args.new):
            seconds, by_engine = engine_tokens(engine, ids, new, stop)
            times.setdefault(("engine", new), []).append(seconds)
            seconds, by_bare = bare_tokens(model, ids, new, layers, engine.media_token_ids)
            times.setdefault(("bare", new), []).append(seconds)
            if by_engine != by_bare:
                row = next(r for r, (a, b) in enumerate(zip(by_engine, by_bare)) if a != b)
                at = next((i for i, (a, b) in enumerate(zip(by_engine[row], by_bare[row])) if a != b),
                          min(len(by_engine[row]), len(by_bare[row])))
                print(f"the bare loop's tokens differ from the engine's (repeat {repeat}, {new} new): row {row} "
                      f"from token {at}", file=sys.stderr)
                return 1
            if any(len(row) != new for row in by_engine):
                print(f"a row stopped before {new} tokens: pick another --prompt or seed", file=sys.stderr)
                return 1
        print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr)

    median = {key: statistics.median(values) for key, values in times.items()}
    step = {name: (median[(name, args.new)] - median[(name, 1)]) / (args.new - 1) for name in ("engine", "bare")}
    print(f"{args.rows} rows, {args.prompt}-token prompts, {args.new} new tokens, {args.threads} thread(s), "
          f"medians of {args.repeats}; tokens equal in every repeat")
    print("| loop | prefill + 1 token (s) | decoding step (ms) |")
    print("|---|---:|---:|")
    for name in ("engine", "bare"):
        print(f"| {name} | {median[(name, 1)]:.3f} | {step[name] * 1e3:.2f} |")
    print(f"bare / engine, decoding step: {step['bare'] / step['engine']:.2f}x "
          f"(the model's forward is that share of the engine's step)")
    if args.kernels:
        with KernelSplit(profiled=True) as split:
            engine_tokens(engine, ids, args.new, stop)
        cpu = split.split["cpu_s"]
        print(f"one engine call under torch.profiler: {cpu:.2f} CPU s, matrix products "
              f"{split.split['matmul_s'] / cpu:.0%}, attention {split.split['attention_s'] / cpu:.0%}, "
              f"the rest {split.split['rest_s'] / cpu:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
