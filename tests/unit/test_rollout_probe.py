"""The rollout probe's summaries (paravt_core.miniature.rollout_probe): pure functions of scored rollouts."""

from __future__ import annotations

import pytest

from paravt_core.miniature.rollout_probe import ALL, Outcome, render_table, summarize


def _group(index: int, truth: str, answers: list[str], calls: int = 2) -> list[Outcome]:
    return [Outcome(index, truth, a, float(a == truth), float(a == truth) + 0.5, calls) for a in answers]


def test_mixed_groups_are_the_prompts_whose_rollouts_disagree_on_accuracy():
    outcomes = (_group(0, "A", ["A", "B", "B", "B"]) + _group(1, "A", ["B", "B", "B", "B"])
                + _group(2, "C", ["C", "C", "C", "C"]) + _group(3, "C", ["C", "D", "C", "C"]))
    stats = summarize(outcomes)
    assert list(stats) == [ALL, "A", "C"]
    assert stats[ALL].prompts == 4 and stats[ALL].rollouts == 16
    assert stats[ALL].mixed_groups == pytest.approx(0.5)
    assert stats["A"].accuracy == pytest.approx(1 / 8)
    assert stats["A"].mixed_groups == pytest.approx(0.5)
    assert stats["A"].answers == {"B": 7, "A": 1}
    assert stats["C"].accuracy == pytest.approx(7 / 8)
    assert stats["C"].mixed_groups == pytest.approx(0.5)


def test_a_group_that_differs_only_in_format_is_informative_but_not_mixed():
    outcomes = [Outcome(0, "A", "A", 1.0, 1.5, 1), Outcome(0, "A", "A", 1.0, 1.2, 1)]
    stats = summarize(outcomes)[ALL]
    assert stats.mixed_groups == 0.0
    assert stats.informative_groups == 1.0
    assert stats.kappa == 1.0


def test_answers_are_shortened_to_one_line_and_an_empty_one_is_named():
    outcomes = [Outcome(0, "A", "", 0.0, 0.0, 0), Outcome(0, "A", "a very long\nanswer text here", 0.0, 0.0, 3)]
    answers = summarize(outcomes)["A"].answers
    assert answers == {"(none)": 1, "a very long…": 1}


def test_rollouts_of_one_prompt_must_share_their_ground_truth():
    with pytest.raises(ValueError, match="prompt 0"):
        summarize([Outcome(0, "A", "A", 1.0, 1.0, 0), Outcome(0, "B", "A", 0.0, 0.0, 0)])
    with pytest.raises(ValueError, match="no rollouts"):
        summarize([])


def test_the_table_has_a_line_per_temperature_and_truth():
    stats = summarize(_group(0, "A", ["A", "B"]) + _group(1, "B", ["B", "B"]))
    table = render_table({0.7: stats, 0.3: stats}).splitlines()
    assert len(table) == 2 + 2 * 3
    assert table[2].startswith("| 0.7 | all | 2 | 4 | 0.75 | 0.50 |")
    assert "| 0.3 | A | 1 | 2 | 0.50 | 1.00 |" in table[-2]
