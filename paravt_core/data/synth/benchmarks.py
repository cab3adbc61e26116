"""The seven evaluation splits of SPEC §7, as rows in the real datasets' field layouts.

Each split gets its own held-out videos (none of them is a training video), named the way
the dataset names its files, and a few questions about their events, laid out exactly
as the real annotation rows (field names, types and conventions checked against the real
rows in `shared/benchmarks/`), in the real repos' layouts: the evaluation owns those
(`paravt_core.eval.splits`, one record per split) and this module writes what they say.

LongVideoBench's videos come as a tar split into parts, as the real repo ships them. MLVU's
real repo keeps videos in per-task folders (`1_plotQA/<video_name>`); the mirror puts them
directly under `video/`, and the loader accepts both.
Categorical fields that describe real content (Video-MME `domain`, LVBench `type`,
LongVideoBench `topic_category`, MMVU `subject`) carry honest synthetic values;
LongVideoBench subtitle files are not generated (SPEC §7 uses subtitles only for
videomme_wsub).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from paravt_core.data.synth.config import SynthConfig
from paravt_core.data.synth.questions import EVENT_TOPICS, SHUFFLED, OptionStyle, Question, event_question
from paravt_core.data.synth.traces import background_phrase, describe_event, indefinite, place_phrase
from paravt_core.data.synth.world import (
    DIGIT_WORDS,
    Event,
    VideoSpec,
    charades_like_id,
    derived_rng,
    sample_video,
    youtube_like_id,
)
from paravt_core.eval.splits import EVAL_SPLITS, LAYOUTS, SPLITS, VALIDATION_SPLITS, BenchmarkLayout

# The miniature's validation split (`SynthConfig.validation`).
VALIDATION_SPLIT = VALIDATION_SPLITS[0]
# Splits with their own videos and rows; videomme_wsub reuses videomme's.
GENERATED_SPLITS = tuple(s for s in EVAL_SPLITS if SPLITS[s].videos_of is None)
MCQ_TOPICS = ("colour", "shape", "position", "digit", "direction")
MMVU_URL = "https://huggingface.co/datasets/yale-nlp/MMVU/resolve/main/"

VIDEOMME_TASK_TYPE = {
    "colour": "Attribute Perception",
    "shape": "Object Recognition",
    "position": "Spatial Perception",
    "digit": "OCR Problems",
    "direction": "Action Recognition",
}
LVB_CATEGORY = {"colour": "S2A", "shape": "S2O", "position": "S2O", "digit": "S2O", "direction": "S2E"}
LVBENCH_TYPE = {
    "colour": "entity recognition",
    "shape": "entity recognition",
    "position": "entity recognition",
    "digit": "key information retrieval",
    "direction": "event understanding",
}
KIND_CATEGORY = {"shape": "Shapes", "digit": "Digits", "motion": "Motion"}
MMVU_SUBJECT = {"shape": "Geometry", "digit": "Arithmetic", "motion": "Kinematics"}
LVB_DURATION_GROUPS = (15, 60, 600, 3600)

SCHEMAS: dict[str, pa.Schema] = {
    "videomme": pa.schema(
        [(n, pa.string()) for n in ("video_id", "duration", "domain", "sub_category", "url", "videoID")]
        + [(n, pa.string()) for n in ("question_id", "task_type", "question")]
        + [("options", pa.list_(pa.string())), ("answer", pa.string())]
    ),
    "longvideobench": pa.schema(
        [(n, pa.string()) for n in ("video_id", "id", "video_path", "subtitle_path")]
        + [("correct_choice", pa.int64()), ("question", pa.string())]
        + [(f"option{i}", pa.string()) for i in range(5)]
        + [("duration", pa.float64()), ("duration_group", pa.int64())]
        + [("question_category", pa.string()), ("topic_category", pa.string())]
        + [("starting_timestamp_for_subtitles", pa.float64())]
    ),
    "lvbench": pa.schema(
        [(n, pa.string()) for n in ("key", "type", "uid", "question", "answer")]
        + [("question_type", pa.list_(pa.string())), ("time_reference", pa.string())]
    ),
    "mlvu": pa.schema(
        [("video_name", pa.string()), ("duration", pa.float64()), ("question", pa.string())]
        + [("candidates", pa.list_(pa.string()))]
        + [(n, pa.string()) for n in ("answer", "task_type", "question_id")]
    ),
    "mmvu": pa.schema(
        [(n, pa.string()) for n in ("id", "video", "youtube_url", "question_type")]
        + [
            (
                "metadata",
                pa.struct(
                    [
                        ("subject", pa.string()),
                        ("textbook", pa.string()),
                        ("knowledge", pa.list_(pa.string())),
                        ("rationale", pa.string()),
                    ]
                ),
            ),
            ("question", pa.string()),
            ("choices", pa.struct([(letter, pa.string()) for letter in "ABCDE"])),
            ("answer", pa.string()),
        ]
    ),
    "charades": pa.schema(
        [("video", pa.string()), ("caption", pa.string()), ("timestamp", pa.list_(pa.float16()))]
    ),
}
SCHEMAS[VALIDATION_SPLIT] = SCHEMAS["videomme"]


@dataclass(frozen=True)
class EvalVideo:
    """A held-out video: its world spec, its path relative to the layout's `video_dir`
    (the path its rows name) and the dataset-specific identifiers its rows carry."""

    spec: VideoSpec
    file_name: str
    ids: dict = field(default_factory=dict)


@dataclass(frozen=True)
class EvalSplit:
    """The rows of one split, with the videos they point at and the questions behind them."""

    layout: BenchmarkLayout
    rows: list[dict]
    videos: list[EvalVideo]
    questions: list[Question]


# ----- video naming ---------------------------------------------------------------


def _videomme_duration(cfg: SynthConfig, duration: float) -> str:
    """Video-MME's short / medium / long, by thirds of the configured duration range."""
    third = (cfg.max_duration_s - cfg.min_duration_s) / 3
    if duration < cfg.min_duration_s + third:
        return "short"
    return "medium" if duration < cfg.min_duration_s + 2 * third else "long"


