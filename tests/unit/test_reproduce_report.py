"""The miniature reproduction's report: intervals, Table 2 cells, findings, figure (#15)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
from dataclasses import asdict

import pytest

from paravt_core.miniature.intervals import interval95
from paravt_core.miniature.measurements import ModelRun, group_breakdown, held_out_groups, read_steps, runs_from_json
from paravt_core.miniature.report_plot import plot_steps
from paravt_core.miniature.report_tables import (
    findings,
    group_table_markdown,
    hosts_markdown,
    report_markdown,
    table_markdown,
)
from paravt_core.miniature.reproduce import read_report_dir, write_report


def _steps(kappas, f_taus, accs=None):
    accs = accs or [0.5] * len(kappas)
    return [{"step": i + 1, "kappa": k, "f_tau_fixed": f, "reward_acc": a}
            for i, (k, f, a) in enumerate(zip(kappas, f_taus, accs))]


def _runs():
    return [
        ModelRun("sft", None, accuracy=0.50, accuracy_direct=0.20, eval_tool_calls=2.8),
        ModelRun("vanilla_grpo", 0, 0.55, 0.25, 0.4, _steps([2.5, 1.0, 0.2, 0.1, 0.0], [0.4, 0.3, 0.2, 0.2, 0.2])),
        ModelRun("vanilla_grpo", 1, 0.53, 0.25, 0.5, _steps([2.6, 1.2, 0.4, 0.2, 0.0], [0.4, 0.3, 0.2, 0.1, 0.2])),
        ModelRun("paragrpo", 0, 0.66, 0.25, 2.9, _steps([2.5, 2.6, 2.7, 2.8, 2.9], [0.5, 0.6, 0.7, 0.7, 0.8])),
        ModelRun("paragrpo", 1, 0.64, 0.24, 2.8, _steps([2.4, 2.6, 2.8, 2.8, 2.7], [0.5, 0.6, 0.6, 0.7, 0.8])),
    ]


def test_interval95_is_the_student_t_interval():
    iv = interval95([1.0, 2.0, 3.0])
    assert iv.mean == pytest.approx(2.0)
    # sd = 1, n = 3, t(0.975, 2) = 4.302653
    assert iv.high - iv.mean == pytest.approx(4.302653 / math.sqrt(3))
    assert iv.low == pytest.approx(2.0 - 4.302653 / math.sqrt(3))
    # beyond 11 runs too a t quantile, not the normal 1.96: t(0.975, 14) = 2.144787
    values = [float(i % 2) for i in range(15)]
    wide = interval95(values)
    assert wide.high - wide.mean == pytest.approx(2.144787 * statistics.stdev(values) / math.sqrt(15))
    assert interval95([]) is None
    single = interval95([0.4])
    assert (single.low, single.high, single.n) == (0.4, 0.4, 1)


def test_table_has_one_line_per_row_with_gains_and_last_step_means():
    text = table_markdown(_runs())
    lines = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| row")]
    assert [line.split(" | ")[0][2:] for line in lines] == ["sft", "vanilla_grpo", "paragrpo"]
    paragrpo = lines[2].split(" | ")
    assert paragrpo[1] == "2"
    assert paragrpo[2].startswith("65.0 ± ")  # mean of 66 and 64
    assert paragrpo[5].startswith("15.0 ± ")  # gain over SFT: +16 and +14
    # training κ: the mean over seeds of each run's last 3 steps (2.8 and 2.7667)
    assert paragrpo[8].startswith(f"{(2.8 + (2.8 + 2.8 + 2.7) / 3) / 2:.2f}")
    sft = lines[0].split(" | ")
    assert sft[5] == "–"  # no gain of SFT over itself
    assert sft[8].startswith("2.45")  # SFT training κ = paragrpo's first steps (2.5, 2.4)
    # runs from before the transcript-scope fτ (and the answer format) were logged leave those columns empty
    assert all(line.split(" | ")[9] == "–" and line.split(" | ")[10] == "–" and line.split(" | ")[11] == "–" for line in lines)
    # and runs without the held-out probe leave its two columns empty
    assert all(line.split(" | ")[11] == "–" and line.split(" | ")[12] == "– |" for line in lines)


def test_table_shows_the_sampled_probe_per_row_as_a_mean_over_runs():
    runs = [ModelRun("sft", None, 0.5, 0.2, 2.8, probe_calls={"a": 2.0, "b": 3.0}, probe_format={"a": 1.0, "b": 0.5}),
            ModelRun("vanilla_grpo", 0, 0.5, 0.2, 0.1, probe_calls={"a": 0.0, "b": 1.0}, probe_format={"a": 0.0, "b": 0.0}),
            ModelRun("vanilla_grpo", 1, 0.5, 0.2, 0.1, probe_calls={"a": 1.0, "b": 1.0}, probe_format={"a": 0.5, "b": 0.5})]
    lines = [line for line in table_markdown(runs).splitlines() if line.startswith("| ") and not line.startswith("| row")]
    assert lines[0].split(" | ")[11] == "2.50" and lines[0].split(" | ")[12] == "0.75 |"
    assert lines[1].split(" | ")[11].startswith("0.75 ± ")  # runs' means 0.5 and 1.0
    assert lines[1].split(" | ")[12].startswith("0.25 ± ")  # runs' means 0.0 and 0.5


def test_table_shows_the_held_out_answer_format_where_measured():
    runs = [ModelRun("sft", None, 0.5, 0.2, 2.8, answer_tag_rate=0.99),
            ModelRun("gating_only", 0, 0.5, 0.2, 2.0, _steps([2, 2], [0.5, 0.5]), answer_tag_rate=0.5),
            ModelRun("gating_only", 1, 0.5, 0.2, 2.0, _steps([2, 2], [0.5, 0.5]), answer_tag_rate=1.0),
            ModelRun("gating_only", 2, 0.5, 0.2, 2.0, _steps([2, 2], [0.5, 0.5]))]  # an older run: not measured
    lines = [line for line in table_markdown(runs).splitlines() if line.startswith("| ") and not line.startswith("| row")]
    assert lines[0].split(" | ")[10] == "99.0"
    assert lines[1].split(" | ")[10].startswith("75.0 ± ")  # mean of the two seeds that measured it
    assert runs_from_json(json.dumps([asdict(r) for r in runs])) == runs
    legacy = asdict(runs[0])
    del legacy["answer_tag_rate"]  # runs.json written before the field existed
    assert runs_from_json(json.dumps([legacy]))[0].answer_tag_rate is None


def test_table_shows_the_transcript_scope_format_where_logged():
    runs = [ModelRun("sft", None, 0.5, 0.2, 2.8)]
    for seed, values in ((0, [0.9, 1.0, 1.0, 1.0]), (1, [1.0, 1.0, 1.0, 1.0])):
        steps = [{**s, "f_tau_fixed_transcript": v} for s, v in zip(_steps([2, 2, 2, 2], [0.5] * 4), values)]
        runs.append(ModelRun("paragrpo", seed, 0.5, 0.2, 2.0, steps))
    lines = [line for line in table_markdown(runs).splitlines() if line.startswith("| ") and not line.startswith("| row")]
    assert lines[0].split(" | ")[9].startswith("0.95 ± ")  # SFT: paragrpo's first steps (0.9, 1.0)
    assert lines[1].split(" | ")[9].startswith("1.00 ± ")  # last 3 steps of both seeds
    assert lines[1].split(" | ")[7].startswith("0.50")  # the SPEC's generated-scope column beside it


def test_findings_state_whether_the_targets_are_met():
    text = "\n".join(findings(_runs()))
    assert "gain of 30.0 points (target >= 25: met)" in text
    assert "paragrpo vs SFT: +15.0 points" in text and "NOT met" not in text.split("paragrpo vs SFT")[1]
    weak = [ModelRun("sft", None, 0.30, 0.20, 1.0),
            ModelRun("paragrpo", 0, 0.45, 0.2, 1.0, _steps([1], [0.5])),
            ModelRun("paragrpo", 1, 0.28, 0.2, 1.0, _steps([1], [0.5]))]
    lines = findings(weak)
    assert "(target >= 25: NOT met)" in lines[0]
    assert "interval above 0: NOT met" in lines[1]


def test_with_several_sft_builds_each_run_gains_over_its_own_build_s_model():
    """#62 item 4: a run is held against the SFT model it started from, not the first one listed."""
    runs = [ModelRun("sft", None, 0.50, 0.20, 2.8, sft_build="sft0"),
            ModelRun("sft", None, 0.70, 0.60, 2.8, sft_build="sft1"),
            ModelRun("paragrpo", 0, 0.60, 0.25, 2.9, sft_build="sft0"),
            ModelRun("paragrpo", 0, 0.80, 0.25, 2.9, sft_build="sft1")]
    line = next(line for line in table_markdown(runs).splitlines() if line.startswith("| paragrpo"))
    assert line.split(" | ")[5] == "10.0 ± 0.0"  # +10 each against its own build (+10, +30 against sft0)
    text = "\n".join(findings(runs))
    assert "SFT build sft0 answers 50.0 %" in text and "SFT build sft1 answers 70.0 %" in text
    assert "gain of 10.0 points (target >= 25: NOT met)" in text  # sft1: 70 - 60
    assert "paragrpo vs SFT: +10.0 points" in text and "over 2 seed(s)" in text


