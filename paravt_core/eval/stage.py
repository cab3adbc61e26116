"""Evaluation stage: a checkpoint on the prepared SPEC §7 splits -> `EvalReport`.

`run(cfg, model, eval_data, label, splits)` reads top to bottom:
1. one runner of `eval.engine` for all splits, opened when a split first has samples left
   to run (`hf`: the checkpoint loaded into an `HFEngine`, on CUDA when there is one;
   `openai`: a client of the server at `eval.endpoint`, or, with no endpoint, of a server
   started then on this checkpoint and stopped after the splits, `eval/served.py`);
2. per split: load `<eval_data>/<split>/split.json` (the data stage's output; a row the
   loader cannot read is quarantined into the split's summary), keep the
   first `eval.max_samples_per_split` samples, and `evaluate_split` them into the results
   folder, resuming from the split's JSON line log;
3. `build_report`: the splits' summaries and their average.

Resume key: a finished record is reused only when the checkpoint, the result-shaping
settings, the code that words the prompts and the split's data are all unchanged.
- The results folder is `<output_dir>/eval/<model sha256[:12]>-<results config hash>/`: the
  same checkpoint under the same `results_config` (eval settings, frame sampling, and a
  digest of the prompt-wording sources `PROMPT_SOURCES`) always lands in the same folder,
  so a re-run resumes instead of redoing samples.
- Each split also gets `<split>.source.json` pinning the content hash of its prepared data
  folder (annotation rows, split.json, source.json). When the split's data changed (e.g.
  re-prepared with other rows), or a log has no readable pin, the old log and JSON are set
  aside as `<split>.jsonl.stale-<old hash or "unpinned">` and the split starts over.

At the `openai` engine's start, before any other request, `agent.served_model.check_served_model`
holds what the server says it serves (`/v1/models`) to the checkpoint: a served name carrying
its sha256[:12] or a root folder with its content, else the run stops naming both (issue #48);
then `check_serves_weights` holds the server's log-probabilities of a fixed probe to the
checkpoint's, loaded on the CPU for it (issue #61 item 1: a name proves nothing).
Then `openai_engine.check_server_rendering` holds the server's chat template and image
handling to ours on a probe request, frames resized to `video.min_pixels`/`max_pixels`
(SPEC §1, §3) whatever the served processor config says; a mismatch stops the run.
The `openai` engine's server comes from `eval.endpoint` / `eval.served_model_name` /
`eval.request_timeout_s`, or from PARAVT_EVAL_ENDPOINT / PARAVT_EVAL_MODEL_NAME /
PARAVT_EVAL_TIMEOUT_S when those are unset (model name default: the checkpoint folder's path,
vLLM's default served name; timeout default 600 s); the key only from PARAVT_EVAL_API_KEY.
With neither endpoint the stage serves the checkpoint itself (`served.ServerOnDemand`, under
the name `served_model_name` gives it, on a free port): the results folder is keyed as above,
never by the port or the GPUs the server got.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from paravt_core import registry
from paravt_core.agent.hf_build import build_hf_engine
from paravt_core.agent.policy_probe import ServedPolicyMismatch, check_served_logprobs, probe_tolerance
from paravt_core.agent.served_model import ServedModelMismatch, ServerUnanswered, check_served_model
from paravt_core.atomic import atomic_write_text
from paravt_core.cache_identity import eval_results_settings
from paravt_core.config import KNOWN_SPLITS, EvalConfig, ModelConfig, PipelineConfig
from paravt_core.eval.evaluator import (
    EvalError,
    EvalSettings,
    HFSampleRunner,
    OpenAISampleRunner,
    SampleRunner,
    SplitRun,
    evaluate_split,
)
from paravt_core.eval.openai_engine import ChatError, OpenAIChatClient, ServerRenderingMismatch, check_server_rendering
from paravt_core.eval.report import EvalReport, build_report, format_table, log_report
from paravt_core.eval.results import EpisodeOutcome
from paravt_core.eval.samples import EvalSample, LoadedSplit, read_split
from paravt_core.eval.served import ENDPOINT_ENV, Served, ServerOnDemand, serves_its_own
from paravt_core.model.loading import build_model, load_processor
from paravt_core.own_process import call_in_own_process
from paravt_core.plan import declare_stage
from paravt_core.provenance import git_revision
from paravt_core.refs import ArtifactRef, content_hash, source_digest
from paravt_core.tracking import flatten

logger = logging.getLogger(__name__)

MODEL_NAME_ENV = "PARAVT_EVAL_MODEL_NAME"
API_KEY_ENV = "PARAVT_EVAL_API_KEY"
TIMEOUT_ENV = "PARAVT_EVAL_TIMEOUT_S"
SPLIT_FILE = "split.json"


# The files whose strings the evaluated model reads: system turns and forced answers,
# question texts built from the rows, the video path sentence and sub-agent request, and
# how frames are rendered (timestamped image items, agent/media.py).
PROMPT_SOURCES = {"paravt_core.eval": ("prompting.py", "samples.py"), "paravt_core.agent": ("prompts.py", "media.py")}


def prompt_sources_digest() -> str:
    """Digest of `PROMPT_SOURCES`: rewording a prompt moves results to a new folder."""
    return "-".join(source_digest(package, only=files) for package, files in sorted(PROMPT_SOURCES.items()))


def results_config(cfg: PipelineConfig) -> dict[str, Any]:
    """The settings a per-sample result depends on (`cache_identity.eval_results_settings`: not
    the split list, the sample cap, the concurrency or how the stage starts its own server) and
    the digest of the prompts' sources."""
    return {**eval_results_settings(cfg), "prompt_sources": prompt_sources_digest()}


