"""`miniature.visibility`: which overview budgets show a generated video's events."""

from __future__ import annotations

import pytest

from paravt_core.miniature.visibility import event_visible, table_markdown, visibility_table, visible_share
from paravt_core.video.sampling import overview_frame_indices


def video(n_frames: int, *spans: tuple[int, int]) -> dict:
    return {"n_frames": n_frames, "events": [{"start_frame": s, "end_frame": e} for s, e in spans]}


def test_an_event_counts_only_on_frames_it_covers_end_excluded():
    # 101 frames: K=2 takes 0 and 100, K=3 adds 50, K=5 takes 0, 25, 50, 75, 100.
    assert overview_frame_indices(101, 3) == [0, 50, 100]
    between = video(101, (40, 50))  # frames 40..49: 50 is past its end
    assert [event_visible(between, k) for k in (2, 3, 5)] == [False, False, False]
    on_middle = video(101, (45, 51))
    assert [event_visible(on_middle, k) for k in (2, 3, 5)] == [False, True, True]
    on_quarter = video(101, (20, 30))
    assert [event_visible(on_quarter, k) for k in (2, 3, 5)] == [False, False, True]
    assert event_visible(video(101, (90, 95), (99, 101)), 2)  # any of its events
    assert not event_visible(video(101), 5)  # no event at all


def test_the_table_has_a_row_per_video_set_and_a_share_per_budget():
    manifest = {"train": [{"video": video(101, (45, 51))}, {"video": video(101, (40, 50))}],
                "eval": {"videomme": {"videos": [{"video": video(101, (20, 30))}]}, "empty": {"videos": []}}}
    rows = visibility_table(manifest, [5, 3, 3])
    assert [(r.videos, r.n, r.shares) for r in rows] == [("train", 2, {3: 0.5, 5: 0.5}),
                                                          ("videomme", 1, {3: 0.0, 5: 1.0})]
    assert table_markdown(rows).splitlines()[2] == "| train | 2 | 50.0 % | 50.0 % |"
    with pytest.raises(ValueError, match="no videos"):
        visible_share([], 3)


def test_evaluation_records_split_by_whether_the_k_frames_show_the_event():
    import pytest

    from paravt_core.miniature.visibility import records_by_shown, shown_markdown

    # 20 frames; K=6 takes 0, 4, 8, 11, 15, 19: "a" shows its event (8-11), "b" (1-2) does not
    video_of = {"a": {"n_frames": 20, "events": [{"start_frame": 8, "end_frame": 12}]},
                "b": {"n_frames": 20, "events": [{"start_frame": 1, "end_frame": 3}]},
                "c": {"n_frames": 20, "events": [{"start_frame": 9, "end_frame": 10}]}}
    records = [{"id": "a", "correct": True, "tool_calls": 0}, {"id": "c", "correct": False, "tool_calls": 2},
               {"id": "b", "correct": True, "tool_calls": 3}]
    shown, hidden = records_by_shown(records, video_of, 6)
    assert (shown.shown, shown.questions, shown.accuracy, shown.calls) == (True, 1, 1.0, 0.0)
    assert (hidden.shown, hidden.questions, hidden.accuracy, hidden.calls) == (False, 2, 0.5, 2.5)
    assert "| no | 2 | 50.0 | 2.50 |" in shown_markdown([shown, hidden], 6)
    assert [r.shown for r in records_by_shown(records, video_of, 2)] == [False]  # K=2: frames 0 and 19 only
    with pytest.raises(ValueError, match="without a video"):
        records_by_shown(records + [{"id": "d", "correct": True, "tool_calls": 0}], video_of, 6)
