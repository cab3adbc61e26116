"""Prefect tasks around the MLflow registry: register checkpoints, move the champion alias."""

from __future__ import annotations

import hashlib
from typing import Any

from prefect import task
from prefect.context import TaskRunContext

from paravt_core import registry
from paravt_core.config import PipelineConfig
from paravt_core.provenance import git_revision
from paravt_core.refs import ArtifactRef
from tasks._cache import stage_key


def _register_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    cfg: PipelineConfig = parameters["cfg"]
    ckpt: ArtifactRef = parameters["checkpoint"]
    return stage_key("register", cfg.mlflow_uri(), cfg.model.registered_name, ckpt.sha256, parameters["stage"],
                     parameters.get("parent_version"), parameters.get("alias"))


@task(name="register", cache_key_fn=_register_key, persist_result=True, retries=2, retry_delay_seconds=5)
def register(cfg: PipelineConfig, checkpoint: ArtifactRef, stage: str, data_sha256: str,
             parent_version: str | None = None, alias: str | None = None) -> registry.ModelVersion:
    """Register a checkpoint as an MLflow model version (idempotent on its content hash)."""
    return registry.register_checkpoint(
        cfg.mlflow_uri(), cfg.mlflow.experiment, cfg.model.registered_name, checkpoint, stage=stage,
        parent_version=parent_version, data_sha256=data_sha256, config_hash=cfg.section_hash(),
        git_revision=git_revision(), alias=alias)


@task(name="promote", retries=1)
def promote(cfg: PipelineConfig, candidate: registry.ModelVersion, score: float, eval_data: ArtifactRef) -> bool:
    """Move `champion` to the candidate when its seven-split average beats the champion's
    on the same evaluation (eval data and eval settings)."""
    eval_key = hashlib.sha256(f"{eval_data.sha256}|{cfg.section_hash('eval')}".encode()).hexdigest()[:16]
    return registry.promote(cfg.mlflow_uri(), cfg.model.registered_name, candidate, score, eval_key)
