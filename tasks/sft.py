"""Prefect task around the SFT stage: streams the launcher's log, retries by resuming."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.context import TaskRunContext

from paravt_core.config import PipelineConfig
from paravt_core.refs import ArtifactRef
from paravt_core.sft import stage as sft_stage
from tasks._cache import stage_key


def _sft_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    cfg: PipelineConfig = parameters["cfg"]
    base: ArtifactRef = parameters["base"]
    data: ArtifactRef = parameters["sft_data"]
    out = sft_stage.run_dir(cfg, base, data) / "model"
    return stage_key("sft", base.sha256, data.sha256, cfg.section_hash("sft", "video", "run"), output=out)


@task(name="sft", cache_key_fn=_sft_key, persist_result=True, retries=2, retry_delay_seconds=10)
def sft(cfg: PipelineConfig, base: ArtifactRef, sft_data: ArtifactRef) -> ArtifactRef:
    """Cold-start SFT; a retry resumes from the run's latest DeepSpeed checkpoint."""
    log = get_run_logger()
    return sft_stage.run(cfg, base, sft_data, log_line=lambda line: log.info(line))
