"""Verdicts that can tell: a training run is the unit of the miniature's comparisons.

The last reproduction ranked rows by a paired bootstrap over questions with each row's runs
fixed: its half-width was about 4 points while runs of one row differed by 14-15 points (SD
over seeds, and over frame-budget draws of one seed; docs/miniature.md). Question noise was
counted, run noise was not. Here both are:

- `two_level`: the difference of two rows' means of a per-question measure (correct or not,
  tool calls, answers in format), resampled at two levels: the runs of each row with
  replacement, then the questions, the same resampled questions for both rows (paired, as the
  questions are shared). A row of one run (the SFT model) has nothing to resample at the first
  level. Percentile interval at 1 - alpha, the equivalence interval at 1 - 2 alpha (two one-sided
  tests) and a two-sided bootstrap p-value for "no difference".
- `holm`: Holm's step-down adjustment over the comparisons of one finding.
- `label`: reproduced / reversed / equivalent / inconclusive against a minimum effect fixed
  before the run: a direction is claimed only when the adjusted p-value is below alpha AND the
  estimate is at least the minimum effect; "equivalent" when the whole equivalence interval
  lies within plus or minus the minimum effect; anything else is inconclusive, however large
  the point estimate.
- `runs_needed`: runs per row for a two-row comparison to resolve a minimum effect, from the
  between-run SD a pilot measured (normal approximation).

With 3 runs a row the first level can draw only 10 distinct multisets of runs and the
percentile bootstrap understates their spread (a known small-sample bias); `MIN_RUNS` makes a
comparison with fewer runs on an RL side inconclusive by rule. All functions are pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

ALPHA = 0.05
MIN_RUNS = 4
LABELS = ("reproduced", "reversed", "equivalent", "inconclusive")

PerQuestion = Mapping[str, float]  # question id -> the measure for that question in one run


@dataclass(frozen=True)
class Estimate:
    """`a - b` of two rows' mean per-question measure, with its resampling distribution's summaries."""

    mean: float
    low: float  # 1 - alpha percentile interval
    high: float
    eq_low: float  # 1 - 2 alpha interval, for the equivalence test
    eq_high: float
    p: float  # two-sided bootstrap p-value of "a - b = 0"
    runs: tuple[int, int]
    questions: int


def _resampled_means(values, run_counts, question_counts):
    """Per resample s: the mean over its drawn runs and drawn questions, from how often each
    run (`run_counts` [S, R]) and each question (`question_counts` [S, n]) was drawn."""
    import numpy as np

    total = run_counts.sum(axis=1) * question_counts.sum(axis=1)  # [S]
    return np.einsum("sr,rq,sq->s", run_counts, values, question_counts) / total


def two_level(a: Sequence[PerQuestion], b: Sequence[PerQuestion], samples: int = 4000, seed: int = 0,
              alpha: float = ALPHA) -> Estimate | None:
    """Row A minus row B (module docstring). Only questions every run of both rows has a value
    for count; None when there are none or a row has no run."""
    import numpy as np

    if not a or not b:
        return None
    ids = sorted(set.intersection(*(set(run) for run in (*a, *b))))
    if not ids:
        return None
    va = np.array([[float(run[q]) for q in ids] for run in a])  # [Ra, n]
    vb = np.array([[float(run[q]) for q in ids] for run in b])  # [Rb, n]
    n = len(ids)
    rng = np.random.default_rng(seed)

    def counts(k: int, size: int):  # [S, size]: how often each of `size` items is drawn in k draws
        picks = rng.integers(0, size, (samples, k))
        out = np.zeros((samples, size))
        np.add.at(out, (np.arange(samples)[:, None], picks), 1.0)
        return out

    ra, rb, qs = counts(len(va), len(va)), counts(len(vb), len(vb)), counts(n, n)
    draws = np.sort(_resampled_means(va, ra, qs) - _resampled_means(vb, rb, qs))  # paired: the same questions
    point = float(va.mean() - vb.mean())

    def quantile(f: float) -> float:
        return float(draws[min(samples - 1, max(0, int(f * samples)))])

    below, above = int((draws <= 0).sum()), int((draws >= 0).sum())
    p = min(1.0, 2 * (min(below, above) + 1) / (samples + 1))
    return Estimate(point, quantile(alpha / 2), quantile(1 - alpha / 2), quantile(alpha), quantile(1 - alpha), p,
                    (len(va), len(vb)), n)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given (monotone, capped at 1)."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted = [0.0] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def label(estimate: Estimate | None, min_effect: float, expected_sign: int, adjusted_p: float,
          alpha: float = ALPHA, rl_runs: int | None = None) -> str:
    """reproduced / reversed / equivalent / inconclusive (module docstring). `expected_sign`:
    +1 when the paper's finding is a rise of a - b, -1 a fall. `rl_runs`: the fewest runs of an
    RL row in the comparison (below `MIN_RUNS`: inconclusive)."""
    if min_effect <= 0:
        raise ValueError(f"a minimum effect must be positive, got {min_effect}")
    if expected_sign not in (1, -1):
        raise ValueError(f"expected_sign must be +1 or -1, got {expected_sign}")
    if estimate is None or (rl_runs is not None and rl_runs < MIN_RUNS):
        return "inconclusive"
    if adjusted_p < alpha and abs(estimate.mean) >= min_effect:
        return "reproduced" if math.copysign(1, estimate.mean) == expected_sign else "reversed"
    if -min_effect < estimate.eq_low and estimate.eq_high < min_effect:
        return "equivalent"
    return "inconclusive"


def runs_needed(between_run_sd: float, min_effect: float, alpha: float = ALPHA, power: float = 0.8) -> int:
    """Runs per row for a two-row comparison of means to detect `min_effect` with `power` at
    two-sided `alpha`, given the between-run SD of one run's measure (normal approximation:
    n = 2 ((z_{1-alpha/2} + z_power) sd / effect)^2), at least MIN_RUNS."""
    if between_run_sd < 0 or min_effect <= 0:
        raise ValueError("the SD must be >= 0 and the minimum effect > 0")
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    return max(MIN_RUNS, math.ceil(2 * (z * between_run_sd / min_effect) ** 2))
