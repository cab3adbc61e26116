"""`paravt eval ...`: inspect benchmark samples and score responses by the SPEC §7 rules.

    paravt eval samples SPLIT --rows FILE --video-dir DIR [--subtitle-dir DIR]
        one JSON line per row: id, video_path, question, answer, kind, options and, for
        grounding, gt_start / gt_end; `"video_missing": true` (and a warning on stderr)
        when the video file is absent. Samples are never dropped; a row that cannot become
        a sample is named on stderr (file, row, field, reason) and the others still print.
    paravt eval score
        reads JSON lines {"kind": "mcq"|"grounding", "response", "answer"} on stdin
        (answer: a letter, or [start, end] seconds) and prints {"pred", "score"} per line; a
        bad line prints {"pred": null, "score": null, "error"} and scoring goes on.

    paravt eval run --config FILE [--set K=V] --model REF [--split S ...] [--label L]
        evaluate a model on the prepared splits and print the table
        (`paravt_core.eval.run_cli`; the Prefect flow is `paravt-eval`).

    paravt eval serve --model REF [--port 30000] [--server auto|sglang|vllm] [--python PY]
        serve a checkpoint on 127.0.0.1 with SGLang or vLLM, run from the serve venv
        (`make install-serve`), and print the endpoint for `eval run --set
        eval.engine=openai` (`paravt_core.eval.serve`).

Open-ended answers (MMVU) have no SPEC §7 scoring rule, so `score` refuses kind "open".
Exit status 2 on an unreadable rows file, one with no readable row, or any bad `score` input
line, with the file / line named.
"""

from __future__ import annotations

import argparse
import json
import math
import numbers
import sys
from pathlib import Path
from typing import Any

from paravt_core.eval import serve as serve_cli
from paravt_core.eval.samples import SPLITS, EvalSample, read_split
from paravt_core.json_lines import is_blank, load_json_line, raw_lines
from paravt_core.scoring import Scored, score_grounding, score_mcq

# lazy: every `paravt` call imports this module (cli.build_parser), so its commands import what
# they run inside their function: the imports at the top measured +0.17 s on `paravt --help`
# (0.89 -> 1.06 s, min of 8 runs), and some of these modules load torch or Prefect.

