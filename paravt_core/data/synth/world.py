"""The generated world: plain backgrounds in which short, known events happen.

A video is a slowly drifting, low-saturation background (a tint and a brightness
gradient, the facts the overview frames do show) with one to three short events, each
drawn in a saturated colour so that its pixels are unmistakable:

- `shape`: a coloured shape appears at one of five places for 2-4 s;
- `digit`: a digit (5x7 bitmap font) is drawn in a colour at one of five places;
- `motion`: a coloured shape crosses the frame left to right or right to left.

Events start and end on the frame grid (frame i is shown at i / fps seconds), their kinds,
shapes and colours are all distinct within a video (so "the red object" names one
event), and by default they avoid the instants that 4 uniform overview frames fall on
under the usual sampling conventions (or those of several budgets K), so that the overview
misses them and a crop of their window (SPEC §3: 1 fps) is needed to answer. A share of
videos (`visible_event_share`) instead holds one long event placed anywhere, which an
overview shows more often the more frames it has (#35).

Everything here is a pure function of a `random.Random` and the config; the ground
truth lives in `VideoSpec`, which the renderer, the questions, the teacher traces and
the manifest all read.
"""

from __future__ import annotations

import hashlib
import math
import random
import string
from dataclasses import dataclass, field
from typing import Literal

from paravt_core.data.synth.config import SynthConfig
from paravt_core.data.synth.vocab import COLOURS

EventKind = Literal["shape", "digit", "motion"]
EVENT_KINDS: tuple[EventKind, ...] = ("shape", "digit", "motion")

SHAPES = ("square", "circle", "triangle", "diamond", "star")
POSITIONS = ("top left", "top right", "bottom left", "bottom right", "centre")
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
DIRECTIONS = ("left to right", "right to left")
# Answer options for direction questions: the two real directions plus plausible decoys.
DIRECTION_OPTIONS = (*DIRECTIONS, "top to bottom", "bottom to top", "in a circle")
# Per-channel offsets of the background tints: at most 30 levels apart, i.e. low saturation.
TINTS: dict[str, tuple[int, int, int]] = {
    "blue": (-12, -2, 18),
    "green": (-10, 16, -8),
    "red": (18, -6, -10),
    "grey": (0, 0, 0),
}
BRIGHT_SIDES = ("top", "bottom", "left", "right")
EDGE_MARGIN_S = 1.0  # events keep this far from the first and last frame
EVENT_GAP_S = 1.0  # and this far from each other


@dataclass(frozen=True)
class Background:
    """The constant scene: tint, brighter side, grey level and two slowly drifting waves."""

    tint: str
    bright_side: str
    level: int
    waves: tuple[tuple[float, float, float, float], ...]  # (cycles_x, cycles_y, period_s, phase)


@dataclass(frozen=True)
class Event:
    """One event, visible on frames `start_frame <= i < end_frame`; the ground truth of manifest.json."""

    kind: EventKind
    start_frame: int
    end_frame: int
    fps: float
    colour: str
    shape: str | None = None
    position: str | None = None
    digit: int | None = None
    direction: str | None = None

    @property
    def start_s(self) -> float:
        return self.start_frame / self.fps

    @property
    def end_s(self) -> float:
        return self.end_frame / self.fps

    @property
    def label(self) -> str:
        """A noun phrase naming this event's object uniquely within its video."""
        if self.kind == "digit":
            return f"{self.colour} digit"
        return f"{self.colour} {self.shape}"


@dataclass(frozen=True)
class VideoSpec:
    """A whole video: geometry, background and events; `render.encode_mp4` draws it."""

    video_id: str
    n_frames: int
    fps: float
    width: int
    height: int
    background: Background
    events: tuple[Event, ...] = field(default_factory=tuple)

    @property
    def duration_s(self) -> float:
        return self.n_frames / self.fps