def name_video(
    split: str, rng: random.Random, index: int, spec: VideoSpec, cfg: SynthConfig, subject_counts: dict[str, int]
) -> EvalVideo:
    """The file name and ids a dataset would give this video."""
    if split in ("videomme", VALIDATION_SPLIT):
        yt = youtube_like_id(rng)
        ids = {"video_id": f"{index + 1:03d}", "videoID": yt, "duration": _videomme_duration(cfg, spec.duration_s)}
        return EvalVideo(spec, f"{yt}.mp4", ids)
    if split in ("longvideobench", "lvbench"):
        yt = youtube_like_id(rng)
        return EvalVideo(spec, f"{yt}.mp4", {"video_id": yt})
    if split == "mlvu":
        name = f"needle_{index + 1}.mp4"
        return EvalVideo(spec, name, {"video_name": name})
    if split == "mmvu":
        subject = MMVU_SUBJECT[spec.events[0].kind]
        number = subject_counts.get(subject, 0)
        subject_counts[subject] = number + 1
        folder = subject.replace(" ", "_")
        return EvalVideo(spec, f"videos/{folder}/{number}.mp4", {"subject": subject, "youtube": youtube_like_id(rng)})
    if split == "charades":
        name = f"{charades_like_id(rng)}.mp4"
        return EvalVideo(spec, name, {"video": name})
    raise ValueError(f"unknown evaluation split {split!r}; expected one of {', '.join(GENERATED_SPLITS)}")


def split_videos(cfg: SynthConfig, split: str) -> list[EvalVideo]:
    """`eval_videos_per_split` fresh videos for one split, named as the dataset does."""
    subject_counts: dict[str, int] = {}
    videos = []
    for index in range(cfg.eval_videos_per_split):
        rng = derived_rng(cfg.seed, "eval", split, index)
        spec = sample_video(rng, cfg, f"{split}-{index:03d}")
        videos.append(name_video(split, rng, index, spec, cfg, subject_counts))
    return videos


# ----- question slots --------------------------------------------------------------


def question_slots(
    rng: random.Random, specs: Sequence[VideoSpec], count: int, topics: Sequence[str]
) -> list[tuple[int, int, str]]:
    """Up to `count` distinct (video, event, topic) triples, round-robin over the videos."""
    per_video = []
    for vi, spec in enumerate(specs):
        slots = [(vi, ei, t) for ei, e in enumerate(spec.events) for t in EVENT_TOPICS[e.kind] if t in topics]
        rng.shuffle(slots)
        per_video.append(slots)
    chosen: list[tuple[int, int, str]] = []
    while len(chosen) < count and any(per_video):
        for slots in per_video:
            if slots and len(chosen) < count:
                chosen.append(slots.pop())
    return chosen


# ----- rows per dataset -----------------------------------------------------------


def _event(video: EvalVideo, question: Question) -> Event:
    return video.spec.events[question.event_index]


