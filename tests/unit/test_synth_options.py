"""The world's option knobs (#15): a colour palette (`SynthConfig.colours`) and options listed in
their topic's fixed order (`option_order: canonical`), so that with four colours the letter is a
function of the value."""

from __future__ import annotations

import json
import random
import string

import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from paravt_core.data.synth import PARQUET_REPO, SynthConfig, generate_world
from paravt_core.data.synth.benchmarks import build_eval_split
from paravt_core.data.synth.paravt import RL_FILE
from paravt_core.data.synth.questions import (
    SHUFFLED,
    TOPIC_VALUES,
    OptionStyle,
    background_question,
    event_question,
    option_text,
)
from paravt_core.data.synth.world import COLOURS, sample_video

FOUR = ("blue", "green", "red", "yellow")
KNOBS = SynthConfig(
    seed=5,
    train_videos=6,
    eval_videos_per_split=4,
    eval_rows_per_split=4,
    min_duration_s=34,
    max_duration_s=46,
    width=64,
    height=64,
    sft_traces_per_video=3,
    rl_prompts_per_video=2,
    max_calls_per_trace=3,
    teacher_windows="cover",
    event_kinds=("shape",),
    max_events=1,
    question_topics=("colour",),
    prompts="eval",
    colours=("yellow", "red", "green", "blue"),  # any order: the style sorts them
    option_order="canonical",
)
CANONICAL = tuple(option_text(c) for c in FOUR)


def test_style_of_a_config():
    assert OptionStyle.of(SynthConfig()) == SHUFFLED
    assert SHUFFLED.colours == tuple(sorted(COLOURS))
    style = OptionStyle.of(KNOBS)
    assert style == OptionStyle(colours=FOUR, canonical=True)
    assert style.values("colour") == FOUR
    assert style.values("position") == TOPIC_VALUES["position"]


@pytest.mark.parametrize(
    ("colours", "message"),
    [(("red", "green", "blue"), "at least 4"), (("red", "green", "blue", "pink"), "pink"),
     (("red", "green", "blue", "red"), "distinct")],
)
def test_a_palette_needs_four_distinct_known_colours(colours, message):
    with pytest.raises(ValidationError, match=message):
        SynthConfig(colours=colours)


def test_events_are_drawn_in_the_palette():
    cfg = SynthConfig(colours=FOUR, max_events=3)
    rng = random.Random(0)
    drawn = {e.colour for i in range(60) for e in sample_video(rng, cfg, f"v{i}").events}
    assert drawn == set(FOUR)


def test_canonical_four_colour_options_are_always_the_same_and_the_letter_follows_the_value():
    style = OptionStyle.of(KNOBS)
    rng = random.Random(1)
    seen = set()
    for i in range(40):
        spec = sample_video(rng, KNOBS, f"v{i}")
        question = event_question(rng, spec, 0, "mcq", topic="colour", style=style)
        assert question.options == CANONICAL
        assert question.answer == string.ascii_uppercase[FOUR.index(spec.events[0].colour)]
        seen.add(question.answer)
    assert seen == set("ABCD")


def test_canonical_order_keeps_the_topics_order_when_options_are_a_subset():
    style = OptionStyle(canonical=True)  # seven colours, four options: which four varies
    rng = random.Random(2)
    lists = set()
    for i in range(30):
        spec = sample_video(rng, SynthConfig(), f"v{i}")
        for index, event in enumerate(spec.events):
            question = event_question(rng, spec, index, "mcq", topic="colour", style=style)
            order = [style.values("colour").index(o.lower()) for o in question.options]
            assert order == sorted(order)
            assert question.options[string.ascii_uppercase.index(question.answer)].lower() == event.colour
            lists.add(question.options)
    assert len(lists) > 1
    tint = background_question(random.Random(3), spec, "mcq", style=style)
    assert [TOPIC_VALUES[tint.topic].index(o.lower()) for o in tint.options] == sorted(
        TOPIC_VALUES[tint.topic].index(o.lower()) for o in tint.options
    )


def test_shuffled_options_still_vary_in_order():
    rng = random.Random(4)
    spec = sample_video(rng, KNOBS, "v")
    orders = {event_question(rng, spec, 0, "mcq", topic="colour", style=OptionStyle(colours=FOUR)).options
              for _ in range(20)}
    assert len(orders) > 1 and all(sorted(o) == sorted(CANONICAL) for o in orders)


def test_a_value_outside_the_palette_is_an_error():
    spec = sample_video(random.Random(5), SynthConfig(colours=("cyan", "orange", "purple", "red")), "v")
    with pytest.raises(ValueError, match="not among the world's values"):
        event_question(random.Random(0), spec, 0, "mcq", topic="colour", style=OptionStyle(colours=FOUR))


def test_eval_splits_fit_a_four_colour_palette():
    videomme = build_eval_split(KNOBS, "videomme")
    assert {q.options for q in videomme.questions} == {CANONICAL}
    longvideobench = build_eval_split(KNOBS, "longvideobench")  # 4 or 5 options: 4 here
    assert {q.options for q in longvideobench.questions} == {CANONICAL}
    mmvu = build_eval_split(KNOBS, "mmvu")  # its multiple-choice rows have five choices
    assert {q.qtype for q in mmvu.questions} == {"oe"}
    assert {q.answer for q in mmvu.questions} <= set(FOUR)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return generate_world(KNOBS, tmp_path_factory.mktemp("options"), progress=False)


def _text(message: dict) -> str:
    return "".join(item["text"] for item in message["content"] if item["type"] == "text")


def test_sft_and_rl_rows_list_the_canonical_options(world):
    """Every event colour question of the SFT and RL rows lists the same four options."""
    block = "Options:\nA. Blue\nB. Green\nC. Red\nD. Yellow\n"
    repo = world.repos[PARQUET_REPO]
    sft = [row for path in repo.files if path.startswith("sft/")
           for row in pq.read_table(repo.folder / path).to_pylist()]
    asked = [_text(m) for row in sft for m in row["messages"] if m["role"] == "user"]
    listed = [text for text in asked if "Options:" in text and "What colour was" in text]
    assert listed and all(block in text for text in listed)
    rl = pq.read_table(repo.folder / RL_FILE).to_pylist()
    prompts = [m["content"] for row in rl for m in row["prompt"] if m["role"] == "user"]
    listed = [text for text in prompts if "Options:" in text and "What colour was" in text]
    assert listed and all(block in text for text in listed)
