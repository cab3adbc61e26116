"""The RL budget chosen on validation, the run-to-run spread part of the criterion (#62 item 3).

SPEC §6 asks for RL's settings to be chosen once, for vanilla GRPO, and kept for every row. The
reproduction's default (lr 1e-4, 12 steps) was chosen on version 2's test split from one
PARA-GRPO seed; `make rl-budget` trains vanilla GRPO at each budget of a profile
(`reproduce.variants`: learning rate and steps) from the same SFT model, one run per seed, and
evaluates each run on the validation split. The rule, fixed here before any run of the profile:

- a budget's score is the mean of its runs' validation accuracies less their standard deviation
  (sample SD, in points): what a typical bad run of that budget gets, so that a budget whose
  runs sometimes fall loses to one a little lower on average that does not;
- only budgets with `MIN_RUNS` or more runs are scored (an SD from fewer says little);
- the chosen budget is the first, in the profile's order, whose score is within `TIE_POINTS`
  of the best: the profile lists the default first, so another budget must beat it by more
  than that. The band is a tie-break, not a test: with run SDs of 13-19 points a score moves
  by more than a point between draws of four runs, and the report says so beside the choice.

Nothing here reads the test split. Pure functions of the runs (the fields of
`measurements.ModelRun`); `report_tables.report_markdown` renders `choice_markdown`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean, stdev

MIN_RUNS = 3
TIE_POINTS = 1.0


@dataclass(frozen=True)
class BudgetScore:
    label: str  # the row's label: `vanilla_grpo` or `vanilla_grpo.<variant>`
    runs: int
    mean: float  # validation accuracy, points
    sd: float  # sample SD over runs, points

    @property
    def score(self) -> float:
        return self.mean - self.sd


def budget_scores(runs: Sequence, row: str = "vanilla_grpo") -> list[BudgetScore]:
    """Each budget of `row` (the row itself and its variants `row.<name>`), in the order the runs
    list them, with its validation mean and SD; budgets with fewer than `MIN_RUNS` validated runs
    are left out."""
    labels = list(dict.fromkeys(r.row for r in runs if r.row == row or r.row.startswith(f"{row}.")))
    scores = []
    for label in labels:
        values = [100 * float(r.accuracy_val) for r in runs if r.row == label and r.accuracy_val is not None]
        if len(values) < MIN_RUNS:
            continue
        scores.append(BudgetScore(label, len(values), fmean(values), stdev(values)))
    return scores


def choose(scores: Sequence[BudgetScore]) -> BudgetScore | None:
    """The first budget within `TIE_POINTS` of the best score; None with fewer than two budgets
    (nothing to choose between)."""
    if len(scores) < 2:
        return None
    best = max(s.score for s in scores)
    return next(s for s in scores if s.score >= best - TIE_POINTS)


def choice_markdown(runs: Sequence, row: str = "vanilla_grpo") -> str:
    """The scores and the choice ("" when the runs hold fewer than two scored budgets of `row`)."""
    scores = budget_scores(runs, row)
    chosen = choose(scores)
    if chosen is None:
        return ""
    lines = ["| budget | runs | validation accuracy, mean (%) | SD (points) | score: mean - SD |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {s.label}{' (chosen)' if s is chosen else ''} | {s.runs} | {s.mean:.1f} | {s.sd:.1f} | {s.score:.1f} |"
              for s in scores]
    return "\n".join(lines) + (f"\n\nChosen: `{chosen.label}`, the first budget in the profile's order within "
                               f"{TIE_POINTS:g} point of the best score (`miniature.budget_choice`, fixed before "
                               "the runs); the test split played no part. A tie-break, not a test: a score's "
                               "own draw-to-draw noise is wider than the band.")
