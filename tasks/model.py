"""Prefect task around the model stage (`paravt_core.model.stage.run`)."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.context import TaskRunContext

from paravt_core.config import PipelineConfig
from paravt_core.model import stage as model_stage
from paravt_core.refs import ArtifactRef
from tasks._cache import stage_key


def _base_model_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    cfg: PipelineConfig = parameters["cfg"]
    if cfg.model.is_tiny:
        # The tiny model is a pure function of its spec and of the builder's code (both in the
        # folder name): cache on the folder, while it exists.
        out = model_stage.base_model_dir(cfg)
        return stage_key("base-model", out.name, output=out)
    # A hub or local checkpoint can change behind our back: always re-resolve (cheap).
    return stage_key("base-model", cfg.model.base, context.task_run.id)


@task(name="base-model", cache_key_fn=_base_model_key, persist_result=True, retries=2, retry_delay_seconds=5)
def base_model(cfg: PipelineConfig) -> ArtifactRef:
    """Build the tiny Qwen3-VL or resolve the configured checkpoint."""
    return model_stage.run(cfg)


@task(name="pretrain", retries=2, retry_delay_seconds=10)
def pretrain(cfg: PipelineConfig, base: ArtifactRef) -> ArtifactRef:
    """Perception pretraining of the tiny base (model.pretrain); a retry resumes from its checkpoint.

    Not result-cached: the stage itself is idempotent (a finished pretraining is filed by the
    content it trained on and reused from there, by any world whose corpus is the same; a
    finished run folder returns its exported model at once), and that key needs the corpus,
    which exists only once the corpus is built."""
    from prefect import get_run_logger

    from paravt_core.miniature import pretrain as pretrain_stage
    from paravt_core.sft.stage import unseeded

    log = get_run_logger()
    # sft.seed seeds cold-start SFT only: every SFT seed starts from this one pretraining.
    return pretrain_stage.run(unseeded(cfg), base, log_line=lambda line: log.info(line))


def base_stage(cfg: PipelineConfig) -> ArtifactRef:
    """The base model every training stage starts from: built or resolved, then perception
    pretrained when `model.pretrain.enabled` (the tiny model only)."""
    base = base_model(cfg)
    return pretrain(cfg, base) if cfg.model.pretrain.enabled else base
