"""`paravt tiny-model`: write the tiny random-weight Qwen3-VL model directory (the test kit and the
embedded default's base model)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from paravt_core.atomic import output_folder
from paravt_core.seeds import seed_argument

# lazy: every `paravt` call imports this module (cli.build_parser), so its commands import what
# they run inside their function: the imports at the top measured +0.17 s on `paravt --help`
# (0.89 -> 1.06 s, min of 8 runs), and some of these modules load torch or Prefect.


def _tiny_model(args: argparse.Namespace) -> int:
    from paravt_core.model.tiny import TinyModelSpec, build_tiny_model

    out = build_tiny_model(TinyModelSpec(seed=args.seed), args.out)
    print(f"tiny Qwen3-VL written to {out}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("tiny-model", help="write a tiny random-weight Qwen3-VL model directory")
    p.add_argument("--out", required=True, type=output_folder, help="output model directory")
    p.add_argument("--seed", type=seed_argument, default=0, help="weight and tokenizer seed (same seed, same files)")
    p.set_defaults(func=_tiny_model)
