"""The tiny tokenizer spells the generated world's words as Qwen3-VL does: one token each,
with its leading space, in lower case and capitalised (`model.tiny.WORLD_WORDS`)."""

from __future__ import annotations

from paravt_core.data.synth.questions import option_text
from paravt_core.data.synth.world import COLOURS, DIGIT_WORDS, DIRECTION_OPTIONS, POSITIONS, SHAPES
from paravt_core.model.tiny import WORLD_WORDS


def world_words() -> set[str]:
    values = [*COLOURS, *SHAPES, *POSITIONS, *DIGIT_WORDS, *DIRECTION_OPTIONS, "yes", "no", "vs", "same", "different"]
    return {word for value in values for word in value.split()}


def test_every_world_word_is_in_the_tokenizer_corpus():
    assert world_words() <= set(WORLD_WORDS), sorted(world_words() - set(WORLD_WORDS))


def test_world_words_are_one_token_each_in_both_cases(tiny_processor):
    tok = tiny_processor.tokenizer
    split = {}
    for word in sorted(world_words()):
        for form in (word, word.capitalize()):
            ids = tok(f" {form}", add_special_tokens=False)["input_ids"]
            if len(ids) != 1:
                split[form] = [tok.decode([i]) for i in ids]
    assert not split, split


def test_an_option_check_line_is_word_tokens(tiny_processor):
    tok = tiny_processor.tokenizer
    line = f"A. {option_text('top left')} vs {option_text('purple')}: different. B. {option_text('purple')}, yes."
    pieces = [tok.decode([i]) for i in tok(line, add_special_tokens=False)["input_ids"]]
    assert pieces == ["A", ".", " Top", " left", " vs", " Purple", ":", " different", ".", " B", ".", " Purple", ",",
                      " yes", "."], pieces
