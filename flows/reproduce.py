"""The miniature reproduction of #15 as one flow (deployment `paravt/reproduce`).

    data -> base (+ perception pretraining) -> SFT -> fanned out, `run.fanout.max_concurrent`
         jobs at a time (flows/fanout.py; their order: `job_order`):
           - for each RL row x seed: PARA-GRPO variant -> eval (subagent, direct), probe;
           - the SFT model: eval (subagent, direct) and the held-out sampled probe (κ, format
             per question at one K, `reproduce.probe`);
           - the SFT model at each gating budget K on the validation split (subagent, direct);
         -> Table 2 in miniature + per-step figure (outputs and MLflow)

Every stage is a cached task, so an interrupted reproduction resumes with the rows and
seeds it finished (and an RL run resumes from its checkpoint). The rows and seeds are
`reproduce.rows` / `reproduce.seeds` of the config (`conf/pipeline/reproduce.yaml`). With
`reproduce.sft_seeds`, SFT runs once per seed from the one base, and each of those SFT builds
is measured and trains every row x seed (the report's verdicts take the build as a level; the
budget sweep measures the first build).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from pydantic import Field, model_validator

from flows.data import data_stage
from flows.eval import eval_stage
from flows.fanout import RowSpec, check_fanout_fits, fan_out, row_spec
from flows.params import PipelineParams
from flows.progress import PROGRESS
from paravt_core.config import VALIDATION_SPLITS, FanoutConfig, PipelineConfig, rl_row_path
from paravt_core.refs import ArtifactRef
from paravt_core.eval.results import ResultsLog
from paravt_core.data.mirror import world_dir
from paravt_core.data.stage import DataBundle
from paravt_core.miniature.pretrain import sft_replay
from paravt_core.miniature.measurements import (
    BudgetPoint,
    ModelRun,
    group_breakdown,
    held_out_groups,
    model_numerics,
    read_steps,
)
from paravt_core.miniature.reproduce import clock_dir, row_variants
from paravt_core.miniature.visibility import manifest_video_sets, visible_share
from paravt_core.job_tally import JobTally
from paravt_core.provenance import foreign_models
from paravt_core.run_clock import RunClock, read_clock
from paravt_core.run_lock import hold_output_dir
from tasks.miniature import pretrain, reproduce_report, sampled_probe
from tasks.model import base_stage
from tasks.rl import rl
from tasks.sft import sft

HELD_OUT_SPLIT = "videomme"  # the test split: what the table reports
VALIDATION_SPLIT = VALIDATION_SPLITS[0]  # where knobs are chosen (data.synth.validation)


class ReproduceParams(PipelineParams):
    config_path: str = Field("conf/pipeline/reproduce.yaml", description="pipeline YAML, relative to the project root")

    @model_validator(mode="after")
    def _rows_exist(self) -> ReproduceParams:
        for row in self.load().reproduce.rows:
            if not (path := rl_row_path(self.config_path, row)).is_file():
                raise ValueError(f"reproduce.rows names {row!r} but {path} does not exist")
        cfg = self.load()
        check_fanout_fits(cfg.run.fanout)
        if cfg.reproduce.probe.enabled and cfg.reproduce.probe.split not in cfg.eval.splits:
            raise ValueError(f"reproduce.probe.split is {cfg.reproduce.probe.split!r} but eval.splits "
                             f"{list(cfg.eval.splits)} does not prepare it; add it there or set "
                             "reproduce.probe.enabled=false")
        return self


def measure(cfg: PipelineConfig, model: ArtifactRef, eval_data: ArtifactRef, row: str, seed: int | None,
            label: str) -> ModelRun:
    """The held-out evaluation of one model in subagent tool mode and in direct mode on the test
    split and, where the config draws one, in subagent mode on the validation split (the SFT
    model also in direct mode there: the RL rows' direct validation figure chooses nothing, and
    its evaluation is time the default run does not have, #35; an RL run only where
    `reproduce.rl_validation`). Then, where `reproduce.probe`
    is enabled, the held-out sampled probe (`tasks.miniature`): κ and format per question, what
    the κ and format verdicts compare (#46 item 4)."""
    validation = VALIDATION_SPLIT in cfg.eval.splits and (row == "sft" or cfg.reproduce.rl_validation)
    splits = (HELD_OUT_SPLIT, VALIDATION_SPLIT) if validation else (HELD_OUT_SPLIT,)
    direct_splits = splits if row == "sft" else (HELD_OUT_SPLIT,)
    tools_cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(
        update={"prompt_mode": "agentic_general", "tool_mode": "subagent", "splits": splits})})
    direct_cfg = cfg.model_copy(update={"eval": tools_cfg.eval.model_copy(
        update={"prompt_mode": "direct", "splits": direct_splits})})
    build = sft_build(cfg)
    label += "" if build is None else f"-{build}"  # one results folder per build's model
    tools = eval_stage(tools_cfg, model, eval_data, label)
    direct = eval_stage(direct_cfg, model, eval_data, f"{label}-direct")
    summary = tools.summaries[HELD_OUT_SPLIT]
    records = list(ResultsLog(tools.results_dir / f"{HELD_OUT_SPLIT}.jsonl").load().values())
    probe = sampled_probe(tools_cfg, model, eval_data, label) if cfg.reproduce.probe.enabled else None
    return ModelRun(row=row, seed=seed, accuracy=tools.primary(HELD_OUT_SPLIT),
                    accuracy_direct=direct.primary(HELD_OUT_SPLIT),
                    eval_tool_calls=float(summary.get("avg_tool_calls", 0.0)),
                    answer_tag_rate=summary.get("answer_tag_rate"),
                    steps=read_steps(model.path) if row != "sft" else [],
                    by_group=group_breakdown(records, held_out_groups(eval_data.path / HELD_OUT_SPLIT)),
                    accuracy_val=tools.primary(VALIDATION_SPLIT) if validation else None,
                    accuracy_direct_val=direct.primary(VALIDATION_SPLIT) if VALIDATION_SPLIT in direct_splits else None,
                    correct={str(r["id"]): bool(r["correct"]) for r in records},
                    gating_draw_key=cfg.rl.gating.draw_key if row != "sft" else None,
                    probe_calls=probe.calls if probe else {}, probe_format=probe.fmt if probe else {},
                    sft_build=build, numerics=model_numerics(model.path))


