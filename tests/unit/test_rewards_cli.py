"""Tests of `paravt rewards` (JSON lines in, JSON lines out; SPEC §4 and §2)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from paravt_core.cli import COMMAND_MODULES, main

ARGUMENTS = '{"video_path": "v.mp4", "start_time": "00:10", "end_time": 20}'
CALL = '<tool_call>{"name": "crop_video", "arguments": ' + ARGUMENTS + "}</tool_call>"
BROKEN_CALL = '<tool_call>{"name": "crop_video", "arguments": {"video_path": "v.mp4", "start_time": 1,}}</tool_call>'
THINK = "<think>I will look at the start.</think>"


def with_knob(key: str, value: object) -> dict[str, object]:
    return {"completion": "x", "answer": "B", "question_type": "mcq", key: value}


def run_rewards(
    records: list[object], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, list[dict], str]:
    lines = [record if isinstance(record, str) else json.dumps(record) for record in records]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n"))
    status = main(["rewards"])
    captured = capsys.readouterr()
    return status, [json.loads(line) for line in captured.out.splitlines()], captured.err


def test_command_is_registered() -> None:
    assert "paravt_core.rl.cli" in COMMAND_MODULES


def test_scores_with_spec_defaults(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    record = {"completion": THINK + CALL + "<answer>B</answer>", "answer": "B", "question_type": "mcq"}
    status, outputs, err = run_rewards([record], monkeypatch, capsys)
    assert (status, err) == (0, "")
    (out,) = outputs
    # acc 1; format 0.7 + 0.5 * 0.7 + 0.3 + 0.1 = 1.45 -> 1.0; tool 0.1 + 0.5; total 2.6
    assert out["answer"] == "B"
    assert (out["acc"], out["format"], out["tool"], out["total"]) == pytest.approx((1.0, 1.0, 0.6, 2.6))
    assert out["tool_calls"] == [
        {
            "index": 0,
            "kind": "json",
            "name": "crop_video",
            "arguments": {"video_path": "v.mp4", "start_time": 10.0, "end_time": 20.0},
        }
    ]


@pytest.mark.parametrize(
    ("knobs", "expected"),
    [
        # acc 1, no tool; format 0.2 + 0.5 + 0.5 * 0.7 + 0.1 = 1.15 -> 1.0; total 2.0
        ({}, (1.0, 1.0, 0.0, 2.0)),
        # vanilla: 0.3 + 0.2 + 0.1 + 0.1 = 0.7; total 1.7
        ({"answer_suffix": False, "anchor_weight": 0}, (1.0, 0.7, 0.0, 1.7)),
        # format 1.0 weighted by 0.25: total 1.25
        ({"format_weight": 0.25}, (1.0, 1.0, 0.0, 1.25)),
    ],
)
def test_format_knobs(
    knobs: dict, expected: tuple, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    record = {"completion": THINK + "<answer>B</answer>", "answer": "B", "question_type": "mcq", **knobs}
    status, (out,), _ = run_rewards([record], monkeypatch, capsys)
    assert status == 0
    assert (out["acc"], out["format"], out["tool"], out["total"]) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("mode", "acc"),
    [
        ("exact", 0.0),
        ("f1", 0.8),  # common {red, car}: precision 1, recall 2/3, F1 0.8
        ("llm", 0.8),  # no judge in the command: F1
    ],
)
def test_open_ended_modes(
    mode: str, acc: float, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    record = {"completion": "<answer>red car</answer>", "answer": "the big red car", "question_type": "oe"}
    record["mode"] = mode
    _, (out,), _ = run_rewards([record], monkeypatch, capsys)
    # format with no think: 0.3 + 0.2 + 0.1 = 0.6
    assert (out["acc"], out["format"], out["total"]) == pytest.approx((acc, 0.6, acc + 0.6))


def test_malformed_block_is_reported_beside_valid_ones(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    completion = THINK + CALL + BROKEN_CALL + "<tool_code>crop_video('v.mp4', 30, 40, 4)</tool_code>"
    _, (out,), _ = run_rewards([{"completion": completion, "answer": "B", "question_type": "mcq"}], monkeypatch, capsys)
    first, broken, third = out["tool_calls"]
    assert first["arguments"]["start_time"] == 10.0
    assert broken["name"] is None and "arguments" not in broken
    assert broken["index"] == 1 and "malformed JSON" in broken["error"]
    assert broken["raw"].startswith('{"name": "crop_video"')
    assert third == {
        "index": 2,
        "kind": "python",
        "name": "crop_video",
        "arguments": {"video_path": "v.mp4", "start_time": 30.0, "end_time": 40.0, "num_frames": 4},
    }


def test_tool_code_block_with_one_call_per_line_lists_each_call(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """SPEC §2: a bare call, a print(...) call with a stray quote, and a malformed line."""
    lines = ['crop_video(video_path="v.mp4", start_time=10, end_time=20)', "print(crop_video('v.mp4', 30, 40'))",
             'crop_video("v.mp4", 5)']
    completion = THINK + "<tool_code>" + "\n".join(lines) + "</tool_code>"
    _, (out,), _ = run_rewards([{"completion": completion, "answer": "B", "question_type": "mcq"}], monkeypatch, capsys)
    bare, printed, broken = out["tool_calls"]
    assert bare == {"index": 0, "kind": "python", "name": "crop_video",
                    "arguments": {"video_path": "v.mp4", "start_time": 10.0, "end_time": 20.0}}
    assert printed == {"index": 1, "kind": "python", "name": "crop_video",
                       "arguments": {"video_path": "v.mp4", "start_time": 30.0, "end_time": 40.0}}
    assert broken == {"index": 2, "kind": "python", "name": None, "raw": lines[2],
                      "error": "line 3 of the <tool_code> block: missing required argument(s) end_time"}


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ("[" * 100_000, "nesting too deep"),
        ('{"completion": "x", "question_type": "mcq"}', 'missing key "answer"'),
        ('{"completion": "x", "answer": "B"}', 'missing key "question_type"'),
        (json.dumps(with_knob("completion", 5)), '"completion" must be a string'),
        (json.dumps(with_knob("question_type", "yesno")), '"question_type" must be one of mcq, tvg, oe'),
        (json.dumps(with_knob("mode", "bleu")), '"mode" must be one of exact, f1, llm'),
        (json.dumps(with_knob("answer_suffix", "yes")), '"answer_suffix" must be true or false'),
        (json.dumps(with_knob("anchor_weight", "0.5")), '"anchor_weight" must be a finite number'),
        (json.dumps(with_knob("format_weight", float("nan"))), '"format_weight" must be a finite number'),
        (json.dumps(with_knob("anchor_wieght", 0)), "unknown key(s) anchor_wieght"),
    ],
)
def test_bad_line_is_reported_and_the_rest_scored(
    bad_line: str, message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    good = {"completion": "<answer>B</answer>", "answer": "B", "question_type": "mcq"}
    status, outputs, err = run_rewards([good, bad_line, "", good], monkeypatch, capsys)
    assert status == 1
    assert err.startswith("paravt rewards: line 2: ") and message in err
    # the blank line 3 is skipped; outputs stay aligned with the non-blank inputs
    assert len(outputs) == 3
    assert outputs[1]["line"] == 2 and message in outputs[1]["error"]
    # acc 1 + format 0.6 (0.3 + 0.2 + 0.1)
    assert outputs[0]["total"] == pytest.approx(1.6) and outputs[2]["total"] == pytest.approx(1.6)


def test_installed_console_script() -> None:
    script = Path(sys.executable).with_name("paravt")
    if not script.exists():
        pytest.skip("the paravt console script is not installed in this environment")
    record = {"completion": "<answer>[10, 20]</answer>", "answer": "[15, 25]", "question_type": "tvg"}
    done = subprocess.run([str(script), "rewards"], input=json.dumps(record) + "\n", capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    # IoU: overlap 5 / union 15; format 0.3 + 0.2 + 0.1 = 0.6
    assert (out["acc"], out["format"], out["total"]) == pytest.approx((1 / 3, 0.6, 1 / 3 + 0.6))
