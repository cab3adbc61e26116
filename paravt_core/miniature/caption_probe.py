"""Can the tiny model see? A teacher-forced probe of the captioning phase's skill (#15).

`paravt miniature perception` asks the sub-agent's question and parses what the model writes, which
says little about a model never trained on that prompt (the captioning phase's, for one).
This probe asks what the captioning phase taught, on clips it never saw: held-out videos of
the config's world drawn from a stream of their own, cut into the grid segments a sub-agent
is given, each clip shown exactly as a crop is (`pretrain.caption_row`, encoded by the SFT
encoder) beside its true caption. The whole row is fed once (teacher forcing) and each word
of the caption that only the frames can tell is scored by whether the model's argmax gives
all its tokens:

- colour, shape and place of each event ("a red circle appears in the top left corner");
- times: the "From MM:SS.s to MM:SS.s" of each event;
- empty: the first word of a window where nothing happens ("Nothing" vs "From");
- detected: the first word of a window where something happens ("From" vs "Nothing"): the
  sub-agent's greedy summary turns on it, and a model that always says "Nothing" scores 1.0
  on `empty` and 0 here.

Teacher forcing scores the place given the true colour and shape before it, so a model that
sees colours but not corners shows it directly. Scores are per event (per window for empty).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from paravt_core.config import PipelineConfig
from paravt_core.data.synth.render import encode_mp4
from paravt_core.data.synth.traces import segment_grid, summarize_window
from paravt_core.data.synth.world import derived_rng, sample_video, youtube_like_id
from paravt_core.miniature.forced import ProbeScores, score_row, teacher_forced, token_offsets
from paravt_core.miniature.pretrain import caption_row
from paravt_core.model.loading import build_model, load_processor

# lazy: torch (2.3 s to import) only where a model runs: `paravt miniature` imports this module to
# check a command's config, model folder and split first (a config error took 0.9 s; 6.9 s with
# these imports at the top).

PROBE_STREAM = "probe-caption"  # derived_rng stream; pretraining clips come from "pretrain"
EVENT = re.compile(r"From (\d\d:\d\d\.\d) to (\d\d:\d\d\.\d) an? (\w+) (\w+) appears in (the centre|the (?:\w+ \w+) corner)\.")


@dataclass(frozen=True)
class CaptionProbe(ProbeScores):
    COUNTS = ("windows", "events")
    PREFIX = "caption"

    windows: int
    events: int
    colour: float
    shape: float
    place: float
    times: float
    empty: float  # windows without events whose first word is right; nan when none
    detected: float  # windows with events whose first word ("From") is right; nan when none


def caption_spans(caption: str) -> tuple[list[dict[str, list[tuple[int, int]]]], tuple[int, int] | None]:
    """Per event of a caption, the character spans of its colour, shape, place and times
    (the space before a word counts for it); and, for an empty window, its first word.

    Raises:
        ValueError: a caption neither empty nor made of shape-event sentences.
    """
    if caption.startswith("Nothing notable"):
        return [], (0, len("Nothing"))
    matches = list(EVENT.finditer(caption))
    if not matches or "".join(m.group(0) for m in matches) != caption.replace(". From", ".From"):
        raise ValueError(f"not a caption of shape events: {caption[:120]!r}")
    events = []
    for m in matches:
        events.append({"times": [m.span(1), m.span(2)], "colour": [(m.start(3) - 1, m.end(3))],
                       "shape": [(m.start(4) - 1, m.end(4))], "place": [(m.start(5) - 1, m.end(5))]})
    return events, None


def caption_probe(model_dir: Path, cfg: PipelineConfig, videos: int = 24, seed: int = 0) -> CaptionProbe:
    """Score the model in `model_dir` on the grid-segment clips of `videos` held-out videos."""
    from paravt_core.sft.dataset import FrameCache, FrameSampling, load_image
    from paravt_core.sft.encode import IGNORE_INDEX, encode_conversation

    synth = cfg.data.synth
    if synth.event_kinds is None or set(synth.event_kinds) != {"shape"}:  # None: every kind
        raise ValueError("caption-probe scores shape events only; this config's data.synth.event_kinds is "
                         f"{list(synth.event_kinds) if synth.event_kinds else 'every kind'}: pass a config whose "
                         "world draws shapes only (conf/pipeline/reproduce.yaml), or --set 'data.synth.event_kinds=[shape]'")
    processor = load_processor(model_dir)
    model = build_model(cfg.model, model_dir, dtype="float32").eval()
    sampling = FrameSampling.from_config(cfg.video)  # as the SFT worker samples
    totals = dict(colour=0, shape=0, place=0, times=0, empty=0, detected=0)
    windows = events = empty_windows = event_windows = 0
    with tempfile.TemporaryDirectory(prefix="caption-probe-") as tmp:
        cache = FrameCache(Path(tmp) / "frames", sampling)
        for index in range(videos):
            rng = derived_rng(synth.seed, PROBE_STREAM, seed, index)
            spec = sample_video(rng, synth, youtube_like_id(rng))
            video_file = Path(tmp) / f"{spec.video_id}.mp4"
            video_file.write_bytes(encode_mp4(spec, synth.codec))
            for window in segment_grid(spec, int(synth.max_crop_s)):
                caption = summarize_window(spec, *window, background=True)  # the captioning corpus's wording
                row = caption_row(video_file, window, caption)
                sample = encode_conversation(row["messages"], processor, cache.load, load_image, None,
                                             (sampling.min_pixels, sampling.max_pixels))
                answer = (sample.labels != IGNORE_INDEX).nonzero().flatten().tolist()
                text, offsets, correct = teacher_forced(model, processor.tokenizer, sample, answer)
                if not text.startswith(caption):
                    raise ValueError(f"the answer tokens decode to {text[:80]!r}, not the caption {caption[:80]!r}")
                spans, first_word = caption_spans(caption)
                windows += 1
                if first_word is not None:
                    empty_windows += 1
                    totals["empty"] += score_row(correct, offsets, {"empty": [first_word]})["empty"]
                else:
                    event_windows += 1
                    totals["detected"] += score_row(correct, offsets, {"detected": [(0, len("From"))]})["detected"]
                for event in spans:
                    events += 1
                    for part, ok in score_row(correct, offsets, event).items():
                        totals[part] += ok
    if not events:
        raise ValueError(f"no events in the grid segments of {videos} probe videos")
    nan = float("nan")
    return CaptionProbe(windows=windows, events=events, empty=totals["empty"] / empty_windows if empty_windows else nan,
                        detected=totals["detected"] / event_windows if event_windows else nan,
                        **{p: totals[p] / events for p in ("colour", "shape", "place", "times")})