def videomme_row(video: EvalVideo, question: Question, number: int, k: int) -> dict:
    video_id, yt = video.ids["video_id"], video.ids["videoID"]
    return {
        "video_id": video_id,
        "duration": video.ids["duration"],
        "domain": "Synthetic",
        "sub_category": KIND_CATEGORY[_event(video, question).kind],
        "url": f"https://www.youtube.com/watch?v={yt}",
        "videoID": yt,
        "question_id": f"{video_id}-{k}",
        "task_type": VIDEOMME_TASK_TYPE[question.topic],
        "question": question.text,
        "options": [f"{letter}. {option}" for letter, option in zip(question.letters, question.options, strict=True)],
        "answer": question.answer,
    }


def longvideobench_row(video: EvalVideo, question: Question, number: int, k: int) -> dict:
    yt, duration = video.ids["video_id"], video.spec.duration_s
    options = list(question.options) + ["N/A"] * (5 - len(question.options))
    return {
        "video_id": yt,
        "id": f"{yt}_{k - 1}",
        "video_path": f"{yt}.mp4",
        "subtitle_path": f"{yt}_en.json",
        "correct_choice": question.letters.index(question.answer),
        "question": question.text,
        **{f"option{i}": option for i, option in enumerate(options)},
        "duration": round(duration, 2),
        "duration_group": next(g for g in LVB_DURATION_GROUPS if duration <= g),
        "question_category": LVB_CATEGORY[question.topic],
        "topic_category": "SY-Synthetic-World",
        "starting_timestamp_for_subtitles": 0.0,
    }


def _mmss(seconds: int) -> str:
    return f"{seconds // 60:02d}:{seconds % 60:02d}"


def _lettered_lines(question: Question) -> str:
    return "\n".join(f"({letter}) {option}" for letter, option in zip(question.letters, question.options, strict=True))


def lvbench_row(video: EvalVideo, question: Question, number: int, k: int) -> dict:
    event = _event(video, question)
    return {
        "key": video.ids["video_id"],
        "type": "synthetic",
        "uid": str(number),
        "question": f"{question.text}\n{_lettered_lines(question)}",
        "answer": question.answer,
        "question_type": [LVBENCH_TYPE[question.topic]],
        "time_reference": f"{_mmss(math.floor(event.start_s))}-{_mmss(math.ceil(event.end_s))}",
    }


def mlvu_row(video: EvalVideo, question: Question, number: int, k: int) -> dict:
    return {
        "video_name": video.ids["video_name"],
        "duration": float(round(video.spec.duration_s)),
        "question": f"{question.text}\n{_lettered_lines(question)}\n",
        "candidates": list(question.options),
        "answer": question.answer,
        "task_type": "findNeedle",
        "question_id": f"Q{number}",
    }


def mmvu_row(video: EvalVideo, question: Question, number: int, k: int) -> dict:
    event = _event(video, question)
    evidence = describe_event(event, event.start_s, event.end_s)
    if question.qtype == "mcq":
        choices = dict(zip("ABCDE", question.options, strict=True))
        verdict = f"The answer is {question.answer_text}, option {question.answer}."
    else:
        choices = dict.fromkeys("ABCDE", "")
        verdict = f"The answer is {question.answer_text}."
    return {
        "id": f"validation_{number}",
        "video": MMVU_URL + video.file_name,
        "youtube_url": f"https://www.youtube.com/watch?v={video.ids['youtube']}",
        "question_type": "multiple-choice" if question.qtype == "mcq" else "open-ended",
        "metadata": {
            "subject": video.ids["subject"],
            "textbook": "paravt synthetic world",
            "knowledge": [],
            "rationale": f"{evidence} {verdict}",
        },
        "question": question.text,
        "choices": choices,
        "answer": question.answer,
    }


# Row builders take (video, question, number: the row's index in the split, k: 1-based
# count of this video's questions so far) and return one row in the dataset's layout.
ROW_BUILDERS: dict[str, Callable[[EvalVideo, Question, int, int], dict]] = {
    "videomme": videomme_row,
    VALIDATION_SPLIT: videomme_row,
    "longvideobench": longvideobench_row,
    "lvbench": lvbench_row,
    "mlvu": mlvu_row,
    "mmvu": mmvu_row,
}


# ----- Charades-STA ---------------------------------------------------------------


def charades_caption(event: Event, variant: int) -> str:
    """A lower-case sentence naming the event, like Charades-STA's "person turn a light on."."""
    if event.kind == "shape":
        place = place_phrase(event.position)
        options = (f"{indefinite(event.label)} appears in {place}.", f"the {event.label} shows up in {place}.")
    elif event.kind == "digit":
        word = DIGIT_WORDS[event.digit]
        options = (
            f"the digit {word} is shown in {event.colour}.",
            f"{indefinite(event.colour)} {word} appears on screen.",
        )
    else:
        options = (
            f"{indefinite(event.label)} moves from {event.direction}.",
            f"the {event.label} crosses the frame from {event.direction}.",
        )
    return options[variant]


