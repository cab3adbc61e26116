"""Stream commands give one output line per non-blank input line, whatever the line holds
(issue #48 item 4): `paravt eval score` and `paravt rewards`."""

from __future__ import annotations

import io
import json
import sys

import pytest

from paravt_core.cli import main

DEEP_LINE = "[" * 100_000 + "]" * 100_000
DEEP_OBJECT = '{"a": ' * 100_000 + "1" + "}" * 100_000
NOT_UTF8 = b'{"kind": "mcq", "response": "\xff", "answer": "A"}'
LONG_INTEGER = '{"kind": "mcq", "response": "A", "answer": ' + "1" * 5000 + "}"

EVAL_GOOD = b'{"kind": "mcq", "response": "B", "answer": "B"}'
REWARDS_GOOD = b'{"completion": "<answer>B</answer>", "answer": "B", "question_type": "mcq"}'


def byte_stdin(monkeypatch: pytest.MonkeyPatch, lines: list[bytes]) -> None:
    """A stdin like the real one: bytes underneath, decoded strictly (a UTF-8 locale, or
    PYTHONIOENCODING=utf-8), so a bad byte raised from the reading loop itself."""
    raw = io.BytesIO(b"\n".join(lines) + b"\n")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(raw, encoding="utf-8", errors="strict"))


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[dict], str]:
    status = main(argv)
    out, err = capsys.readouterr()
    return status, [json.loads(line) for line in out.splitlines()], err


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (DEEP_LINE.encode(), "nesting too deep"),
        (DEEP_OBJECT.encode(), "nesting too deep"),
        (NOT_UTF8, "not UTF-8 text (byte 30 is 0xff)"),
        (LONG_INTEGER.encode(), "a number is too long"),
        (b"{not json", "not valid JSON (Expecting property name"),
    ],
)
def test_eval_score_answers_every_line(bad: bytes, message: str, monkeypatch, capsys) -> None:
    byte_stdin(monkeypatch, [EVAL_GOOD, bad, EVAL_GOOD])
    status, outputs, err = run(["eval", "score"], capsys)
    assert status == 2  # the module's documented status for a bad input line
    assert len(outputs) == 3
    assert outputs[0] == outputs[2] == {"pred": "B", "score": 1.0}
    assert outputs[1]["score"] is None and outputs[1]["error"].startswith("line 2: ") and message in outputs[1]["error"]
    assert "stdin line 2" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (DEEP_LINE.encode(), "nesting too deep"),
        (NOT_UTF8, "not UTF-8 text"),
        (LONG_INTEGER.encode(), "a number is too long"),
    ],
)
def test_rewards_answers_every_line(bad: bytes, message: str, monkeypatch, capsys) -> None:
    byte_stdin(monkeypatch, [REWARDS_GOOD, bad, REWARDS_GOOD])
    status, outputs, err = run(["rewards"], capsys)
    assert status == 1  # the module's documented status for a bad input line
    assert len(outputs) == 3
    assert outputs[0]["total"] == outputs[2]["total"] == pytest.approx(1.6)
    assert outputs[1]["line"] == 2 and message in outputs[1]["error"]
    assert err.startswith("paravt rewards: line 2: ")


def test_eval_score_prints_json_for_a_number_too_long_for_a_float(monkeypatch, capsys) -> None:
    line = json.dumps({"kind": "grounding", "response": "1 - " + "9" * 400, "answer": [1, 5]})
    byte_stdin(monkeypatch, [line.encode()])
    status = main(["eval", "score"])
    out = capsys.readouterr().out
    assert status == 0
    assert "Infinity" not in out and json.loads(out) == {"pred": None, "score": 0.0}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        # a JSON integer too large for a float: math.isfinite raised OverflowError, ending the stream
        ('{"completion": "x", "answer": "B", "question_type": "mcq", "anchor_weight": 1' + "0" * 400 + "}",
         '"anchor_weight" must be a finite number, got 10000000000000000000...(401 characters)'),
        # finite weights whose product is not: the line printed "total": -Infinity, which is not JSON
        ('{"completion": "<think>abc", "answer": "B", "question_type": "mcq", "anchor_weight": 1e308, '
         '"format_weight": 1e308}', "make the reward overflow a float"),
    ],
)
def test_rewards_weights_too_large_are_that_lines_error(bad: str, message: str, monkeypatch, capsys) -> None:
    byte_stdin(monkeypatch, [REWARDS_GOOD, bad.encode(), REWARDS_GOOD])
    status = main(["rewards"])
    out, err = capsys.readouterr()
    assert "Infinity" not in out
    outputs = [json.loads(line) for line in out.splitlines()]
    assert status == 1 and len(outputs) == 3
    assert outputs[1]["line"] == 2 and message in outputs[1]["error"]
    assert outputs[2]["total"] == pytest.approx(1.6)
