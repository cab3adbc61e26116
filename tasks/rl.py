"""Prefect task around the RL stage: streams the launcher's log, retries by resuming."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.context import TaskRunContext

from paravt_core.config import PipelineConfig
from paravt_core.refs import ArtifactRef
from paravt_core.rl import stage as rl_stage
from tasks._cache import model_intact, stage_key


def _rl_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    cfg: PipelineConfig = parameters["cfg"]
    init: ArtifactRef = parameters["init"]
    data: ArtifactRef = parameters["rl_data"]
    out = rl_stage.run_dir(cfg, init, data) / "model"
    return stage_key("rl", init.sha256, data.sha256, cfg.section_hash("rl", "video", "run"), output=out,
                     intact=model_intact)


@task(name="rl", cache_key_fn=_rl_key, persist_result=True, retries=2, retry_delay_seconds=10)
def rl(cfg: PipelineConfig, init: ArtifactRef, rl_data: ArtifactRef) -> ArtifactRef:
    """PARA-GRPO from `init` (the SFT checkpoint); a retry resumes from the latest checkpoint."""
    log = get_run_logger()
    return rl_stage.run(cfg, init, rl_data, log_line=lambda line: log.info(line))
