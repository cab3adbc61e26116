"""The README is the guide, not the lab notebook (#63 item 4): it says what the project does and
how to use it, with the current figures, in at most 250 lines, and holds no dated work notes
(dated runs belong in docs/log/). The one dated line it keeps is the measured `make test` line,
a current figure that is rewritten after each full run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
MAX_LINES = 250

_MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|December"
           "|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec")
# Month names are matched capitalized only, so "may 4 runs" is not a date.
_DATES = re.compile(rf"\b\d{{4}}-\d{{2}}-\d{{2}}\b"                        # 2026-11-26
                    rf"|\b\d{{1,2}} (?:{_MONTHS})\b"                        # 26 November
                    rf"|\b(?:{_MONTHS})\.? \d{{1,2}}(?:st|nd|rd|th)?\b"     # Nov 26, November 26th
                    rf"|\b(?:{_MONTHS}) \d{{4}}\b")                         # November 2026
# Words that date a note without a date: which session ran it, what the day was like.
_CHRONOLOGY = re.compile(r"\bsessions? \d+\b|\byesterday\b|\btoday\b|\blast (?:week|night|session)\b"
                         r"|\b(?:a|this|that|the) (?:fast|slow|faster|slower) day\b", re.IGNORECASE)
# "1714 passed, 11 skipped (gpu) in 13.0 min (2026-11-29, the last run)."
MAKE_TEST_LINE = re.compile(r"^\d+ passed\b.* in [\d.]+ min \(\d{4}-\d{2}-\d{2}, the last run\)\.$")


def dated_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of each line that dates a work note, the `make test` line excepted."""
    return [(n, line) for n, line in enumerate(text.splitlines(), 1)
            if not MAKE_TEST_LINE.match(line.strip()) and (_DATES.search(line) or _CHRONOLOGY.search(line))]


@pytest.mark.parametrize("line", [
    "grammar: in the latest `make demo` (2026-11-26), 88 % (49 of 56) of held-out greedy episodes",
    "Measured on one H100 (26 November, two calls of the earlier check)",
    "the default took 61.1 min on Nov 28 on this machine",
    "as measured in November 2026",
    "measured in session 57 on the same host",
    "on a fast day the reproduction takes 49.5 min",
    "1714 passed, 11 skipped (gpu) in 13.0 min (2026-11-29), measured today",
])
def test_a_dated_note_is_found(line):
    assert dated_lines(line) == [(1, line)]


@pytest.mark.parametrize("line", [
    "1714 passed, 11 skipped (gpu) in 13.0 min (2026-11-29, the last run).",
    "A reproducible pipeline for **ParaVT** (arXiv 2605.20342): a Qwen3-VL model answers",
    "Requirements: Python 3.11 (3.12 for the GPU profile) and torch 2.14.1 + torchvision 0.29.1.",
    "4 runs each; may 4 runs decide? (`reproduce.seeds`), 22.3 min increment",
])
def test_a_current_figure_is_not_a_dated_note(line):
    assert dated_lines(line) == []


def test_readme_is_at_most_250_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines, more than {MAX_LINES}: move detail to docs/"


def test_readme_holds_no_dated_work_notes():
    found = dated_lines(README.read_text(encoding="utf-8"))
    assert not found, "README.md holds dated work notes (move them to docs/log/):\n" + "\n".join(
        f"  line {n}: {line}" for n, line in found)


def test_readme_keeps_its_measured_make_test_line():
    lines = [line for line in README.read_text(encoding="utf-8").splitlines() if MAKE_TEST_LINE.match(line.strip())]
    assert len(lines) == 1, ("README.md should hold one measured `make test` line, as "
                             "'N passed, M skipped (gpu) in T min (YYYY-MM-DD, the last run).'")
