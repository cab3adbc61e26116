"""Prefect tasks around the evaluation stage (`paravt_core.eval.stage`).

`eval_model` evaluates one checkpoint on its splits (`stage.run`; `eval.engine: hf` in a process
of its own, `stage.run_in_own_process`, so no model stays in the flow process): one task, not one per
split, because the checkpoint's own server (`eval.engine: openai` with no endpoint,
`eval/served.py`) is started once for all of them and stopped when the task ends, also when
an attempt fails, so a retry leaves no server behind. It is cached by what its report
depends on: the label, the model's content hash, the result-shaping eval settings
(`stage.results_config_hash`), the sample cap and, per split, the hash of its prepared
folder tied to the epoch of its results JSON (`tasks._cache`), so a deleted result re-runs
the task, which re-summarizes the finished splits from their logs (no model, no server) and
runs only what is missing. A retry resumes from the splits' JSON line logs.

`log_eval` opens one MLflow run per evaluated model; `resolve_model` turns an alias,
version, "base" or folder into a checkpoint reference (never cached: aliases move).
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.context import TaskRunContext

from paravt_core.config import PipelineConfig
from paravt_core.eval import stage as eval_stage
from paravt_core.eval.models import ResolvedModel
from paravt_core.eval.models import resolve_model as resolve_model_reference
from paravt_core.eval.report import EvalReport
from paravt_core.refs import ArtifactRef
from tasks._cache import output_epoch, stage_key


def _model_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    cfg: PipelineConfig = parameters["cfg"]
    model: ArtifactRef = parameters["model"]
    eval_data: ArtifactRef = parameters["eval_data"]
    results = eval_stage.results_dir(cfg, model).resolve()
    splits = [(split, eval_stage.split_data_hash(eval_data, split), output_epoch(results / f"{split}.json"))
              for split in parameters["splits"]]
    return stage_key("eval-checkpoint", parameters["label"], model.sha256, eval_stage.results_config_hash(cfg),
                     cfg.eval.max_samples_per_split, str(results), splits)


@task(name="eval-checkpoint", cache_key_fn=_model_key, persist_result=True, retries=1, retry_delay_seconds=10)
def eval_model(cfg: PipelineConfig, model: ArtifactRef, eval_data: ArtifactRef, label: str,
               splits: tuple[str, ...]) -> EvalReport:
    """One checkpoint on the SPEC §7 `splits`: each resumes from its log and writes
    `<results>/<split>.json`; its own server, if it needs one, runs for this task only."""
    log = get_run_logger()
    if cfg.eval.engine == "hf":  # the model it loads stays in its process: not the flow process
        report = eval_stage.run_in_own_process(cfg, model, eval_data, label, splits, log_line=log.info)
    else:  # the server is a process of its own; this one holds a processor and a client
        report = eval_stage.run(cfg, model, eval_data, label, splits, progress=False, notify=log.info)
    for split, summary in report.summaries.items():
        primary = summary["primary"]
        log.info("%s %s: %s %.3f over %d samples; avg tool calls %.2f", label, split, primary["name"],
                 primary["value"], summary["n"], summary["avg_tool_calls"])
    return report


def _log_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    cfg: PipelineConfig = parameters["cfg"]
    report: EvalReport = parameters["report"]
    return stage_key("eval-log", cfg.mlflow_uri(), cfg.mlflow.experiment, report.model_dump_json())


@task(name="eval-log", cache_key_fn=_log_key, persist_result=True, retries=2, retry_delay_seconds=5)
def log_eval(cfg: PipelineConfig, report: EvalReport, model: ArtifactRef) -> str:
    """An MLflow run for the evaluated model: a metric per split, the summary table."""
    run_id = eval_stage.log_to_mlflow(cfg, report, model)
    get_run_logger().info("eval %s logged to MLflow run %s", report.label, run_id)
    return run_id


@task(name="eval-model", retries=2, retry_delay_seconds=5)
def resolve_model(cfg: PipelineConfig, reference: str) -> ResolvedModel:
    """The checkpoint an MLflow alias / version / "base" / local folder names."""
    resolved = resolve_model_reference(cfg, reference)
    get_run_logger().info("model %r -> %s (sha256 %s)", reference, resolved.artifact.path,
                          resolved.artifact.sha256[:12])
    return resolved
