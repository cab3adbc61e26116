"""The captioning corpus's clip windows (#15): the grid first, then random windows, a share of
them drawn to hold an event whole (`model.pretrain.event_windows`)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from paravt_core.config import load_config
from paravt_core.data.synth.traces import segment_grid
from paravt_core.data.synth.world import sample_video
from paravt_core.miniature.pretrain import clip_windows, corpus_dir

REPRODUCE = Path(__file__).resolve().parents[2] / "conf" / "pipeline" / "reproduce.yaml"


def _specs(count: int = 40):
    synth = load_config(REPRODUCE, []).data.synth
    rng = random.Random(0)
    return [sample_video(rng, synth, f"v{i}") for i in range(count)]


def _holds_event(spec, window) -> bool:
    return any(window[0] <= e.start_s and e.end_s <= window[1] for e in spec.events)


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_the_grid_comes_first_then_distinct_random_windows(share: float):
    for spec in _specs(10):
        windows = clip_windows(random.Random(1), spec, 16, 8, share)
        grid = segment_grid(spec, 16)
        assert windows[: len(grid)] == grid and len(windows) == 8 and len(set(windows)) == 8
        assert all(4 <= end - start <= 16 and 0 <= start and end <= int(spec.duration_s)
                   for start, end in windows[len(grid):])


def test_event_windows_hold_an_event_whole():
    specs = _specs()
    every = [w for s in specs for w in clip_windows(random.Random(2), s, 16, 8, 1.0)[3:]]
    assert all(_holds_event(s, w) for s in specs for w in clip_windows(random.Random(2), s, 16, 8, 1.0)[3:])
    anywhere = sum(_holds_event(s, w) for s in specs for w in clip_windows(random.Random(2), s, 16, 8, 0.0)[3:])
    assert len(every) == 5 * len(specs) and anywhere < 0.5 * len(every)


def test_event_windows_key_the_captioning_corpus():
    cfg = load_config(REPRODUCE, [])
    assert corpus_dir(cfg) != corpus_dir(load_config(REPRODUCE, ["model.pretrain.event_windows=0.25"]))
