"""The sub-agent perception check (#15): pure scoring of summaries against a world's truth."""

from __future__ import annotations

import pytest

from paravt_core.data.synth.world import COLOURS
from paravt_core.miniature.perception import SummaryScore, aggregate, score_summary


@pytest.mark.parametrize(
    ("summary", "colours", "expected"),
    [
        ("Nothing notable happens in this window: only the plain red-tinted background is visible.", (),
         SummaryScore(True, 0, 0, 0)),
        ("Nothing notable happens in this window.", ("blue",), SummaryScore(False, 0, 0, 1)),
        ("From 00:16.0 to 00:18.0 a red circle appears in the centre.", ("red",), SummaryScore(True, 1, 1, 1)),
        ("From 00:16.0 to 00:18.0 a red circle appears in the centre.", ("blue",), SummaryScore(True, 0, 1, 1)),
        ("From 00:16.0 to 00:18.0 a red circle appears in the centre.", (), SummaryScore(False, 0, 1, 0)),
        ("A Green star, then a cyan square on a blue-tinted background.", ("green", "yellow"),
         SummaryScore(True, 1, 2, 2)),
    ],
)
def test_score_summary(summary, colours, expected):
    assert score_summary(summary, colours, COLOURS) == expected


@pytest.mark.parametrize(
    ("summary", "positions", "found"),
    [
        ("From 00:16.0 to 00:18.0 a red circle appears in the top left corner.", ("top left",), 1),
        ("From 00:16.0 to 00:18.0 a red circle appears in the top right corner.", ("top left",), 0),
        # the place must be in the sentence that names the colour
        ("From 00:16.0 to 00:18.0 a red circle appears. From 00:20.0 to 00:22.0 a blue star appears in the centre.",
         ("centre",), 0),
        ("From 00:16.0 to 00:18.0 a red circle appears in the centre. A blue star in the top left corner.",
         ("centre",), 1),
        ("Nothing notable happens in this window.", ("centre",), 0),
        # no known place: not scored (an empty place must not match every sentence)
        ("From 00:16.0 to 00:18.0 a red circle appears in the centre.", ("",), 0),
    ],
)
def test_score_summary_positions(summary, positions, found):
    score = score_summary(summary, ("red",), COLOURS, positions)
    assert score.positions_found == found
    assert score.positions_true == sum(bool(p) for p in positions)


def test_aggregate_is_detection_accuracy_and_colour_recall_and_precision():
    report = aggregate([SummaryScore(True, 1, 1, 1, 1, 1), SummaryScore(False, 0, 2, 1, 0, 1),
                        SummaryScore(True, 0, 0, 0), SummaryScore(True, 1, 1, 1, 0, 0)])
    assert report.windows == 4
    assert report.position_recall == pytest.approx(1 / 2)  # of the 2 events with a known place
    assert report.detection_accuracy == pytest.approx(3 / 4)
    assert report.colour_recall == pytest.approx(2 / 3)
    assert report.colour_precision == pytest.approx(2 / 4)
    with pytest.raises(ValueError, match="no windows"):
        aggregate([])


def test_the_world_manifest_is_this_configs_not_the_newest_looking(tmp_path):
    from pathlib import Path

    from paravt_core.config import load_config
    from paravt_core.data.mirror import world_dir as synth_world_dir
    from paravt_core.miniature.perception import world_manifest

    reproduce = Path(__file__).resolve().parents[2] / "conf" / "pipeline" / "reproduce.yaml"
    cfg = load_config(reproduce, [f"run.output_dir={tmp_path}"])
    stale = tmp_path / "data" / "world-ffffffffffffffff" / "manifest.json"  # sorts after any other
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    with pytest.raises(FileNotFoundError, match="generated world of this config is missing"):
        world_manifest(cfg)
    own = synth_world_dir(cfg) / "manifest.json"
    own.parent.mkdir(parents=True)
    own.write_text("{}")
    assert world_manifest(cfg) == own
    other = load_config(reproduce, [f"run.output_dir={tmp_path}", "data.synth.seed=7"])
    with pytest.raises(FileNotFoundError):
        world_manifest(other)
