"""Where the data stage keeps its folders under `run.output_dir` (pure functions of the config).

Shared by the stages that read what the data stage wrote (RL's media, the evaluation's
prepared splits), so that they need not import the data stage itself.
"""

from __future__ import annotations

from pathlib import Path

from paravt_core.config import PipelineConfig

MATERIALIZED, VALIDATED = "materialized", "validated"  # the data folder's two kinds of table folders
MEDIA = "media"


def data_dir(cfg: PipelineConfig) -> Path:
    return cfg.run.output_dir / "data"


def media_dir(cfg: PipelineConfig) -> Path:
    return data_dir(cfg) / MEDIA


def materialized_dir(cfg: PipelineConfig) -> Path:
    return data_dir(cfg) / MATERIALIZED


def media_health_dir(cfg: PipelineConfig) -> Path:
    """Video probe verdicts by content hash (`paravt_core.video.health`), kept across runs."""
    return data_dir(cfg) / "media_health"


def validated_dir(cfg: PipelineConfig) -> Path:
    return data_dir(cfg) / VALIDATED


def eval_dir(cfg: PipelineConfig) -> Path:
    return data_dir(cfg) / "eval"


def media_dir_of(tables: Path) -> Path | None:
    """The media folder of the data stage that wrote `tables`, a folder of materialized or
    validated shards (`<data dir>/materialized/<kind>`, `<data dir>/validated/<kind>`); None for a
    folder laid out otherwise. A stage that reads another run's data (an RL row reusing a data
    bundle from another output folder) finds that run's media here, not under its own config's."""
    tables = Path(tables)
    if tables.parent.name not in (MATERIALIZED, VALIDATED):
        return None
    return tables.parent.parent / MEDIA
