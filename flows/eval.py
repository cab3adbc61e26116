"""The evaluation stage as its own Prefect flow, `paravt-eval`.

    data (cached) -> resolve model -> evaluate its splits -> MLflow run

`eval_stage(cfg, model_ref, eval_data, label)` chains the evaluation task (all splits of
one checkpoint, on its own server when `eval.engine: openai` names no endpoint) and the
MLflow logging; the full pipeline flow calls it once per model (base, sft, rl). The `paravt-eval`
flow evaluates one model named by an MLflow alias, a version number, "base" or a folder.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefect import flow, get_run_logger
from pydantic import Field, model_validator

from flows.data import data_stage
from flows.params import PipelineParams
from paravt_core.config import KNOWN_SPLITS, PipelineConfig
from paravt_core.eval.report import EvalReport, format_table
from paravt_core.refs import ArtifactRef
from paravt_core.run_lock import hold_output_dir
from tasks.eval import eval_model, log_eval, resolve_model


class EvalParams(PipelineParams):
    """A pipeline config plus which model to evaluate on which splits."""

    model: str = Field("champion", description='MLflow alias ("champion", "candidate", "sft"), a version number '
                                               '("3"), "base", or a local model folder')
    splits: list[str] = Field(default_factory=list, description="splits to evaluate; empty: eval.splits")
    label: str | None = Field(None, description="row name in the table; default: the alias / v<version>")

    @model_validator(mode="after")
    def _known_splits(self) -> EvalParams:
        unknown = sorted(set(self.splits) - set(KNOWN_SPLITS))
        if unknown:
            raise ValueError(f"unknown split(s) {unknown}; known: {list(KNOWN_SPLITS)}")
        return self


def eval_stage(cfg: PipelineConfig, model_ref: ArtifactRef, eval_data: ArtifactRef, label: str,
               splits: Sequence[str] | None = None) -> EvalReport:
    """The splits `splits` (default `eval.splits`) as one cached task, then the MLflow run."""
    report = eval_model(cfg, model_ref, eval_data, label, tuple(splits or cfg.eval.splits))
    log_eval(cfg, report, model_ref)
    return report


@flow(name="paravt-eval", log_prints=True)
def eval_flow(params: EvalParams = EvalParams()) -> EvalReport:
    cfg = params.load()
    with hold_output_dir(cfg.run.output_dir, "paravt-eval flow"):
        data = data_stage(cfg)
        resolved = resolve_model(cfg, params.model)
        report = eval_stage(cfg, resolved.artifact, data.eval, params.label or resolved.label, params.splits or None)
        get_run_logger().info("eval of %s (results in %s):\n%s", report.label, report.results_dir,
                              format_table({report.label: report}))
        return report