def derived_rng(seed: int, *labels: object) -> random.Random:
    """An independent, stable random stream per (seed, labels), unlike Python's `hash()`."""
    key = ":".join(str(x) for x in (seed, *labels)).encode()
    return random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))


def youtube_like_id(rng: random.Random) -> str:
    """An 11-character id in the YouTube alphabet (Video-MME, LongVideoBench, LVBench)."""
    alphabet = string.ascii_letters + string.digits + "-_"
    return "".join(rng.choice(alphabet) for _ in range(11))


def charades_like_id(rng: random.Random) -> str:
    """A 5-character upper-case id like Charades' `3MSZA`."""
    return "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(5))


def overview_frame_indices(n_frames: int, k: int) -> set[int]:
    """Frame indices that k uniform overview frames land on under the usual conventions.

    Covered: `linspace(0, n - 1, k)` rounded or floored (qwen-vl-utils, lmms-eval, decord
    examples) and segment centres `(j + 0.5) * n / k` (TSN style), both floored and ceiled.
    """
    if k <= 0:
        return set()
    step = (n_frames - 1) / (k - 1) if k > 1 else 0.0
    points = [j * step for j in range(k)] + [(j + 0.5) * n_frames / k for j in range(k)]
    return {min(n_frames - 1, f(p)) for p in points for f in (math.floor, math.ceil)}


def sample_background(rng: random.Random) -> Background:
    waves = tuple(
        (rng.uniform(0.3, 1.2), rng.uniform(0.3, 1.2), rng.uniform(20.0, 60.0), rng.uniform(0, 2 * math.pi))
        for _ in range(2)
    )
    return Background(
        tint=rng.choice(sorted(TINTS)),
        bright_side=rng.choice(BRIGHT_SIDES),
        level=rng.randint(95, 140),
        waves=waves,
    )


def _free_starts(blocked: list[bool], length: int) -> list[int]:
    """Start frames `a` such that frames a .. a + length - 1 are all unblocked."""
    starts, run = [], 0
    for i, is_blocked in enumerate(blocked):
        run = 0 if is_blocked else run + 1
        if run >= length:
            starts.append(i - length + 1)
    return starts


def blind_instants(cfg: SynthConfig, n_frames: int) -> set[int]:
    """The frames short events avoid: the instants of `overview_blind_frames` uniform overview
    frames under the usual conventions, and the frames the pipeline's own overview sampler
    (`video.sampling.overview_frame_indices`, the same for SFT, RL and evaluation) takes at each
    budget of `overview_blind_budgets`."""
    from paravt_core.video.sampling import overview_frame_indices as pipeline_overview

    instants = overview_frame_indices(n_frames, cfg.overview_blind_frames)
    for k in cfg.overview_blind_budgets:
        instants |= set(pipeline_overview(n_frames, k))
    return instants


def place_event_windows(rng: random.Random, cfg: SynthConfig, n_frames: int, count: int,
                        visible: bool = False) -> list[tuple[int, int]]:
    """Non-overlapping [start, end) frame windows for `count` events, sorted by start.

    Windows keep EDGE_MARGIN_S from the ends, EVENT_GAP_S from each other and off the
    overview instants (`blind_instants`). An event that cannot be
    placed is dropped, except the first, which is then placed without the overview rule.
    `visible`: the first event is long (`visible_event_min_s`..`visible_event_max_s`) and
    placed anywhere between the margins, so the overview may show it (#35).
    """
    fps = cfg.fps
    margin, gap = round(EDGE_MARGIN_S * fps), round(EVENT_GAP_S * fps)
    overview = blind_instants(cfg, n_frames)
    blocked = [i < margin or i >= n_frames - margin or i in overview for i in range(n_frames)]
    lengths = range(math.ceil(cfg.min_event_s * fps), math.floor(cfg.max_event_s * fps) + 1)
    long_lengths = range(math.ceil(cfg.visible_event_min_s * fps), math.floor(cfg.visible_event_max_s * fps) + 1)
    windows: list[tuple[int, int]] = []
    for index in range(count):
        length = rng.choice(long_lengths if visible and index == 0 else lengths)
        starts = _free_starts(blocked, length)
        if (visible and index == 0) or (not starts and not windows):
            starts = _free_starts([i < margin or i >= n_frames - margin for i in range(n_frames)], length)
        if not starts:
            continue
        start = rng.choice(starts)
        windows.append((start, start + length))
        for i in range(max(0, start - gap), min(n_frames, start + length + gap)):
            blocked[i] = True
    return sorted(windows)


