"""Verdicts at their sample size: the training run is the unit, the SFT build a level (#62).

The reproduction's rows differ by their RL runs far more than by the questions (runs of one row
46.9 to 93.8 % on the same 128 questions, docs/miniature.md), so every comparison here is made on
run-level values (one number per run: its held-out accuracy, probe κ or probe format), never on
pooled questions. An earlier version resampled runs and questions in a percentile bootstrap; with
four runs a row it treated the spread between runs as known and its intervals were far too
narrow (it called a 22-point fall "reversed" where a t test on the same runs gives p 0.16).

- `welch`: two rows of runs from one SFT build: the difference of their run means, Welch's t
  test (unequal variances, Welch-Satterthwaite degrees of freedom) with t-based intervals, and
  the exact permutation test over runs (every split of the pooled runs into the two rows' sizes).
- `against_value`: a row of runs against one fixed number (the SFT model the runs started from,
  which is one run); and, with the value 0, per-build differences when there are several builds.
  One-sample t with t-based intervals, and the exact sign-flip test (every sign pattern).
- Several SFT builds: a row difference is taken within each build (the mean of its runs of each
  row, or the build's SFT model), and the builds' differences are the units (`against_value`
  at 0). For a balanced design this is the mixed model's test of the row effect with build as a
  random level (the row x build interaction is the error term), so what it finds holds across
  builds. With one build nothing generalizes past that build, whatever the p-value.
- `holm`: Holm's step-down adjustment over a family of comparisons fixed before any run.
- `label`: reproduced / reversed / equivalent / inconclusive against a minimum effect fixed
  before the run. A direction is claimed only when the Holm-adjusted p is below alpha for BOTH
  the t test and the exact test (`Estimate.p`, the larger of the two) and the estimate is at
  least the minimum effect; "equivalent" when the 1 - 2 alpha t interval lies within plus or
  minus the minimum effect (two one-sided tests) and the units show a spread at all; otherwise
  inconclusive. Accuracy on 128 questions is discrete, so two builds' differences can tie
  exactly (part 6-7 of the conclusive profile: -1.2 points in both); the t interval is then a
  point, which says the spread was not seen, not that it is small, and claims no equivalence.
- `units_needed`: the power calculation for an inconclusive comparison (see its docstring).
- `fisher_exact`: the share of runs that fell, one row against another (two-sided).

All functions are pure. The exact tests enumerate every relabelling up to `EXACT_LIMIT` of them
(4 + 4 runs: 70; sign flips of 4 runs: 16); beyond that a seeded Monte Carlo of `MONTE_CARLO`
relabellings stands in (p = (hits + 1) / (draws + 1)).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

ALPHA = 0.05
POWER = 0.8
LABELS = ("reproduced", "reversed", "equivalent", "inconclusive")
EXACT_LIMIT = 200_000
MONTE_CARLO = 100_000
MAX_UNITS = 10_000  # `units_needed` gives up above this many runs (or builds)
_TIE = 1e-9  # relative: a relabelling whose statistic equals the observed one up to rounding counts as a hit


@dataclass(frozen=True)
class Estimate:
    """`a - b` of two rows' run-level values (or of per-build differences), with its tests.

    Attributes:
        mean: the difference of the means (a - b).
        low, high: the 1 - alpha t interval; eq_low, eq_high: the 1 - 2 alpha one (equivalence).
        p_t: two-sided p of the t test (Welch's, or one-sample); p_exact: of the exact test.
        p_floor: the smallest p_exact these sizes can give at all (2 / relabellings).
        df: the t test's degrees of freedom.
        units: runs (or builds) of a and of b; b's is 1 for a fixed value.
        unit: "run" or "build".
        sd: the spread a power calculation starts from: the pooled SD of the two rows' runs, or
            the SD of the values tested against a fixed value.
        paired: True for a one-sample design (against a value, or builds' differences).
    """

    mean: float
    low: float
    high: float
    eq_low: float
    eq_high: float
    p_t: float
    p_exact: float
    p_floor: float
    df: float
    units: tuple[int, int]
    unit: str
    sd: float
    paired: bool

    @property
    def spread_seen(self) -> bool:
        """False when the units show no spread (up to rounding): one row's values, or each of two
        rows', all alike. The t interval is then a point and measures nothing (`label` claims no
        equivalence from it)."""
        return self.sd > _TIE * max(1.0, abs(self.mean))

    @property
    def p(self) -> float:
        """What the verdict adjusts: a direction needs both tests (the larger p)."""
        return max(self.p_t, self.p_exact)


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _var(values: Sequence[float]) -> float:
    m = _mean(values)
    return math.fsum((v - m) ** 2 for v in values) / (len(values) - 1)


def _t_parts(mean: float, se: float, df: float, alpha: float) -> tuple[float, float, float, float, float]:
    """(low, high, eq_low, eq_high, p) of a t statistic `mean / se` with `df` degrees of freedom.
    A zero standard error (every run alike) gives a point interval and p 1 (no difference) or 0."""
    from scipy import stats

    if se == 0:
        return mean, mean, mean, mean, 1.0 if mean == 0 else 0.0
    half, eq_half = stats.t.ppf(1 - alpha / 2, df) * se, stats.t.ppf(1 - alpha, df) * se
    p = float(2 * stats.t.sf(abs(mean) / se, df))
    return mean - half, mean + half, mean - eq_half, mean + eq_half, min(1.0, p)


def _hits(observed: float, statistics) -> tuple[int, int]:
    """(relabellings at least as extreme as `observed`, relabellings) of an iterable of |statistic|."""
    bar = observed - _TIE * max(1.0, observed)
    values = list(statistics)
    return sum(1 for v in values if v >= bar), len(values)


def permutation_p(a: Sequence[float], b: Sequence[float], seed: int = 0) -> tuple[float, float]:
    """(two-sided p, smallest possible p) of the exact permutation test of `mean(a) - mean(b)`:
    every way of splitting the pooled runs into groups of len(a) and len(b) is equally likely
    under "the row makes no difference"; the statistic is |difference of means|."""
    pooled = [float(v) for v in (*a, *b)]
    n, k, total = len(pooled), len(a), math.fsum(pooled)
    observed = abs(_mean(a) - _mean(b))
    splits = math.comb(n, k)

    def statistic(chosen) -> float:
        s = math.fsum(chosen)
        return abs(s / k - (total - s) / (n - k))

    if splits <= EXACT_LIMIT:
        count, drawn = _hits(observed, (statistic(c) for c in itertools.combinations(pooled, k)))
        # two rows of one size: a split and its mirror give the same |difference|
        return count / drawn, (2 if n == 2 * k else 1) / splits
    import numpy as np

    chosen = np.random.default_rng(seed).random((MONTE_CARLO, n)).argsort(axis=1)[:, :k]  # [draws, k]
    sums = np.asarray(pooled)[chosen].sum(axis=1)
    count, drawn = _hits(observed, np.abs(sums / k - (total - sums) / (n - k)))
    return (count + 1) / (drawn + 1), 1 / (drawn + 1)


def sign_flip_p(values: Sequence[float], seed: int = 0) -> tuple[float, float]:
    """(two-sided p, smallest possible p) of the exact sign-flip test of mean(values) = 0: under
    a distribution symmetric about 0 each of the 2^n sign patterns is equally likely; the
    statistic is |mean|. All values 0: p 1."""
    values = [float(v) for v in values]
    n = len(values)
    observed = abs(_mean(values))
    if observed == 0:
        return 1.0, 2 / 2 ** n
    if 2 ** n <= EXACT_LIMIT:
        count, drawn = _hits(observed, (abs(math.fsum(s * v for s, v in zip(signs, values))) / n
                                        for signs in itertools.product((1, -1), repeat=n)))
        return count / drawn, 2 / drawn
    import numpy as np

    signs = np.random.default_rng(seed).choice((-1.0, 1.0), (MONTE_CARLO, n))  # [draws, n]
    count, drawn = _hits(observed, np.abs((signs * np.asarray(values)).mean(axis=1)))
    return (count + 1) / (drawn + 1), 1 / (drawn + 1)


def welch(a: Sequence[float], b: Sequence[float], alpha: float = ALPHA, unit: str = "run") -> Estimate:
    """Row A's runs against row B's (module docstring). Each row needs at least 2 runs."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch's test needs at least 2 {unit}s a row, got {len(a)} and {len(b)}")
    va, vb = _var(a), _var(b)
    mean = _mean(a) - _mean(b)
    wa, wb = va / len(a), vb / len(b)
    se = math.sqrt(wa + wb)
    # Welch-Satterthwaite; with no spread at all the pooled df stands (the interval is a point anyway)
    df = (wa + wb) ** 2 / (wa ** 2 / (len(a) - 1) + wb ** 2 / (len(b) - 1)) if se > 0 else len(a) + len(b) - 2
    low, high, eq_low, eq_high, p_t = _t_parts(mean, se, df, alpha)
    p_exact, floor = permutation_p(a, b)
    return Estimate(mean, low, high, eq_low, eq_high, p_t, p_exact, floor, df, (len(a), len(b)), unit,
                    math.sqrt((va + vb) / 2), paired=False)


