"""The miniature's verdict statistics (paravt_core.miniature.inference): pure functions."""

from __future__ import annotations

import math

import pytest

from paravt_core.miniature.inference import MIN_RUNS, Estimate, holm, label, runs_needed, two_level


def _run(accuracy: float, n: int = 80) -> dict[str, float]:
    """A run answering the first `accuracy` share of n questions right."""
    return {f"q{i}": float(i < round(accuracy * n)) for i in range(n)}


def test_run_to_run_spread_widens_the_interval_that_question_resampling_alone_keeps_narrow():
    """The last reproduction's defect: its bootstrap resampled questions with each row's runs
    fixed, so runs that disagree by 40 points gave a 'significant' difference."""
    a = [_run(0.9), _run(0.5), _run(0.9), _run(0.5)]  # mean 0.7, runs 40 points apart
    b = [_run(0.6)] * 4
    two = two_level(a, b)
    # questions only: each row's runs averaged into one, so only the questions are resampled
    averaged = [{q: sum(r[q] for r in a) / len(a) for q in a[0]}]
    questions_only = two_level(averaged, [b[0]])
    assert two.mean == pytest.approx(0.1) == questions_only.mean
    assert (two.high - two.low) > 2 * (questions_only.high - questions_only.low)
    assert questions_only.low > 0 and two.low < 0  # "A wins" only if run noise is ignored
    assert two.runs == (4, 4) and two.questions == 80


def test_identical_rows_differ_by_exactly_nothing_and_a_clear_gap_is_significant():
    same = two_level([_run(0.5)] * 4, [_run(0.5)] * 4)
    assert same.mean == same.low == same.high == 0.0 and same.p == 1.0
    gap = two_level([_run(0.9), _run(0.88), _run(0.92), _run(0.9)], [_run(0.5), _run(0.52), _run(0.48), _run(0.5)])
    assert gap.mean == pytest.approx(0.4) and gap.low > 0.25 and gap.p < 0.001
    assert two_level([_run(0.9)], [_run(0.5)], seed=3) == two_level([_run(0.9)], [_run(0.5)], seed=3)


def test_only_questions_every_run_answered_count_and_an_empty_side_gives_none():
    partial = [{"q0": 1.0, "q1": 0.0, "extra": 1.0}]
    assert two_level(partial, [_run(0.5, 4)]).questions == 2
    assert two_level([], [_run(0.5)]) is None
    assert two_level([{"x": 1.0}], [{"y": 1.0}]) is None


def test_holm_steps_down_and_stays_monotone():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5]) == [0.5]
    assert holm([0.6, 0.01]) == pytest.approx([0.6, 0.02])
    assert holm([0.4, 0.4, 0.4]) == pytest.approx([1.0, 1.0, 1.0])


def _estimate(mean: float, half: float, p: float) -> Estimate:
    return Estimate(mean, mean - half, mean + half, mean - 0.8 * half, mean + 0.8 * half, p, (MIN_RUNS, MIN_RUNS), 100)


def test_labels_claim_a_direction_only_for_a_significant_effect_of_at_least_the_minimum():
    assert label(_estimate(-0.2, 0.05, 0.001), 0.1, -1, 0.001) == "reproduced"
    assert label(_estimate(+0.2, 0.05, 0.001), 0.1, -1, 0.001) == "reversed"
    assert label(_estimate(0.03, 0.02, 0.001), 0.1, +1, 0.001) == "equivalent"  # significant but too small: a 0.03 fall
    assert label(_estimate(0.03, 0.2, 0.5), 0.1, +1, 0.5) == "inconclusive"  # an interval over 0 is not "not reproduced"
    assert label(_estimate(0.3, 0.1, 0.01), 0.1, +1, 0.08) == "inconclusive"  # Holm's adjusted p decides
    assert label(_estimate(0.3, 0.1, 0.001), 0.1, +1, 0.001, rl_runs=MIN_RUNS - 1) == "inconclusive"
    assert label(None, 0.1, +1, 1.0) == "inconclusive"
    with pytest.raises(ValueError, match="minimum effect"):
        label(_estimate(0.3, 0.1, 0.001), 0.0, +1, 0.001)


def test_runs_needed_is_the_two_sample_normal_approximation():
    z = 1.959964 + 0.841621
    assert runs_needed(0.145, 0.05) == math.ceil(2 * (z * 0.145 / 0.05) ** 2)  # the last run's spread: 133 a row
    assert runs_needed(0.01, 0.5) == MIN_RUNS
    assert runs_needed(0.3, 0.1, power=0.9) > runs_needed(0.3, 0.1)