def test_findings_set_the_single_mechanism_rows_beside_the_paper_when_run():
    assert not any("Single mechanisms" in line for line in findings(_runs()))
    runs = [*_runs(),
            ModelRun("gating_only", 0, 0.5, 0.2, 2.0, _steps([3.0, 3.0, 2.0, 2.0], [0.1, 0.2, 0.3, 0.4])),
            ModelRun("anchoring_only", 0, 0.5, 0.2, 2.0, _steps([1.0, 0.5, 0.5, 0.5], [0.9, 0.9, 0.9, 0.9]))]
    (line,) = [line for line in findings(runs) if line.startswith("Single mechanisms")]
    # the paper's order; κ and fτ_fixed the means of each run's last 3 steps
    assert line == ("Single mechanisms at the end: anchoring_only κ 0.50, fτ_fixed 0.90 (paper: 0.19, 0.35); "
                    "gating_only κ 2.33, fτ_fixed 0.30 (paper: 1.36, 0.10).")


def test_read_steps_keeps_the_last_record_of_a_repeated_step(tmp_path):
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    rows = [{"step": 1, "kappa": 1.0}, {"step": 2, "kappa": 2.0}, {"step": 2, "kappa": 3.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_steps(run / "model") == [{"step": 1, "kappa": 1.0}, {"step": 2, "kappa": 3.0}]
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        read_steps(tmp_path / "other" / "model")


def test_report_files_are_written(tmp_path):
    report = write_report(_runs(), tmp_path / "report", "test")
    assert report.read_text().startswith("# test")
    assert "![per-step curves](steps.png)" in report.read_text()
    assert (tmp_path / "report" / "steps.png").stat().st_size > 1000
    runs = json.loads((tmp_path / "report" / "runs.json").read_text())
    assert [r["row"] for r in runs] == ["sft", "vanilla_grpo", "vanilla_grpo", "paragrpo", "paragrpo"]


def test_plot_without_rl_rows_still_draws(tmp_path):
    out = plot_steps([ModelRun("sft", None, 0.5, 0.2, 2.0)], tmp_path / "p.png")
    assert out.is_file()


def test_report_from_mlflow_rebuilds_the_logged_measurements(tmp_path):
    from paravt_core.miniature.reproduce import latest_logged

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    write_report(_runs(), tmp_path / "report", "logged", uri, "exp")
    assert latest_logged(uri, "exp") == (_runs(), [], None)  # from before the budget sweep and the clock
    with pytest.raises(ValueError, match="no reproduction run"):
        from paravt_core.tracking import start_stage_run

        start_stage_run(uri, "other", "x", {"stage": "eval"}, {})
        latest_logged(uri, "other")


def _record(sample_id: str, correct: bool, calls: int) -> dict:
    return {"id": sample_id, "correct": correct, "tool_calls": calls}


def test_group_breakdown_counts_accuracy_and_calls_per_group():
    groups = {"1": "first wording", "2": "first wording", "3": "second wording", "4": "second wording"}
    records = [_record("1", True, 3), _record("2", False, 3), _record("3", False, 0), _record("4", True, 2)]
    assert group_breakdown(records, groups) == {
        "first wording": {"n": 2, "accuracy": 0.5, "tool_calls": 3.0},
        "second wording": {"n": 2, "accuracy": 0.5, "tool_calls": 1.0},
    }
    # one group is no breakdown; a record outside the split's questions is an error
    assert group_breakdown(records[:2], groups) == {}
    with pytest.raises(KeyError, match="'9' is not among the split's questions"):
        group_breakdown([_record("9", True, 0)], groups)


def test_held_out_groups_read_the_wording_from_the_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from paravt_core.data.synth.questions import QUESTION_TEMPLATES

    with pytest.raises(FileNotFoundError, match="materialize the evaluation data"):
        held_out_groups(tmp_path)
    first = [t.format(obj="the star") for kind in QUESTION_TEMPLATES.values() for t in kind.values()]
    second = ["What is the colour of the star in this video?", "At what time is the star in this video?"]
    ids = [f"{i:03d}-1" for i in range(len(first) + len(second))]
    pq.write_table(pa.table({"question_id": ids, "question": first + second}), tmp_path / "test.parquet")
    groups = held_out_groups(tmp_path)
    assert [groups[i] for i in ids] == ["first wording"] * len(first) + ["second wording"] * len(second)


def test_group_table_and_report_section_only_where_measured():
    by = {"first wording": {"n": 68, "accuracy": 1.0, "tool_calls": 3.0},
          "second wording": {"n": 60, "accuracy": 0.25, "tool_calls": 0.0}}
    later = {"first wording": {"n": 68, "accuracy": 0.9, "tool_calls": 3.0},
             "second wording": {"n": 60, "accuracy": 0.75, "tool_calls": 2.0}}
    runs = [ModelRun("sft", None, 0.64, 0.25, 1.6, by_group=by),
            ModelRun("paragrpo", 0, 0.8, 0.25, 2.5, by_group=later),
            ModelRun("paragrpo", 1, 0.8, 0.25, 2.5, by_group=later)]
    table = group_table_markdown(runs)
    assert "| sft | 1 | 100.0 | 3.00 | 25.0 | 0.00 |" in table
    assert "| paragrpo | 2 | 90.0 ± 0.0 | 3.00 ± 0.00 | 75.0 ± 0.0 | 2.00 ± 0.00 |" in table
    assert table.endswith("Questions per group: first wording 68, second wording 60.")
    assert "## By question group" in report_markdown(runs, "steps.png", "t")
    assert group_table_markdown(_runs()) == "" and "## By question group" not in report_markdown(_runs(), "s.png", "t")
    assert runs_from_json(json.dumps([asdict(r) for r in runs])) == runs


def test_the_validation_split_gets_its_own_table_only_where_measured():
    from paravt_core.miniature.report_tables import validation_table_markdown

    runs = [ModelRun("sft", None, 0.5, 0.2, 2.8, accuracy_val=0.45, accuracy_direct_val=0.25),
            ModelRun("paragrpo", 0, 0.6, 0.2, 2.0, _steps([2, 2], [0.5, 0.5]), accuracy_val=0.55,
                     accuracy_direct_val=0.2),
            ModelRun("paragrpo", 1, 0.6, 0.2, 2.0, _steps([2, 2], [0.5, 0.5]), accuracy_val=0.65,
                     accuracy_direct_val=0.3)]
    lines = validation_table_markdown(runs).splitlines()
    assert lines[2] == "| sft | 1 | 45.0 | 25.0 | 20.0 |"
    assert lines[3].startswith("| paragrpo | 2 | 60.0 ± ") and "| 35.0 ± " in lines[3]
    assert "## Validation split" in report_markdown(runs, "steps.png", "t")
    older = [ModelRun("sft", None, 0.5, 0.2, 2.8)]  # a run from before the split: no table, no heading
    assert validation_table_markdown(older) == "" and "Validation" not in report_markdown(older, "steps.png", "t")
    assert runs_from_json(json.dumps([asdict(r) for r in runs])) == runs


def test_rl_rows_without_a_direct_validation_figure_show_a_dash_there():
    from paravt_core.miniature.report_tables import validation_table_markdown

    runs = [ModelRun("sft", None, 0.5, 0.2, 2.8, accuracy_val=0.45, accuracy_direct_val=0.25),
            ModelRun("paragrpo", 0, 0.6, 0.2, 2.0, accuracy_val=0.55)]
    assert validation_table_markdown(runs).splitlines()[3] == "| paragrpo | 1 | 55.0 | – | – |"


def _calls(value: float, n: int = 40, spread: float = 0.0) -> dict[str, float]:
    return {f"q{i}": max(0.0, value + spread * ((i % 3) - 1)) for i in range(n)}


def _row(row: str, runs: int, accuracy: float, calls: float, fmt: float, jitter: float = 0.0,
         build: str | None = None) -> list[ModelRun]:
    """`runs` runs of `row` whose accuracy, probe κ and format move by `jitter` from run to run."""
    return [ModelRun(row, s, min(1.0, accuracy + jitter * s), 0.2, calls,
                     probe_calls=_calls(calls + jitter * s, spread=0.1),
                     probe_format={f"q{i}": min(1.0, max(0.0, fmt + jitter * s)) for i in range(40)}, sft_build=build)
            for s in range(runs)]


def _sft(calls: float = 2.5, accuracy: float = 0.5, build: str | None = None) -> ModelRun:
    return ModelRun("sft", None, accuracy, 0.2, calls, probe_calls=_calls(calls, spread=0.5), probe_format=_calls(0.9),
                    sft_build=build)


def test_verdicts_label_each_comparison_from_run_level_tests_against_the_minimum_effects():
    from paravt_core.miniature.report_tables import verdicts

    runs = [_sft(), *_row("vanilla_grpo", 6, 0.5, 0.1, 0.2, 0.01), *_row("paragrpo", 6, 0.75, 2.0, 0.8, 0.01),
            *_row("anchoring_only", 6, 0.5, 0.2, 0.7, 0.01), *_row("gating_only", 6, 0.5, 2.4, 0.3, 0.01)]
    text = "\n".join(verdicts(runs))
    assert "GRPO after SFT collapses κ: κ falls: reproduced (vanilla_grpo - sft" in text
    assert "6 runs vs the SFT model" in text and "one-sample t (df 5.0)" in text and "exact sign-flip p 0.031" in text
    assert "format held (vs vanilla_grpo): reproduced" in text and "tools suppressed (vs SFT): reproduced" in text
    assert "tools kept (vs vanilla_grpo): reproduced" in text and "format lost (vs paragrpo): reproduced" in text
    assert "vs vanilla_grpo: reproduced (paragrpo - vanilla_grpo +25.0 points" in text and "Welch t (df 10.0)" in text
    assert "vs gating_only: reproduced" in text and "exact permutation p 0.002" in text
    assert "PARA-GRPO improves on its SFT model: accuracy: reproduced (paragrpo - sft +27.5 points" in text
    assert "no direction can be claimed" not in text and "not run (counted" not in text
    # the opposite measurements give the opposite labels
    flipped = [_sft(), *_row("vanilla_grpo", 6, 0.5, 4.0, 0.2, 0.01), *_row("paragrpo", 6, 0.25, 2.0, 0.8, 0.01)]
    text = "\n".join(verdicts(flipped))
    assert "collapses κ: κ falls: reversed" in text and "improves on its SFT model: accuracy: reversed" in text
    # runs that agree with SFT to within a hair: equivalent, not "not reproduced"
    same = [_sft(), *_row("paragrpo", 4, 0.5, 2.0, 0.8, 0.001)]
    assert "improves on its SFT model: accuracy: equivalent" in "\n".join(verdicts(same))
    # four runs against the SFT model: the sign-flip test cannot go below 2/16, so no direction, whatever the estimate
    four = "\n".join(verdicts([_sft(), *_row("vanilla_grpo", 4, 0.5, 0.1, 0.2, 0.01)]))
    assert "collapses κ: κ falls: inconclusive (vanilla_grpo - sft" in four and "needs 6 runs (80% power" in four
    assert "no direction can be claimed: the exact test's smallest p is 0.125" in four
    # an SFT model that never calls a tool has no κ to collapse; runs without a probe are not measured
    idle = ModelRun("sft", None, 0.5, 0.2, 0.0, probe_calls=_calls(0.0), probe_format=_calls(0.9))
    assert "no κ to fall from" in "\n".join(verdicts([idle, *_row("vanilla_grpo", 4, 0.5, 0.1, 0.2, 0.01)]))
    unprobed = [ModelRun("sft", None, 0.5, 0.2, 2.5), *[ModelRun("vanilla_grpo", s, 0.5, 0.2, 0.1) for s in range(2)]]
    assert "κ falls: inconclusive (not measured: no held-out probe" in "\n".join(verdicts(unprobed))
    one = "\n".join(verdicts([_sft(), *_row("vanilla_grpo", 1, 0.5, 0.1, 0.2)]))
    assert "κ falls: inconclusive (1 run of vanilla_grpo: no spread between runs" in one
    # a finding none of whose rows were run is left out; the rows of a fixed family not run count at p 1
    assert not any("Both together" in line for line in verdicts(same))
    two_rows = "\n".join(verdicts([_sft(), *_row("vanilla_grpo", 6, 0.5, 0.1, 0.2, 0.01),
                                    *_row("paragrpo", 6, 0.75, 2.0, 0.8, 0.01)]))
    assert "Both together win (PARA-GRPO above every other RL row on held-out accuracy): vs vanilla_grpo: " \
        "reproduced" in two_rows and "vs gating_only: not run (counted at p 1 in the family)" in two_rows


def _docs_runs(rows=("vanilla_grpo", "paragrpo")) -> list[ModelRun]:
    """The default reproduction of 2026-11-28 and the Table 2 profile's extra rows, as docs/miniature.md
    records them per run (held-out accuracy of 128 questions, probe κ), with per-question records that
    give those accuracies (what the earlier bootstrap resampled)."""
    recorded = {"vanilla_grpo": [(120, 2.77), (121, 2.93), (121, 2.89), (116, 2.90)],  # 93.8 94.5 94.5 90.6 %
                "paragrpo": [(120, 2.91), (60, 2.42), (114, 2.71), (70, 0.91)],  # 93.8 46.9 89.1 54.7 %
                "anchoring_only": [(86, 1.84), (108, 2.66), (123, 2.75), (107, 2.94)],  # 67.2 84.4 96.1 83.6 %
                "gating_only": [(124, 2.77), (115, 2.91), (100, 2.91), (109, 2.89)]}  # 96.9 89.8 78.1 85.2 %

    def run(row, seed, right, kappa):
        return ModelRun(row, seed, right / 128, 0.75, 2.9, correct={f"q{i:03d}": i < right for i in range(128)},
                        probe_calls={"mean": kappa})

    return [run("sft", None, 105, 2.92),  # 82.0 %
            *[run(row, s, right, kappa) for row in rows for s, (right, kappa) in enumerate(recorded[row])]]


def test_four_runs_with_one_run_s_spread_are_inconclusive_where_the_bootstrap_said_reversed():
    """#62: the default's eight run means. The percentile bootstrap over runs and questions called
    "both together win" reversed (-22.3 points [-43.6, -1.4]); on runs, Welch's p is 0.16 and the
    exact permutation p 6/70, and Holm over the family's three comparisons needs p below 0.017,
    which four runs a row cannot give (2/70 = 0.029)."""
    from paravt_core.miniature.report_tables import verdicts

    text = "\n".join(verdicts(_docs_runs()))
    assert ("vs vanilla_grpo: inconclusive (paragrpo - vanilla_grpo -22.3 points [-59.9, +15.4], Welch t (df 3.0) "
            "p 0.157, exact permutation p 0.086, Holm p 0.472") in text
    assert "needs 240 runs a row (80% power of the t test at two-sided 0.05/3" in text
    assert "no direction can be claimed: the exact test's smallest p is 0.029 and Holm over the family's 3 needs " \
           "one below 0.017" in text
    assert "reversed" not in text
    assert "paragrpo against vanilla_grpo: inconclusive (2 of 4 against 0 of 4, Fisher exact p 0.429" in text


def test_a_label_does_not_change_with_the_rows_a_profile_trains():
    """The Holm family is fixed in code: the default's two rows and the Table 2 profile's four give the
    same Holm p for PARA-GRPO against vanilla (the bootstrap's 0.028 became 0.085 among three)."""
    from paravt_core.miniature.report_tables import verdicts

    def against_vanilla(runs):
        (line,) = [line for line in verdicts(runs) if line.startswith("Both together")]
        return line.split("vs vanilla_grpo: ")[1].split("; ")[0]

    table2 = _docs_runs(("vanilla_grpo", "paragrpo", "anchoring_only", "gating_only"))
    assert against_vanilla(_docs_runs()) == against_vanilla(table2)


def test_several_sft_builds_are_a_level_of_the_verdicts():
    from paravt_core.miniature import verdicts as judged
    from paravt_core.miniature.inference import against_value
    from paravt_core.miniature.report_tables import report_markdown, verdicts

    runs = []
    for b, (shift, sft_acc) in enumerate(((0.0, 0.5), (0.2, 0.6), (-0.1, 0.4))):
        runs += [_sft(accuracy=sft_acc, build=f"b{b}"), *_row("vanilla_grpo", 2, 0.5 + shift, 2.0, 0.9, 0.02, f"b{b}"),
                 *_row("paragrpo", 2, 0.6 + shift + 0.01 * b, 2.0, 0.9, 0.02, f"b{b}")]
    assert judged.builds(runs) == ["b0", "b1", "b2"]
    e, why = judged.compare(runs, judged.FAMILIES[3][1][0])
    # per build: the mean of each row's runs, then their difference; the builds are the units
    expected = against_value([0.1, 0.11, 0.12], 0.0, unit="build")
    assert (e.mean, e.p_t, e.p_exact, e.low) == pytest.approx((expected.mean, expected.p_t, expected.p_exact,
                                                                expected.low)) and why == ""
    assert e.units == (3, 1) and e.unit == "build" and e.p_floor == pytest.approx(0.25)
    text = "\n".join(verdicts(runs))
    assert "3 builds" in text and "needs" in text and "builds (80% power" in text
    assert "3 SFT builds" in report_markdown(runs, "s.png", "t")
    assert "nothing generalizes past that build" in report_markdown(_docs_runs(), "s.png", "t")
    # a build missing a row is left out of that comparison
    assert judged.compare([r for r in runs if not (r.sft_build == "b2" and r.row == "paragrpo")],
                          judged.FAMILIES[3][1][0])[0].units == (2, 1)


def test_enough_builds_with_an_effect_under_the_minimum_do_not_say_they_need_what_they_have():
    from paravt_core.miniature.report_tables import verdicts

    # docs/log/conclusive, all 13 builds (of 128 questions): the SFT model's right answers, then
    # PARA-GRPO's four runs'
    builds = [(105, (125, 119, 113, 112)), (114, (117, 95, 124, 122)), (94, (118, 113, 106, 102)),
              (116, (125, 127, 113, 123)), (86, (90, 94, 102, 117)), (110, (104, 103, 99, 106)),
              (99, (120, 120, 39, 111)), (94, (97, 77, 98, 98)), (120, (126, 127, 123, 126)),
              (106, (121, 126, 104, 125)), (113, (115, 117, 107, 96)), (90, (91, 98, 84, 93)),
              (87, (90, 104, 99, 77))]
    runs = []
    for b, (sft_right, para) in enumerate(builds):
        runs += [_sft(accuracy=sft_right / 128, build=f"sft{b}"),
                 *[ModelRun("paragrpo", s, n / 128, 0.2, 2.5, sft_build=f"sft{b}") for s, n in enumerate(para)]]
    line = next(v for v in verdicts(runs) if v.startswith("PARA-GRPO improves on its SFT model"))
    # a rise the tests see (p just under 0.05) but under the 5-point minimum, its interval past it
    assert "accuracy: inconclusive (paragrpo - sft +3.6 points [+0.1, +7.2]" in line and "13 builds" in line
    assert "needs 13 builds" not in line
    assert ("has the 13 builds that 80% power of the t test at two-sided 0.05/1, noncentral t, SD 5.9 points as "
            "measured asks for the minimum effect; the estimate is under the minimum effect and its 90 % interval "
            "reaches past it: neither the finding nor equivalence, and more builds would narrow it") in line
    # with fewer builds than the spread asks for, the count to reach stays
    short = [r for r in runs if r.sft_build not in {f"sft{b}" for b in range(6, 13)}]
    line = next(v for v in verdicts(short) if v.startswith("PARA-GRPO improves on its SFT model"))
    needed = re.search(r"6 builds; needs (\d+) builds \(80% power", line)
    assert needed and int(needed.group(1)) > 6 and "has the" not in line


def test_two_builds_whose_differences_tie_are_inconclusive_not_equivalent():
    from paravt_core.miniature.report_tables import verdicts

    # docs/log/conclusive/part-6-7: per build PARA-GRPO's run mean is its SFT model's minus 1.5/128
    runs = []
    for b, (sft_acc, para) in enumerate(((99 / 128, (120, 120, 39, 111)), (94 / 128, (97, 77, 98, 98)))):
        runs += [_sft(accuracy=sft_acc, build=f"sft{6 + b}"),
                 *[ModelRun("paragrpo", s, n / 128, 0.2, 2.5, sft_build=f"sft{6 + b}") for s, n in enumerate(para)]]
    line = next(v for v in verdicts(runs) if v.startswith("PARA-GRPO improves on its SFT model"))
    assert "accuracy: inconclusive (paragrpo - sft -1.2 points [-1.2, -1.2]" in line
    assert "every build gives the same difference, so the t interval is a point: no spread seen" in line
    assert "needs 6 builds (at least, for the exact test to reach 0.05/1: no spread seen to size it by)" in line
    # one build, two rows of runs each alike: Welch's interval is a point too, and says why
    one = [_sft(accuracy=0.75, build="b0"), *[ModelRun(row, s, 0.78, 0.2, 2.5, sft_build="b0")
                                              for row in ("vanilla_grpo", "paragrpo") for s in range(4)]]
    line = next(v for v in verdicts(one) if v.startswith("Both together win"))
    assert "vs vanilla_grpo: inconclusive (paragrpo - vanilla_grpo +0.0 points [+0.0, +0.0]" in line
    assert "each row's runs give the same value, so the t interval is a point" in line


def test_runs_that_fell_are_their_own_outcome():
    from paravt_core.miniature.verdicts import FALL_POINTS, fell, falls_lines

    runs = _docs_runs(("vanilla_grpo", "paragrpo", "anchoring_only", "gating_only"))
    assert fell(runs) == {"vanilla_grpo": (0, 4), "paragrpo": (2, 4), "anchoring_only": (1, 4), "gating_only": (0, 4)}
    edge = [_sft(accuracy=0.8), ModelRun("paragrpo", 0, 0.8 - FALL_POINTS, 0.2, 1.0),
            ModelRun("paragrpo", 1, 0.71, 0.2, 1.0)]
    assert fell(edge) == {"paragrpo": (1, 2)}  # exactly 10 points below falls
    lines = falls_lines(runs)
    assert lines[0] == ("Runs that fell (held-out accuracy 10 or more points below their SFT model's): vanilla_grpo "
                        "0 of 4, paragrpo 2 of 4, anchoring_only 1 of 4, gating_only 0 of 4.")
    assert "paragrpo against anchoring_only: inconclusive (2 of 4 against 1 of 4, Fisher exact p 1.000" in lines[1]
    # four runs a row: Fisher cannot go below 2/70, Holm over three needs 0.017; and the threshold was
    # fixed after these runs were seen, so the line says it describes them
    assert "no direction can be claimed: Fisher's smallest p is 0.029 and Holm over 3 needs one below 0.017" in lines[1]
    assert lines[1].startswith("Runs that fell, PARA-GRPO against each other RL row (descriptive for runs made before")
    assert falls_lines([_row("paragrpo", 2, 0.5, 1.0, 1.0)][0]) == []  # no SFT model: nothing to fall from


def test_the_report_prints_the_holm_families_fixed_in_code(tmp_path):
    from paravt_core.miniature.verdicts import FAMILIES

    text = write_report(_docs_runs(), tmp_path / "r", "t").read_text()
    assert "Holm families, fixed in code before any run" in text
    for finding, comparisons in FAMILIES:
        assert f"- {finding} ({len(comparisons)}): " in text
    assert "- Runs that fell (3, Fisher exact): paragrpo vs vanilla_grpo" in text
    assert "the falls family `FALLS_FAMILY` and its threshold after the runs of 2026-11-28" in text


def test_budget_sweep_table_and_its_file(tmp_path):
    from paravt_core.miniature.measurements import BudgetPoint, budget_from_json
    from paravt_core.miniature.report_tables import budget_table_markdown

    points = [BudgetPoint(6, 0.8, 0.6, 2.5, 0.5, 128), BudgetPoint(2, 0.75, 0.25, 2.9, 0.0, 128)]
    lines = budget_table_markdown(points).splitlines()
    assert lines[2] == "| 2 | 0.0 | 75.0 | 25.0 | +50.0 | 2.90 |" and lines[3].startswith("| 6 | 50.0 | 80.0 | 60.0 | +20.0")
    assert budget_table_markdown([]) == ""
    runs = [ModelRun("sft", None, 0.5, 0.2, 2.8)]
    report = write_report(runs, tmp_path, "t", budget=points)
    assert "## Before RL: the SFT model at each overview budget K" in report.read_text()
    assert budget_from_json((tmp_path / "budget.json").read_text()) == points


def test_report_command_rebuilds_from_mlflow_or_a_report_folder_with_the_budget_sweep(tmp_path, capsys):
    import argparse

    from paravt_core.miniature import cli
    from paravt_core.miniature.measurements import BudgetPoint
    from paravt_core.miniature.reproduce import latest_logged

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    points = [BudgetPoint(2, 0.75, 0.25, 2.9, 0.0, 128)]
    write_report(_runs(), tmp_path / "report", "logged", uri, "exp", budget=points)
    assert latest_logged(uri, "exp") == (_runs(), points, None)

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["miniature", "report", "--from", str(tmp_path / "report"), "--out", str(tmp_path / "again")])
    assert args.func(args) == 0
    assert "## Before RL" in (tmp_path / "again" / "report.md").read_text()
    args = parser.parse_args(["miniature", "report", "--experiment", "exp", "--tracking-uri", uri,
                              "--out", str(tmp_path / "from-mlflow")])
    assert args.func(args) == 0
    assert (tmp_path / "from-mlflow" / "budget.json").read_text() == (tmp_path / "report" / "budget.json").read_text()
    args = parser.parse_args(["miniature", "report", "--from", str(tmp_path / "nowhere")])
    assert args.func(args) == 2 and "runs.json does not exist" in capsys.readouterr().err


def _report_command(*argv: str):
    import argparse

    from paravt_core.miniature import cli

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["miniature", "report", *argv])
    return args.func(args)


