"""Questions about the generated world, answerable only from the frames that show them.

Event questions (colour, shape, place, digit, direction, and "when") can be answered only
from the event's frames, which the overview usually misses; background questions (tint,
brighter side) can be answered from any frame and back the no-tool SFT traces.

Answers follow the reward's conventions (SPEC §4.2): an MCQ answer is one option letter,
a grounding (tvg) answer is "[start, end]" in seconds, an open-ended (oe) answer is a
short phrase.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Literal

from paravt_core.data.synth.vocab import EVENT_TOPICS
from paravt_core.data.synth.world import (
    BRIGHT_SIDES,
    COLOURS,
    DIGIT_WORDS,
    DIRECTION_OPTIONS,
    POSITIONS,
    SHAPES,
    TINTS,
    Event,
    VideoSpec,
)

QuestionType = Literal["mcq", "tvg", "oe"]
QUESTION_TYPES: tuple[QuestionType, ...] = ("mcq", "tvg", "oe")

# The values each topic's answer is drawn from; MCQ distractors come from the same list.
TOPIC_VALUES: dict[str, tuple[str, ...]] = {
    "colour": tuple(sorted(COLOURS)),
    "shape": SHAPES,
    "position": POSITIONS,
    "digit": DIGIT_WORDS,
    "direction": DIRECTION_OPTIONS,
    "tint": tuple(sorted(TINTS)),
    "side": BRIGHT_SIDES,
}
# Which topics each event kind supports, and which question types each topic allows.
BACKGROUND_TOPICS = ("tint", "side")
TOPIC_TYPES: dict[str, tuple[QuestionType, ...]] = {
    "colour": ("mcq", "oe"),
    "shape": ("mcq", "oe"),
    "position": ("mcq",),
    "digit": ("mcq", "oe"),
    "direction": ("mcq",),
    "when": ("tvg",),
    "tint": ("mcq", "oe"),
    "side": ("mcq",),
}


@dataclass(frozen=True)
class OptionStyle:
    """How a world's multiple-choice options are drawn (`SynthConfig.colours`, `option_order`).

    `colours`: the palette colour questions choose from (the world's events are drawn in it).
    `canonical`: options listed in their topic's fixed order instead of shuffled; with as many
    values as options (a 4-colour palette, 4 options) every question then lists the same
    options in the same order, and the letter is a function of the value: no reading of the
    options is needed to name it (#15: the tiny model never learnt to look an option up).
    `second_wording`: the share of event questions asked in their second wording
    (`second_wording_text`, `SynthConfig.second_wording`); 0 draws nothing, so a world without
    it keeps its draws.
    """

    colours: tuple[str, ...] = tuple(sorted(COLOURS))
    canonical: bool = False
    second_wording: float = 0.0

    @classmethod
    def of(cls, cfg) -> OptionStyle:
        """The style of a `SynthConfig`."""
        palette = tuple(sorted(cfg.colours)) if cfg.colours else tuple(sorted(COLOURS))
        return cls(colours=palette, canonical=cfg.option_order == "canonical",
                   second_wording=cfg.second_wording)

    def values(self, topic: str) -> tuple[str, ...]:
        """The values `topic`'s answers and distractors are drawn from, in their fixed order."""
        return self.colours if topic == "colour" else TOPIC_VALUES[topic]


SHUFFLED = OptionStyle()


@dataclass(frozen=True)
class Question:
    """One question with its ground truth.

    `answer` is what the scorer compares with (letter, "[s, e]" or phrase); `answer_text`
    is the value in words, used by teacher reasoning and benchmark rationales.
    """

    video_id: str
    qtype: QuestionType
    topic: str
    text: str
    answer: str
    answer_text: str
    options: tuple[str, ...] = ()
    event_index: int | None = None
    window: tuple[float, float] | None = None
    wording: int = 0  # 1: asked in the second wording (SECOND_WORDING)

    @property
    def letters(self) -> tuple[str, ...]:
        return tuple(string.ascii_uppercase[: len(self.options)])


def option_text(value: str) -> str:
    """How an answer value reads as an option: "top left" -> "Top left"."""
    return value[:1].upper() + value[1:]


def asked_object(event: Event, topic: str) -> str:
    """How a question on `topic` names its event: never by the asked value ("the star" when its
    colour is asked, "the red object" when its shape is). Questions and the direct-mode traces
    that must not leak the answer (`traces.direct_trace`) both name it so."""
    if event.kind == "digit":
        return f"the digit {DIGIT_WORDS[event.digit]}" if topic == "when" else "the digit"
    if topic == "colour":
        return f"the {event.shape}"
    if topic == "shape":
        return f"the {event.colour} object"
    return f"the {event.label}"


# Question templates per event kind and topic; {obj} is `asked_object`.
QUESTION_TEMPLATES: dict[str, dict[str, str]] = {
    "digit": {
        "digit": "Which digit was shown in the video?",
        "colour": "What colour was {obj} shown in the video?",
        "when": "When is {obj} shown?",
    },
    "shape": {
        "colour": "What colour was {obj} that appeared in the video?",
        "shape": "What shape was {obj} that appeared in the video?",
        "position": "Where in the frame did {obj} appear?",
        "when": "When does {obj} appear?",
    },
    "motion": {
        "colour": "What colour was {obj} that moved across the frame?",
        "shape": "What shape was {obj} that moved across the frame?",
        "direction": "In which direction did {obj} move across the frame?",
        "when": "When does {obj} move across the frame?",
    },
}


# The second wording of every event question (`SynthConfig.second_wording`): the same
# question, asked as a benchmark with several annotators would, so that a world can hold a
# wording its cold-start teacher seldom looked for (`SynthConfig.second_wording_look`).
SECOND_NOUNS = {"colour": "colour", "shape": "shape", "position": "position in the frame", "direction": "direction"}


def second_wording_text(event: Event, topic: str) -> str:
    """"What is the colour of the star in this video?" (topic `when`: "At what time is ... in
    this video?"; topic `digit`: "What is the digit in this video?")."""
    obj = asked_object(event, topic)
    if topic == "when":
        return f"At what time is {obj} in this video?"
    if topic == "digit":
        return "What is the digit in this video?"
    return f"What is the {SECOND_NOUNS[topic]} of {obj} in this video?"


def _event_question_text(event: Event, topic: str, wording: int = 0) -> str:
    if wording:
        return second_wording_text(event, topic)
    return QUESTION_TEMPLATES[event.kind][topic].format(obj=asked_object(event, topic))


def _event_value(event: Event, topic: str) -> str:
    values = {
        "colour": event.colour,
        "shape": event.shape,
        "position": event.position,
        "digit": DIGIT_WORDS[event.digit] if event.digit is not None else None,
        "direction": event.direction,
    }
    return values[topic]


def _answer(
    rng: random.Random, topic: str, value: str, qtype: QuestionType, n_options: int, style: OptionStyle = SHUFFLED
) -> dict:
    """The answer fields of a question: options and letter for MCQ, the phrase for oe."""
    if qtype == "oe":
        return {"answer": value, "answer_text": value}
    order = style.values(topic)
    if value not in order:
        raise ValueError(f"{topic} {value!r} is not among the world's values {list(order)}")
    pool = [v for v in order if v != value]
    if len(pool) + 1 < n_options:
        raise ValueError(f"topic {topic!r} has only {len(pool) + 1} values, cannot make {n_options} options")
    values = [value, *rng.sample(pool, n_options - 1)]
    rng.shuffle(values)
    if style.canonical:
        values.sort(key=order.index)
    letter = string.ascii_uppercase[values.index(value)]
    return {"answer": letter, "answer_text": value, "options": tuple(option_text(v) for v in values)}


def event_question(
    rng: random.Random,
    spec: VideoSpec,
    event_index: int,
    qtype: QuestionType,
    n_options: int = 4,
    topic: str | None = None,
    style: OptionStyle = SHUFFLED,
) -> Question:
    """A question of type `qtype` about one event; the topic is drawn if not given."""
    event = spec.events[event_index]
    if topic is None:
        topic = rng.choice([t for t in EVENT_TOPICS[event.kind] if qtype in TOPIC_TYPES[t]])
    if qtype not in TOPIC_TYPES[topic] or topic not in EVENT_TOPICS[event.kind]:
        raise ValueError(f"no {qtype} question on topic {topic!r} for a {event.kind} event")
    wording = int(rng.random() < style.second_wording) if style.second_wording > 0 else 0
    common = dict(video_id=spec.video_id, qtype=qtype, topic=topic, event_index=event_index, wording=wording)
    text = _event_question_text(event, topic, wording)
    if qtype == "tvg":
        window = (event.start_s, event.end_s)
        answer = f"[{window[0]:.1f}, {window[1]:.1f}]"
        return Question(**common, text=text, answer=answer, answer_text=answer, window=window)
    return Question(**common, text=text, **_answer(rng, topic, _event_value(event, topic), qtype, n_options, style))


def background_question(
    rng: random.Random, spec: VideoSpec, qtype: QuestionType, n_options: int = 4, style: OptionStyle = SHUFFLED
) -> Question:
    """A question about the constant background: any overview frame answers it."""
    topic = rng.choice([t for t in BACKGROUND_TOPICS if qtype in TOPIC_TYPES[t]])
    if topic == "tint":
        text, value = "What colour tint does the background of this video have?", spec.background.tint
    else:
        text, value = "Which side of the background is brighter?", spec.background.bright_side
    fields = _answer(rng, topic, value, qtype, n_options, style)
    return Question(video_id=spec.video_id, qtype=qtype, topic=topic, text=text, **fields)


def random_event_question(
    rng: random.Random,
    spec: VideoSpec,
    n_options: int = 4,
    topics: tuple[str, ...] | None = None,
    style: OptionStyle = SHUFFLED,
) -> Question:
    """A question on a random event, with the type drawn uniformly from mcq / tvg / oe.

    With `topics` (`SynthConfig.question_topics`), the (event, topic) pair is drawn among
    the allowed ones, then the type among that topic's types.
    """
    if topics is None:
        return event_question(
            rng, spec, rng.randrange(len(spec.events)), rng.choice(QUESTION_TYPES), n_options, style=style
        )
    pairs = [(i, t) for i, e in enumerate(spec.events) for t in EVENT_TOPICS[e.kind] if t in topics]
    if not pairs:
        raise ValueError(f"video {spec.video_id}: no event supports a question on {list(topics)}")
    index, topic = rng.choice(pairs)
    return event_question(rng, spec, index, rng.choice(TOPIC_TYPES[topic]), n_options, topic=topic, style=style)
