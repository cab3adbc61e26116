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