def _folder_bytes(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


_NAN_ACCURACY = '[{"row": "sft", "seed": null, "accuracy": NaN, "accuracy_direct": 0.2, "eval_tool_calls": 2.8}]'
_STRING_ACCURACY = '[{"row": "sft", "seed": null, "accuracy": "0.5", "accuracy_direct": 0.2, "eval_tool_calls": 2.8}]'


@pytest.mark.parametrize(("name", "content", "message"), [
    ("runs.json", b"[]", "holds no runs"),
    ("runs.json", _NAN_ACCURACY.encode(), "[0].accuracy: Input should be a finite number"),
    ("runs.json", _STRING_ACCURACY.encode(), '[0].accuracy: Input should be a valid number (got "0.5")'),
    ("runs.json", b'[{"row": "sft", "seed": null, "accur', "Invalid JSON"),  # truncated
    ("runs.json", b"\x00\xff\x13\x80binary", "Invalid JSON"),
    ("budget.json", b'[{"k": 2, "accuracy": 0.7', "Invalid JSON"),
    ("budget.json", b'[{"k": 2, "accuracy": 1.5, "accuracy_direct": 0.2, "eval_tool_calls": 1, "visible": 0, "n": 8}]',
     "[0].accuracy: Input should be less than or equal to 1"),
])
def test_report_from_a_damaged_folder_exits_2_naming_the_file_and_writes_nothing(tmp_path, capsys, name, content,
                                                                                   message):
    """#48 item 6: `[]` or a NaN accuracy gave exit 0 and "nan ± nan"; a garbled budget.json a traceback
    naming no file; a string accuracy a half-rewritten folder."""
    write_report(_runs(), tmp_path / "report", "t")
    (tmp_path / "report" / name).write_bytes(content)
    before = _folder_bytes(tmp_path / "report")
    assert _report_command("--from", str(tmp_path / "report")) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'report' / name}: " in err and message in err and "Traceback" not in err
    assert _folder_bytes(tmp_path / "report") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # no rebuilt folder, no leftovers


