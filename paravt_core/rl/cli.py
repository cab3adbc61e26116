"""`paravt rewards`: score completions read as JSON lines on stdin (SPEC §4, tool calls SPEC §2).

Input, one JSON object per line:
  {"completion": str, "answer": str, "question_type": "mcq" | "tvg" | "oe",
   "answer_suffix": bool, "anchor_weight": number, "format_weight": number,
   "mode": "exact" | "f1" | "llm", "question": str}
The last five keys are optional (defaults: answer_suffix true, anchor_weight 0.5,
format_weight 1.0, mode "f1", question ""); any other key is an error, so a misspelt knob
is caught rather than silently replaced by its default. No judge model is loaded here, so
mode "llm" scores with the token F1 fallback of SPEC §4.2.

Output, one JSON line per non-blank input line, in input order:
  {"answer": extracted answer, "acc", "format", "tool" (one key per term of the reward,
   `rewards.REWARD_TERMS`, unweighted), "total",
   "tool_calls": [{"index", "kind", "name": "crop_video", "arguments": {...}} or
                  {"index", "kind", "name": null, "error": message, "raw": block body}]}
Scores are rounded to 10 decimal places. Tool-call times are in seconds; a malformed
block is reported with "error" in place of "arguments" and does not hide the other blocks.

A bad input line prints "paravt rewards: line N: <what is wrong>" on stderr and writes
{"line": N, "error": ...} in its place, so outputs stay aligned with inputs; the remaining
lines are still scored and the exit status is 1. Blank lines are skipped.

Example:
  echo '{"completion": "<answer>B</answer>", "answer": "B", "question_type": "mcq"}' | paravt rewards
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable
from typing import TextIO

from paravt_core.agent.tool_calls import TOOL_NAME, ParsedBlock, parse_tool_calls
from paravt_core.json_lines import BadLine, is_blank, load_json_line, raw_lines
from paravt_core.rewards import OPEN_ENDED_MODES, QUESTION_TYPES, compute_reward, reward_term_names

# lazy: rl.replay loads torch (2.3 s); `paravt rewards` and `paravt --help` run without it
# (tests/unit/test_rewards.py).

_REQUIRED_STRINGS = ("completion", "answer")
_OPTIONAL_KEYS = ("answer_suffix", "anchor_weight", "format_weight", "mode", "question")
_KNOWN_KEYS = (*_REQUIRED_STRINGS, "question_type", *_OPTIONAL_KEYS)
# Scores are sums of tenths; rounding hides float noise such as 0.7999999999999999.
_DECIMALS = 10


class InputLineError(ValueError):
    """An input line that cannot be scored; the message says what is wrong with it."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "rewards",
        help="score completions given as JSON lines on stdin (SPEC §4)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(func=run_rewards_command)

    replay = subparsers.add_parser(
        "rl-replay",
        help="roll out one logged RL step again from its draws log and say whether the rollouts are identical",
        description="Each RL step logs its draws (prompts, frame budgets K, sampler seed, weight version) in "
                    "<run>/draws/. This rebuilds the step's rollout on this rank from that log with the weights "
                    "it used (the SFT model for step 1, else the checkpoint written after the step before) and "
                    "compares the rollouts' digest with the logged one. The log is checked first against the "
                    "run (its step, prompts, videos, K, seed and weight version) and the checkpoint against its "
                    "manifest. Exit 0: identical; 1: they differ; 2: the run folder, its log, data, model or "
                    "checkpoint cannot be used as it is (the message names the file).",
    )
    replay.add_argument("--run-dir", required=True, help="the RL run folder (<output_dir>/rl/<row>-<key>)")
    replay.add_argument("--step", type=int, required=True, help="the step to replay (1-based, as metrics.jsonl)")
    replay.add_argument("--rank", type=int, default=0, help="which rank's share of the step")
    replay.set_defaults(func=run_replay_command)


def run_replay_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from paravt_core.rl.replay import ReplayError, replay_step

    if not (Path(args.run_dir) / "job.json").is_file():
        print(f"paravt rl-replay: {args.run_dir} is not an RL run folder (no job.json)", file=sys.stderr)
        return 2
    try:
        replay = replay_step(Path(args.run_dir), args.step, args.rank)
    except ReplayError as exc:
        print(f"paravt rl-replay: {exc}", file=sys.stderr)
        return 2
    d = replay.draws
    budgets = ", ".join(f"{p.prompt_id}:K={p.nframes}" for p in d.prompts)
    print(f"step {d.step} rank {d.rank}: {len(replay.episodes)} episodes of {len(d.prompts)} prompts ({budgets}), "
          f"sampler seed {d.sampler_seed}, weights after {d.weight_version} steps")
    print(f"logged   {d.rollout_sha256}\nreplayed {replay.digest}\n"
          f"{'identical' if replay.identical else 'DIFFERENT'}")
    return 0 if replay.identical else 1


