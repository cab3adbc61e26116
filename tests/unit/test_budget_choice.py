"""#62 item 3: the RL budget is chosen on validation by mean less SD, the default kept on a tie."""

from __future__ import annotations

import pytest

from paravt_core.miniature import budget_choice
from paravt_core.miniature.measurements import ModelRun
from paravt_core.miniature.report_tables import report_markdown


def _budget(label: str, val: list[float], test: float = 0.5) -> list[ModelRun]:
    return [ModelRun(label, seed, test, test, 2.0, accuracy_val=v) for seed, v in enumerate(val)]


def test_a_budget_whose_runs_fall_loses_to_a_steadier_one_a_little_lower_on_average():
    runs = [*_budget("vanilla_grpo", [0.70, 0.68, 0.72, 0.70]),  # mean 70, SD 1.63
            *_budget("vanilla_grpo.lr_double", [0.90, 0.90, 0.45, 0.88]),  # mean 78.25, SD 22.19
            *_budget("paragrpo", [0.99, 0.99, 0.99])]  # another row: not a budget of vanilla's
    scores = budget_choice.budget_scores(runs)
    assert [s.label for s in scores] == ["vanilla_grpo", "vanilla_grpo.lr_double"]
    assert scores[1].mean == pytest.approx(78.25) and scores[1].sd == pytest.approx(22.187, abs=0.001)
    assert budget_choice.choose(scores).label == "vanilla_grpo"


def test_the_first_budget_within_a_point_of_the_best_is_kept_and_a_clear_winner_changes_it():
    default = _budget("vanilla_grpo", [0.70, 0.70, 0.70])
    assert budget_choice.choose(budget_choice.budget_scores(
        [*default, *_budget("vanilla_grpo.steps_24", [0.705, 0.705, 0.705])])).label == "vanilla_grpo"
    assert budget_choice.choose(budget_choice.budget_scores(
        [*default, *_budget("vanilla_grpo.steps_24", [0.75, 0.75, 0.76])])).label == "vanilla_grpo.steps_24"


def test_budgets_with_too_few_validated_runs_are_not_scored_and_one_budget_chooses_nothing():
    runs = [*_budget("vanilla_grpo", [0.7, 0.6, 0.8]), *_budget("vanilla_grpo.lr_half", [0.9, 0.9]),
            ModelRun("vanilla_grpo.lr_half", 2, 0.5, 0.5, 2.0)]  # not evaluated on validation
    scores = budget_choice.budget_scores(runs)
    assert [s.label for s in scores] == ["vanilla_grpo"]
    assert budget_choice.choose(scores) is None and budget_choice.choice_markdown(runs) == ""


def test_the_report_shows_the_choice_only_for_a_budget_profile():
    runs = [ModelRun("sft", None, 0.5, 0.4, 2.5, accuracy_val=0.5), *_budget("vanilla_grpo", [0.70, 0.68, 0.72]),
            *_budget("vanilla_grpo.lr_half", [0.75, 0.74, 0.76])]
    text = report_markdown(runs, "steps.png", "budget")
    assert "## The RL budget chosen on validation" in text
    assert "| vanilla_grpo.lr_half (chosen) | 3 | 75.0 | 1.0 | 74.0 |" in text
    plain = report_markdown([runs[0], *_budget("vanilla_grpo", [0.70, 0.68, 0.72])], "steps.png", "default")
    assert "chosen on validation" not in plain
