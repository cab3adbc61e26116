"""Prefect tasks of the miniature reproduction (flows/reproduce.py), its own wing: the full
pipeline's flows and tasks import nothing from `paravt_core.miniature` (pyproject.toml's contracts).

`pretrain`: the tiny base's perception pretraining, plugged into `tasks.model.base_stage`.

`sampled_probe` samples every model of the reproduction on the same held-out questions at one
overview budget K (`reproduce.probe`) and returns its per-question κ and format, the maps the
κ and format verdicts compare (#46 item 4). It is cached by what the result depends on: the
model's content hash, the probed split's prepared folder, the probe settings, the K, and the
sections that shape an episode (eval prompts and turns, video bounds, rollout lengths, the
model's speed options); the result is kept as JSON under `<output_dir>/probe/`, read back when
its fingerprint matches, and a deleted file re-runs the task.

`reproduce_report`: Table 2 in miniature and the per-step figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.context import TaskRunContext

from paravt_core.config import PipelineConfig
from paravt_core.data.stage import SPLIT_FILE
from paravt_core.eval.stage import results_config_hash, split_data_hash, split_folder
from paravt_core.miniature import pretrain as pretrain_stage
from paravt_core.miniature.heldout_probe import ProbeResult, probe_frames, probe_to_file
from paravt_core.miniature.reproduce import Profile, write_report
from paravt_core.refs import ArtifactRef
from paravt_core.run_clock import ClockSummary
from paravt_core.sft.stage import unseeded
from tasks._cache import stage_key


# 2: probes sampled beside another sampled call in the flow process drew from a shared generator
# and so depended on thread timing until the `hf` engine ran one sampled call at a time
# (`agent.hf_engine._SAMPLING`); results of version 1 are computed again.
PROBE_DRAWS = 2


def _fingerprint(cfg: PipelineConfig, model: ArtifactRef, eval_data: ArtifactRef) -> str:
    # The evaluation's settings a result depends on (`results_config`: not the splits a model is also
    # evaluated on, nor the concurrency; the probe samples its questions in one call), so a model's probe
    # is found again whichever splits its evaluation covered (`reproduce.rl_validation`).
    probe = cfg.reproduce.probe
    return stage_key("sampled-probe", PROBE_DRAWS, model.sha256, split_data_hash(eval_data, probe.split),
                     probe.model_dump_json(), probe_frames(cfg), results_config_hash(cfg), cfg.section_hash("model"),
                     cfg.rl.rollout.model_dump_json())


def probe_file(cfg: PipelineConfig, model: ArtifactRef, label: str):
    return cfg.run.output_dir / "probe" / f"{label}-{model.sha256[:12]}.json"


def _probe_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    cfg: PipelineConfig = parameters["cfg"]
    model: ArtifactRef = parameters["model"]
    return stage_key("sampled-probe-task", _fingerprint(cfg, model, parameters["eval_data"]),
                     output=probe_file(cfg, model, parameters["label"]))


@task(name="sampled-probe", cache_key_fn=_probe_key, persist_result=True, retries=1, retry_delay_seconds=5)
def sampled_probe(cfg: PipelineConfig, model: ArtifactRef, eval_data: ArtifactRef, label: str) -> ProbeResult:
    """κ and format per held-out question of one model (`reproduce.probe`)."""
    probe = cfg.reproduce.probe
    out = probe_file(cfg, model, label)
    result = probe_to_file(model.path, cfg, split_folder(eval_data, probe.split) / SPLIT_FILE, out,
                           _fingerprint(cfg, model, eval_data))
    n = len(result.calls)
    get_run_logger().info("%s probe (%s, K=%d, %d questions x %d samples at τ=%.1f): κ %.2f, format %.2f -> %s",
                          label, probe.split, probe_frames(cfg), n, probe.samples, probe.temperature,
                          sum(result.calls.values()) / n, sum(result.fmt.values()) / n, out)
    return result


@task(name="pretrain", retries=2, retry_delay_seconds=10)
def pretrain(cfg: PipelineConfig, base: ArtifactRef) -> ArtifactRef:
    """Perception pretraining of the tiny base (model.pretrain); a retry resumes from its checkpoint.

    Not result-cached: the stage itself is idempotent (a finished pretraining is filed by the
    content it trained on and reused from there, by any world whose corpus is the same; a
    finished run folder returns its exported model at once), and that key needs the corpus,
    which exists only once the corpus is built."""
    log = get_run_logger()
    # sft.seed seeds cold-start SFT only: every SFT seed starts from this one pretraining.
    return pretrain_stage.run(unseeded(cfg), base, log_line=lambda line: log.info(line))


@task(name="reproduce-report", retries=1)
def reproduce_report(cfg: PipelineConfig, runs: list, budget: list | None = None,
                     running: ClockSummary | None = None) -> Path:
    """Table 2 in miniature and the per-step figure under `<output_dir>/<reproduce.report_dir>/`
    (`report/` by default), with the reproduction's running time where given, logged to MLflow.

    Not cached: it is a pure function of the measurements and takes a second."""
    return write_report(runs, cfg.run.output_dir / cfg.reproduce.report_dir, f"Miniature reproduction: `{cfg.run.name}`",
                        cfg.mlflow_uri(), cfg.mlflow.experiment, budget=budget or (), running=running,
                        profile=Profile.of(cfg))
