"""Statistics of the miniature reproduction's runs over seeds: a mean with its 95 % t-interval
(`interval95`), the runs of each row in the order they came (`rows_in_order`, `by_row`), and the
runs whose first step stands for the SFT policy (`sft_training_start`). The tests behind the
verdicts are `inference.py`'s, their findings `verdicts.py`'s."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from paravt_core.miniature.measurements import ModelRun


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int

    def cell(self, scale: float = 1.0, digits: int = 1) -> str:
        if self.n < 2:
            return f"{scale * self.mean:.{digits}f}"
        half = scale * (self.high - self.mean)
        return f"{scale * self.mean:.{digits}f} ± {half:.{digits}f}"


def interval95(values: Sequence[float]) -> Interval | None:
    """Mean and two-sided 95 % Student t interval of `values` (None when there are none)."""
    values = [float(v) for v in values]
    if not values:
        return None
    n, mean = len(values), sum(values) / len(values)
    if n == 1:
        return Interval(mean, mean, mean, 1)
    from scipy import stats

    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def rows_in_order(runs: Sequence[ModelRun]) -> list[str]:
    return list(dict.fromkeys(r.row for r in runs))


def by_row(runs: Sequence[ModelRun], row: str) -> list[ModelRun]:
    return [r for r in runs if r.row == row]


def sft_training_start(runs: Sequence[ModelRun], prefer: str = "paragrpo") -> list[ModelRun]:
    """The RL runs whose first step stands for the SFT policy's training-time fτ / κ."""
    rl_rows = [row for row in rows_in_order(runs) if row != "sft"]
    chosen = prefer if prefer in rl_rows else (rl_rows[0] if rl_rows else None)
    return by_row(runs, chosen) if chosen else []