def sft_build(cfg: PipelineConfig) -> str | None:
    """The SFT build a model is or starts from, as the report names it: None where the
    reproduction trains one SFT model (`reproduce.sft_seeds` empty), else `sft<seed>`."""
    return f"sft{cfg.sft.seed}" if cfg.reproduce.sft_seeds else None


def build_configs(cfg: PipelineConfig) -> list[tuple[list[str], PipelineConfig]]:
    """(the overrides that name it, its config) of each SFT build (`reproduce.sft_seeds`): one
    with no override where the list is empty, else one per `sft.seed`."""
    if not cfg.reproduce.sft_seeds:
        return [([], cfg)]
    return [([f"sft.seed={seed}"], cfg.model_copy(update={"sft": cfg.sft.model_copy(update={"seed": seed})}))
            for seed in cfg.reproduce.sft_seeds]


def budget_ks(cfg: PipelineConfig) -> list[int]:
    """The overview budgets of the SFT model's sweep: every K nFrames gating draws
    (`rl.gating.choices`) and the evaluation's own; none where the world draws no validation
    split or the sweep is off (`reproduce.budget_sweep`)."""
    if not cfg.reproduce.budget_sweep or VALIDATION_SPLIT not in cfg.eval.splits:
        return []
    return sorted({*cfg.rl.gating.choices, cfg.eval.nframes})


def validation_videos(cfg: PipelineConfig, world: Path | None = None) -> list:
    """The validation split's videos from the world's manifest. `world`: the world folder the
    data stage used, named when the flow started (its name hashes the generator's code: an edit
    during a long run would otherwise name another folder, which a run measured crashing here)."""
    manifest = json.loads(((world or world_dir(cfg)) / "manifest.json").read_text())
    return manifest_video_sets(manifest)[VALIDATION_SPLIT]