def charades_split(cfg: SynthConfig, videos: list[EvalVideo]) -> EvalSplit:
    """Grounding rows: one or two captions per event, timestamps as float16 [start, end]."""
    rng = derived_rng(cfg.seed, "eval-questions", "charades")
    slots = question_slots(rng, [v.spec for v in videos], cfg.eval_rows_per_split, ("when",))
    # A second caption of an already-used event fills the split when events run out.
    slots += [(vi, ei, "when") for vi, ei, _ in slots][: cfg.eval_rows_per_split - len(slots)]
    rows, questions, seen = [], [], set()
    for vi, ei, _ in slots:
        video, event = videos[vi], videos[vi].spec.events[ei]
        question = event_question(rng, video.spec, ei, "tvg", topic="when")
        variant = int((vi, ei) in seen)
        seen.add((vi, ei))
        timestamp = np.array([event.start_s, event.end_s], dtype=np.float16).tolist()
        rows.append({"video": video.ids["video"], "caption": charades_caption(event, variant), "timestamp": timestamp})
        questions.append(question)
    return EvalSplit(LAYOUTS["charades"], rows, videos, questions)


# ----- the splits ----------------------------------------------------------------


def _split_question(
    rng: random.Random, split: str, spec: VideoSpec, event_index: int, topic: str, style: OptionStyle = SHUFFLED
) -> Question:
    """MCQ everywhere (4 options; LongVideoBench 4 or 5; MMVU 5), MMVU also open-ended.

    A topic with fewer values than the split's options (a 4-colour palette, `SynthConfig.colours`)
    gets 4 options on LongVideoBench and an open-ended question on MMVU, whose rows have five."""
    if split == "mmvu" and topic in ("colour", "shape", "digit") and rng.random() < 0.4:
        return event_question(rng, spec, event_index, "oe", topic=topic, style=style)
    n_options = {"mmvu": 5, "longvideobench": rng.choice((4, 5))}.get(split, 4)
    if n_options > len(style.values(topic)):
        if split == "mmvu":
            return event_question(rng, spec, event_index, "oe", topic=topic, style=style)
        n_options = len(style.values(topic))
    return event_question(rng, spec, event_index, "mcq", n_options=n_options, topic=topic, style=style)


def build_eval_split(cfg: SynthConfig, split: str) -> EvalSplit:
    """One generated split: fresh held-out videos and up to `eval_rows_per_split` rows."""
    videos = split_videos(cfg, split)
    if split == "charades":
        return charades_split(cfg, videos)
    rng = derived_rng(cfg.seed, "eval-questions", split)
    topics = MCQ_TOPICS if cfg.question_topics is None else tuple(t for t in MCQ_TOPICS if t in cfg.question_topics)
    slots = question_slots(rng, [v.spec for v in videos], cfg.eval_rows_per_split, topics)
    rows, questions, per_video = [], [], [0] * len(videos)
    for number, (vi, ei, topic) in enumerate(slots):
        question = _split_question(rng, split, videos[vi].spec, ei, topic, OptionStyle.of(cfg))
        per_video[vi] += 1
        rows.append(ROW_BUILDERS[split](videos[vi], question, number, per_video[vi]))
        questions.append(question)
    return EvalSplit(LAYOUTS[split], rows, videos, questions)


def _srt_time(seconds: float) -> str:
    millis = round(seconds * 1000)
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    return f"{hours:02d}:{minutes:02d}:{rest // 1000:02d},{rest % 1000:03d}"


def subtitles_srt(spec: VideoSpec) -> str:
    """Narration as SubRip: the background every ~10 s, and a cue at each event start.

    The cues say when something appears but not what, as real subtitles help locate a
    moment without giving the answer away.
    """
    cues = [(e.start_s, e.end_s, "Something appears on the screen now.") for e in spec.events]
    narration = f"The screen shows a plain {background_phrase(spec)} background."
    for start in np.arange(0.0, spec.duration_s - 1.0, 10.0).tolist():
        end = min(start + 4.0, spec.duration_s)
        if all(end <= s or start >= e for s, e, _ in cues):
            cues.append((start, end, narration))
    cues.sort()
    blocks = [f"{i}\n{_srt_time(s)} --> {_srt_time(e)}\n{text}\n" for i, (s, e, text) in enumerate(cues, start=1)]
    return "\n".join(blocks)
