"""The miniature reproduction of #15 as one flow (deployment `paravt/reproduce`).

    data -> base (+ perception pretraining) -> SFT -> eval (subagent, direct)
           and the held-out sampled probe (κ, format per question at one K, `reproduce.probe`)
         -> the SFT model at each gating budget K on the validation split (subagent, direct)
         -> for each RL row x seed: PARA-GRPO variant -> eval (subagent, direct), probe
            (`run.fanout.max_concurrent` rows at a time, flows/fanout.py)
         -> Table 2 in miniature + per-step figure (outputs and MLflow)

Every stage is a cached task, so an interrupted reproduction resumes with the rows and
seeds it finished (and an RL run resumes from its checkpoint). The rows and seeds are
`reproduce.rows` / `reproduce.seeds` of the config (`conf/pipeline/reproduce.yaml`).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from prefect import flow, get_run_logger
from pydantic import Field, model_validator

from flows.data import data_stage
from flows.eval import eval_stage
from flows.fanout import check_fanout_fits, fan_out
from flows.params import PipelineParams
from flows.progress import PROGRESS
from paravt_core.config import VALIDATION_SPLITS, PipelineConfig, config_file, load_config
from paravt_core.refs import ArtifactRef
from paravt_core.eval.results import ResultsLog
from paravt_core.data.mirror import world_dir
from paravt_core.data.stage import DataBundle
from paravt_core.miniature.reproduce import BudgetPoint, ModelRun, group_breakdown, held_out_groups, read_steps
from paravt_core.miniature.visibility import manifest_video_sets, visible_share
from paravt_core.run_lock import hold_output_dir
from tasks.miniature import sampled_probe
from tasks.model import base_stage
from tasks.registry import reproduce_report
from tasks.rl import rl
from tasks.sft import sft

HELD_OUT_SPLIT = "videomme"  # the test split: what the table reports
VALIDATION_SPLIT = VALIDATION_SPLITS[0]  # where knobs are chosen (data.synth.validation)


class ReproduceParams(PipelineParams):
    config_path: str = Field("conf/pipeline/reproduce.yaml", description="pipeline YAML, relative to the project root")

    @model_validator(mode="after")
    def _rows_exist(self) -> ReproduceParams:
        for row in self.load().reproduce.rows:
            if not row_file(self.config_path, row).is_file():
                raise ValueError(f"reproduce.rows names {row!r} but {row_file(self.config_path, row)} does not exist")
        cfg = self.load()
        check_fanout_fits(cfg.run.fanout)
        if cfg.reproduce.probe.enabled and cfg.reproduce.probe.split not in cfg.eval.splits:
            raise ValueError(f"reproduce.probe.split is {cfg.reproduce.probe.split!r} but eval.splits "
                             f"{list(cfg.eval.splits)} does not prepare it; add it there or set "
                             "reproduce.probe.enabled=false")
        return self


def row_file(config_path: str, row: str) -> Path:
    """`conf/rl/<row>.yaml` beside the pipeline config's folder."""
    return config_file(config_path).resolve().parents[1] / "rl" / f"{row}.yaml"


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
                    probe_calls=probe.calls if probe else {}, probe_format=probe.fmt if probe else {})


def budget_sweep(cfg: PipelineConfig, model: ArtifactRef, eval_data: ArtifactRef,
                 world: Path | None = None) -> list[BudgetPoint]:
    """Before RL, on the validation split: the SFT model at every overview budget K that nFrames
    gating draws (`rl.gating.choices`) and the evaluation's own, with tools and without, beside
    the share of the split's videos whose event the K overview frames show (#35 item 2). Empty
    where the world draws no validation split. `world`: the world folder the data stage used,
    named when the flow started (its name hashes the generator's code: an edit during a long
    run would otherwise name another folder, which a run measured crashing here)."""
    if VALIDATION_SPLIT not in cfg.eval.splits:
        return []
    manifest = json.loads(((world or world_dir(cfg)) / "manifest.json").read_text())
    videos = manifest_video_sets(manifest)[VALIDATION_SPLIT]
    points = []
    for k in sorted({*cfg.rl.gating.choices, cfg.eval.nframes}):
        at_k = cfg.eval.model_copy(update={"nframes": k, "splits": (VALIDATION_SPLIT,),
                                           "prompt_mode": "agentic_general", "tool_mode": "subagent"})
        tools = eval_stage(cfg.model_copy(update={"eval": at_k}), model, eval_data, f"sft-k{k}")
        direct = eval_stage(cfg.model_copy(update={"eval": at_k.model_copy(update={"prompt_mode": "direct"})}),
                            model, eval_data, f"sft-k{k}-direct")
        summary = tools.summaries[VALIDATION_SPLIT]
        points.append(BudgetPoint(k=k, accuracy=tools.primary(VALIDATION_SPLIT),
                                  accuracy_direct=direct.primary(VALIDATION_SPLIT),
                                  eval_tool_calls=float(summary.get("avg_tool_calls", 0.0)),
                                  visible=visible_share(videos, k), n=len(videos)))
    return points


def train_and_measure(row_cfg: PipelineConfig, sft_model: ArtifactRef, data: DataBundle, row: str,
                      seed: int) -> tuple[ModelRun, ArtifactRef]:
    """One row x seed: PARA-GRPO from the SFT model, then its held-out evaluations."""
    model = rl(row_cfg, sft_model, data.rl)
    return measure(row_cfg, model, data.eval, row, seed, f"{row}-seed{seed}"), model


@flow(name="paravt", log_prints=True)
def reproduce(params: ReproduceParams = ReproduceParams()) -> str:
    cfg = params.load()
    with hold_output_dir(cfg.run.output_dir, "paravt flow (reproduce)"):
        log = get_run_logger()
        PROGRESS.reset()
        world = world_dir(cfg) if cfg.data.source == "synth" else None  # before any stage: see budget_sweep
        data = data_stage(cfg)
        sft_model = sft(cfg, base_stage(cfg), data.sft)
        PROGRESS.stage("sft_model", sft_model.path)
        runs = [measure(cfg, sft_model, data.eval, "sft", None, "sft")]
        budget = budget_sweep(cfg, sft_model, data.eval, world)
        PROGRESS.stage("budget sweep (validation)", sft_model.path)
        rows = []
        for row in cfg.reproduce.rows:
            for seed in cfg.reproduce.seeds:
                row_cfg = load_config(params.config_path, [*params.overrides, f"run.seed={seed}"],
                                      row_file(params.config_path, row))
                rows.append((f"{row} seed {seed}", functools.partial(train_and_measure, row_cfg, sft_model, data, row,
                                                                     seed)))
        # Rows x seeds at most run.fanout.max_concurrent at a time, gathered in this order (flows/fanout.py).
        runs += [run for run, _ in fan_out(rows, cfg.run.fanout,
                                            lambda label, done: PROGRESS.stage(label, done[1].path))]
        report = reproduce_report(cfg, runs, budget)
        text = report.read_text()
        log.info("miniature reproduction (%s):\n%s", report, text)
        print(text)
        return PROGRESS.finish(str(report))