def drawn_visible(cfg: SynthConfig, video_id: str) -> bool:
    """Whether this video's first event is a long one placed anywhere (`visible_event_share`):
    a stable draw per video, not taken at share 0 (so such worlds draw what they always drew)."""
    return cfg.visible_event_share > 0 and derived_rng(cfg.seed, "visible", video_id).random() < cfg.visible_event_share


def event_off_overviews(spec: VideoSpec, event: Event, cfg: SynthConfig) -> bool:
    """Whether `event` lies off every overview instant the world's short events avoid
    (`blind_instants`): what a teacher may say of it without knowing the row's budget K."""
    instants = blind_instants(cfg, spec.n_frames)
    return bool(instants) and not any(event.start_frame <= i < event.end_frame for i in instants)


def event_on_overview(spec: VideoSpec, event: Event, k: int) -> bool:
    """Whether `event` is on one of the K overview frames the pipeline takes of the video
    (`video.sampling.overview_frame_indices`, the same for SFT, RL and evaluation)."""
    from paravt_core.video.sampling import overview_frame_indices as pipeline_overview

    return any(event.start_frame <= i < event.end_frame for i in pipeline_overview(spec.n_frames, k))


def sample_events(rng: random.Random, cfg: SynthConfig, n_frames: int, visible: bool = False) -> tuple[Event, ...]:
    """1-3 events of distinct kinds (or of `cfg.event_kinds`), colours and shapes, in temporal order
    (`visible`: the first drawn is long and placed anywhere, `place_event_windows`)."""
    count = rng.randint(cfg.min_events, cfg.max_events)
    windows = place_event_windows(rng, cfg, n_frames, count, visible=visible)
    if cfg.event_kinds is None:
        kinds = rng.sample(EVENT_KINDS, len(windows))
    else:
        kinds = [rng.choice(cfg.event_kinds) for _ in windows]
    colours = rng.sample(sorted(cfg.colours or COLOURS), len(windows))
    shapes = rng.sample(SHAPES, len(windows))
    events = []
    for (start, end), kind, colour, shape in zip(windows, kinds, colours, shapes, strict=True):
        common = dict(kind=kind, start_frame=start, end_frame=end, fps=cfg.fps, colour=colour)
        if kind == "shape":
            events.append(Event(**common, shape=shape, position=rng.choice(POSITIONS)))
        elif kind == "digit":
            events.append(Event(**common, position=rng.choice(POSITIONS), digit=rng.randrange(10)))
        else:
            events.append(Event(**common, shape=shape, direction=rng.choice(DIRECTIONS)))
    return tuple(events)


def sample_video(rng: random.Random, cfg: SynthConfig, video_id: str) -> VideoSpec:
    """A video of uniform random duration in the config's range, on the frame grid."""
    duration = rng.uniform(cfg.min_duration_s, cfg.max_duration_s)
    n_frames = max(1, round(duration * cfg.fps))
    return VideoSpec(
        video_id=video_id,
        n_frames=n_frames,
        fps=cfg.fps,
        width=cfg.width,
        height=cfg.height,
        background=sample_background(rng),
        events=sample_events(rng, cfg, n_frames, visible=drawn_visible(cfg, video_id)),
    )


def events_in_window(spec: VideoSpec, start_s: float, end_s: float) -> list[Event]:
    """The events visible at some instant of [start_s, end_s), in temporal order."""
    return [e for e in spec.events if e.start_s < end_s and e.end_s > start_s]