def budget_point(cfg: PipelineConfig, model: ArtifactRef, eval_data: ArtifactRef, k: int,
                 videos: list) -> BudgetPoint:
    """Before RL, on the validation split: the SFT model with an overview of `k` frames, with
    tools and without, beside the share of the split's `videos` whose event the K overview
    frames show (#35 item 2)."""
    at_k = cfg.eval.model_copy(update={"nframes": k, "splits": (VALIDATION_SPLIT,),
                                       "prompt_mode": "agentic_general", "tool_mode": "subagent"})
    tools = eval_stage(cfg.model_copy(update={"eval": at_k}), model, eval_data, f"sft-k{k}")
    direct = eval_stage(cfg.model_copy(update={"eval": at_k.model_copy(update={"prompt_mode": "direct"})}),
                        model, eval_data, f"sft-k{k}-direct")
    summary = tools.summaries[VALIDATION_SPLIT]
    return BudgetPoint(k=k, accuracy=tools.primary(VALIDATION_SPLIT),
                       accuracy_direct=direct.primary(VALIDATION_SPLIT),
                       eval_tool_calls=float(summary.get("avg_tool_calls", 0.0)),
                       visible=visible_share(videos, k), n=len(videos))


def sft_jobs(cfg: PipelineConfig, sft_model: ArtifactRef, eval_data: ArtifactRef,
             world: Path | None, sweep: bool = True) -> list[tuple[str, Callable[[], tuple[str, Any]]]]:
    """The SFT model's measurements as fan-out jobs, each `(label, work)` whose work returns
    `(kind, result)`: its held-out evaluations and probe, then the sweep's point at the
    evaluation's own K (the same evaluation's results, so in the same job: two jobs must never
    write one results folder at once), and one job per other K of the sweep. Without `sweep`
    (a second SFT build), the held-out measurements alone."""
    ks = budget_ks(cfg) if sweep else []
    videos = validation_videos(cfg, world) if ks else []
    own = [k for k in ks if k == cfg.eval.nframes]
    build = sft_build(cfg)
    name = "sft" if build is None else f"sft ({build})"

    def measured() -> tuple[str, Any]:
        run = measure(cfg, sft_model, eval_data, "sft", None, "sft")
        return "sft", (run, [budget_point(cfg, sft_model, eval_data, k, videos) for k in own])

    def point(k: int) -> tuple[str, Any]:
        return "budget", budget_point(cfg, sft_model, eval_data, k, videos)

    return [(name, measured), *((f"sft at K={k}", functools.partial(point, k)) for k in ks if k not in own)]


def train_and_measure(row_cfg: PipelineConfig, sft_model: ArtifactRef, data: DataBundle, row: str,
                      seed: int) -> tuple[ModelRun, ArtifactRef]:
    """One row x seed: PARA-GRPO from the SFT model, then its held-out evaluations."""
    model = rl(row_cfg, sft_model, data.rl)
    return measure(row_cfg, model, data.eval, row, seed, f"{row}-seed{seed}"), model


def job_order(fanout: FanoutConfig, rl_jobs: list, sft_measurements: list) -> list:
    """The fan-out's jobs in the order they start. Side by side, the SFT model's measurements go
    after the RL runs: each is shorter than a run, so they fill the slots the last runs leave
    (longest first), on the fan-out's thread budget (two evaluations side by side on one thread
    each finished 1.33x sooner than one after the other on two, docs/log/miniature-world-v3d.md). One at a
    time, they go first, as before: the SFT model's figures are then known before hours of RL."""
    return [*rl_jobs, *sft_measurements] if fanout.max_concurrent > 1 else [*sft_measurements, *rl_jobs]


def rl_job(row_cfg: PipelineConfig, sft_model: ArtifactRef, data: DataBundle, row: str,
           seed: int) -> tuple[str, tuple[ModelRun, ArtifactRef]]:
    return "rl", train_and_measure(row_cfg, sft_model, data, row, seed)


def reproduce_row(spec: RowSpec) -> tuple[str, tuple[ModelRun, ArtifactRef]]:
    """The row x seed `spec` names, in this process or on a worker (flows/rl_row.py)."""
    return rl_job(spec.config(), spec.sft_model, spec.data, spec.row, spec.seed)