def _first_steps(runs: list) -> list:
    return runs[1]["steps"]


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda runs: runs.append(runs[1]), "[5] is the same run (vanilla_grpo, seed 0, draw key None) as [1]"),
    (lambda runs: runs.append(dict(runs[2], accuracy=0.9)), "[5] is the same run (vanilla_grpo, seed 1"),
    (lambda runs: runs.append(runs[0]), "[5] is a second SFT model of the report as [0]"),
    (lambda runs: runs[3].update(row=""), "[3].row: Value error, '' is not a row name"),
    (lambda runs: runs[3].update(row=" paragrpo"), "[3].row: Value error, ' paragrpo' is not a row name"),
    (lambda runs: _first_steps(runs)[0].pop("step"), "[1].steps: Value error, step record [0] has no whole, "
                                                      "non-negative 'step'"),
    (lambda runs: _first_steps(runs)[2].update(step=2.0), "step record [2] has no whole, non-negative 'step'"),
    (lambda runs: _first_steps(runs)[1].update(step=1), "[1].steps: Value error, step record [1] repeats step 1"),
    (lambda runs: _first_steps(runs)[0].update(kappa=1e308), "[1].steps[0].kappa: Value error, 1e+308 is beyond ±1e+12"),
    (lambda runs: runs[1].update(by_group={"first wording": {}}), "[1].by_group.first wording.n: Field required"),
    (lambda runs: runs[1].update(by_group={"g": {"n": 4, "accuracy": 1.5, "tool_calls": 1}}),
     "[1].by_group.g.accuracy: Input should be less than or equal to 1"),
    (lambda runs: runs[1].update(numerics={**_HOST, "host_cpus": "2"}), "[1].numerics.host_cpus: Input should be"),
    (lambda runs: runs[1].update(numerics={**_HOST, "torch_threads": 0}),
     "[1].numerics.torch_threads: Input should be greater than or equal to 1"),
])
def test_report_inputs_that_would_count_a_run_twice_or_break_the_report_are_refused(tmp_path, capsys, mutate, message):
    """#61 item 3 and the report partials: a run listed twice reported "3 seeds", two SFT entries
    "sft 2", a row named "" was accepted; step records without `step`, with 1e308 or an empty
    group were tracebacks."""
    write_report(_runs(), tmp_path / "report", "t")
    runs = json.loads((tmp_path / "report" / "runs.json").read_text())
    mutate(runs)
    (tmp_path / "report" / "runs.json").write_text(json.dumps(runs))
    assert _report_command("--from", str(tmp_path / "report")) == 2
    err = capsys.readouterr().err
    assert message in err and f"{tmp_path / 'report' / 'runs.json'}: " in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


