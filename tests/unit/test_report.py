"""`paravt report`: tables and plots from MLflow runs of RL rows and evaluations."""

from __future__ import annotations

from pathlib import Path

from paravt_core.eval.experiment_report import write_report
from paravt_core.tracking import MetricLogger, start_stage_run


def test_report_tables_and_plots(tmp_path: Path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for row, kappas in (("paragrpo", [0.5, 0.4, 0.3, 0.2]), ("vanilla_grpo", [0.5, 0.1, 0.0, 0.0])):
        run = start_stage_run(uri, "exp", f"rl-{row}", {"stage": "rl", "ablation_row": row}, {})
        log = MetricLogger(uri, run)
        for step, kappa in enumerate(kappas, start=1):
            # each row's own fτ differs (its reward knobs); Table 2 must use the fixed one
            log.log(step, {"f_tau_fixed": 0.1 * step, "f_tau": 0.9 if row == "paragrpo" else 0.05, "kappa": kappa})
    run = start_stage_run(uri, "exp", "eval-paragrpo", {"stage": "eval", "label": "paragrpo"}, {})
    MetricLogger(uri, run).log(0, {"videomme/primary": 0.5, "charades/primary": 0.25, "average": 0.4})

    report = write_report(uri, "exp", tmp_path / "out")
    text = report.read_text()
    # paragrpo: fτ_fixed mean of steps 2..4 = (0.2+0.3+0.4)/3 = 0.30; κ = (0.4+0.3+0.2)/3 = 0.30; VideoMME 50.0
    assert "| paragrpo | 0.30 | 0.30 | 50.0 | – | – | – | 0.41 | 0.21 | 62.1 |" in text
    # vanilla: κ = (0.1+0+0)/3 = 0.03
    assert "| vanilla_grpo | 0.30 | 0.03 |" in text
    assert "| paragrpo (ours) | 50.0 | – | – | – | – | – | 25.0 |" in text
    assert "ParaVT-8B (paper) | 62.1" in text
    for name in ("f_tau_per_step.png", "kappa_per_step.png"):
        assert (tmp_path / "out" / name).stat().st_size > 1000

    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    (rep,) = client.search_runs([client.get_experiment_by_name("exp").experiment_id], "tags.stage = 'report'")
    assert {a.path for a in client.list_artifacts(rep.info.run_id, "report")} >= {"report/report.md"}
