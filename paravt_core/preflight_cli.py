"""`paravt plan` (the memory plan for given cards) and `paravt preflight` (this machine, before a GPU run)."""

from __future__ import annotations

import argparse
import sys

from paravt_core.config import ConfigError, load_config

# lazy: every `paravt` call imports this module (cli.build_parser), so its commands import what
# they run inside their function: the imports at the top measured +0.17 s on `paravt --help`
# (0.89 -> 1.06 s, min of 8 runs), and some of these modules load torch or Prefect.

READY, MISSING, INPUT_ERROR = 0, 1, 2
# Far above any card (an H200 has 141 GB); bounds --gpu-memory-gib so inf or 1e300 is a usage error.
MAX_GPU_MEMORY_GIB = 1 << 20


def _load(command: str, args: argparse.Namespace):
    try:
        return load_config(args.config, args.set, args.rl_row)
    except ConfigError as err:
        print(f"paravt {command}: {err}", file=sys.stderr)
        return None


def _plan(args: argparse.Namespace) -> int:
    from paravt_core.plan import GIB, PlanError, memory_plan, model_shape
    from paravt_core.rl.overlap import format_estimate, read_step_split

    cfg = _load("plan", args)
    if cfg is None:
        return INPUT_ERROR
    if args.gpus < 1 or not 0 < args.gpu_memory_gib < MAX_GPU_MEMORY_GIB:
        print(f"paravt plan: --gpus must be >= 1 and --gpu-memory-gib a number of GiB above 0 and below "
              f"{MAX_GPU_MEMORY_GIB:,} (got --gpus {args.gpus}, --gpu-memory-gib {args.gpu_memory_gib})", file=sys.stderr)
        return INPUT_ERROR
    if cfg.model.is_tiny:
        print(f"paravt plan: {args.config} trains the tiny model (model.base: tiny), which runs on CPU; the plan is "
              "for a real checkpoint (e.g. --set model.base=Qwen/Qwen3-VL-8B-Instruct)", file=sys.stderr)
        return INPUT_ERROR
    try:
        shape = model_shape(cfg.model.base)
    except PlanError as err:
        print(f"paravt plan: {err}", file=sys.stderr)
        return INPUT_ERROR
    split = None
    if args.step_log is not None:
        try:
            split = read_step_split(args.step_log)
        except ValueError as err:
            print(f"paravt plan: --step-log: {err}", file=sys.stderr)
            return INPUT_ERROR
    plan = memory_plan(cfg, shape, args.gpus, int(args.gpu_memory_gib * GIB))
    print(plan.format())
    if split is not None:
        print("\n" + "\n".join(format_estimate(split, args.step_log)))
    return READY if plan.fits else MISSING


def check_before_run(command: str, cfg, config_path: str) -> bool:
    """`paravt run`'s gate: True when the config needs no GPU or the machine passes; else prints why."""
    from paravt_core.preflight import needs_gpu, run_preflight, system_probes

    if not needs_gpu(cfg):
        return True
    report = run_preflight(cfg, system_probes())
    if report.ok:
        return True
    print(f"{command}: {config_path} needs GPUs and this machine is not ready; nothing was run.\n{report.format()}",
          file=sys.stderr)
    return False


def _preflight(args: argparse.Namespace) -> int:
    from paravt_core.preflight import needs_gpu, run_preflight, system_probes

    cfg = _load("preflight", args)
    if cfg is None:
        return INPUT_ERROR
    if not needs_gpu(cfg):
        print(f"paravt preflight: {args.config} trains the tiny model, which runs on CPU: nothing to check")
        return READY
    report = run_preflight(cfg, system_probes())
    print(f"paravt preflight: {args.config} ({cfg.model.base})\n{report.format()}")
    if not report.ok:
        print(f"paravt preflight: not ready ({sum(not c.ok for c in report.checks)} check(s) failed, listed above)",
              file=sys.stderr)
    return READY if report.ok else MISSING


def _config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="pipeline YAML")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. rl.micro_batch_size=2")
    parser.add_argument("--rl-row", default=None, help="RL ablation row (conf/rl/*.yaml) laid over the rl section")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plan", help="the memory plan per GPU and stage for given cards (exit 1: over budget)",
                              description="Bytes per GPU of SFT, the RL passes, the rollout server, the grammar "
                                          "check and evaluation, from the config and the model's shape "
                                          "(paravt_core/plan.py). Exit 0: every stage fits; 1: a stage is over "
                                          "budget (the knob is named); 2: the config or its model does not load.")
    _config_args(p)
    p.add_argument("--gpus", type=int, required=True, help="GPUs on the node, e.g. 8")
    p.add_argument("--gpu-memory-gib", type=float, required=True,
                   help="memory of one GPU in GiB as torch reports it, e.g. 79 for an H100 80 GB")
    p.add_argument("--step-log", default=None, metavar="METRICS_JSONL",
                   help="a synchronous RL run's step log (its metrics.jsonl, e.g. the first steps on the node "
                        "planned for): adds the step's time without and with rl.overlap from its measured phases")
    p.set_defaults(func=_plan)
    p = subparsers.add_parser("preflight", help="check this machine for a GPU config before running it",
                              description="Python, CUDA visible to torch, GPU count, driver against torch's CUDA "
                                          "build, free disk for the checkpoints, DeepSpeed / SGLang / the serve "
                                          "venv, and the memory plan on the GPUs found (paravt_core/preflight.py). "
                                          "Exit 0: ready (or a tiny CPU config); 1: something is missing (each "
                                          "with what to do); 2: the config does not load.")
    _config_args(p)
    p.set_defaults(func=_preflight)
