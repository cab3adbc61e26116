"""The teacher-forced caption probe (#15): the scored words of a caption and the probe itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from paravt_core.config import load_config
from paravt_core.miniature.caption_probe import caption_probe, caption_spans
from paravt_core.miniature.forced import token_offsets

REPO = Path(__file__).resolve().parents[2]
REPRODUCE = REPO / "conf" / "pipeline" / "reproduce.yaml"
CAPTION = ("From 00:03.0 to 00:05.5 a red circle appears in the top left corner. "
           "From 00:09.0 to 00:11.0 an orange star appears in the centre.")


def test_caption_spans_name_each_events_words_with_the_space_before_them():
    events, first_word = caption_spans(CAPTION)
    assert first_word is None
    words = [{part: [CAPTION[a:b] for a, b in ranges] for part, ranges in e.items()} for e in events]
    assert words == [
        {"times": ["00:03.0", "00:05.5"], "colour": [" red"], "shape": [" circle"], "place": [" the top left corner"]},
        {"times": ["00:09.0", "00:11.0"], "colour": [" orange"], "shape": [" star"], "place": [" the centre"]},
    ]


def test_an_empty_window_is_scored_on_its_first_word():
    events, first_word = caption_spans("Nothing notable happens in this window: only the plain grey background is visible.")
    assert events == [] and first_word == (0, len("Nothing"))


@pytest.mark.parametrize("caption", [
    "A red circle appears.",  # not the summary wording
    CAPTION + " Then it is gone.",  # a sentence the probe would silently not score
])
def test_caption_spans_refuse_other_wording(caption: str):
    with pytest.raises(ValueError, match="not a caption of shape events"):
        caption_spans(caption)


def test_token_offsets_cover_the_decoded_text(tiny_processor):
    ids = tiny_processor.tokenizer(CAPTION, add_special_tokens=False)["input_ids"]
    text, offsets = token_offsets(tiny_processor.tokenizer, ids)
    assert text == CAPTION
    assert offsets[0][0] == 0 and offsets[-1][1] == len(CAPTION)
    assert all(a[1] == b[0] for a, b in zip(offsets, offsets[1:], strict=False))


def test_caption_probe_scores_a_model_folder(tiny_model_dir):
    report = caption_probe(tiny_model_dir, load_config(REPRODUCE, []), videos=2)
    assert report.windows >= 2 * 3 and report.events >= 2  # 36-46 s videos: three 16 s segments each
    assert set(report.as_metrics()) == {"caption_colour", "caption_shape", "caption_place", "caption_times",
                                        "caption_empty", "caption_detected"}
    # a random-weight model writes no caption word whole
    assert report.times == 0.0 and report.place == 0.0


def test_caption_probe_refuses_worlds_of_other_event_kinds(tiny_model_dir):
    cfg = load_config(REPRODUCE, ["data.synth.event_kinds=[shape,digit]"])
    with pytest.raises(ValueError, match="shape events only"):
        caption_probe(tiny_model_dir, cfg, videos=1)
    # a world of every kind (the embedded default's: event_kinds unset) is refused the same way
    with pytest.raises(ValueError, match="shape events only.*every kind"):
        caption_probe(tiny_model_dir, load_config(REPO / "conf/pipeline/tiny.yaml"), videos=1)


def test_detected_scores_the_first_word_of_windows_with_an_event(tiny_model_dir, tiny_processor, oracle_model,
                                                                 monkeypatch):
    """A model that never writes "From" still scores every empty window and, teacher-forced,
    every colour, but detects no event: the sub-agent's greedy summary would say "Nothing"."""
    import paravt_core.model.loading as loading

    vocab = len(tiny_processor.tokenizer)
    cfg = load_config(REPRODUCE, [])
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: oracle_model(vocab))
    right = caption_probe(tiny_model_dir, cfg, videos=3)
    assert (right.colour, right.empty, right.detected) == (1.0, 1.0, 1.0)
    start = tiny_processor.tokenizer("From 00:03.0", add_special_tokens=False)["input_ids"][0]
    assert "From".startswith(tiny_processor.tokenizer.decode([start]))  # "F": the word is two tokens here
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: oracle_model(vocab, miss=start))
    blind = caption_probe(tiny_model_dir, cfg, videos=3)
    assert (blind.colour, blind.empty, blind.detected) == (1.0, 1.0, 0.0)