def test_a_step_value_too_large_for_a_float_is_refused_naming_it(tmp_path, capsys):
    write_report(_runs(), tmp_path / "report", "t")
    text = (tmp_path / "report" / "runs.json").read_text()
    (tmp_path / "report" / "runs.json").write_text(text.replace('"kappa": 2.5', '"kappa": 1' + "0" * 400, 1))
    assert _report_command("--from", str(tmp_path / "report")) == 2
    err = capsys.readouterr().err
    assert "[1].steps[0].kappa: Value error, an integer of 401 digits is beyond ±1e+12" in err and "Traceback" not in err


def test_runs_of_different_builds_or_draw_keys_are_not_duplicates():
    from paravt_core.miniature.measurements import MeasurementsError, check_distinct

    runs = [ModelRun("sft", None, 0.5, 0.2, 2.0, sft_build="a"), ModelRun("sft", None, 0.6, 0.2, 2.0, sft_build="b"),
            ModelRun("paragrpo", 0, 0.6, 0.2, 2.0, sft_build="a"), ModelRun("paragrpo", 0, 0.6, 0.2, 2.0, sft_build="b"),
            ModelRun("paragrpo", 0, 0.6, 0.2, 2.0, gating_draw_key=1, sft_build="b")]
    check_distinct(runs, "runs.json")
    assert runs_from_json(json.dumps([asdict(r) for r in runs])) == runs
    with pytest.raises(MeasurementsError, match=r"\[1\] is a second SFT model of SFT build 'a' as \[0\]"):
        check_distinct([runs[0], runs[0]], "runs.json")


