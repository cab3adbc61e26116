"""Prefect tasks around the evaluation stage (`paravt_core.eval.stage`).

`eval_split` evaluates one split and is cached by what its result depends on: the model's
content hash, the hash of that split's prepared folder, the result-shaping eval settings
(`stage.results_config_hash`) and the sample cap, tied to the epoch of the split's
results JSON (`tasks._cache`), so a deleted result re-runs the split. A retry resumes
from the split's JSON line log instead of starting over.

`log_eval` opens one MLflow run per evaluated model; `resolve_model` turns an alias,
version, "base" or folder into a checkpoint reference (never cached: aliases move).
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.context import TaskRunContext

from paravt_core.config import PipelineConfig
from paravt_core.eval import stage as eval_stage
from paravt_core.eval.evaluator import SplitRun
from paravt_core.eval.models import ResolvedModel
from paravt_core.eval.models import resolve_model as resolve_model_reference
from paravt_core.eval.report import EvalReport
from paravt_core.refs import ArtifactRef
from tasks._cache import stage_key


def _split_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    cfg: PipelineConfig = parameters["cfg"]
    model: ArtifactRef = parameters["model"]
    eval_data: ArtifactRef = parameters["eval_data"]
    split: str = parameters["split"]
    out = eval_stage.results_dir(cfg, model) / f"{split}.json"
    return stage_key("eval-split", split, model.sha256, eval_stage.split_data_hash(eval_data, split),
                     eval_stage.results_config_hash(cfg), cfg.eval.max_samples_per_split, output=out)


@task(name="eval-split", cache_key_fn=_split_key, persist_result=True, retries=1, retry_delay_seconds=10)
def eval_split(cfg: PipelineConfig, model: ArtifactRef, eval_data: ArtifactRef, split: str) -> SplitRun:
    """One SPEC §7 split: resumes from its log, writes `<results>/<split>.json`."""
    result = eval_stage.evaluate_prepared_split(cfg, model, eval_data, split, progress=False)
    primary = result.summary["primary"]
    get_run_logger().info("%s: %s %.3f over %d samples (%d run now); avg tool calls %.2f", split, primary["name"],
                          primary["value"], result.summary["n"], result.evaluated, result.summary["avg_tool_calls"])
    return result


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
