"""The teacher-forced reading probe (#15): the parts of a reading answer and their scoring."""

from __future__ import annotations

from pathlib import Path

import pytest

from paravt_core.config import load_config
from paravt_core.miniature.forced import score_row
from paravt_core.miniature.reading_probe import PARTS, answer_spans, padded, probe_rows, reading_probe

REPRODUCE = Path(__file__).resolve().parents[2] / "conf" / "pipeline" / "reproduce.yaml"
ANSWER = ("The notes say: From 00:20.0 to 00:22.0 a green circle appears in the top right corner. So the answer is "
          "Top right. Checking the options: A. Bottom left vs Top right: different. B. Top right vs Top right: same. "
          "So the answer is option B.")


def test_answer_spans_name_each_part():
    spans = answer_spans(ANSWER)
    text = {part: [ANSWER[a:b] for a, b in ranges] for part, ranges in spans.items()}
    # each with the space before it (where a split tokenizer may decide the word)
    assert text["quote"] == [" From 00:20.0 to 00:22.0 a green circle appears in the top right corner."]
    assert text["value"] == [" Top right"]
    assert text["options"] == [" Bottom left", " Top right"]
    assert text["values"] == [" Top right", " Top right"]
    assert text["verdicts"] == [" different", " same"]
    assert text["letter"] == [" B"]
    assert text["chain"] == [ANSWER[ANSWER.index(" Top right. Checking"):-1]]


def test_answer_spans_refuse_an_answer_in_another_layout():
    with pytest.raises(ValueError, match="not a multiple-choice reading answer"):
        answer_spans("The notes say: nothing. So the answer is Red.")


@pytest.fixture(scope="module")
def rendered(tiny_processor):
    """A held-out reading row's answer and the offsets of its trained tokens, encoded as SFT
    encodes it (the answer, then its `<|im_end|>`)."""
    from paravt_core.miniature.forced import token_offsets
    from paravt_core.sft.encode import IGNORE_INDEX, encode_conversation

    row = probe_rows(load_config(REPRODUCE, []), 1)[0]
    sample = encode_conversation(row["messages"], tiny_processor, None, None)
    trained = sample.input_ids[sample.labels != IGNORE_INDEX].tolist()
    text, offsets = token_offsets(tiny_processor.tokenizer, trained)
    answer = row["messages"][1]["content"][0]["text"]
    assert text == answer + "<|im_end|>"
    return answer, offsets


def _token_at(offsets, char: int) -> int:
    return next(i for i, (a, b) in enumerate(offsets) if a <= char < b)


def test_score_row_fails_exactly_the_parts_a_wrong_token_belongs_to(rendered):
    answer, offsets = rendered
    spans = answer_spans(answer)
    assert score_row([True] * len(offsets), offsets, spans) == dict.fromkeys(PARTS, True)
    cases = {"letter": {"letter", "chain"}, "value": {"value", "chain"}, "quote": {"quote"},
             "verdicts": {"verdicts", "chain"}, "options": {"options", "chain"}, "values": {"values", "chain"}}
    for part, failed in cases.items():
        correct = [True] * len(offsets)
        correct[_token_at(offsets, spans[part][-1][0])] = False
        scores = score_row(correct, offsets, spans)
        assert {p for p, ok in scores.items() if not ok} == failed, part
    # a wrong token after the answer (its <|im_end|>) fails nothing
    correct = [True] * len(offsets)
    correct[-1] = False
    assert all(score_row(correct, offsets, spans).values())


def test_a_bare_space_before_a_split_word_counts_for_that_word():
    # "...A. Red vs Red: same." with " same" split as " ", "s", "ame": the bare space decides
    answer = ("The notes say: A red star. So the answer is Red. Checking the options: A. Red vs Red: same. "
              "So the answer is option A.")
    spans = answer_spans(answer)
    yes = answer.index(" same")
    offsets = [(0, yes), (yes, yes + 1), (yes + 1, yes + 2), (yes + 2, yes + 5), (yes + 5, len(answer))]
    scores = score_row([True, False, True, True, True], offsets, {"verdicts": spans["verdicts"]})
    assert scores == {"verdicts": False}
    assert score_row([True] * 5, offsets, {"verdicts": spans["verdicts"]}) == {"verdicts": True}


def test_probe_rows_are_multiple_choice_and_not_the_training_rows():
    from paravt_core.data.synth.world import derived_rng, sample_video, youtube_like_id
    from paravt_core.miniature.pretrain import reading_row

    cfg = load_config(REPRODUCE, [])
    probe = probe_rows(cfg, 20)
    assert len(probe) == 20 and all("Checking the options" in r["messages"][1]["content"][0]["text"] for r in probe)
    synth = cfg.data.synth
    train = []
    for index in range(50):  # the reading phase's own stream (pretrain.build_reading_corpus)
        rng = derived_rng(synth.seed, "pretrain-reading", cfg.model.pretrain.seed, index)
        train.append(reading_row(rng, sample_video(rng, synth, youtube_like_id(rng)), int(synth.max_crop_s),
                                 tuple(synth.question_topics)))
    questions = {r["messages"][0]["content"][0]["text"] for r in train}
    assert not questions & {r["messages"][0]["content"][0]["text"] for r in probe}


def test_padded_rows_move_the_options_back_by_whole_empty_notes_and_keep_the_checks():
    cfg = load_config(REPRODUCE, [])
    plain, shifted = probe_rows(cfg, 10), probe_rows(cfg, 10, pad=2)
    for row, far in zip(plain, shifted, strict=True):
        assert far["messages"][0] == row["messages"][0]  # same notes, same question
        answer, longer = row["messages"][1]["content"][0]["text"], far["messages"][1]["content"][0]["text"]
        empty = next(line.split(": ", 1)[1] for line in row["messages"][0]["content"][0]["text"].splitlines()
                     if ": Nothing notable" in line)
        assert longer == answer.replace("The notes say: ", f"The notes say: {empty} {empty} ", 1)
        assert answer_spans(longer).keys() == answer_spans(answer).keys()
        assert answer_spans(longer)["letter"][0][0] - answer_spans(answer)["letter"][0][0] == 2 * (len(empty) + 1)
    notes_only = {"messages": [{"role": "user", "content": [{"type": "text", "text": "00:00.0 to 00:16.0: From ..."}]},
                               {"role": "assistant", "content": [{"type": "text", "text": "The notes say: x"}]}]}
    assert padded(notes_only, 1) is None  # no empty window to repeat
    with pytest.raises(ValueError, match="pad must be 0 or more"):
        padded(plain[0], -1)


def test_reading_probe_scores_a_model_folder(tiny_model_dir):
    report = reading_probe(tiny_model_dir, load_config(REPRODUCE, []), rows=3)
    assert report.rows == 3
    assert set(report.as_metrics()) == {f"reading_{p}" for p in PARTS}
    # a random-weight model copies nothing whole
    assert report.chain == 0.0 and report.quote == 0.0
