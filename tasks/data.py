"""Prefect tasks around the data stage's steps (`paravt_core.data.stage`), one per step.

`download` retries transient failures on top of the library's own backoff (a hub outage
can outlast it), never a permanent one such as a wrong repo id or revision;
`unzip` is not cached because its completion markers already make a re-run cheap and
catch deleted files; `materialize`, `validate` and `prepare_eval` are cached by the
content hashes of what they read (snapshot hashes, archive hashes, table hashes, the
contracts' source), tied to the epoch of the folder they write (`tasks._cache`), so a
deleted output re-runs its step.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.client.schemas.objects import State, TaskRun
from prefect.context import TaskRunContext

from paravt_core.config import PipelineConfig
from paravt_core.data import stage as data_stage
from paravt_core.data.hub import Downloads, LocalMirror, is_transient
from paravt_core.data.materialize import Materialized, missing_table
from paravt_core.data.mirror import ensure_world, world_complete, world_dir
from paravt_core.refs import ArtifactRef, source_digest
from tasks._cache import output_epoch, stage_key


def _materialize_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    cfg: PipelineConfig = parameters["cfg"]
    downloads: Downloads = parameters["downloads"]
    media: data_stage.Media = parameters["media"]
    out = data_stage.materialized_dir(cfg)
    return stage_key("data-materialize", downloads.parquet.sha256, media.paravt_digest,
                     output_epoch((out / "rl").resolve()), output=out / "sft")


def _validate_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    cfg: PipelineConfig = parameters["cfg"]
    tables: Materialized = parameters["tables"]
    downloads: Downloads = parameters["downloads"]
    media: data_stage.Media = parameters["media"]
    eval_inputs = sorted(
        (split, downloads.benchmark(split).sha256, media.splits[split].model_dump(mode="json"))
        for split in cfg.eval.splits
    )
    # The step's own code (which probes go with which contract, what it records) is in the key too.
    step_code = source_digest("paravt_core.data", only=("stage.py",))
    return stage_key("data-validate", tables.sft.sha256, tables.rl.sha256, eval_inputs, cfg.data.on_bad_rows,
                     cfg.data.max_quarantine_share, data_stage.contracts_version(), step_code,
                     output=data_stage.validated_dir(cfg))


def _eval_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    cfg: PipelineConfig = parameters["cfg"]
    downloads: Downloads = parameters["downloads"]
    media: data_stage.Media = parameters["media"]
    checked: data_stage.Validated = parameters["checked"]
    inputs = {
        split: [checked.eval_rows[split].sha256, downloads.benchmark(split).sha256,
                media.splits[split].model_dump(mode="json")]
        for split in cfg.eval.splits
    }
    return stage_key("data-eval", sorted(inputs.items()), output=data_stage.eval_dir(cfg))


def _download_failed_transiently(task: Any, task_run: TaskRun, state: State) -> bool:
    error = state.result(raise_on_failure=False)
    return isinstance(error, BaseException) and is_transient(error)


def _world_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    cfg: PipelineConfig = parameters["cfg"]
    out = world_dir(cfg)  # its name hashes data.synth and the generator's code
    return stage_key("data-synth-world", out.name, cfg.data.revision, output=out,
                     intact=lambda folder: world_complete(folder, cfg))


@task(name="data-synth-world", cache_key_fn=_world_key, persist_result=True)
def synth_world(cfg: PipelineConfig) -> LocalMirror:
    """The generated world as a local hub mirror (`data.source: synth`); built once per world."""
    return ensure_world(cfg)


@task(name="data-download", retries=3, retry_delay_seconds=[10, 30, 90],
      retry_condition_fn=_download_failed_transiently)
def download(cfg: PipelineConfig, mirror: LocalMirror | None = None) -> Downloads:
    """The ParaVT release and the benchmark repos, from the Hub or from a local `mirror`."""
    downloads = data_stage.download(cfg, mirror=mirror)
    get_run_logger().info("downloaded %d repos", 2 + len(downloads.benchmarks))
    return downloads


@task(name="data-unzip")
def unzip(cfg: PipelineConfig, downloads: Downloads) -> data_stage.Media:
    """Every ParaVT-Source archive into one media root; the benchmark archives per repo."""
    return data_stage.unzip(cfg, downloads)


@task(name="data-materialize", cache_key_fn=_materialize_key, persist_result=True)
def materialize(cfg: PipelineConfig, downloads: Downloads, media: data_stage.Media) -> Materialized:
    """Sentinel paths to file:// URLs (SPEC §8); logs the per-root missing-media table."""
    tables = data_stage.materialize(cfg, downloads, media)
    get_run_logger().info("media per sentinel root:\n%s", missing_table(tables.media))
    return tables


@task(name="data-validate", cache_key_fn=_validate_key, persist_result=True)
def validate(
    cfg: PipelineConfig, tables: Materialized, downloads: Downloads, media: data_stage.Media
) -> data_stage.Validated:
    """The data contracts on every SFT / RL shard and each split's annotation rows and media."""
    return data_stage.validate(cfg, tables, downloads, media)


@task(name="data-eval", cache_key_fn=_eval_key, persist_result=True)
def prepare_eval(
    cfg: PipelineConfig, downloads: Downloads, media: data_stage.Media, checked: data_stage.Validated
) -> ArtifactRef:
    """`<output_dir>/data/eval/<split>/` with rows and split.json, every video checked present."""
    return data_stage.prepare_eval(cfg, downloads, media, checked)