@pytest.mark.parametrize(("errno_code", "reason"), [(30, "Read-only file system"), (28, "No space left on device")])
def test_report_out_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, errno_code, reason):
    """#61's partials: --out on a read-only mount, or a full disk, were tracebacks. (Simulated: this
    machine's tests run as root, whom a read-only folder's mode bits do not stop.)"""
    import os

    from paravt_core import atomic

    write_report(_runs(), tmp_path / "report", "t")

    def refuse(*args, **kwargs):
        raise OSError(errno_code, os.strerror(errno_code), str(tmp_path / "mount"))

    monkeypatch.setattr(atomic.tempfile, "mkdtemp" if errno_code == 30 else "mkstemp", refuse)
    assert _report_command("--from", str(tmp_path / "report"), "--out", str(tmp_path / "mount" / "out")) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"paravt miniature report: cannot write the report to {tmp_path / 'mount' / 'out'}: {reason}")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "mount" / "out").exists()


def test_report_from_never_writes_into_the_folder_it_reads(tmp_path, capsys):
    write_report(_runs(), tmp_path / "report", "t")
    before = _folder_bytes(tmp_path / "report")
    assert _report_command("--from", str(tmp_path / "report")) == 0
    assert "Miniature reproduction" in (tmp_path / "report-rebuilt" / "report.md").read_text()
    assert _folder_bytes(tmp_path / "report") == before
    assert _report_command("--from", str(tmp_path / "report"), "--out", str(tmp_path / "report-rebuilt")) == 0  # again
    for out in (tmp_path / "report", tmp_path / "report" / "sub", tmp_path):
        capsys.readouterr()
        assert _report_command("--from", str(tmp_path / "report"), "--out", str(out)) == 2
        assert "would write into the folder the report is rebuilt from" in capsys.readouterr().err
    assert _folder_bytes(tmp_path / "report") == before
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    assert _report_command("--from", str(tmp_path / "report"), "--out", str(tmp_path / "notes")) == 2
    assert "is not a report folder" in capsys.readouterr().err and (tmp_path / "notes" / "todo.txt").is_file()