def results_config_hash(cfg: PipelineConfig) -> str:
    return hashlib.sha256(json.dumps(results_config(cfg), sort_keys=True).encode()).hexdigest()[:12]


def results_dir(cfg: PipelineConfig, model: ArtifactRef) -> Path:
    return cfg.run.output_dir / "eval" / f"{model.sha256[:12]}-{results_config_hash(cfg)}"


def split_folder(eval_data: ArtifactRef, split: str) -> Path:
    folder = Path(eval_data.path) / split
    if not (folder / SPLIT_FILE).is_file():
        prepared = sorted(p.name for p in Path(eval_data.path).iterdir() if (p / SPLIT_FILE).is_file())
        raise EvalError(f"split {split}: {folder / SPLIT_FILE} does not exist (prepared splits: {prepared}); add "
                        f"{split} to eval.splits and re-run the data stage")
    return folder


def split_data_hash(eval_data: ArtifactRef, split: str) -> str:
    """Content hash of one split's prepared folder (rows, split.json, source.json)."""
    return content_hash(split_folder(eval_data, split))


def load_samples(cfg: PipelineConfig, eval_data: ArtifactRef, split: str) -> LoadedSplit:
    """The split's samples, the first `eval.max_samples_per_split` of them when set, and
    the rows its loader quarantined (they go into the split's summary)."""
    record = json.loads((split_folder(eval_data, split) / SPLIT_FILE).read_text())
    subtitle_dir = Path(record["subtitle_dir"]) if record["subtitle_dir"] else None
    loaded = read_split(record["split"], Path(record["rows"]), Path(record["video_dir"]), subtitle_dir)
    for quarantined in loaded.quarantined:
        logger.warning("split %s: quarantined %s", split, quarantined.error())
    cap = cfg.eval.max_samples_per_split
    return LoadedSplit(split, loaded.samples[:cap] if cap else loaded.samples, loaded.quarantined)


# --- runners --------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _loaded_model(model_path: str, sha256: str, model_cfg: ModelConfig, device: str) -> tuple[Any, Any]:
    logger.info("loading %s (sha256 %s) as %s on %s", model_path, sha256[:12], model_cfg.dtype, device)
    processor = load_processor(model_path)
    return build_model(model_cfg, model_path, device=device), processor