@flow(name="paravt", log_prints=True)
def reproduce(params: ReproduceParams = ReproduceParams()) -> str:
    cfg = params.load()
    # The running time over this config's invocations, from heartbeats (paravt_core/run_clock.py).
    with hold_output_dir(cfg.run.output_dir, "paravt flow (reproduce)"), RunClock(clock_dir(cfg)) as clock:
        log = get_run_logger()
        PROGRESS.reset()
        world = world_dir(cfg) if cfg.data.source == "synth" else None  # before any stage: see validation_videos
        data = data_stage(cfg)
        # The miniature plugs into the full pipeline's stages: its perception pretraining after the
        # base model, its replay rows as one more SFT shard. One SFT model, or one per
        # `reproduce.sft_seeds` from the same base.
        base = base_stage(cfg, pretrain=pretrain)
        rl_jobs, sft_measurements, sft_models = [], [], {}
        builds = build_configs(cfg)
        # The builds train one after another before any RL run: one line as each ends, with the time left.
        # Timed on the run clock: a stop of the process is not a build's time.
        tally = JobTally(len(builds), 1, lambda line: log.info("SFT builds: %s", line), clock=clock.running_now)
        for index, (build_sets, build_cfg) in enumerate(builds):
            build = sft_build(build_cfg)
            sft_model = tally.timed(build or "sft", functools.partial(sft, build_cfg, base, data.sft,
                                                                      extra=sft_replay(build_cfg)))()
            sft_models[build] = sft_model
            PROGRESS.stage("sft_model" if build is None else f"sft_model ({build})", sft_model.path)
            for row in cfg.reproduce.rows:
                # Each row as its file says, or once per variant of `reproduce.variants` (`make replay-falls`).
                for label, sets in row_variants(row, cfg.reproduce.variants):
                    for seed in cfg.reproduce.seeds:
                        spec = row_spec("reproduce", label, params.config_path,
                                        [*params.overrides, f"run.seed={seed}", *build_sets, *sets],
                                        rl_row_path(params.config_path, row), sft_model, data, seed=seed,
                                        build=build)
                        rl_jobs.append((spec.label, functools.partial(reproduce_row, spec), spec))
            # Each build's own measurements; the budget sweep on the first build only.
            sft_measurements += sft_jobs(build_cfg, sft_model, data.eval, world, sweep=index == 0)
        # A cache another host filled: say so now, not only in the report hours later.
        for line in foreign_models({f"{what} ({model.path})": model_numerics(model.path) for what, model in
                                    (("the base model", base), *((f"SFT model {b or ''}".strip(), m)
                                                                 for b, m in sft_models.items()))}):
            log.warning(line)
        # The SFT models' own measurements run in the same fan-out (`job_order` says when).
        jobs = job_order(cfg.run.fanout, rl_jobs, sft_measurements)
        # At most run.fanout.max_concurrent at a time, gathered in this order (flows/fanout.py).
        first_build = next(iter(sft_models))

        def finished(label: str, result: tuple[str, Any]) -> None:
            kind, value = result
            if kind == "rl":
                where = value[1]
            elif kind == "sft":
                where = sft_models[value[0].sft_build]
            else:  # a sweep point: the first build's model
                where = sft_models[first_build]
            PROGRESS.stage(label, where.path)

        done = fan_out(jobs, cfg.run.fanout, finished, clock=clock.running_now)
        sft_runs, budget, rl_runs, points = [], [], [], []
        for kind, result in done:
            if kind == "sft":
                sft_runs.append(result[0])
                budget += result[1]
            elif kind == "rl":
                rl_runs.append(result[0])
            else:
                points.append(result)
        budget = sorted([*budget, *points], key=lambda point: point.k)
        runs = [*sft_runs, *rl_runs]
        clock.beat()  # this invocation's record up to now, not up to its last heartbeat
        report = reproduce_report(cfg, runs, budget, read_clock(clock_dir(cfg)))
        text = report.read_text()
        log.info("miniature reproduction (%s):\n%s", report, text)
        print(text)
        return PROGRESS.finish(str(report))