def test_a_rebuild_that_fails_half_way_leaves_the_earlier_report_whole(tmp_path, monkeypatch):
    from paravt_core.miniature import reproduce

    write_report(_runs(), tmp_path / "report", "t")
    write_report(_runs()[:1], tmp_path / "out", "earlier")  # other measurements than the rebuild's
    before = _folder_bytes(tmp_path / "out")

    def fail(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(reproduce, "report_markdown", fail)  # after the figure and runs.json are written
    with pytest.raises(RuntimeError, match="disk full"):
        _report_command("--from", str(tmp_path / "report"), "--out", str(tmp_path / "out"))
    assert _folder_bytes(tmp_path / "out") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "report"]


_HOST = {"torch_threads": 1, "host_cpus": 2, "cpu_capability": "AVX2", "torch": "2.14.1",
         "cpu": "AMD EPYC (AuthenticAMD family 23 model 1)"}


def _on(run: ModelRun, **numerics) -> ModelRun:
    threads = 2 if run.row == "sft" else 1
    return dataclasses.replace(run, numerics={**_HOST, "torch_threads": threads, **numerics})


def test_the_report_names_the_host_that_trained_its_models(tmp_path):
    runs = [_on(run) for run in _runs()]
    line = hosts_markdown(runs)
    assert line == ("Trained on (each model's `numerics` in its `paravt_meta.json`): 2 cores, AMD EPYC (AuthenticAMD "
                    "family 23 model 1), AVX2, torch 2.14.1: 1 SFT model on 2 threads, 4 RL runs on 1 thread.")
    report = write_report(runs, tmp_path / "report", "t")
    assert line in report.read_text()
    # kept with the measurements and read back
    assert [run.numerics for run in read_report_dir(tmp_path / "report")[0]] == [run.numerics for run in runs]
    assert hosts_markdown(_runs()) == "" and "Trained on" not in report_markdown(_runs(), "f.png", "t")


@pytest.mark.parametrize("moved, settings", [
    ({"cpu_capability": "AVX512"}, 2),  # resumed on a host with other CPU kernels
    ({"host_cpus": 4}, 2),  # or with more cores
    ({"cpu": "AMD EPYC (AuthenticAMD family 25 model 1)"}, 2),  # or on another CPU with the same kernels
    ({"torch_threads": 2}, 2),  # or under another OMP_NUM_THREADS on the same host
    ({"accelerator": "NVIDIA H200 (CUDA 13.0, cuDNN 91002)"}, 2),  # or on a GPU
])
def test_a_report_whose_models_come_from_several_hosts_says_so(moved, settings):
    """A reproduction resumed elsewhere goes on from the other host's models: the report says its
    numbers are not one host's."""
    runs = [_on(run) for run in _runs()]
    runs[-1] = _on(runs[-1], **moved)
    line = hosts_markdown(runs)
    assert f"**These models come from {settings} host settings**" in line
    assert "not what one host's `paravt reproduce` gives" in line
    assert "host settings" not in hosts_markdown(runs[:-1])


def test_the_report_names_the_card_that_trained_a_model_on_a_gpu():
    card = "NVIDIA H200 (CUDA 13.0, cuDNN 91002)"
    runs = [_on(run, accelerator=card, host_cpus=16) for run in _runs()]
    assert hosts_markdown(runs) == (
        f"Trained on (each model's `numerics` in its `paravt_meta.json`): {card}, 16 cores, AMD EPYC (AuthenticAMD "
        "family 23 model 1), AVX2, torch 2.14.1: 1 SFT model on 2 threads, 4 RL runs on 1 thread.")
    # another card, or another CUDA on the same card, is another setting
    runs[-1] = _on(runs[-1], accelerator="NVIDIA H200 (CUDA 12.8, cuDNN 91002)", host_cpus=16)
    assert "**These models come from 2 host settings**" in hosts_markdown(runs)


def test_models_without_a_record_are_counted_as_such():
    runs = [_on(run) for run in _runs()[:3]] + _runs()[3:]
    line = hosts_markdown(runs)
    assert ("2 cores, AMD EPYC (AuthenticAMD family 23 model 1), AVX2, torch 2.14.1: 1 SFT model on 2 threads, "
            "2 RL runs on 1 thread; not recorded: 2 RL runs.") in line
    assert line.endswith("The models without a record may come from another host.")


def test_records_from_before_the_cpu_was_recorded_are_not_a_second_host():
    runs = [_on(run) for run in _runs()]
    older = {k: v for k, v in runs[0].numerics.items() if k != "cpu"}
    runs[0] = dataclasses.replace(runs[0], numerics=older)
    line = hosts_markdown(runs)
    assert "2 cores, AVX2, torch 2.14.1: 1 SFT model on 2 threads, 4 RL runs on 1 thread." in line
    assert "host settings" not in line
    runs[1] = _on(runs[1], cpu_capability="AVX512")  # a difference they do record still counts
    assert "**These models come from 2 host settings**" in hosts_markdown(runs)


def test_cpu_model_names_the_first_processor(tmp_path):
    import platform

    from paravt_core.provenance import cpu_model

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 23\nmodel\t\t: 1\n"
                    "model name\t: AMD EPYC\n\nprocessor\t: 1\nmodel name\t: Other\n")
    assert cpu_model(info) == "AMD EPYC (AuthenticAMD family 23 model 1)"
    # a Raspberry Pi's: the board's name in the trailer after the processor blocks
    info.write_text("processor\t: 0\nBogoMIPS\t: 108.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd08\n\n"
                    "processor\t: 1\nCPU implementer\t: 0x41\n\nHardware\t: BCM2835\n"
                    "Model\t\t: Raspberry Pi 4 Model B Rev 1.4\n")
    assert cpu_model(info) == "Raspberry Pi 4 Model B Rev 1.4 (implementer 0x41 part 0xd08)"
    # an ARM server's: no name at all
    info.write_text("processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd40\n\n")
    assert cpu_model(info) == f"{platform.machine() or 'unknown'} (implementer 0x41 part 0xd40)"
    assert cpu_model(tmp_path / "missing") == (platform.machine() or "unknown")