INPUT_ERROR = 2


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `eval samples` and `eval score` to the `paravt` parser."""
    parser = subparsers.add_parser("eval", help="benchmark samples and SPEC §7 scoring")
    commands = parser.add_subparsers(dest="eval_command", required=True, metavar="EVAL_COMMAND")

    samples = commands.add_parser("samples", help="print a split's samples as JSON lines")
    samples.add_argument("split", choices=SPLITS)
    samples.add_argument("--rows", type=Path, required=True, help=".jsonl/.json/.parquet rows")
    samples.add_argument("--video-dir", type=Path, required=True)
    samples.add_argument("--subtitle-dir", type=Path, default=None,
                         help="where <videoID>.srt lie (videomme_wsub; default: --video-dir)")
    samples.set_defaults(func=print_samples)

    score = commands.add_parser("score", help="score JSON-line responses read on stdin")
    score.set_defaults(func=score_stdin)

    run = commands.add_parser("run", help="evaluate a model on the prepared splits (no Prefect)")
    run.add_argument("--config", default="conf/pipeline/tiny.yaml", help="pipeline YAML")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. eval.concurrency=4")
    run.add_argument("--model", default="champion",
                     help='MLflow alias (champion, candidate, sft), version number, "base" or a model folder')
    run.add_argument("--split", action="append", choices=SPLITS, dest="splits", help="repeatable; default eval.splits")
    run.add_argument("--label", default=None, help="row name in the table (default: the alias / v<version>)")
    run.set_defaults(func=run_evaluation)

    serve_cli.register(commands)


def sample_record(sample: EvalSample) -> dict[str, Any]:
    """The JSON object `eval samples` prints for one sample."""
    record: dict[str, Any] = {
        "id": sample.id,
        "video_path": str(sample.video_path),
        "question": sample.question,
        "answer": list(sample.answer) if sample.kind == "grounding" else sample.answer,
        "kind": sample.kind,
        "options": list(sample.options),
    }
    if sample.letters:  # options with their own letters (a benchmark's gaps), not A, B, C, ...
        record["option_letters"] = list(sample.letters)
    if sample.kind == "grounding":
        record["gt_start"], record["gt_end"] = sample.gt_start, sample.gt_end
    if sample.video_missing:
        record["video_missing"] = True
    return record


def _warn_missing(sample: EvalSample) -> None:
    if sample.video_missing:
        print(f"warning: {sample.id}: video missing: {sample.video_path}", file=sys.stderr)
    if sample.split == "videomme_wsub" and sample.subtitle_path is None:
        print(f"warning: {sample.id}: no .srt subtitles found; question has none",
              file=sys.stderr)


def print_samples(args: argparse.Namespace) -> int:
    try:
        loaded = read_split(args.split, args.rows, args.video_dir, args.subtitle_dir)
    except (ValueError, OSError) as exc:
        print(f"paravt eval samples: {exc}", file=sys.stderr)
        return INPUT_ERROR
    samples = loaded.samples
    for quarantined in loaded.quarantined:
        print(f"warning: quarantined {quarantined.error()}", file=sys.stderr)
    for sample in samples:
        _warn_missing(sample)
        print(json.dumps(sample_record(sample), ensure_ascii=False))
    missing = sum(sample.video_missing for sample in samples)
    if missing:
        print(f"warning: {missing} of {len(samples)} samples have no video file", file=sys.stderr)
    if loaded.quarantined:
        print(f"warning: {len(loaded.quarantined)} rows quarantined, {len(samples)} samples printed",
              file=sys.stderr)
    if not samples:
        print(f"paravt eval samples: no row of {args.rows} could be read as a {args.split} sample", file=sys.stderr)
        return INPUT_ERROR
    return 0


def _grounding_answer(value: Any) -> tuple[float, float]:
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value)
    ):
        raise ValueError(f'grounding "answer" must be [start, end] numbers, got {value!r}')
    start, end = float(value[0]), float(value[1])
    if not (math.isfinite(start) and math.isfinite(end)) or start < 0 or start >= end:
        raise ValueError(f'grounding "answer" must be finite seconds with 0 <= start < end, got {value!r}')
    return start, end


def score_record(record: Any) -> Scored:
    """Score one {"kind", "response", "answer"} object by the SPEC §7 rules."""
    if not isinstance(record, dict):
        raise ValueError("expected a JSON object")
    kind, response, answer = record.get("kind"), record.get("response"), record.get("answer")
    if not isinstance(response, str):
        raise ValueError(f'"response" must be text, got {response!r}')
    if kind == "mcq":
        if not isinstance(answer, str):
            raise ValueError(f'mcq "answer" must be a letter, got {answer!r}')
        return score_mcq(response, answer)
    if kind == "grounding":
        return score_grounding(response, _grounding_answer(answer))
    raise ValueError(f'"kind" must be "mcq" or "grounding", got {kind!r}')


def run_evaluation(args: argparse.Namespace) -> int:
    from paravt_core.eval.run_cli import run_command  # deferred: torch loads only for this command

    return run_command(args)


def score_stdin(args: argparse.Namespace) -> int:
    """One output line per non-blank input line; a bad line gets {"pred": null, "score": null,
    "error": ...} (and its reason on stderr) and scoring goes on; exit 2 if any line was bad."""
    bad = 0
    for number, line in enumerate(raw_lines(sys.stdin), start=1):
        if is_blank(line):
            continue
        try:
            scored = score_record(load_json_line(line))
        except ValueError as exc:  # BadLine is a ValueError
            print(f"paravt eval score: stdin line {number}: {exc}", file=sys.stderr)
            print(json.dumps({"pred": None, "score": None, "error": f"line {number}: {exc}"}))
            bad += 1
            continue
        pred = list(scored.pred) if isinstance(scored.pred, tuple) else scored.pred
        print(json.dumps({"pred": pred, "score": scored.score}))
    if bad:
        print(f"paravt eval score: {bad} bad line(s) not scored (score null)", file=sys.stderr)
        return INPUT_ERROR
    return 0
