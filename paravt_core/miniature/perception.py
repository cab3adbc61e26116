"""Can the sub-agent see? The perception check of a checkpoint on a generated world (#15).

Tool calls pay off only if the sub-agent's summary of a crop carries the evidence (SPEC §3).
On a generated world the ground truth of every window is known (`manifest.json`), so this
check asks the sub-agent, exactly as the rollout does (`agent.dispatch.CropRunner`, greedy),
for the summary of each grid segment of held-out evaluation videos and scores it:

- detection: the summary says "nothing notable" exactly when no event is in the window;
- colours: of the events in the window, how many the summary names by colour (recall),
  and of the colours it names, how many are there (precision);
- corners: of the events in the window, how many the summary names by colour in a sentence
  that also names the event's place ("top left", "centre"): what a position question needs.

The score of one summary is a pure function of its text (`score_summary`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from paravt_core.agent.hf_build import build_hf_engine
from paravt_core.config import PipelineConfig
from paravt_core.data.mirror import world_dir as synth_world_dir
from paravt_core.data.synth.traces import segment_grid
from paravt_core.data.synth.world import COLOURS, Background, VideoSpec
from paravt_core.model.loading import build_model, load_processor

# lazy: torch (2.3 s to import) only where a model runs: `paravt miniature` imports this module to
# check a command's config, model folder and split first (a config error took 0.9 s; 6.9 s with
# these imports at the top).

NOTHING_PHRASE = "nothing notable"  # how the teacher summaries of `data.synth.traces` say an empty window


@dataclass(frozen=True)
class WindowTruth:
    """One window of one video and the colours of the events visible in it."""

    video: Path
    window: tuple[float, float]
    colours: tuple[str, ...]
    positions: tuple[str, ...] = ()  # each event's place, in the order of `colours` (none: not scored)


@dataclass(frozen=True)
class SummaryScore:
    detection_ok: bool
    colours_found: int  # truth colours the summary names
    colours_named: int  # colour words the summary names
    colours_true: int  # truth colours
    positions_found: int = 0  # truth events named by colour beside their place
    positions_true: int = 0  # truth events with a known place


@dataclass(frozen=True)
class PerceptionReport:
    windows: int
    detection_accuracy: float
    colour_recall: float  # NaN-free: 0 when no window holds an event
    colour_precision: float
    position_recall: float = 0.0  # of the truth events with a place, named by colour beside it

    def as_metrics(self, prefix: str = "perception") -> dict[str, float]:
        return {f"{prefix}_detection_accuracy": self.detection_accuracy,
                f"{prefix}_colour_recall": self.colour_recall,
                f"{prefix}_colour_precision": self.colour_precision,
                f"{prefix}_position_recall": self.position_recall}


def _names_colour(text: str, colour: str) -> bool:
    # a colour word, but not a background tint ("red-tinted")
    return re.search(rf"\b{re.escape(colour)}\b(?!-tinted)", text) is not None


def score_summary(summary: str, colours: Sequence[str], vocabulary: Iterable[str],
                  positions: Sequence[str] = ()) -> SummaryScore:
    """Score one summary against the colours (and, given, the places) of the window's events
    (empty: nothing happens)."""
    text = summary.lower()
    named = {c for c in vocabulary if _names_colour(text, c)}
    # sentences end at a full stop after a word; the timestamps' "00:20.0" do not end one
    sentences = re.split(r"(?<=[a-z])\.(?:\s+|$)", text)
    # an event without a known place (positions shorter, or "") is not scored for it
    known = [(colour, place) for colour, place in zip(colours, positions, strict=False) if place]
    placed = sum(any(_names_colour(s, colour) and re.search(rf"\b{re.escape(place)}\b", s) for s in sentences)
                 for colour, place in known)
    return SummaryScore(
        detection_ok=(NOTHING_PHRASE in text) == (not colours),
        colours_found=sum(c in named for c in colours),
        colours_named=len(named),
        colours_true=len(colours),
        positions_found=placed,
        positions_true=len(known),
    )


def aggregate(scores: Sequence[SummaryScore]) -> PerceptionReport:
    if not scores:
        raise ValueError("no windows were scored")
    true = sum(s.colours_true for s in scores)
    found_placed = sum(s.positions_found for s in scores)
    named = sum(s.colours_named for s in scores)
    found = sum(s.colours_found for s in scores)
    return PerceptionReport(
        windows=len(scores),
        detection_accuracy=sum(s.detection_ok for s in scores) / len(scores),
        colour_recall=found / true if true else 0.0,
        colour_precision=found / named if named else 0.0,
        position_recall=found_placed / placed_true if (placed_true := sum(s.positions_true for s in scores)) else 0.0,
    )


def world_manifest(cfg: PipelineConfig) -> Path:
    """The manifest of the world `cfg` generates (`data.mirror.world_dir`): an output folder
    keeps the worlds of earlier settings or generator code beside it, whose videos and events
    differ, so "the newest-looking manifest" is not this config's.

    Raises:
        FileNotFoundError: this config's world was not generated, naming where it should be.
    """
    manifest = synth_world_dir(cfg) / "manifest.json"
    if not manifest.is_file():
        raise FileNotFoundError(f"{manifest}: the generated world of this config is missing; run its data stage "
                                "first (data.source: synth)")
    return manifest


def window_truths(manifest: Path, split: str, video_dir: Path, segment_s: float, max_videos: int
                  ) -> list[WindowTruth]:
    """The `segment_s` grid segments (as the teacher crops them) of up to `max_videos` videos of
    one evaluation split of the world `manifest` describes, with their events' colours."""
    record = json.loads(Path(manifest).read_text())
    try:
        videos = record["eval"][split]["videos"][:max_videos]
    except KeyError as exc:
        raise ValueError(f"{manifest}: no evaluation split {split!r}; the world has {sorted(record['eval'])}") from exc
    truths = []
    for video in videos:
        v = video["video"]
        spec = VideoSpec(v["video_id"], v["n_frames"], v["fps"], v["width"], v["height"],
                         Background("grey", "left", 100, ()), ())
        path = Path(video_dir) / video["file_name"]
        if not path.is_file():
            raise FileNotFoundError(f"{path}: video of {split} named in {manifest} is missing; run the data stage")
        for start, end in segment_grid(spec, int(segment_s)):
            events = [e for e in v["events"] if e["start_s"] < end and e["end_s"] > start]
            truths.append(WindowTruth(path, (float(start), float(end)), tuple(e["colour"] for e in events),
                                      tuple(e.get("position") or "" for e in events)))
    return truths


