"""SFT stage: cold-start SFT of the base model on the materialized SFT shards (SPEC §1).

`run` launches the DeepSpeed workers (`paravt_core.sft.worker`) through the `deepspeed`
launcher, so the same call trains on 1 CPU rank, N local GPUs or a hostfile's nodes. The
run folder is keyed by (base model hash, data hash, config hash): calling `run` again
after a crash resumes from the latest checkpoint in that folder, and calling it after a
finished run returns the exported model at once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from paravt_core.cache_identity import sft_run_settings
from paravt_core.config import PipelineConfig
from paravt_core.dist.launch import LogLine, run_stage_workers
from paravt_core.dist.weights import MODEL_META
from paravt_core.provenance import git_revision
from paravt_core.refs import ArtifactRef
from paravt_core.sft.job import SFTJob
from paravt_core.tracking import flatten, stage_run_id
WORKER = Path(__file__).with_name("worker.py")


@dataclass(frozen=True)
class ExtraShard:
    """One more parquet shard trained beside the SFT data, written into the run folder when the
    run starts (the miniature's replay rows, `paravt_core.miniature.pretrain.replay_shard`).

    `key` joins the run folder's key: it must name everything that decides the rows that the
    data and base model hashes do not already cover.
    """

    key: str
    file_name: str  # the shard's name in the run folder
    write: Callable[[Path, LogLine], Path]  # (path in the run folder, log) -> the written shard


def run_dir(cfg: PipelineConfig, base: ArtifactRef, sft_data: ArtifactRef, stage: str = "sft",
            extra: ExtraShard | None = None) -> Path:
    """`<output_dir>/<stage>/<key>`: keyed by the base model, the data, the `sft`, `video` and
    `run` sections and the extra shard's key, if any."""
    key = hashlib.sha256(
        f"{base.sha256}|{sft_data.sha256}|{sft_run_settings(cfg)}{f'|{extra.key}' if extra else ''}"
        .encode()).hexdigest()[:16]
    return cfg.run.output_dir / stage / key


def seeded(cfg: PipelineConfig) -> PipelineConfig:
    """`cfg` as the SFT workers see it: `run.seed` replaced by `sft.seed` where that is set."""
    if cfg.sft.seed is None:
        return cfg
    return cfg.model_copy(update={"run": cfg.run.model_copy(update={"seed": cfg.sft.seed})})


def unseeded(cfg: PipelineConfig) -> PipelineConfig:
    """`cfg` without `sft.seed`: what a stage that trains the base SFT starts from (the
    miniature's pretraining, which takes its optimisation settings from the `sft` section) runs
    on, so that SFT seeds share one base."""
    if cfg.sft.seed is None:
        return cfg
    return cfg.model_copy(update={"sft": cfg.sft.model_copy(update={"seed": None})})


def sft_shards(sft_data: ArtifactRef) -> list[Path]:
    files = sorted(Path(sft_data.path).glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no SFT parquet shards in {sft_data.path}; run the data stage first")
    return files


def run(cfg: PipelineConfig, base: ArtifactRef, sft_data: ArtifactRef, log_line: LogLine = print,
        stage: str = "sft", extra: ExtraShard | None = None) -> ArtifactRef:
    """Train (or resume, or return the finished) model on `sft_data`'s shards and `extra`'s, if
    given; `stage` names the run folder and the MLflow run (the miniature's pretraining phases
    run under their own names)."""
    out = run_dir(cfg, base, sft_data, stage, extra)

    def job() -> SFTJob:
        files = sft_shards(sft_data)
        if extra is not None:
            files.append(extra.write(out.resolve() / extra.file_name, log_line))
        return SFTJob(
            config=seeded(cfg),
            base_model=base.path,
            base_model_sha256=base.sha256,
            data_files=files,
            data_sha256=sft_data.sha256,
            out_dir=out.resolve(),
            frame_cache_dir=(cfg.run.output_dir / "cache" / "frames").resolve(),
            tracking_uri=cfg.mlflow_uri(),
            mlflow_run_id=_mlflow_run(cfg, out, base, sft_data, stage) if cfg.mlflow.enabled else None,
            git_revision=git_revision(),
            stage=stage,
        )

    model = run_stage_workers(out, "sft_model", job, WORKER, cfg.sft.num_ranks, cfg.sft.hostfile, log_line)
    skipped = json.loads((Path(model.path) / MODEL_META).read_text()).get("media_skipped") or {}
    for source, problem in skipped.items():
        log_line(f"warning: SFT skipped {source}: {problem}")
    return model


def _mlflow_run(cfg: PipelineConfig, out: Path, base: ArtifactRef, sft_data: ArtifactRef, stage: str) -> str:
    """The run's MLflow run id; a resumed run keeps logging into the run it started."""
    return stage_run_id(
        out, cfg.mlflow_uri(), cfg.mlflow.experiment, f"{cfg.run.name}-{stage}",
        tags={"stage": stage, "base_model_sha256": base.sha256, "data_sha256": sft_data.sha256,
              "config_hash": cfg.section_hash(), "git_revision": git_revision()},
        params=flatten(cfg.model_dump(mode="json", include={"sft", "video", "model", "run"})),
    )