def hf_engine(cfg: PipelineConfig, model: ArtifactRef) -> tuple[Any, Any]:
    """(HFEngine, processor) of a checkpoint on CUDA when there is one, else the CPU, built from
    `cfg` (`model.loading.build_model`: `model.*`; `agent.hf_build`: `eval.hf_batch_tokens`).
    The model is loaded once per process and shared by all its splits (the last checkpoint
    loaded stays cached)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    loaded, processor = _loaded_model(str(model.path), model.sha256, cfg.model, device)
    return build_hf_engine(cfg, loaded, processor, "evaluation"), processor


def _openai_client(model: ArtifactRef, eval_cfg: EvalConfig, served: Served | None = None) -> Any:
    timeout = eval_cfg.request_timeout_s or float(os.environ.get(TIMEOUT_ENV, "600"))
    if served is not None:
        return OpenAIChatClient(served.endpoint, served.model_name, timeout_s=timeout)
    endpoint = eval_cfg.endpoint or os.environ.get(ENDPOINT_ENV)
    if not endpoint:
        raise EvalError(f"eval.engine is openai but neither eval.endpoint nor {ENDPOINT_ENV} is set, and no server "
                        f"was started for {model.path}; evaluate through `stage.run` (it serves the checkpoint), or "
                        "serve it with `paravt eval serve` and set eval.endpoint, e.g. http://127.0.0.1:30000/v1")
    name = eval_cfg.served_model_name or os.environ.get(MODEL_NAME_ENV, str(model.path))
    return OpenAIChatClient(endpoint, name, timeout_s=timeout, api_key=os.environ.get(API_KEY_ENV))


def check_serves_checkpoint(client: Any, model: ArtifactRef) -> None:
    """Refuse a server that serves another checkpoint than `model` (`agent/served_model.py`):
    its answers would be scored and cached under this checkpoint's key (issue #48)."""
    api_root = client.url.removesuffix("/chat/completions")
    try:
        check_served_model(api_root, client.model, model.path, model.sha256, api_key=client.api_key,
                           timeout_s=client.timeout_s)
    except ServerUnanswered as exc:  # the server's fault, as a failed chat request is
        raise ChatError(f"eval.engine=openai: {exc}") from exc
    except ServedModelMismatch as exc:
        raise EvalError(f"eval.engine=openai: {exc}") from exc


def check_serves_weights(client: Any, model: ArtifactRef, tokenizer: Any, cfg: PipelineConfig) -> float:
    """Refuse a server whose log-probabilities of a fixed probe are not `model`'s, loaded here
    on the CPU (`agent/policy_probe.py`): `check_serves_checkpoint` takes a server whose root
    is not a folder on this machine on its name, and a name proves nothing (issue #61 item
    1). Returns the gap, nats per token."""
    api_root = client.url.removesuffix("/chat/completions")
    try:
        gap = check_served_logprobs(api_root, client.model, model.path, tokenizer, cfg.model,
                                    probe_tolerance(cfg.model.dtype, cfg.rl.served_logprob_tolerance),
                                    api_key=client.api_key, deadline_s=client.timeout_s)
    except ServerUnanswered as exc:  # the server's fault, as a failed chat request is
        raise ChatError(f"eval.engine=openai: the log-probability probe at {api_root}/completions got {exc}") from exc
    except ServedPolicyMismatch as exc:
        raise EvalError(f"eval.engine=openai: {exc}") from exc
    logger.info("eval: the server at %s serves %s's weights (probe log-prob gap %.2e nats per token)", api_root,
                model.path, gap)
    return gap


class LazyRunner:
    """Opens the real runner (loads the model, or starts its server) only once a sample is
    left to run, so a finished split re-summarized after a restart costs no model load."""

    def __init__(self, cfg: PipelineConfig, model: ArtifactRef, server: ServerOnDemand | None = None):
        self.cfg, self.model, self.server = cfg, model, server
        self._runner: SampleRunner | None = None

    def outcomes(self, samples: Sequence[EvalSample]) -> Iterator[tuple[EvalSample, EpisodeOutcome]]:
        if not samples:
            return iter(())
        if self._runner is None:
            self._runner = open_runner(self.cfg, self.model, self.server.get() if self.server else None)
        return self._runner.outcomes(samples)


def runner_settings(cfg: PipelineConfig, served: Served | None = None) -> EvalSettings:
    """The evaluation settings; on the stage's own server, `eval.concurrency` samples in
    flight per replica it serves (`served.py`)."""
    settings = EvalSettings.from_pipeline(cfg)
    if served is None or served.replicas == 1:
        return settings
    in_flight = cfg.eval.concurrency * served.replicas
    return EvalSettings(cfg.eval.model_copy(update={"concurrency": in_flight}), settings.video, settings.rollout)