def run_rewards_command(args: argparse.Namespace) -> int:
    return score_json_lines(raw_lines(sys.stdin), sys.stdout, sys.stderr)


def score_json_lines(lines: Iterable[bytes | str], out: TextIO, err: TextIO) -> int:
    """Score each non-blank JSON line of `lines` (bytes are decoded line by line, so a line that is
    not UTF-8 is that line's error); returns the exit status (1 if any line was bad)."""
    status = 0
    for number, line in enumerate(lines, start=1):
        if is_blank(line):
            continue
        try:
            result = score_record(parse_record(line))
        except InputLineError as exc:
            err.write(f"paravt rewards: line {number}: {exc}\n")
            result, status = {"line": number, "error": str(exc)}, 1
        out.write(json.dumps(result) + "\n")
    return status


def parse_record(line: bytes | str) -> dict[str, object]:
    """Decode and check one input line; returns the record with the SPEC defaults filled in."""
    try:
        record = load_json_line(line)
    except BadLine as exc:
        raise InputLineError(str(exc)) from None
    if not isinstance(record, dict):
        raise InputLineError("expected a JSON object")
    unknown = sorted(set(record) - set(_KNOWN_KEYS))
    if unknown:
        raise InputLineError(f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(_KNOWN_KEYS)}")
    for key in (*_REQUIRED_STRINGS, "question_type"):
        if key not in record:
            raise InputLineError(f'missing key "{key}"')
    checked = {"answer_suffix": True, "anchor_weight": 0.5, "format_weight": 1.0, "mode": "f1", "question": ""}
    checked.update(record)
    _check_record_types(checked)
    return checked


def score_record(record: dict[str, object]) -> dict[str, object]:
    """The output object of one checked record."""
    breakdown = compute_reward(
        record["completion"],
        record["answer"],
        record["question_type"],
        answer_suffix=record["answer_suffix"],
        anchor_weight=float(record["anchor_weight"]),
        format_weight=float(record["format_weight"]),
        oe_mode=record["mode"],
        question=record["question"],
    )
    terms = {name: breakdown.terms[name] for name in reward_term_names()} | {"total": breakdown.total}
    if not all(math.isfinite(term) for term in terms.values()):
        # Each weight is finite, but their product can overflow: JSON has no inf to print.
        raise InputLineError(f"anchor_weight {record['anchor_weight']} and format_weight {record['format_weight']} "
                             "make the reward overflow a float; give weights of ordinary size")
    return {
        "answer": breakdown.answer,
        **{name: round(value, _DECIMALS) for name, value in terms.items()},
        "tool_calls": [tool_call_entry(block) for block in parse_tool_calls(record["completion"])],
    }


def tool_call_entry(block: ParsedBlock) -> dict[str, object]:
    """The JSON form of one parsed call block (see the module docstring)."""
    entry: dict[str, object] = {"index": block.index, "kind": block.kind}
    if block.call is None:
        return entry | {"name": None, "error": block.error, "raw": block.raw}
    return entry | {"name": TOOL_NAME, "arguments": block.call.arguments()}


def _check_record_types(record: dict[str, object]) -> None:
    for key in (*_REQUIRED_STRINGS, "question"):
        if not isinstance(record[key], str):
            raise InputLineError(f'"{key}" must be a string, got {type(record[key]).__name__}')
    for key, allowed in (("question_type", QUESTION_TYPES), ("mode", OPEN_ENDED_MODES)):
        if record[key] not in allowed:
            raise InputLineError(f'"{key}" must be one of {", ".join(allowed)}, got {record[key]!r}')
    if not isinstance(record["answer_suffix"], bool):
        raise InputLineError('"answer_suffix" must be true or false')
    for key in ("anchor_weight", "format_weight"):
        value = record[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not _fits_a_float(value):
            raise InputLineError(f'"{key}" must be a finite number, got {_short(value)}')


def _fits_a_float(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # a JSON integer of hundreds of digits
        return False


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"
