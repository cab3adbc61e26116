"""RL stage: PARA-GRPO from the SFT checkpoint on the materialized RL prompts (SPEC §5).

Like SFT, `run` launches the DeepSpeed workers (`paravt_core.rl.worker`) through the
`deepspeed` launcher; the run folder is keyed by (init model hash, data hash, RL config
hash), a re-run after a crash resumes from its latest checkpoint, and a finished run
returns its exported model at once. The MLflow run is tagged with the ablation row.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from paravt_core.agent.weight_snapshots import release_shm_staging
from paravt_core.cache_identity import rl_run_config
from paravt_core.config import PipelineConfig
from paravt_core.dist.launch import LogLine, run_stage_workers
from paravt_core.layout import media_dir, media_dir_of
from paravt_core.provenance import git_revision
from paravt_core.refs import ArtifactRef
from paravt_core.rl.job import RLJob
from paravt_core.rl.rollout_engine import check_rollout_engine
from paravt_core.tracking import flatten, stage_run_id

WORKER = Path(__file__).with_name("worker.py")


def run_dir(cfg: PipelineConfig, init: ArtifactRef, rl_data: ArtifactRef) -> Path:
    # Where the rollout server runs is not part of the run's identity (`cache_identity.server_location`).
    key = hashlib.sha256(
        f"{init.sha256}|{rl_data.sha256}|{rl_run_config(cfg).section_hash('rl', 'video', 'run')}".encode()
    ).hexdigest()[:16]
    return cfg.run.output_dir / "rl" / f"{cfg.rl.row}-{key}"


def rl_shards(rl_data: ArtifactRef) -> list[Path]:
    files = sorted(Path(rl_data.path).glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no RL parquet shards in {rl_data.path}; run the data stage first")
    return files


def media_root(cfg: PipelineConfig, rl_data: ArtifactRef) -> Path:
    """What the RL videos are keyed relative to (`rl.data.video_key`, which seeds gating's K):
    the media folder of the data stage that wrote `rl_data`, which need not be this config's
    run.output_dir (a row given another run's data bundle, flows/fanout.py `RowSpec`); the
    config's own media folder for RL data laid out otherwise."""
    return (media_dir_of(Path(rl_data.path)) or media_dir(cfg)).resolve()


def make_job(cfg: PipelineConfig, init: ArtifactRef, rl_data: ArtifactRef, with_mlflow: bool = True) -> RLJob:
    out = run_dir(cfg, init, rl_data)
    out.mkdir(parents=True, exist_ok=True)
    return RLJob(config=cfg, init_model=init.path, init_model_sha256=init.sha256, data_files=rl_shards(rl_data),
                 media_root=media_root(cfg, rl_data),
                 data_sha256=rl_data.sha256, out_dir=out.resolve(), tracking_uri=cfg.mlflow_uri(),
                 mlflow_run_id=_mlflow_run(cfg, out, init, rl_data) if with_mlflow and cfg.mlflow.enabled else None,
                 git_revision=git_revision())


def run(cfg: PipelineConfig, init: ArtifactRef, rl_data: ArtifactRef, log_line: LogLine = print) -> ArtifactRef:
    """Raises `ConfigError` before any worker starts when `rl.rollout.engine` cannot run here."""
    check_rollout_engine(cfg)
    out = run_dir(cfg, init, rl_data)
    try:
        return run_stage_workers(out, "rl_model", lambda: make_job(cfg, init, rl_data), WORKER, cfg.rl.num_ranks,
                                 cfg.rl.hostfile, log_line, threads_per_rank(cfg))
    finally:
        # Rank 0 deletes its /dev/shm weight snapshots when it closes; a killed or crashed rank 0 cannot.
        release_shm_staging(out / "rollout_weights")


def threads_per_rank(cfg: PipelineConfig) -> int | None:
    """Each rank's share of the run's thread budget (`run.fanout.threads_per_run`), at least one."""
    budget = cfg.run.fanout.threads_per_run
    return None if budget is None else max(1, budget // cfg.rl.num_ranks)


def _mlflow_run(cfg: PipelineConfig, out: Path, init: ArtifactRef, rl_data: ArtifactRef) -> str:
    """The run's MLflow run id, tagged with its ablation row; a resumed run reuses it."""
    return stage_run_id(
        out, cfg.mlflow_uri(), cfg.mlflow.experiment, f"{cfg.run.name}-rl-{cfg.rl.row}",
        tags={"stage": "rl", "ablation_row": cfg.rl.row, "init_model_sha256": init.sha256,
              "data_sha256": rl_data.sha256, "config_hash": cfg.section_hash(), "git_revision": git_revision()},
        params=flatten(cfg.model_dump(mode="json", include={"rl", "video", "model", "run"})),
    )
