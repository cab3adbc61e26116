"""Peak memory of "final hidden states -> selected log-probs": full-vocabulary logits vs chunks (SPEC §5, issue 31).

One micro-batch of --tokens positions at the Qwen3-VL-2B hidden size (2048) and the real
vocabulary (151,936), a random head and random hidden states, float32 on the CPU:
  before  the path `sequence_logprobs` used to take: logits = head(hidden).float() / T for
          every position ([N, V]), log_softmax over them, gather the targets;
  after   `paravt_core.model.logprobs.selected_token_logprobs` with its default chunk
          (LOGPROB_CHUNK rows of [chunk, V] at a time, checkpointed under autograd).
Two modes: forward only under no_grad (the reference pass) and forward + backward of a
weighted sum of the log-probs into the hidden states and the head weight (the policy pass;
the head weight's gradient, the same 1.2 GB in both columns, is part of its peak).

Each variant runs in a process of its own. Peak = ru_maxrss at the end minus the resident
set once the head weight and the inputs are allocated, so it is what the step itself adds.
Wall time is of the step alone, one run, both sides on the same 2-core machine in one
invocation: a ratio, not an absolute throughput.

The `before` path needs several [N, V] float32 copies (5.0 GB each at 8192 tokens): its
length is cut, and the output says so, when the estimate would not fit in the memory
available now less a margin; `after` then also runs at that length so the ratio compares
like with like.

Run: `.venv/bin/python bench/logprob_memory.py [--tokens 8192]`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

VOCAB, HIDDEN, TEMPERATURE = 151_936, 2048, 0.7
DTYPE = torch.float32
# [N, V] float32 copies alive at once on the `before` path (an upper estimate): forward keeps
# the scaled logits and log_softmax's output; backward adds gather's zero-filled gradient and
# log_softmax's gradient (and a temporary of it).
FULL_COPIES = {"forward": 2, "backward": 4}
MARGIN_GB = 4.0  # left free for the rest of the machine


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def available_bytes() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def full_vocabulary_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = head(hidden).float() / TEMPERATURE  # [N, V]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)


def measure(path: str, mode: str, tokens: int) -> dict[str, float]:
    """One variant, in this process: the step's peak memory above the allocated inputs, and its time."""
    from paravt_core.model.logprobs import selected_token_logprobs

    torch.manual_seed(0)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False, dtype=DTYPE)
    hidden = torch.randn(tokens, HIDDEN, dtype=DTYPE, requires_grad=mode == "backward")  # [N, H]
    targets = torch.randint(0, VOCAB, (tokens,))  # [N]
    weights = torch.randn(tokens)  # [N]
    step = full_vocabulary_logprobs if path == "before" else (
        lambda h, x, t: selected_token_logprobs(h, x, t, TEMPERATURE))
    base = resident_bytes()
    started = time.perf_counter()
    if mode == "forward":
        with torch.no_grad():
            step(head, hidden, targets)
    else:
        (step(head, hidden, targets) * weights).sum().backward()
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"mb": (peak - base) / 2**20, "seconds": seconds}


def run_variant(path: str, mode: str, tokens: int) -> dict[str, float]:
    child = subprocess.run([sys.executable, __file__, "--child", path, mode, str(tokens)], capture_output=True,
                           text=True, check=False)
    if child.returncode != 0:
        raise RuntimeError(f"{path} {mode} at {tokens} tokens failed:\n{child.stderr[-3000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def fitting_length(mode: str, tokens: int) -> int:
    """The longest of tokens, tokens/2, ... whose `before` logits fit in the available memory less the margin."""
    budget = available_bytes() - MARGIN_GB * 2**30
    length = tokens
    while length > 256 and FULL_COPIES[mode] * length * VOCAB * 4 > budget:
        length //= 2
    return length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--child", nargs=3, metavar=("PATH", "MODE", "TOKENS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        path, mode, tokens = args.child
        print(json.dumps(measure(path, mode, int(tokens))))
        return

    from paravt_core.model.logprobs import LOGPROB_CHUNK

    print(f"hidden {HIDDEN}, vocab {VOCAB:,}, {DTYPE}, CPU, {torch.get_num_threads()} threads, "
          f"chunk {LOGPROB_CHUNK}; one [N, V] float32 copy = {args.tokens * VOCAB * 4 / 2**30:.2f} GiB at "
          f"N = {args.tokens}")
    rows = []
    for mode in ("forward", "backward"):
        length = fitting_length(mode, args.tokens)
        if length < args.tokens:
            need = FULL_COPIES[mode] * args.tokens * VOCAB * 4 / 2**30
            print(f"note: `before` {mode} at {args.tokens} tokens needs about {need:.1f} GiB ({FULL_COPIES[mode]} "
                  f"[N, V] copies), more than the {available_bytes() / 2**30 - MARGIN_GB:.1f} GiB available less "
                  f"a {MARGIN_GB:.0f} GiB margin: run at {length} tokens, with `after` at both lengths")
        rows.append((mode, length, run_variant("before", mode, length), run_variant("after", mode, length)))
        if length < args.tokens:
            rows.append((mode, args.tokens, None, run_variant("after", mode, args.tokens)))

    print(f"\n{'mode':<17} {'tokens':>6} | {'before MB':>9} {'after MB':>9} {'before/after':>12} | "
          f"{'before s':>8} {'after s':>8} {'after/before':>12}")
    for mode, length, before, after in rows:
        label = "forward (no_grad)" if mode == "forward" else "forward+backward"
        if before is None:
            print(f"{label:<17} {length:>6} | {'skipped':>9} {after['mb']:>9.0f} {'-':>12} | "
                  f"{'-':>8} {after['seconds']:>8.1f} {'-':>12}")
            continue
        print(f"{label:<17} {length:>6} | {before['mb']:>9.0f} {after['mb']:>9.0f} "
              f"{before['mb'] / after['mb']:>12.1f} | {before['seconds']:>8.1f} {after['seconds']:>8.1f} "
              f"{after['seconds'] / before['seconds']:>12.2f}")


if __name__ == "__main__":
    main()