def open_runner(cfg: PipelineConfig, model: ArtifactRef, served: Served | None = None) -> SampleRunner:
    """The `SampleRunner` of `eval.engine` for this checkpoint; with `served`, on that server
    (the stage's own) with `eval.concurrency` samples in flight per replica."""
    settings = runner_settings(cfg, served)
    if cfg.eval.engine == "openai":
        client = _openai_client(model, cfg.eval, served)
        check_serves_checkpoint(client, model)
        processor = load_processor(model.path)
        check_serves_weights(client, model, processor.tokenizer, cfg)
        try:
            # Held to the configuration's pixel bounds, not the served processor's: a server on
            # a folder whose processor upscales frames renders the same as that processor, and
            # would pass (issue #60 finding 2).
            check_server_rendering(client, processor, settings.rollout_for(cfg.eval.prompt_mode).think_prefix,
                                   pixel_bounds=(cfg.video.min_pixels, cfg.video.max_pixels))
        except ServerRenderingMismatch as exc:
            raise EvalError(f"the server does not render prompts as {model.path} does: {exc}") from exc
        return OpenAISampleRunner(client, processor, settings)

    declare_stage("evaluation (hf)", "evaluation (hf)", cfg, model.path)
    engine, processor = hf_engine(cfg, model)
    return HFSampleRunner(engine, processor, settings)


# --- one split ------------------------------------------------------------------------


def _pinned_data_hash(source: Path) -> str | None:
    """The split data hash a results log was made from, None when no readable pin says."""
    if not source.is_file():
        return None
    try:
        pinned = json.loads(source.read_text()).get("split_sha256")
    except (json.JSONDecodeError, AttributeError, UnicodeDecodeError):
        return None
    return pinned if isinstance(pinned, str) and pinned else None


def _set_aside(path: Path, tag: str) -> Path:
    """Rename `path` to `<name>.stale-<tag>`, numbered when that name is taken."""
    target, number = path.with_name(f"{path.name}.stale-{tag}"), 1
    while target.exists():
        target, number = path.with_name(f"{path.name}.stale-{tag}.{number}"), number + 1
    path.rename(target)
    return target


def _pin_split_data(folder: Path, split: str, data_hash: str) -> None:
    """Set aside a log not made from this split data (or of unknown data), then record
    this split data's hash: part of the resume key (module docstring)."""
    source = folder / f"{split}.source.json"
    old = _pinned_data_hash(source)
    if old == data_hash:
        return
    tag = old[:12] if old else "unpinned"
    for name in (f"{split}.jsonl", f"{split}.json"):
        if (folder / name).exists():
            target = _set_aside(folder / name, tag)
            logger.warning("split %s: %s was made from %s; set aside as %s", split, name,
                           "other split data" if old else "split data of unknown hash", target.name)
    atomic_write_text(source, json.dumps({"split": split, "split_sha256": data_hash}, indent=1) + "\n")


def own_server(cfg: PipelineConfig, model: ArtifactRef,
               notify: Callable[[str], None] | None = None) -> ServerOnDemand | None:
    """The server this checkpoint's evaluation starts when it needs one (`served.py`), else None."""
    if not serves_its_own(cfg):
        return None
    return ServerOnDemand(cfg, model, results_dir(cfg, model) / "server.log", notify)


def evaluate_prepared_split(cfg: PipelineConfig, model: ArtifactRef, eval_data: ArtifactRef, split: str,
                            runner: SampleRunner | None = None, progress: bool = True) -> SplitRun:
    """One prepared split of `eval_data` evaluated into `results_dir(cfg, model)`; without a
    `runner`, the stage's own (and its own server for the split, stopped after it)."""
    if runner is None:
        server = own_server(cfg, model)
        with server or contextlib.nullcontext():
            return evaluate_prepared_split(cfg, model, eval_data, split, LazyRunner(cfg, model, server), progress)
    if split not in KNOWN_SPLITS:
        raise EvalError(f"unknown split {split!r}; known: {', '.join(KNOWN_SPLITS)}")
    folder = results_dir(cfg, model)
    folder.mkdir(parents=True, exist_ok=True)
    _pin_split_data(folder, split, split_data_hash(eval_data, split))
    loaded = load_samples(cfg, eval_data, split)
    return evaluate_split(split, loaded.samples, runner, folder, progress,
                          quarantined=[row.to_record() for row in loaded.quarantined])


