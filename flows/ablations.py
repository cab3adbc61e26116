"""The ablation study of SPEC §6 as one flow (deployment `paravt/ablations`).

    data -> base -> SFT (once) -> for each RL row: PARA-GRPO variant -> eval
                                -> sequential-dispatch eval of the full row
    (`run.fanout.max_concurrent` rows at a time, flows/fanout.py)

Every row trains from the same SFT checkpoint; each is an MLflow run tagged
`ablation_row` (fτ, κ and the other SPEC §5 metrics per step), evaluated on the configured
splits with the eval run labelled by the row. `paravt report --experiment ...` turns the
runs into the Table-2-shaped table and the fτ / κ plots.
"""

from __future__ import annotations

import functools

from prefect import flow, get_run_logger
from pydantic import Field, model_validator

from flows.data import data_stage
from flows.eval import eval_stage
from flows.fanout import RowSpec, check_fanout_fits, fan_out, row_spec
from flows.params import PipelineParams
from paravt_core.config import PipelineConfig, config_file
from paravt_core.data.stage import DataBundle
from paravt_core.eval.report import EvalReport, format_table
from paravt_core.refs import ArtifactRef
from paravt_core.run_lock import hold_output_dir
from tasks.model import base_stage
from tasks.rl import rl
from tasks.sft import sft

DEFAULT_ROWS = ["paragrpo", "vanilla_grpo", "anchoring_only", "gating_only", "no_tool_reward", "no_penalty"]


class AblationParams(PipelineParams):
    rows: list[str] = Field(default_factory=lambda: list(DEFAULT_ROWS),
                            description="RL rows: names of conf/rl/<row>.yaml")
    sequential_eval: bool = Field(True, description="also evaluate the full row with sequential dispatch")

    @model_validator(mode="after")
    def _fanout_fits(self) -> AblationParams:
        check_fanout_fits(self.load().run.fanout)
        return self


def train_and_evaluate(row_cfg: PipelineConfig, sft_model: ArtifactRef, data: DataBundle, row: str,
                       sequential_eval: bool) -> dict[str, EvalReport]:
    """One row: PARA-GRPO from the SFT model, its evaluation, and for the full row with
    `sequential_eval` its sequential-dispatch evaluation too."""
    model = rl(row_cfg, sft_model, data.rl)
    reports = {row: eval_stage(row_cfg, model, data.eval, row)}
    if row == "paragrpo" and sequential_eval:
        seq_cfg = row_cfg.model_copy(update={"eval": row_cfg.eval.model_copy(update={"dispatch": "sequential"})})
        reports["paragrpo-sequential"] = eval_stage(seq_cfg, model, data.eval, "paragrpo-sequential")
    return reports


def ablation_row(spec: RowSpec) -> dict[str, EvalReport]:
    """The row `spec` names, in this process or on a worker (flows/rl_row.py)."""
    return train_and_evaluate(spec.config(), spec.sft_model, spec.data, spec.row, spec.sequential_eval)


@flow(name="paravt", log_prints=True)
def ablations(params: AblationParams = AblationParams()) -> str:
    cfg = params.load()
    with hold_output_dir(cfg.run.output_dir, "paravt flow (ablations)"):
        log = get_run_logger()
        data = data_stage(cfg)
        sft_model = sft(cfg, base_stage(cfg), data.sft)
        reports = {"sft": eval_stage(cfg, sft_model, data.eval, "sft")}
        rl_dir = config_file(params.config_path).resolve().parents[1] / "rl"
        specs = [row_spec("ablation", row, params.config_path, params.overrides, rl_dir / f"{row}.yaml", sft_model,
                          data, sequential_eval=params.sequential_eval) for row in params.rows]
        rows = [(spec.label, functools.partial(ablation_row, spec), spec) for spec in specs]
        # At most run.fanout.max_concurrent rows at a time, or each on a worker of run.fanout.work_pool
        # (run.fanout.runner), gathered in this order (flows/fanout.py).
        for row_reports in fan_out(rows, cfg.run.fanout):
            reports.update(row_reports)
        table = format_table(reports)
        log.info("ablations:\n%s", table)
        return table
