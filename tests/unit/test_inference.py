"""The miniature's verdict statistics (paravt_core.miniature.inference): pure functions, checked
against hand-computed values and scipy's own implementations."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from paravt_core.miniature import inference
from paravt_core.miniature.inference import (
    Estimate,
    against_value,
    exact_floor,
    fisher_exact,
    holm,
    label,
    permutation_p,
    sign_flip_p,
    units_needed,
    welch,
)

# The default reproduction of 2026-11-28 (docs/miniature.md): held-out accuracy per run.
VANILLA = [0.938, 0.945, 0.945, 0.906]
PARAGRPO = [0.938, 0.469, 0.891, 0.547]


def test_welch_by_hand_and_against_scipy():
    e = welch([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    # by hand: variances 1 and 1, se = sqrt(1/3 + 1/3), df = (2/3)^2 / (2 (1/3)^2 / 2) = 4
    se = math.sqrt(2 / 3)
    assert e.mean == -3.0 and e.df == pytest.approx(4.0) and e.sd == pytest.approx(1.0)
    assert e.high == pytest.approx(-3.0 + 2.776445 * se, abs=1e-5)  # t(0.975, 4) = 2.776445
    assert e.p_t == pytest.approx(2 * stats.t.sf(3 / se, 4))
    ref = stats.ttest_ind(PARAGRPO, VANILLA, equal_var=False)
    e = welch(PARAGRPO, VANILLA)
    assert (e.p_t, e.df) == pytest.approx((ref.pvalue, ref.df))
    assert (e.low, e.high) == pytest.approx(tuple(ref.confidence_interval(0.95)))
    assert (e.eq_low, e.eq_high) == pytest.approx(tuple(ref.confidence_interval(0.90)))
    assert e.units == (4, 4) and e.unit == "run" and not e.paired
    with pytest.raises(ValueError, match="at least 2 runs a row"):
        welch([0.5], VANILLA)


def test_the_issue_s_eight_run_means():
    """#62: Welch p 0.16 (95 % CI -59.9 to +15.4 points), exact permutation over runs p 0.086."""
    e = welch(PARAGRPO, VANILLA)
    assert round(e.p_t, 2) == 0.16 and (round(100 * e.low, 1), round(100 * e.high, 1)) == (-59.9, 15.4)
    assert e.p_exact == pytest.approx(6 / 70) and e.p_floor == pytest.approx(2 / 70)
    assert e.p == e.p_t  # a direction needs both tests: the larger p


def test_permutation_p_by_hand_and_against_scipy():
    # the 6 splits of {1,2,3,4} into pairs: |differences| 2, 1, 0, 0, 1, 2; observed 2
    assert permutation_p([1.0, 2.0], [3.0, 4.0]) == pytest.approx((2 / 6, 2 / 6))
    assert permutation_p([1.0], [2.0, 3.0]) == pytest.approx((2 / 3, 1 / 3))  # unequal sizes: no mirror
    ref = stats.permutation_test((PARAGRPO, VANILLA), lambda x, y: sum(x) / len(x) - sum(y) / len(y),
                                 permutation_type="independent", n_resamples=math.inf)
    assert permutation_p(PARAGRPO, VANILLA)[0] == pytest.approx(ref.pvalue)


def test_sign_flip_p_by_hand_and_against_scipy():
    # 8 sign patterns of (1, 2, 3): |sum| 6 only for all + and all -
    assert sign_flip_p([1.0, 2.0, 3.0]) == pytest.approx((2 / 8, 2 / 8))
    assert sign_flip_p([0.0, 0.0]) == (1.0, 0.5)
    d = [0.3, -0.1, 0.25, 0.4, 0.05]
    ref = stats.permutation_test((d,), lambda x: sum(x) / len(x), permutation_type="samples", n_resamples=math.inf)
    assert sign_flip_p(d)[0] == pytest.approx(ref.pvalue)


def test_against_value_is_scipy_s_one_sample_t_with_the_sign_flip_test():
    e = against_value(PARAGRPO, 0.820)
    ref = stats.ttest_1samp(PARAGRPO, 0.820)
    assert e.mean == pytest.approx(sum(PARAGRPO) / 4 - 0.820) and e.p_t == pytest.approx(ref.pvalue)
    assert (e.low, e.high) == pytest.approx(tuple(v - 0.820 for v in ref.confidence_interval(0.95)))
    assert e.p_floor == pytest.approx(2 / 16) and e.paired and e.units == (4, 1)
    assert against_value([0.1, 0.2, 0.3], 0.0, unit="build").unit == "build"
    with pytest.raises(ValueError, match="at least 2 runs"):
        against_value([0.5], 0.4)


def test_no_spread_at_all_gives_a_point_interval():
    same = welch([0.5, 0.5], [0.5, 0.5])
    assert same.low == same.high == 0.0 and same.p_t == 1.0 and same.p_exact == 1.0
    apart = welch([0.9, 0.9, 0.9], [0.5, 0.5, 0.5])
    assert apart.p_t == 0.0 and apart.p_exact == pytest.approx(2 / 20) and apart.p == pytest.approx(0.1)


