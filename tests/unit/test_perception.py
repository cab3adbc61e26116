"""The sub-agent perception check (#15): pure scoring of summaries against a world's truth."""

from __future__ import annotations

import pytest

from paravt_core.data.synth.world import COLOURS
from paravt_core.sft.perception import SummaryScore, aggregate, score_summary


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


def test_aggregate_is_detection_accuracy_and_colour_recall_and_precision():
    report = aggregate([SummaryScore(True, 1, 1, 1), SummaryScore(False, 0, 2, 1), SummaryScore(True, 0, 0, 0)])
    assert report.windows == 3
    assert report.detection_accuracy == pytest.approx(2 / 3)
    assert report.colour_recall == pytest.approx(1 / 2)
    assert report.colour_precision == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="no windows"):
        aggregate([])