def perception_report(model_dir: Path, cfg: PipelineConfig, truths: Sequence[WindowTruth]) -> PerceptionReport:
    """Greedy sub-agent summaries of every window (one engine call per video), scored."""
    from contextlib import ExitStack

    from paravt_core.agent.context import ChatRenderer
    from paravt_core.agent.dispatch import CropJob, CropRunner, CropSource
    from paravt_core.agent.engine import SamplingParams
    from paravt_core.video import VideoFile

    processor = load_processor(model_dir)
    engine = build_hf_engine(cfg, build_model(cfg.model, model_dir, dtype="float32").eval(), processor, "evaluation")
    renderer = ChatRenderer(processor, think_prefix=False, pixel_bounds=(cfg.video.min_pixels, cfg.video.max_pixels))
    runner = CropRunner(renderer, cfg.video)
    params = SamplingParams(max_new_tokens=cfg.rl.rollout.subagent_max_new_tokens, temperature=0.0)
    by_video: dict[Path, list[WindowTruth]] = {}
    for truth in truths:
        by_video.setdefault(truth.video, []).append(truth)
    scores = []
    for key, (path, windows) in enumerate(by_video.items()):
        with ExitStack() as stack:
            video = stack.enter_context(VideoFile(path))
            source = CropSource(key, video, video.info.duration)
            results = runner.run(engine, [CropJob(source, t.window) for t in windows], params)
        scores += [score_summary(r.text, t.colours, COLOURS, t.positions) for t, r in zip(windows, results, strict=True)]
    return aggregate(scores)
