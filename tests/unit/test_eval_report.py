"""The Table-1-shaped comparison table and the metrics logged per evaluated model (SPEC §6, §7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from paravt_core.eval.report import TABLE1_SPLITS, build_report, format_table, report_metrics


def mcq_summary(value: float, n: int = 10) -> dict:
    return {"n": n, "primary": {"name": "accuracy", "value": value}, "accuracy": value, "avg_tool_calls": 1.5,
            "tool_usage_rate": 0.5}


def charades_summary(miou: float) -> dict:
    return {"n": 4, "primary": {"name": "mIoU", "value": miou}, "mIoU": miou, "R@0.3": 0.75, "R@0.5": 0.5,
            "R@0.7": 0.25, "avg_tool_calls": 2.0, "tool_usage_rate": 1.0}


def full_report(label: str, offset: float):
    summaries = {split: mcq_summary(0.4 + offset) for split in TABLE1_SPLITS[:-1]}
    summaries["charades"] = charades_summary(0.3 + offset)
    return build_report(label, "f" * 64, Path("/results"), summaries)


def test_average_is_the_mean_of_primary_metrics():
    report = full_report("sft", 0.0)
    assert report.average == pytest.approx((6 * 0.4 + 0.3) / 7)
    assert report.complete and report.primary("charades") == pytest.approx(0.3) and report.primary("nope") is None


def test_table_has_table1_columns_our_rows_then_the_papers():
    table = format_table({"base": full_report("base", 0.0), "rl": full_report("rl", 0.1)})
    lines = table.splitlines()
    assert lines[0] == ("| model | VideoMME w/o sub | VideoMME w/ sub | LongVideoBench | LVBench | MLVU | MMVU | "
                        "Charades-STA mIoU | avg |")
    assert lines[2] == "| base | 40.0 | 40.0 | 40.0 | 40.0 | 40.0 | 40.0 | 30.0 | 38.6 |"
    assert lines[3] == "| rl | 50.0 | 50.0 | 50.0 | 50.0 | 50.0 | 50.0 | 40.0 | 48.6 |"
    assert lines[4] == "| Qwen3-VL-8B (paper) | 59.9 | 68.4 | 52.2 | 33.1 | 58.3 | 68.0 | 49.3 | 55.6 |"
    assert lines[5] == "| ParaVT-8B (paper) | 62.1 | 69.4 | 60.4 | 39.8 | 65.0 | 68.6 | 50.1 | 59.3 |"
    assert "base: samples per split: videomme 10," in table and "charades 4." in table
    assert "*" not in lines[2]


def test_missing_splits_show_a_dash_and_a_starred_average():
    report = build_report("candidate", "a" * 64, Path("/r"), {"lvbench": mcq_summary(0.25, n=3)})
    table = format_table({"candidate": report})
    row = table.splitlines()[2]
    assert row == "| candidate | – | – | – | 25.0 | – | – | – | 25.0* |"
    assert "* avg over the evaluated splits only" in table


def test_mixed_mmvu_is_footnoted():
    mixed = {"n": 5, "primary": {"name": "score", "value": 0.6}}
    table = format_table({"sft": build_report("sft", "b" * 64, Path("/r"), {"mmvu": mixed})})
    assert "sft: mmvu mix MCQ and open-ended questions" in table


def test_report_metrics_are_mlflow_safe_names_per_split():
    metrics = report_metrics(full_report("rl", 0.0))
    assert metrics["charades/R_at_0.5"] == 0.5 and metrics["charades/mIoU"] == pytest.approx(0.3)
    assert metrics["videomme/accuracy"] == pytest.approx(0.4) and metrics["videomme/primary"] == pytest.approx(0.4)
    assert metrics["lvbench/tool_usage_rate"] == 0.5 and "videomme/n" not in metrics
    assert metrics["average"] == pytest.approx((6 * 0.4 + 0.3) / 7)
    assert all("@" not in name for name in metrics)
