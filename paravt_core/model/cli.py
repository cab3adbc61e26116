"""`paravt tiny-model`: write the tiny random-weight Qwen3-VL model directory;
`paravt reading-probe`: score a checkpoint's reading skill on held-out reading rows;
`paravt caption-probe`: score what it sees in held-out crops;
`paravt agent-probe`: score its last step in held-out agent transcripts;
`paravt copy-probe`: score its lookup of tokens on held-out copy rows (#15)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _tiny_model(args: argparse.Namespace) -> int:
    from paravt_core.model.tiny import TinyModelSpec, build_tiny_model

    out = build_tiny_model(TinyModelSpec(seed=args.seed), args.out)
    print(f"tiny Qwen3-VL written to {out}")
    return 0


def _probe_inputs(args: argparse.Namespace, command: str, example: str):
    """(config, model folder) of a probe command; a folder without config.json is refused."""
    from paravt_core.config import load_config

    cfg = load_config(args.config, args.set)
    model_dir = Path(args.model)
    if not (model_dir / "config.json").is_file():
        raise SystemExit(f"paravt {command}: {model_dir} is not a model folder (no config.json); pass e.g. "
                         f"{cfg.run.output_dir}/{example}/<key>/model")
    return cfg, model_dir


def _print_report(counts: dict[str, int], report) -> int:
    print(json.dumps({**counts, **report.as_metrics()}, indent=1))
    return 0


def _reading_probe(args: argparse.Namespace) -> int:
    from paravt_core.model.reading_probe import reading_probe

    cfg, model_dir = _probe_inputs(args, "reading-probe", "pretrain-reading")
    report = reading_probe(model_dir, cfg, rows=args.rows, seed=args.seed, pad=args.pad)
    return _print_report({"rows": report.rows}, report)


def _caption_probe(args: argparse.Namespace) -> int:
    from paravt_core.model.caption_probe import caption_probe

    cfg, model_dir = _probe_inputs(args, "caption-probe", "pretrain")
    report = caption_probe(model_dir, cfg, videos=args.videos, seed=args.seed)
    return _print_report({"windows": report.windows, "events": report.events}, report)


def _agent_probe(args: argparse.Namespace) -> int:
    from paravt_core.model.agent_probe import agent_probe

    cfg, model_dir = _probe_inputs(args, "agent-probe", "sft")
    report = agent_probe(model_dir, cfg, rows=args.rows, seed=args.seed)
    return _print_report({"rows": report.rows}, report)


def _copy_probe(args: argparse.Namespace) -> int:
    from paravt_core.model.copy_probe import copy_probe

    cfg, model_dir = _probe_inputs(args, "copy-probe", "pretrain-copy")
    report = copy_probe(model_dir, cfg, rows=args.rows, seed=args.seed)
    return _print_report({"rows": report.rows, "lettered_rows": report.lettered_rows, "far_rows": report.far_rows},
                         report)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("tiny-model", help="write a tiny random-weight Qwen3-VL model directory")
    p.add_argument("--out", required=True, help="output model directory")
    p.add_argument("--seed", type=int, default=0, help="weight and tokenizer seed (same seed, same files)")
    p.set_defaults(func=_tiny_model)

    probes = (
        ("reading-probe", _reading_probe, "teacher-forced scores of a checkpoint's reading skill (quote, value, "
         "option checks, letter) on held-out reading rows", "rows", "pretrain-reading",
         ("--rows", 200, "multiple-choice reading rows to score")),
        ("caption-probe", _caption_probe, "teacher-forced scores of what a checkpoint sees in held-out crops (event "
         "colour, shape, place, times)", "clips", "pretrain",
         ("--videos", 24, "held-out videos whose grid segments are scored")),
        ("agent-probe", _agent_probe, "teacher-forced scores of the final option check in held-out agent "
         "transcripts (value, option lines, verdicts, letter)", "questions", "sft",
         ("--rows", 64, "held-out multiple-choice transcripts to score")),
        ("copy-probe", _copy_probe, "teacher-forced share of a list's words a checkpoint writes back from "
         "among 0 to model.pretrain.copy_max_videos videos' notes, near and far apart (the lookup options need)", "rows", "pretrain-copy",
         ("--rows", 100, "held-out copy rows to score")),
    )
    for name, func, help_text, drawn, example, (flag, default, flag_help) in probes:
        p = subparsers.add_parser(name, help=help_text)
        p.add_argument("--config", required=True, help=f"the pipeline YAML whose world the {drawn} are drawn from")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
        p.add_argument("--model", required=True, help=f"model folder (e.g. <output_dir>/{example}/<key>/model)")
        p.add_argument(flag, type=int, default=default, help=flag_help)
        p.add_argument("--seed", type=int, default=0, help="the probe stream's seed")
        if name == "reading-probe":
            p.add_argument("--pad", type=int, default=0, help="lead each answer's quote with this many empty-window "
                           "notes: options that far further back (a copy by fixed distance fails, a lookup does not)")
        p.set_defaults(func=func)
