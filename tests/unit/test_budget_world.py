"""The world where the frame budget matters (#35): short events off every gated budget's overview
frames, a share of long events placed anywhere, and what the teacher may say of each."""

from __future__ import annotations

from paravt_core.data.synth.config import SynthConfig
from paravt_core.data.synth.questions import OptionStyle, random_event_question
from paravt_core.data.synth.traces import direct_trace
from paravt_core.data.synth.world import derived_rng, drawn_visible, event_off_overviews, sample_video
from paravt_core.miniature.visibility import event_visible
from paravt_core.rl.grpo import frame_budget

import pytest

BUDGETS = (2, 3, 4, 6)
WORLD = SynthConfig(min_duration_s=36, max_duration_s=46, min_event_s=2.5, max_event_s=4.0, max_events=1,
                    event_kinds=("shape",), colours=("blue", "green", "red", "yellow"), overview_blind_frames=0,
                    overview_blind_budgets=BUDGETS, visible_event_share=0.5)


def _videos(cfg: SynthConfig, n: int = 300):
    return [sample_video(derived_rng(0, "test-videos", i), cfg, f"v{i:03d}") for i in range(n)]


def _as_manifest(spec) -> dict:
    return {"n_frames": spec.n_frames, "events": [{"start_frame": e.start_frame, "end_frame": e.end_frame}
                                                  for e in spec.events]}


def test_short_events_miss_every_gated_overview_and_long_ones_show_more_with_more_frames():
    videos = _videos(WORLD)
    long_ = [v for v in videos if drawn_visible(WORLD, v.video_id)]
    short = [v for v in videos if not drawn_visible(WORLD, v.video_id)]
    assert 0.4 < len(long_) / len(videos) < 0.6
    assert all(8.0 <= v.events[0].end_s - v.events[0].start_s <= 10.0 for v in long_)
    assert all(2.5 <= v.events[0].end_s - v.events[0].start_s <= 4.0 for v in short)
    # short events: on no overview of any gated budget (the pipeline's own sampler)
    assert not any(event_visible(_as_manifest(v), k) for v in short for k in BUDGETS)
    # long events: visibility rises with K, from none at 2 frames to (nearly) all at 6
    shares = {k: sum(event_visible(_as_manifest(v), k) for v in long_) / len(long_) for k in BUDGETS}
    assert shares[2] == 0.0 and shares[2] < shares[3] < shares[4] < shares[6] and shares[6] > 0.95


def test_at_share_zero_the_world_draws_what_it_drew_before_the_knob():
    """No draw is taken at visible_event_share 0, and an empty budget list blocks what
    overview_blind_frames alone blocked: worlds without the knobs keep their bytes."""
    before = SynthConfig(min_duration_s=36, max_duration_s=46, max_events=1, overview_blind_frames=6)
    with_knobs = before.model_copy(update={"overview_blind_budgets": (), "visible_event_share": 0.0})
    assert _videos(before, 50) == _videos(with_knobs, 50)


def test_direct_traces_say_the_event_is_off_the_overview_only_where_it_is():
    style = OptionStyle.of(WORLD)
    seen = {True: 0, False: 0}
    for spec in _videos(WORLD, 60):
        question = random_event_question(derived_rng(0, "q", spec.video_id), spec, topics=("colour",), style=style)
        hidden = event_off_overviews(spec, spec.events[question.event_index], WORLD)
        assert hidden is not drawn_visible(WORLD, spec.video_id)
        text = direct_trace(spec, question, hidden=hidden).final_turn
        assert ("is not in them" in text) is hidden and ("may show it" in text) is (not hidden)
        seen[hidden] += 1
    assert seen[True] and seen[False]


def test_a_long_event_must_fit_a_crop_with_context():
    with pytest.raises(ValueError, match="visible_event_max_s"):
        SynthConfig(visible_event_share=0.5, visible_event_min_s=8.0, visible_event_max_s=14.5)
    with pytest.raises(ValueError, match="visible_event_min_s"):
        SynthConfig(visible_event_share=0.5, visible_event_min_s=10.0, visible_event_max_s=8.0)


def test_the_gating_draw_key_draws_other_budgets_for_the_same_seed():
    ids = [f"prompt-{i}" for i in range(200)]
    base = [frame_budget(0, p, 0, BUDGETS) for p in ids]
    assert base == [frame_budget(0, p, 0, BUDGETS, draw_key=0) for p in ids]  # key 0: the draws before the knob
    other = [frame_budget(0, p, 0, BUDGETS, draw_key=1) for p in ids]
    assert other != base and set(other) == set(BUDGETS)
    assert other == [frame_budget(0, p, 0, BUDGETS, draw_key=1) for p in ids]