def against_value(a: Sequence[float], value: float, alpha: float = ALPHA, unit: str = "run") -> Estimate:
    """Runs of one row against one fixed number, or (value 0) builds' differences (module
    docstring). Needs at least 2 values."""
    if len(a) < 2:
        raise ValueError(f"a one-sample test needs at least 2 {unit}s, got {len(a)}")
    d = [float(v) - value for v in a]
    sd = math.sqrt(_var(d))
    mean, se, df = _mean(d), sd / math.sqrt(len(d)), len(d) - 1
    low, high, eq_low, eq_high, p_t = _t_parts(mean, se, df, alpha)
    p_exact, floor = sign_flip_p(d)
    return Estimate(mean, low, high, eq_low, eq_high, p_t, p_exact, floor, df, (len(d), 1), unit, sd, paired=True)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given (monotone, capped at 1)."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted = [0.0] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def label(estimate: Estimate | None, min_effect: float, expected_sign: int, adjusted_p: float | None,
          alpha: float = ALPHA) -> str:
    """reproduced / reversed / equivalent / inconclusive (module docstring). `expected_sign`: +1
    when the paper's finding is a rise of a - b, -1 a fall. `adjusted_p`: Holm's adjustment of
    `estimate.p` within its family."""
    if min_effect <= 0:
        raise ValueError(f"a minimum effect must be positive, got {min_effect}")
    if expected_sign not in (1, -1):
        raise ValueError(f"expected_sign must be +1 or -1, got {expected_sign}")
    if estimate is None or adjusted_p is None:
        return "inconclusive"
    if adjusted_p < alpha and abs(estimate.mean) >= min_effect:
        return "reproduced" if math.copysign(1, estimate.mean) == expected_sign else "reversed"
    if estimate.spread_seen and -min_effect < estimate.eq_low and estimate.eq_high < min_effect:
        return "equivalent"
    return "inconclusive"


