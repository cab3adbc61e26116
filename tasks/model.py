"""Prefect task around the model stage (`paravt_core.model.stage.run`)."""

from __future__ import annotations

from collections.abc import Callable
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


def base_stage(cfg: PipelineConfig,
               pretrain: Callable[[PipelineConfig, ArtifactRef], ArtifactRef] | None = None) -> ArtifactRef:
    """The base model every training stage starts from: built or resolved, then, when
    `model.pretrain.enabled` (the tiny model only), passed through `pretrain`: the miniature's
    perception pretraining, which only the reproduction's flow plugs in (`tasks.miniature.pretrain`).

    Raises:
        ValueError: `model.pretrain.enabled` without `pretrain` (a full-pipeline flow).
    """
    if cfg.model.pretrain.enabled and pretrain is None:
        raise ValueError("model.pretrain.enabled: perception pretraining is the miniature reproduction's "
                         "(`paravt reproduce`), not this flow's; set model.pretrain.enabled=false or run "
                         "`paravt reproduce`")
    base = base_model(cfg)
    return pretrain(cfg, base) if cfg.model.pretrain.enabled else base
