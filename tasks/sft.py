"""Prefect task around the SFT stage: streams the launcher's log, retries by resuming."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.context import TaskRunContext

from paravt_core.cache_identity import grammar_key_parts, sft_run_settings
from paravt_core.config import PipelineConfig
from paravt_core.refs import ArtifactRef
from paravt_core.sft import grammar, stage as sft_stage
from paravt_core.sft.stage import ExtraShard
from paravt_core.tracking import MetricLogger
from tasks._cache import model_intact, stage_key


def _sft_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    cfg: PipelineConfig = parameters["cfg"]
    base: ArtifactRef = parameters["base"]
    data: ArtifactRef = parameters["sft_data"]
    out = sft_stage.run_dir(cfg, base, data, extra=parameters.get("extra")) / "model"
    return stage_key("sft", base.sha256, data.sha256, sft_run_settings(cfg), output=out,
                     intact=model_intact)


@task(name="sft", cache_key_fn=_sft_key, persist_result=True, retries=2, retry_delay_seconds=10)
def sft(cfg: PipelineConfig, base: ArtifactRef, sft_data: ArtifactRef, extra: ExtraShard | None = None) -> ArtifactRef:
    """Cold-start SFT; a retry resumes from the run's latest DeepSpeed checkpoint. `extra`: one more
    shard trained beside `sft_data`, its key in the run's folder name (the reproduction passes the
    miniature's replay rows, `model.pretrain.sft_replay_rows`; the full pipeline none)."""
    log = get_run_logger()
    return sft_stage.run(cfg, base, sft_data, log_line=lambda line: log.info(line), extra=extra)


def _grammar_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    # The check reads only the rollout protocol and frame settings: an RL-only change
    # (steps, rewards, a new ablation row with the same protocol) must not re-run it.
    cfg: PipelineConfig = parameters["cfg"]
    return stage_key("sft-grammar", parameters["base"].sha256, parameters["sft_model"].sha256,
                     parameters["data"].eval.sha256, *grammar_key_parts(cfg))


@task(name="sft-grammar", persist_result=True, cache_key_fn=_grammar_key)
def sft_grammar(cfg: PipelineConfig, base: ArtifactRef, sft_model: ArtifactRef, data) -> dict[str, Any]:
    """Share of held-out greedy episodes that follow the response grammar, before and after SFT;
    "set_aside": [prompt id, why] of held-out samples whose video did not decode. The check runs
    in a process of its own, so no model stays in the flow process (`sft/grammar.py`)."""
    log = get_run_logger()
    run_dir = sft_stage.run_dir(cfg, base, data.sft)  # the full pipeline's SFT: no extra shard
    reports = grammar.run_in_own_process(cfg, base.path, sft_model.path, data.sft.path, data.eval.path,
                                         run_dir / "grammar", log_line=lambda line: log.info(line))
    out = {f"grammar_rate_{k}": r.rate for k, r in reports.items()}
    out |= {f"tool_use_rate_{k}": r.used_tools / max(1, r.episodes) for k, r in reports.items()}
    run_id_file = run_dir / "mlflow_run_id"
    if run_id_file.is_file():
        MetricLogger(cfg.mlflow_uri(), run_id_file.read_text().strip()).log(cfg.sft.max_steps, out)
    log.info("grammar on %d held-out prompts: %s", reports["sft"].episodes, out)
    return {**out, "set_aside": [list(entry) for entry in reports["sft"].set_aside]}
