"""The teacher-forced copy probe (#15): which words of a copy answer it scores, and its report."""

from __future__ import annotations

from pathlib import Path

import pytest

from paravt_core.config import load_config
from paravt_core.miniature.copy_probe import copy_probe, probe_rows, score_rows, word_spans

REPRODUCE = Path(__file__).resolve().parents[2] / "conf" / "pipeline" / "reproduce.yaml"


def test_word_spans_are_the_words_with_their_space_not_the_letters():
    answer = "List: A. Purple B. Top C. Seven"
    assert [answer[a:b] for a, b in word_spans(answer)] == [" Purple", " Top", " Seven"]
    answer = "List: Purple Top Seven Cyan"
    assert [answer[a:b] for a, b in word_spans(answer)] == [" Purple", " Top", " Seven", " Cyan"]


@pytest.mark.parametrize("answer", ["The notes say: Purple", "List: A. B.", "List: "])
def test_word_spans_refuse_what_is_not_a_copy_answer(answer: str):
    with pytest.raises(ValueError, match="copy answer"):
        word_spans(answer)


def test_probe_rows_are_held_out_copy_rows():
    from paravt_core.data.synth.world import derived_rng
    from paravt_core.miniature.pretrain import copy_row

    cfg = load_config(REPRODUCE, [])
    rows = probe_rows(cfg, 20)
    assert probe_rows(cfg, 20) == rows and probe_rows(cfg, 20, seed=1) != rows
    synth = cfg.data.synth
    training = [copy_row(derived_rng(synth.seed, "pretrain-copy", 0, i), synth, 16, 2) for i in range(200)]
    answers = {r["messages"][1]["content"][0]["text"] for r in training}
    assert not answers & {r["messages"][1]["content"][0]["text"] for r in rows}
    assert all(word_spans(r["messages"][1]["content"][0]["text"]) for r in rows)


def test_copy_probe_scores_a_model_folder(tiny_model_dir):
    report = copy_probe(tiny_model_dir, load_config(REPRODUCE, []), rows=6)
    assert report.rows == 6 and 0 <= report.lettered_rows <= 6
    assert set(report.as_metrics()) == {"copy_words", "copy_lettered", "copy_plain", "copy_lists", "copy_near",
                                        "copy_far"}
    # random weights look nothing up
    assert report.words < 0.2 and report.lists == 0.0


def test_score_rows_counts_the_words_a_model_writes_back(tiny_processor, oracle_model):
    rows = probe_rows(load_config(REPRODUCE, []), 8)
    vocab = len(tiny_processor.tokenizer)
    report = score_rows(oracle_model(vocab), tiny_processor, rows)
    assert (report.words, report.lettered, report.plain, report.lists) == (1.0, 1.0, 1.0, 1.0)
    assert report.lettered_rows == sum(r["messages"][1]["content"][0]["text"].startswith("List: A. ") for r in rows)
    # a model that never writes " Purple": exactly the rows holding it are not whole
    purple = tiny_processor.tokenizer(" Purple", add_special_tokens=False)["input_ids"]
    assert len(purple) == 1
    missed = score_rows(oracle_model(vocab, purple[0]), tiny_processor, rows)
    holding = sum(" Purple" in r["messages"][1]["content"][0]["text"] for r in rows)
    assert 0 < holding < 8 and missed.lists == 1 - holding / 8 and missed.words < 1.0


def test_score_rows_splits_near_and_far_lists(tiny_processor, oracle_model):
    """Lists more than `FAR_TOKENS` tokens before the request count as far; with the default
    filler (2 videos of notes) none is, with 5 some are."""
    import math

    vocab = len(tiny_processor.tokenizer)
    near = score_rows(oracle_model(vocab), tiny_processor, probe_rows(load_config(REPRODUCE, []), 8))
    assert near.far_rows == 0 and math.isnan(near.far) and near.near == 1.0
    rows = probe_rows(load_config(REPRODUCE, ["model.pretrain.copy_max_videos=5"]), 12)
    report = score_rows(oracle_model(vocab), tiny_processor, rows)
    assert 0 < report.far_rows < 12 and report.near == report.far == report.words == 1.0
    # by the notes after the list (~47 tokens a line): none -> near, 8 or more -> far
    per_row = [_oracle_row(tiny_processor, row, oracle_model) for row in rows]
    assert any(lines == 0 for lines, _ in per_row) and any(lines >= 8 for lines, _ in per_row)
    assert all(far == 0 for lines, far in per_row if lines == 0)
    assert all(far == 1 for lines, far in per_row if lines >= 8)


def _oracle_row(processor, row: dict, oracle_model) -> tuple[int, int]:
    """(note lines after the list, far rows the probe counts) for one row."""
    answer = row["messages"][1]["content"][0]["text"]
    after = row["messages"][0]["content"][0]["text"].split(answer, 1)[1]
    far = score_rows(oracle_model(len(processor.tokenizer)), processor, [row]).far_rows
    return after.count("\n") - 1, far