def test_model_numerics_reads_the_export_s_record(tmp_path):
    from paravt_core.miniature.measurements import MeasurementsError, model_numerics
    from paravt_core.provenance import host_numerics

    assert model_numerics(tmp_path) is None  # no paravt_meta.json
    meta = tmp_path / "paravt_meta.json"
    meta.write_text(json.dumps({"stage": "rl"}))
    assert model_numerics(tmp_path) is None  # exported before the record
    meta.write_text(json.dumps({"stage": "rl", "numerics": host_numerics()}))
    assert model_numerics(tmp_path) == host_numerics()
    meta.write_text(json.dumps({"numerics": {**host_numerics(), "torch_threads": "one"}}))
    with pytest.raises(MeasurementsError, match=r"paravt_meta.json: its \"numerics\" are not"):
        model_numerics(tmp_path)
    meta.write_text("{")
    with pytest.raises(MeasurementsError, match="paravt_meta.json: cannot read the export's metadata"):
        model_numerics(tmp_path)


def test_a_model_from_another_host_is_told_apart_by_cores_kernels_and_torch_not_threads():
    """What the reproduction logs when it goes on from a cache another host filled."""
    from paravt_core.provenance import host_differences, host_numerics, training_device

    here = host_numerics(training_device())  # what this host's ranks record (with the card on a GPU)
    assert host_differences(None) == [] and host_differences({}) == []
    assert host_differences({**here, "torch_threads": here["torch_threads"] + 3}) == []
    other = "AVX512" if here["cpu_capability"] != "AVX512" else "AVX2"
    assert host_differences({**here, "cpu_capability": other, "host_cpus": 96}) == [
        f"cores 96 there, {here['host_cpus']} here", f"CPU kernels {other} there, {here['cpu_capability']} here"]
    assert host_differences({**here, "torch": "2.0.0"}) == [f"torch 2.0.0 there, {here['torch']} here"]
    assert host_differences({**here, "cpu": "Zen 9"}) == [f"CPU Zen 9 there, {here['cpu']} here"]
    # a record from before the CPU was recorded is compared on what it holds
    assert host_differences({k: v for k, v in here.items() if k != "cpu"}) == []


def test_a_model_trained_on_a_gpu_is_told_apart_from_a_cpu_host(monkeypatch):
    """The card decides a GPU run's weights: a model a GPU trained is foreign to a CPU host, and
    the other way round; one with the CPU and no accelerator was trained on the CPU."""
    import torch

    from paravt_core import provenance

    here = provenance.host_numerics("cpu")
    assert "accelerator" not in here  # the CPU's record, as every CPU rank writes it
    card = "NVIDIA H200 (CUDA 13.0, cuDNN 91002)"
    # by default the record is for this process's device: the card once it has initialized CUDA
    # (an SFT rank's export calls it so), the CPU before
    monkeypatch.setattr(provenance, "accelerator_model", lambda device: f"{card} as {device}")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert provenance.host_numerics() == here
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert provenance.host_numerics() == {**here, "accelerator": f"{card} as cuda:1"}
    monkeypatch.setattr(provenance, "training_device", lambda: "cpu")
    assert provenance.host_differences({**here, "accelerator": card}) == [f"accelerator {card} there, none (CPU) here"]
    # what a GPU host's stages would record: this CPU's fields and the card
    monkeypatch.setattr(provenance, "training_device", lambda: "cuda:0")
    monkeypatch.setattr(provenance, "accelerator_model", lambda device: card)
    assert provenance.host_numerics("cuda:0") == {**here, "accelerator": card}
    assert provenance.host_differences({**here, "accelerator": card}) == []
    assert provenance.host_differences(here) == [f"accelerator none (CPU) there, {card} here"]
    # a record from before the CPU was recorded says nothing of an accelerator, so none is compared
    assert provenance.host_differences({k: v for k, v in here.items() if k != "cpu"}) == []


def test_the_reproduction_is_told_of_each_cached_model_from_another_host(tmp_path):
    """What `paravt reproduce` logs at its start (flows/reproduce.py), from the models' own records."""
    from paravt_core.miniature.measurements import model_numerics
    from paravt_core.provenance import foreign_models, host_numerics, training_device

    here, there = tmp_path / "here", tmp_path / "there"
    ours = host_numerics(training_device())  # what this host's ranks record (with the card on a GPU)
    for folder, numerics in ((here, ours), (there, {**ours, "cpu_capability": "NEON"})):
        folder.mkdir()
        (folder / "paravt_meta.json").write_text(json.dumps({"numerics": numerics}))
    lines = foreign_models({"the base model": model_numerics(here), "SFT model sft1": model_numerics(there),
                            "a downloaded model": model_numerics(tmp_path)})
    assert lines == [f"SFT model sft1 was trained on another host (CPU kernels NEON there, "
                     f"{host_numerics()['cpu_capability']} here): the runs that go on from it here are not what one "
                     "host gives; the report's 'Trained on' line counts each host's models"]


def test_the_report_gives_its_running_time_and_a_rebuild_keeps_it(tmp_path, capsys):
    """The flow's heartbeat summary (`run_clock`) goes under the table, into running_time.json
    and MLflow; `miniature report --from` writes it again; a damaged file is named."""
    from paravt_core.eval.experiment_report import _client
    from paravt_core.run_clock import ClockSummary

    summary = ClockSummary(running_s=33840, left_out_s=0, invocations=5, hosts=("vm",),
                           first_start="2026-12-01T01:29:00+00:00", last_beat="2026-12-02T10:02:00+00:00")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    report = write_report(_runs(), tmp_path / "report", "t", uri, "exp", running=summary)
    line = "Running time: 9.4 h over 5 invocations of `paravt reproduce` with this config"
    assert line in report.read_text()
    assert (tmp_path / "report" / "running_time.json").is_file()
    client = _client(uri)
    run = client.search_runs([client.get_experiment_by_name("exp").experiment_id])[0]
    assert run.data.metrics["running_time_h"] == pytest.approx(9.4)
    assert _report_command("--from", str(tmp_path / "report"), "--out", str(tmp_path / "again")) == 0
    assert line in (tmp_path / "again" / "report.md").read_text()
    assert _report_command("--experiment", "exp", "--tracking-uri", uri, "--out", str(tmp_path / "logged")) == 0
    assert line in (tmp_path / "logged" / "report.md").read_text()  # read back from MLflow's artifact
    # a report without it (from before the clock) has no such line, and leaves no earlier figure behind
    write_report(_runs(), tmp_path / "older", "t", running=summary)
    write_report(_runs(), tmp_path / "older", "t")
    assert "Running time" not in (tmp_path / "older" / "report.md").read_text()
    assert not (tmp_path / "older" / "running_time.json").exists()
    (tmp_path / "report" / "running_time.json").write_text("[]")
    capsys.readouterr()
    assert _report_command("--from", str(tmp_path / "report"), "--out", str(tmp_path / "third")) == 2
    assert "running_time.json: not a running-time summary" in capsys.readouterr().err
