"""Where the data stage keeps its folders under `run.output_dir` (pure functions of the config).

Shared by the stages that read what the data stage wrote (RL's media, the evaluation's
prepared splits), so that they need not import the data stage itself.
"""

from __future__ import annotations

from pathlib import Path

from paravt_core.config import PipelineConfig


def data_dir(cfg: PipelineConfig) -> Path:
    return cfg.run.output_dir / "data"


def media_dir(cfg: PipelineConfig) -> Path:
    return data_dir(cfg) / "media"


def materialized_dir(cfg: PipelineConfig) -> Path:
    return data_dir(cfg) / "materialized"


def media_health_dir(cfg: PipelineConfig) -> Path:
    """Video probe verdicts by content hash (`paravt_core.video.health`), kept across runs."""
    return data_dir(cfg) / "media_health"


def validated_dir(cfg: PipelineConfig) -> Path:
    return data_dir(cfg) / "validated"


def eval_dir(cfg: PipelineConfig) -> Path:
    return data_dir(cfg) / "eval"