def test_units_whose_values_tie_claim_no_equivalence_from_their_point_interval():
    # part 6-7 of the conclusive profile: PARA-GRPO minus its SFT model -1.5/128 in both builds
    tied = against_value([-1.5 / 128, -1.5 / 128], 0.0, unit="build")
    assert tied.low == tied.high == tied.eq_low == tied.eq_high and not tied.spread_seen
    assert label(tied, 0.05, +1, 0.5) == "inconclusive"
    # the same mean with any spread at all is judged by its interval as before
    spread = against_value([-1.5 / 128 - 1e-4, -1.5 / 128 + 1e-4, -1.5 / 128], 0.0, unit="build")
    assert spread.spread_seen and label(spread, 0.05, +1, 0.5) == "equivalent"
    # rounding noise is no spread
    assert not against_value([0.1 + 0.2, 0.3, 0.3], 0.0).spread_seen
    assert not welch([0.5, 0.5], [0.5, 0.5]).spread_seen and welch([0.5, 0.6], [0.5, 0.5]).spread_seen


def test_the_exact_tests_fall_back_to_a_seeded_monte_carlo_beyond_the_limit(monkeypatch):
    a, b = [0.9, 0.7, 0.85, 0.6, 0.95], [0.5, 0.65, 0.4, 0.7, 0.55]
    exact = permutation_p(a, b)[0]
    flips = sign_flip_p([x - y for x, y in zip(a, b)])[0]
    monkeypatch.setattr(inference, "EXACT_LIMIT", 10)
    sampled, floor = permutation_p(a, b)
    assert sampled == pytest.approx(exact, abs=0.005) and floor == pytest.approx(1 / (inference.MONTE_CARLO + 1))
    assert sign_flip_p([x - y for x, y in zip(a, b)])[0] == pytest.approx(flips, abs=0.005)
    assert permutation_p(a, b) == (sampled, floor)  # seeded


def test_fisher_exact_against_scipy():
    assert fisher_exact(2, 4, 0, 4) == pytest.approx(0.4285714)  # #62: two fallen runs of four against none
    for table in ((3, 10, 7, 10), (0, 5, 5, 5), (1, 8, 1, 2), (4, 4, 4, 4)):
        k_a, n_a, k_b, n_b = table
        ref = stats.fisher_exact([[k_a, n_a - k_a], [k_b, n_b - k_b]]).pvalue
        assert fisher_exact(*table) == pytest.approx(ref)
    with pytest.raises(ValueError, match="out of range"):
        fisher_exact(5, 4, 0, 4)


def test_holm_steps_down_and_stays_monotone():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5]) == [0.5]
    assert holm([0.6, 0.01]) == pytest.approx([0.6, 0.02])
    assert holm([0.4, 0.4, 0.4]) == pytest.approx([1.0, 1.0, 1.0])


def _estimate(mean: float, half: float, p: float) -> Estimate:
    return Estimate(mean, mean - half, mean + half, mean - 0.8 * half, mean + 0.8 * half, p, p, 0.001, 10.0,
                    (8, 8), "run", 0.1, False)


def test_labels_claim_a_direction_only_for_a_significant_effect_of_at_least_the_minimum():
    assert label(_estimate(-0.2, 0.05, 0.001), 0.1, -1, 0.001) == "reproduced"
    assert label(_estimate(+0.2, 0.05, 0.001), 0.1, -1, 0.001) == "reversed"
    assert label(_estimate(0.03, 0.02, 0.001), 0.1, +1, 0.001) == "equivalent"  # significant but too small
    assert label(_estimate(0.03, 0.2, 0.5), 0.1, +1, 0.5) == "inconclusive"  # an interval over 0 is not "not reproduced"
    assert label(_estimate(0.3, 0.1, 0.01), 0.1, +1, 0.08) == "inconclusive"  # Holm's adjusted p decides
    assert label(None, 0.1, +1, 1.0) == "inconclusive"
    with pytest.raises(ValueError, match="minimum effect"):
        label(_estimate(0.3, 0.1, 0.001), 0.0, +1, 0.001)


def test_exact_floors_and_the_runs_a_comparison_needs():
    assert exact_floor(4, paired=False) == pytest.approx(2 / 70) and exact_floor(4, paired=True) == 2 / 16
    # four runs a row can never pass Holm over three: 2/70 > 0.05/3; six can (2/924)
    assert units_needed(0.0, 0.05, family=3, paired=False) == 5  # 2/252 < 0.0167, 2/70 not
    assert units_needed(0.0, 0.05, family=1, paired=True) == 6  # 2/64 < 0.05, 2/32 not
    n = units_needed(0.168, 0.05, family=3, paired=False)
    level, df = 0.05 / 3, 2 * n - 2

    def power(m: int) -> float:  # the t statistic beyond the critical value on the effect's side
        d = 2 * m - 2
        return stats.nct.sf(stats.t.ppf(1 - level / 2, d), d, 0.05 / (0.168 * math.sqrt(2 / m)))

    assert power(n) >= 0.8 > power(n - 1) and df > 0
    assert units_needed(0.3, 0.1, family=1, paired=False, power=0.9) > units_needed(0.3, 0.1, family=1, paired=False)
    assert units_needed(50.0, 0.01, family=1, paired=True) is None  # beyond MAX_UNITS
