"""The full ParaVT pipeline as one Prefect flow.

    data -> base model -> SFT -> PARA-GRPO -> register -> seven-split eval -> promote

Deployment `paravt/full-pipeline` (prefect.yaml) runs it on the process work pool;
`paravt run --config ...` runs it in-process. Every stage is a cached task over one
`paravt_core` stage, keyed by the content hashes of what it reads. What the stages set
aside instead of stopping (quarantined rows, skipped SFT samples, eval samples whose
video did not decode) is named in the outputs and in `<output_dir>/set_aside.json`.
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from flows.data import data_stage
from flows.eval import eval_stage
from flows.params import PipelineParams
from flows.progress import PROGRESS
from paravt_core.eval.report import format_table
from paravt_core.preflight import needs_gpu
from paravt_core.run_lock import hold_output_dir
from paravt_core.set_aside import (
    format_set_aside,
    from_data_contracts,
    from_eval_reports,
    from_grammar_check,
    from_sft_model,
    write_set_aside,
)
from tasks.model import base_stage
from tasks.preflight import preflight
from tasks.registry import promote, register
from tasks.rl import rl
from tasks.sft import sft, sft_grammar


@flow(name="paravt", log_prints=True)
def full_pipeline(params: PipelineParams = PipelineParams()) -> dict[str, str]:
    cfg = params.load()
    with hold_output_dir(cfg.run.output_dir, "paravt flow (full pipeline)"):
        log = get_run_logger()
        log.info("pipeline %s -> %s", cfg.run.name, cfg.run.output_dir.resolve())
        PROGRESS.reset()  # also run outside the CLI (deployments): the record starts with this run
        if needs_gpu(cfg):  # the machine and the memory plan, before any stage (#44)
            preflight(cfg)
        data = data_stage(cfg)
        PROGRESS.stage("sft data", data.sft.path)
        base = base_stage(cfg)
        PROGRESS.stage("base_model", base.path)
        sft_model = sft(cfg, base, data.sft)
        PROGRESS.stage("sft_model", sft_model.path)
        grammar = sft_grammar(cfg, base, sft_model, data)
        sft_version = register(cfg, sft_model, "sft", data.sft.sha256, alias="sft")
        PROGRESS.stage("registered sft", f"{cfg.model.registered_name} v{sft_version.version}")
        rl_model = rl(cfg, sft_model, data.rl)
        PROGRESS.stage("rl_model", rl_model.path)
        rl_version = register(cfg, rl_model, "rl", data.rl.sha256, parent_version=sft_version.version, alias="candidate")
        log.info("registered %s v%s (sft) and v%s (rl, candidate)", cfg.model.registered_name, sft_version.version,
                 rl_version.version)
        # The RL row is labelled by its ablation row, so Table 2 of `paravt report` joins on it.
        reports = {}
        for label, model in (("base", base), ("sft", sft_model), (cfg.rl.row, rl_model)):
            reports[label] = eval_stage(cfg, model, data.eval, label)
            PROGRESS.stage(f"eval {label}", reports[label].results_dir)
        promoted = promote(cfg, rl_version, reports[cfg.rl.row].average, data.eval)
        table = format_table(reports)
        print(f"seven-split evaluation:\n{table}")  # log_prints: the run log and the terminal get it once
        set_aside = [*from_data_contracts(data.quarantined), *from_sft_model(sft_model.path),
                     *from_grammar_check(grammar), *from_eval_reports(reports)]
        set_aside_file = write_set_aside(cfg.run.output_dir / "set_aside.json", set_aside)
        if set_aside:
            log.warning("set aside instead of stopping the run (%s):\n%s", set_aside_file, format_set_aside(set_aside))
        return PROGRESS.finish({
            "base_model": str(base.path),
            "sft_model": str(sft_model.path),
            "rl_model": str(rl_model.path),
            "registered": f"{cfg.model.registered_name} v{sft_version.version} (sft), v{rl_version.version} (candidate)",
            "sft grammar": f"{grammar['grammar_rate_sft']:.0%} of held-out episodes (base {grammar['grammar_rate_base']:.0%})",
            "champion": f"v{rl_version.version}" if promoted else "unchanged (the candidate did not beat it on this evaluation)",
            "eval results": str(reports[cfg.rl.row].results_dir.parent),
            "mlflow": cfg.mlflow_uri(),
            "set aside": f"{format_set_aside(set_aside)}\n(listed in {set_aside_file.resolve()})",
        })
