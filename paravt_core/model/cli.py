"""`paravt tiny-model`: write the tiny random-weight Qwen3-VL model directory;
`paravt reading-probe`: score a checkpoint's reading skill on held-out reading rows;
`paravt caption-probe`: score what it sees in held-out crops;
`paravt agent-probe`: score its last step in held-out agent transcripts (#15)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _tiny_model(args: argparse.Namespace) -> int:
    from paravt_core.model.tiny import TinyModelSpec, build_tiny_model

    out = build_tiny_model(TinyModelSpec(seed=args.seed), args.out)
    print(f"tiny Qwen3-VL written to {out}")
    return 0


def _reading_probe(args: argparse.Namespace) -> int:
    from paravt_core.config import load_config
    from paravt_core.model.reading_probe import reading_probe

    cfg = load_config(args.config, args.set)
    model_dir = Path(args.model)
    if not (model_dir / "config.json").is_file():
        raise SystemExit(f"paravt reading-probe: {model_dir} is not a model folder (no config.json); pass e.g. "
                         f"{cfg.run.output_dir}/pretrain-reading/<key>/model")
    report = reading_probe(model_dir, cfg, rows=args.rows, seed=args.seed)
    print(json.dumps({"rows": report.rows, **report.as_metrics()}, indent=1))
    return 0


def _caption_probe(args: argparse.Namespace) -> int:
    from paravt_core.config import load_config
    from paravt_core.model.caption_probe import caption_probe

    cfg = load_config(args.config, args.set)
    model_dir = Path(args.model)
    if not (model_dir / "config.json").is_file():
        raise SystemExit(f"paravt caption-probe: {model_dir} is not a model folder (no config.json); pass e.g. "
                         f"{cfg.run.output_dir}/pretrain/<key>/model")
    report = caption_probe(model_dir, cfg, videos=args.videos, seed=args.seed)
    print(json.dumps({"windows": report.windows, "events": report.events, **report.as_metrics()}, indent=1))
    return 0


def _agent_probe(args: argparse.Namespace) -> int:
    from paravt_core.config import load_config
    from paravt_core.model.agent_probe import agent_probe

    cfg = load_config(args.config, args.set)
    model_dir = Path(args.model)
    if not (model_dir / "config.json").is_file():
        raise SystemExit(f"paravt agent-probe: {model_dir} is not a model folder (no config.json); pass e.g. "
                         f"{cfg.run.output_dir}/sft/<key>/model")
    report = agent_probe(model_dir, cfg, rows=args.rows, seed=args.seed)
    print(json.dumps({"rows": report.rows, **report.as_metrics()}, indent=1))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("tiny-model", help="write a tiny random-weight Qwen3-VL model directory")
    p.add_argument("--out", required=True, help="output model directory")
    p.add_argument("--seed", type=int, default=0, help="weight and tokenizer seed (same seed, same files)")
    p.set_defaults(func=_tiny_model)

    p = subparsers.add_parser("reading-probe", help="teacher-forced scores of a checkpoint's reading skill (quote, "
                                                    "value, option checks, letter) on held-out reading rows")
    p.add_argument("--config", required=True, help="the pipeline YAML whose world the rows are drawn from")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--model", required=True, help="model folder (e.g. <output_dir>/pretrain-reading/<key>/model)")
    p.add_argument("--rows", type=int, default=200, help="multiple-choice reading rows to score")
    p.add_argument("--seed", type=int, default=0, help="the probe stream's seed")
    p.set_defaults(func=_reading_probe)

    p = subparsers.add_parser("caption-probe", help="teacher-forced scores of what a checkpoint sees in held-out "
                                                    "crops (event colour, shape, place, times)")
    p.add_argument("--config", required=True, help="the pipeline YAML whose world the clips are drawn from")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--model", required=True, help="model folder (e.g. <output_dir>/pretrain/<key>/model)")
    p.add_argument("--videos", type=int, default=24, help="held-out videos whose grid segments are scored")
    p.add_argument("--seed", type=int, default=0, help="the probe stream's seed")
    p.set_defaults(func=_caption_probe)

    p = subparsers.add_parser("agent-probe", help="teacher-forced scores of the final option check in held-out "
                                                  "agent transcripts (value, option lines, verdicts, letter)")
    p.add_argument("--config", required=True, help="the pipeline YAML whose world the questions are drawn from")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--model", required=True, help="model folder (e.g. <output_dir>/sft/<key>/model)")
    p.add_argument("--rows", type=int, default=64, help="held-out multiple-choice transcripts to score")
    p.add_argument("--seed", type=int, default=0, help="the probe stream's seed")
    p.set_defaults(func=_agent_probe)