def report_of(cfg: PipelineConfig, model: ArtifactRef, label: str, runs: Sequence[SplitRun]) -> EvalReport:
    return build_report(label, model.sha256, results_dir(cfg, model), {r.split: r.summary for r in runs})


def run(cfg: PipelineConfig, model: ArtifactRef, eval_data: ArtifactRef, label: str,
        splits: Sequence[str] | None = None, progress: bool = True,
        notify: Callable[[str], None] | None = None) -> EvalReport:
    """Evaluate `model` on `splits` (default `eval.splits`) of the prepared `eval_data`;
    `notify` gets the lines of its own server's start and stop (`served.ServerOnDemand`)."""
    eval_data.check()
    chosen = tuple(splits or cfg.eval.splits)
    server = own_server(cfg, model, notify)
    with server or contextlib.nullcontext():  # its own server, if one starts, serves every split, then stops
        runner = LazyRunner(cfg, model, server)
        runs = [evaluate_prepared_split(cfg, model, eval_data, split, runner, progress) for split in chosen]
    report = report_of(cfg, model, label, runs)
    logger.info("eval %s: average %.3f over %d splits; results in %s", label, report.average, len(runs),
                report.results_dir)
    return report


class EvalJob(BaseModel):
    """`run`'s arguments, as `run_job` gets them in the evaluation's own process."""

    config: PipelineConfig
    model: ArtifactRef
    eval_data: ArtifactRef
    label: str
    splits: tuple[str, ...]


def run_job(job: str) -> str:
    """`run` of an `EvalJob` (JSON), its report as JSON; its server's lines printed."""
    spec = EvalJob.model_validate_json(job)
    report = run(spec.config, spec.model, spec.eval_data, spec.label, spec.splits, progress=False,
                 notify=lambda line: print(line, flush=True))
    return report.model_dump_json()


def run_in_own_process(cfg: PipelineConfig, model: ArtifactRef, eval_data: ArtifactRef, label: str,
                       splits: Sequence[str] | None = None, log_line: Callable[[str], None] = print) -> EvalReport:
    """`run` in a process of its own (`paravt_core/own_process.py`), so the model an `hf`
    evaluation loads onto a GPU (kept for the process's life, `hf_engine`) is returned when it
    ends rather than held in the flow process beside the next stage; its lines go to `log_line`."""
    job = EvalJob(config=cfg, model=model, eval_data=eval_data, label=label, splits=tuple(splits or cfg.eval.splits))
    work_dir = cfg.run.output_dir / "eval" / "jobs" / f"{label}-{model.sha256[:12]}-{results_config_hash(cfg)}"
    return EvalReport.model_validate_json(call_in_own_process("paravt_core.eval.stage:run_job", job.model_dump_json(),
                                                              work_dir, log_line))


def log_to_mlflow(cfg: PipelineConfig, report: EvalReport, model: ArtifactRef) -> str:
    """An MLflow run for the evaluated model, tagged with its label and registry version
    (when the checkpoint is registered): a metric per split, the table as an artifact.

    Returns:
        the run id.
    """
    uri, name = cfg.mlflow_uri(), cfg.model.registered_name
    version = registry.find_version(uri, name, model.sha256)
    tags = {"stage": "eval", "label": report.label, "model_sha256": model.sha256, "registered_name": name,
            "model_version": version.version if version else "", "config_hash": cfg.section_hash(),
            "results_config_hash": results_config_hash(cfg), "git_revision": git_revision(),
            "results_dir": str(report.results_dir)}
    params = flatten(cfg.model_dump(mode="json", include={"eval", "video"}))
    table = format_table({report.label: report})
    return log_report(uri, cfg.mlflow.experiment, f"{cfg.run.name}-eval-{report.label}", report, table, tags,
                      params)