def exact_floor(n: int, paired: bool) -> float:
    """The smallest two-sided p the exact test can give with n units a row (two rows of n: 2 / C(2n, n);
    one row against a value: 2 / 2^n)."""
    return 2 / 2 ** n if paired else 2 / math.comb(2 * n, n)


def units_needed(sd: float, min_effect: float, family: int, paired: bool, alpha: float = ALPHA,
                 power: float = POWER) -> int | None:
    """Runs a row (or builds) for a comparison like this one to detect `min_effect` with `power`.

    The power calculation: the t test at two-sided level alpha / family (Bonferroni, Holm's
    level for the smallest p of its family); its power, the chance the t statistic passes the
    critical value on the effect's side, from the noncentral t distribution with the pilot's SD
    taken as the truth: two rows of n runs each, df 2n - 2 and noncentrality
    effect / (sd sqrt(2 / n)); one row against a value (or n builds' differences), df n - 1 and
    effect sqrt(n) / sd. The exact test must also be able to reach that level
    (`exact_floor(n) < alpha / family`). Returns the smallest such n (at least 2), None above
    `MAX_UNITS` (a bisection: both conditions only improve with n).
    """
    from scipy import stats

    if sd < 0 or min_effect <= 0 or family < 1:
        raise ValueError("the SD must be >= 0, the minimum effect > 0 and the family at least 1")
    level = alpha / family

    def enough(n: int) -> bool:  # both monotone in n: the exact floor falls, the power rises
        if exact_floor(n, paired) >= level:
            return False
        if sd == 0:
            return True
        if paired:
            df, ncp = n - 1, min_effect * math.sqrt(n) / sd
        else:
            df, ncp = 2 * n - 2, min_effect / (sd * math.sqrt(2 / n))
        critical = stats.t.ppf(1 - level / 2, df)
        return stats.nct.sf(critical, df, ncp) >= power  # rejection on the effect's side

    if not enough(MAX_UNITS):
        return None
    low, high = 1, MAX_UNITS  # enough(high), not enough(low)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


def fisher_exact(k_a: int, n_a: int, k_b: int, n_b: int) -> float:
    """Two-sided p of Fisher's exact test that rows A and B share one rate of an outcome, from
    k_a of n_a and k_b of n_b runs: the sum of the hypergeometric probabilities of the tables
    with the margins observed that are no more likely than the observed one."""
    if not (0 <= k_a <= n_a and 0 <= k_b <= n_b) or n_a + n_b == 0:
        raise ValueError(f"counts out of range: {k_a} of {n_a}, {k_b} of {n_b}")
    k, n = k_a + k_b, n_a + n_b

    def probability(x: int) -> float:
        return math.comb(n_a, x) * math.comb(n_b, k - x) / math.comb(n, k)

    observed = probability(k_a)
    tables = range(max(0, k - n_b), min(k, n_a) + 1)
    return min(1.0, math.fsum(p for x in tables if (p := probability(x)) <= observed * (1 + 1e-7)))
