"""What the RL stage hands to its DeepSpeed workers (written as JSON beside the run)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from paravt_core.config import PipelineConfig


class RLJob(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    config: PipelineConfig
    init_model: Path  # the SFT checkpoint (policy init and frozen reference)
    init_model_sha256: str
    data_files: list[Path]
    media_root: Path | None = None  # what RL video paths are keyed relative to (rl.data.video_key)
    data_sha256: str
    out_dir: Path
    tracking_uri: str | None
    mlflow_run_id: str | None
    git_revision: str
    # A timing run (bench/rl_gpu.py): the steps and metrics.jsonl only, no checkpoint and no
    # exported model (at the 2B shape a checkpoint is 34 GB of optimizer state).
    steps_only: bool = False
