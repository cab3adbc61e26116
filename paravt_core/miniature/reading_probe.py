"""Can the tiny model read? A teacher-forced probe of the reading phase's skill (#15).

The reading phase of the tiny base (`model.pretrain`, rows of `pretrain.reading_row`) should
leave a model that, given a video's notes and a multiple-choice question, quotes the note on
the asked event, names the value, checks the options in order and ends on the right letter
(`data.synth.traces.check_options`). This probe draws held-out reading rows from a stream of
their own (never a training row), feeds each whole row to the model once (teacher forcing:
every token is predicted from the true text before it) and scores each part of the answer by
whether the model's argmax reproduces all of its tokens:

- quote: the quoted note(s); value: the value after "So the answer is";
- options: every option text copied into the checking lines; values: the value beside each;
- verdicts: every "same"/"different";
- letter: the final "option X"; chain: everything from the value to the letter.

Teacher forcing isolates each step from the errors before it: a greedy answer can fail at
the value and never reach a letter, which says nothing about the letter step. The score of
one row is a pure function of its tokens' correctness and offsets (`score_row`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from paravt_core.config import PipelineConfig
from paravt_core.data.synth.questions import OptionStyle
from paravt_core.data.synth.world import derived_rng, sample_video, youtube_like_id
from paravt_core.miniature.forced import ProbeScores, score_row, spaced, text_row_forced
from paravt_core.miniature.pretrain import reading_row
from paravt_core.model.loading import build_model, load_processor

PARTS = ("quote", "value", "options", "values", "verdicts", "letter", "chain")
PROBE_STREAM = "probe-reading"  # derived_rng stream; training rows come from "pretrain-reading"


@dataclass(frozen=True)
class ReadingProbe(ProbeScores):
    PREFIX = "reading"

    rows: int  # multiple-choice rows scored
    quote: float
    value: float
    options: float
    values: float
    verdicts: float
    letter: float
    chain: float


def answer_spans(answer: str) -> dict[str, list[tuple[int, int]]]:
    """Character spans of the scored parts of one reading-row answer (module docstring).

    Raises:
        ValueError: the answer is not in the reading-row layout (quote, value, checks, letter).
    """
    head = re.match(r"The notes say: (.+?) So the answer is (.+?)\. Checking the options: ", answer, re.S)
    if not head or not re.search(r" So the answer is option ([A-Z])\.$", answer):
        raise ValueError(f"not a multiple-choice reading answer: {answer[:120]!r}")
    return {"quote": [spaced(answer, *head.span(1))], **check_spans(answer)}


def check_spans(text: str) -> dict[str, list[tuple[int, int]]]:
    """Character spans of the option check in `text` (a reading answer or an agent's final
    turn): value, options, values, verdicts, letter and the chain from value to letter.

    Raises:
        ValueError: no "So the answer is X. Checking the options: ... So the answer is option L." in it.
    """
    head = re.search(r"So the answer is (.+?)\. Checking the options: ", text)
    tail = re.search(r" So the answer is option ([A-Z])\.", text[head.end():]) if head else None
    if not head or not tail:
        raise ValueError(f"no option check in: {text[:120]!r}")
    base, end = head.end(), head.end() + tail.start(1)
    checks = list(re.finditer(r"([A-Z])\. (.+?) vs (.+?): (same|different)\.", text[base:base + tail.start() + 1]))
    if not checks:
        raise ValueError(f"no option checks in: {text[:120]!r}")
    return {"value": [spaced(text, *head.span(1))],
            "options": [spaced(text, base + m.start(2), base + m.end(2)) for m in checks],
            "values": [spaced(text, base + m.start(3), base + m.end(3)) for m in checks],
            "verdicts": [spaced(text, base + m.start(4), base + m.end(4)) for m in checks],
            "letter": [spaced(text, end, end + 1)], "chain": [spaced(text, head.start(1), end + 1)]}


def padded(row: dict, pad: int) -> dict | None:
    """`row` with its answer's quote led by `pad` copies of one of its own empty-window notes,
    so the options stand `pad` sentences further back from the checks; None when the row's
    notes have no empty window.

    A model that copies each option from a fixed distance back fails on these rows; one that
    finds the option by its letter does not. Measured on the reading phase's model (100
    held-out rows): option lines 91 % unpadded, 10 % with one sentence, 8 % with three."""
    if pad < 0:
        raise ValueError(f"pad must be 0 or more empty-window notes, got {pad}")
    user, answer = (m["content"][0]["text"] for m in row["messages"])
    empty = next((line.split(": ", 1)[1] for line in user.splitlines() if ": Nothing notable" in line), None)
    if empty is None:
        return None
    head = "The notes say: "
    answer = head + f"{empty} " * pad + answer.removeprefix(head)
    return {**row, "messages": [row["messages"][0], {"role": "assistant", "content": [{"type": "text", "text": answer}]}]}


def probe_rows(cfg: PipelineConfig, count: int, seed: int = 0, pad: int = 0) -> list[dict]:
    """`count` multiple-choice reading rows of the config's world from the probe's own stream
    (`pad`: their quotes lengthened, `padded`)."""
    synth = cfg.data.synth
    topics, style = (tuple(synth.question_topics) if synth.question_topics else None), OptionStyle.of(synth)
    rows, index = [], 0
    while len(rows) < count:
        rng = derived_rng(synth.seed, PROBE_STREAM, seed, index)
        index += 1
        row = reading_row(rng, sample_video(rng, synth, youtube_like_id(rng)), int(synth.max_crop_s), topics, style)
        if pad:
            row = padded(row, pad)
        if row is not None and "Checking the options" in row["messages"][1]["content"][0]["text"]:
            rows.append(row)
        if index > 20 * count:
            raise ValueError(f"the world's question topics {topics} give no multiple-choice reading rows")
    return rows


def reading_probe(model_dir: Path, cfg: PipelineConfig, rows: int = 200, seed: int = 0, pad: int = 0) -> ReadingProbe:
    """Score the model in `model_dir` on `rows` held-out reading rows (module docstring;
    `pad`: each quote led by that many empty-window notes, `padded`)."""
    processor = load_processor(model_dir)
    model = build_model(cfg.model, model_dir, dtype="float32").eval()
    totals = dict.fromkeys(PARTS, 0)
    drawn = probe_rows(cfg, rows, seed, pad)
    for row in drawn:
        _, offsets, correct = text_row_forced(model, processor, row["messages"])
        for part, ok in score_row(correct, offsets, answer_spans(row["messages"][1]["content"][0]["text"])).items():
            totals[part] += ok
    return ReadingProbe(rows=len(drawn), **{part: totals[part] / len(drawn) for part in PARTS})
