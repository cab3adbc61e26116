"""What the SFT stage hands to its DeepSpeed workers (written as JSON beside the run)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from paravt_core.config import PipelineConfig


class SFTJob(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    config: PipelineConfig
    base_model: Path
    base_model_sha256: str
    data_files: list[Path]
    data_sha256: str
    out_dir: Path
    frame_cache_dir: Path
    tracking_uri: str | None
    mlflow_run_id: str | None
    git_revision: str
    stage: str = "sft"  # "pretrain": the tiny base's perception pretraining (paravt_core.miniature.pretrain)
    # A timing run (bench/sft_gpu.py): the steps and their losses.jsonl only, no checkpoint
    # and no exported model (at the 2B shape a checkpoint is 34 GB of optimizer state).
    steps_only: bool = False
    # Write torch.profiler's table of the run's second step here (bench/sft_gpu.py, issue #47:
    # profile the project's own step, not the stock forward+backward).
    profile_to: Path | None = None
