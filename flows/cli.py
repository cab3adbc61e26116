"""`paravt run` / `paravt reproduce`: the full pipeline or the miniature reproduction flow in-process
(an ephemeral Prefect API, no server)."""

from __future__ import annotations

import argparse
import os
import sys


def _flow_in_process(command: str, flow, params, cfg):
    """Run `flow(params)` holding the output folder, or None when another run holds it.

    The lock is taken here too (the flow takes it again, re-entrantly) so a busy directory is
    a one-line refusal before Prefect starts a flow run, not a failed flow run."""
    from paravt_core.reaper import start_reaper
    from paravt_core.run_lock import OutputDirBusy, hold_output_dir

    reaper = start_reaper()  # a SIGKILL of this command leaves no Prefect server or DeepSpeed rank behind
    try:
        with hold_output_dir(cfg.run.output_dir, command):
            return flow(params)
    except OutputDirBusy as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return None
    finally:
        if reaper is not None:
            reaper.stop()


def _params_or_refusal(command: str, make):
    """The flow's parameters, or None after a one-line refusal naming the bad config (no traceback)."""
    from pydantic import ValidationError

    try:
        return make()
    except ValidationError as exc:
        for error in exc.errors():
            print(f"{command}: {error['msg'].removeprefix('Value error, ')}", file=sys.stderr)
        return None


def _run(args: argparse.Namespace) -> int:
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "paravt_core")
    from flows.full_pipeline import full_pipeline
    from flows.params import PipelineParams

    params = _params_or_refusal("paravt run", lambda: PipelineParams(config_path=args.config, overrides=args.set,
                                                                      rl_row=args.rl_row))
    if params is None:
        return 2
    cfg = params.load()
    outputs = _flow_in_process("paravt run", full_pipeline, params, cfg)
    if outputs is None:
        return 2
    print("\nPipeline finished. Outputs:")
    for name, where in outputs.items():
        print(f"  {name:<14} " + where.replace("\n", "\n" + " " * 17))
    print(f"  {'output dir':<14} {cfg.run.output_dir.resolve()}")
    print("Run history and MLflow runs: `make ui` (Prefect UI and MLflow UI on 127.0.0.1).")
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "paravt_core")
    from flows.reproduce import ReproduceParams, reproduce

    params = _params_or_refusal("paravt reproduce",
                                lambda: ReproduceParams(config_path=args.config, overrides=args.set))
    if params is None:
        return 2
    cfg = params.load()
    report = _flow_in_process("paravt reproduce", reproduce, params, cfg)
    if report is None:
        return 2
    print(f"\nReport: {report} (figure and measurements beside it; also in MLflow, experiment "
          f"{cfg.mlflow.experiment!r} at {cfg.mlflow_uri()})")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run the full pipeline flow on a config (no server needed)")
    p.add_argument("--config", default="conf/pipeline/tiny.yaml", help="pipeline YAML")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. sft.max_steps=20")
    p.add_argument("--rl-row", default=None, help="RL ablation row (conf/rl/*.yaml) laid over the rl section")
    p.set_defaults(func=_run)
    p = subparsers.add_parser("reproduce", help="the miniature reproduction: SFT, the RL rows x seeds, Table 2 "
                                                "in miniature with 95 %% intervals (#15)")
    p.add_argument("--config", default="conf/pipeline/reproduce.yaml", help="pipeline YAML")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override, e.g. 'reproduce.seeds=[0]' or rl.max_steps=4")
    p.set_defaults(func=_reproduce)
