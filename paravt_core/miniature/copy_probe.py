"""Has the tiny model learned to look a token up? A teacher-forced probe of copy rows (#15).

A copy row (`pretrain.copy_row`) asks to write back a list that stands 0 to ~145 x
`model.pretrain.copy_max_videos` tokens earlier among videos' notes. Each word of the
answer is found only by looking back for where the tokens before it stood ("List:", "B.",
the word before) and taking what followed (an induction head); a model without that lookup
guesses a word of the world's vocabulary. This probe draws held-out copy rows from a stream
of its own, feeds each row whole once (teacher forcing) and scores, with `reading_probe.score_row`:

- words: the share of the list's words whose every token is the argmax;
- lettered / plain: the same over lettered lists ("A. Purple B. Cyan ...", the words after
  "A." as an option is read) and over plain lists;
- lists: the share of rows whose every word is right;
- near / far: words over the rows whose list ends at most / more than `FAR_TOKENS` tokens
  before the request (far is nan when no row is that far; `far_rows` counts them).

Measured: 2.3 % of words (guesses among ~70 world words) after 1000 steps of the copy
phase, 74.8 % after 3000, when the lookup had formed (docs/miniature.md).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from paravt_core.config import PipelineConfig
from paravt_core.miniature.forced import ProbeScores, score_row

PROBE_STREAM = "probe-copy"  # derived_rng stream; training rows come from "pretrain-copy" and "pretrain-reading"
# The lookup reaches about as far as it was trained; the default filler (2 videos of notes)
# puts lists up to ~300 tokens back, an agent's options stand ~526 back (`agent_probe`).
FAR_TOKENS = 300


@dataclass(frozen=True)
class CopyProbe(ProbeScores):
    COUNTS = ("rows", "lettered_rows", "far_rows")
    PREFIX = "copy"

    rows: int
    lettered_rows: int
    far_rows: int
    words: float
    lettered: float
    plain: float
    lists: float
    near: float
    far: float


def word_spans(answer: str) -> list[tuple[int, int]]:
    """Character spans of the list's words, each with the space before it.

    Raises:
        ValueError: `answer` is not a copy row's answer ("List: " and its words).
    """
    if not answer.startswith("List: "):
        raise ValueError(f"not a copy answer: {answer[:80]!r}")
    words = list(re.finditer(r"(?<= )[A-Z][a-z]+", answer))
    if not words:
        raise ValueError(f"a copy answer without words: {answer!r}")
    return [(m.start() - 1, m.end()) for m in words]


def probe_rows(cfg: PipelineConfig, count: int, seed: int = 0) -> list[dict]:
    """`count` copy rows of the config's world from the probe's own stream, their filler as
    training draws it (`model.pretrain.copy_max_videos`; `--set` it to probe farther back)."""
    from paravt_core.data.synth.world import derived_rng
    from paravt_core.miniature.pretrain import copy_row

    synth = cfg.data.synth
    return [copy_row(derived_rng(synth.seed, PROBE_STREAM, seed, index), synth, int(synth.max_crop_s),
                     cfg.model.pretrain.copy_max_videos) for index in range(count)]


def score_rows(model, processor, rows: list[dict]) -> CopyProbe:
    """The probe's report of `model` on copy `rows` (module docstring)."""
    from paravt_core.miniature.forced import text_row_forced

    hits = {kind: [0, 0] for kind in ("lettered", "plain", "near", "far")}
    whole = lettered_rows = far_rows = 0
    for row in rows:
        _, offsets, correct = text_row_forced(model, processor, row["messages"])
        answer = row["messages"][1]["content"][0]["text"]
        right = [score_row(correct, offsets, {"word": [span]})["word"] for span in word_spans(answer)]
        after = row["messages"][0]["content"][0]["text"].split(answer, 1)[1]
        far = len(processor.tokenizer(after, add_special_tokens=False)["input_ids"]) > FAR_TOKENS
        lettered = answer.startswith("List: A. ")
        lettered_rows += lettered
        far_rows += far
        for kind in ("lettered" if lettered else "plain", "far" if far else "near"):
            hits[kind][0] += sum(right)
            hits[kind][1] += len(right)
        whole += all(right)
    share = {kind: good / total if total else math.nan for kind, (good, total) in hits.items()}
    words = (hits["near"][0] + hits["far"][0]) / max(1, hits["near"][1] + hits["far"][1])
    return CopyProbe(rows=len(rows), lettered_rows=lettered_rows, far_rows=far_rows, words=words,
                     lists=whole / len(rows), **share)


def copy_probe(model_dir: Path, cfg: PipelineConfig, rows: int = 100, seed: int = 0) -> CopyProbe:
    """Score the model in `model_dir` on `rows` held-out copy rows (module docstring)."""
    from paravt_core.model.loading import load_model, load_processor

    model = load_model(model_dir, dtype="float32", device="cpu").eval()
    return score_rows(model, load_processor(model_dir), probe_rows(cfg, rows, seed))
