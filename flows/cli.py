"""`paravt run` / `paravt reproduce`: the full pipeline or the miniature reproduction flow in-process
(an ephemeral Prefect API, no server)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from paravt_core.config import ConfigError
from paravt_core.preflight_cli import check_before_run

# lazy: every `paravt` call imports this module (cli.build_parser), so its commands import what
# they run inside their function: the imports at the top measured +0.17 s on `paravt --help`
# (0.89 -> 1.06 s, min of 8 runs), and some of these modules load torch or Prefect.
# The flows import Prefect, which reads its settings at import: `_prefect_environment()` and the
# rehearsal's environment are set before them.


# Prefect's client retries a failed request 5 times by default (2 + 4 + ... + 32 s); with the
# in-process API gone that is a minute per request. Two retries (6 s) still ride out a busy
# server; the environment can set it.
CLIENT_RETRIES = "2"
EPHEMERAL_STARTUP_S = "180"  # seconds the temporary Prefect server may take to start (_prefect_environment)


class ApiGone(Exception):
    """The flow's Prefect API died during the run; `status` is the exit status to end with."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


def _flow_in_process(command: str, flow, params, cfg, show):
    """Run `flow(params)` holding the output folder and `show` its result; None when another run
    holds the folder.

    The lock is taken here too (the flow takes it again, re-entrantly) so a busy directory is
    a one-line refusal before Prefect starts a flow run, not a failed flow run. When the flow
    fails because its Prefect API is gone (flows/progress.py), what the run produced is still
    shown: the whole result if the flow's body finished, else its finished stages, and
    `ApiGone` says how to end."""
    from flows.progress import PROGRESS, api_gone
    from paravt_core.reaper import start_reaper
    from paravt_core.run_lock import OutputDirBusy, hold_output_dir

    reaper = start_reaper()  # a SIGKILL of this command leaves no Prefect server or DeepSpeed rank behind
    try:
        with hold_output_dir(cfg.run.output_dir, command):
            try:
                result = flow(params)
            except Exception as exc:
                if not api_gone():
                    raise
                print(f"{command}: the Prefect API stopped answering during the run ({type(exc).__name__}: "
                      f"{str(exc)[:200]}); Prefect's run history lacks the rest of this run.", file=sys.stderr)
                if PROGRESS.outputs is not None:
                    show(PROGRESS.outputs)
                    raise ApiGone(0) from exc
                print(f"\n{command} stopped before its end. Finished stages (kept; the same command resumes "
                      "from them, reusing what is done):")
                for name, where in PROGRESS.stages.items() or [("(none)", "")]:
                    print(f"  {name:<14} {where}")
                print(f"  {'output dir':<14} {cfg.run.output_dir.resolve()}")
                raise ApiGone(1) from exc
            show(result)
            return result
    except OutputDirBusy as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return None
    except ApiGone:
        # The command ends with os._exit (`_ended`), which stops no child: a temporary server
        # that was still starting when Prefect gave up on it would live on, holding the
        # command's output pipes.
        from paravt_core.reaper import end_descendants

        end_descendants(exclude=(reaper.process.pid,) if reaper is not None else ())
        raise
    finally:
        if reaper is not None:
            reaper.stop()


def _ended(status: int) -> int:
    """End at once: the events queued for the dead API would each take 7 s to fail at exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _params_or_refusal(command: str, make):
    """The flow's parameters, or None after a one-line refusal naming the bad config (no traceback)."""
    from pydantic import ValidationError

    try:
        return make()
    except ValidationError as exc:
        for error in exc.errors():
            print(f"{command}: {error['msg'].removeprefix('Value error, ')}", file=sys.stderr)
        return None


def _prefect_environment() -> None:
    """Before Prefect is imported (it reads its settings then)."""
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "paravt_core")
    os.environ.setdefault("PREFECT_CLIENT_MAX_RETRIES", CLIENT_RETRIES)
    # Prefect gives its temporary server 20 s to answer; on a busy 2-core machine its start-up
    # (imports, database migrations) took longer and `paravt reproduce` died before any stage
    # ("Timed out while attempting to connect to ephemeral Prefect API server").
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", EPHEMERAL_STARTUP_S)


def _show_outputs(cfg, outputs: dict[str, str]) -> None:
    print("\nPipeline finished. Outputs:")
    for name, where in outputs.items():
        print(f"  {name:<14} " + where.replace("\n", "\n" + " " * 17))
    print(f"  {'output dir':<14} {cfg.run.output_dir.resolve()}")
    print("Run history and MLflow runs: `make ui` (Prefect UI and MLflow UI on 127.0.0.1).")


def _run(args: argparse.Namespace) -> int:
    _prefect_environment()
    from flows.full_pipeline import full_pipeline
    from flows.params import PipelineParams

    params = _params_or_refusal("paravt run", lambda: PipelineParams(config_path=args.config, overrides=args.set,
                                                                      rl_row=args.rl_row))
    if params is None:
        return 2
    cfg = params.load()

    if not check_before_run("paravt run", cfg, args.config):  # a GPU config on an unready machine (#44)
        return 2

    try:
        outputs = _flow_in_process("paravt run", full_pipeline, params, cfg, lambda out: _show_outputs(cfg, out))
    except ApiGone as gone:
        return _ended(gone.status)
    return 2 if outputs is None else 0


def _reproduce(args: argparse.Namespace) -> int:
    _prefect_environment()
    from flows.reproduce import ReproduceParams, reproduce

    params = _params_or_refusal("paravt reproduce",
                                lambda: ReproduceParams(config_path=args.config, overrides=args.set))
    if params is None:
        return 2
    cfg = params.load()

    def show(report: str) -> None:
        print(f"\nReport: {report} (figure and measurements beside it; also in MLflow, experiment "
              f"{cfg.mlflow.experiment!r} at {cfg.mlflow_uri()})")

    try:
        report = _flow_in_process("paravt reproduce", reproduce, params, cfg, show)
    except ApiGone as gone:
        return _ended(gone.status)
    return 2 if report is None else 0


def _fresh_rehearsal_dir(out) -> str | None:
    """Empty the rehearsal's output folder but for the generated world (the hub stand-in, not a
    stage of the run): a rehearsal runs every stage from nothing. None, or why it may not."""
    import shutil

    from paravt_core.rehearsal import SUMMARY
    from paravt_core.run_lock import LOCK_FILE

    if not out.exists():
        return None
    if any(p.name != LOCK_FILE for p in out.iterdir()) and not (out / SUMMARY).is_file():
        return (f"{out} holds files and no {SUMMARY}: it is not a rehearsal's folder; give another "
                "(--set run.output_dir=...) or empty it")

    def remove(path: Path) -> None:  # a link goes, never what it points to
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()

    for entry in out.iterdir():
        if entry.name == "data" and entry.is_dir() and not entry.is_symlink():
            for inner in entry.iterdir():
                if not inner.name.startswith("world-"):
                    remove(inner)
        elif entry.name not in (SUMMARY, LOCK_FILE):
            remove(entry)
    return None


def _rehearse(args: argparse.Namespace) -> int:
    from paravt_core.rehearsal import rehearsal_config

    command = "paravt rehearse"
    try:
        real, cfg, changes, sets = rehearsal_config(args.config, args.set, args.rl_row, args.eval_replicas)
    except ConfigError as err:
        print(f"{command}: {err}", file=sys.stderr)
        return 2
    from paravt_core.run_lock import OutputDirBusy, hold_output_dir

    out = cfg.run.output_dir
    try:
        with hold_output_dir(out, command):  # emptied and run under one lock: never another run's folder
            refusal = _fresh_rehearsal_dir(out)
            if refusal:
                print(f"{command}: {refusal}", file=sys.stderr)
                return 2
            return _rehearse_locked(command, args, real, cfg, changes, sets)
    except OutputDirBusy as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 2


def _rehearse_locked(command, args, real, cfg, changes, sets) -> int:
    from paravt_core.rehearsal import GPU_ONLY, SUMMARY, format_changes, ledger_environment, write_summary

    out = cfg.run.output_dir
    gpu_bytes = int(args.gpu_memory_gib * 2**30) if args.gpu_memory_gib else 80 * 10**9
    ledger = out.resolve() / "device_ledger.jsonl"
    summary = {"config": str(args.config), "overrides": sets, "changes": [c.__dict__ for c in changes],
               "gpu_bytes": gpu_bytes, "planned_model": real.model.base, "flow_pid": os.getpid(),
               "gpu_only": list(GPU_ONLY), "status": "running"}
    out.mkdir(parents=True, exist_ok=True)
    write_summary(out / SUMMARY, summary)
    print(f"{command}: {args.config}'s pipeline on this machine's CPU, as the real run has it but for:\n"
          f"{format_changes(changes)}\nGPU memory: each process declares the memory plan's bytes of "
          f"{real.model.base} on {gpu_bytes / 1e9:.1f} GB cards in {ledger}.", flush=True)
    # Every process of the run inherits these; every stage runs (a cached one would declare nothing).
    rehearsal_env = {**ledger_environment(real, ledger, gpu_bytes), "PREFECT_TASKS_REFRESH_CACHE": "true"}
    saved = {key: os.environ.get(key) for key in rehearsal_env}
    os.environ.update(rehearsal_env)
    try:
        return _rehearse_flow(command, args, real, cfg, sets, ledger, gpu_bytes, summary)
    finally:  # as they were (a caller in this process, e.g. a test, runs on)
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)


def _rehearse_flow(command, args, real, cfg, sets, ledger, gpu_bytes, summary) -> int:
    import time

    from paravt_core.device_ledger import LedgerError, read_ledger
    from paravt_core.rehearsal import GPU_ONLY, SUMMARY, expected_roles, ledger_table, verify, write_summary

    out = cfg.run.output_dir
    _prefect_environment()
    from flows.full_pipeline import full_pipeline
    from flows.params import PipelineParams

    params = PipelineParams(config_path=args.config, overrides=sets, rl_row=args.rl_row)
    started, failure = time.monotonic(), None
    try:
        result = _flow_in_process(command, full_pipeline, params, cfg, lambda out: _show_outputs(cfg, out))
        if result is None:
            return 2
    except ApiGone as gone:
        return _ended(gone.status)
    except Exception as exc:  # the stage that failed says why; the ledger says what held the cards
        failure = f"{type(exc).__name__}: {exc}"
    summary["wall_s"] = round(time.monotonic() - started, 1)
    try:
        claims = verify(ledger, gpu_bytes, os.getpid(), () if failure else expected_roles(cfg))
    except LedgerError as err:
        failure = f"{failure}\n{err}" if failure else str(err)
        claims = read_ledger(ledger) if ledger.is_file() else []
    summary["status"] = "failed" if failure else "passed"
    summary["failure"] = failure
    write_summary(out / SUMMARY, summary)
    print(f"\n{command}: device ledger (planned, {real.model.base}):\n{ledger_table(claims, gpu_bytes)}")
    print(f"Not rehearsed here (a GPU shows them): " + "; ".join(GPU_ONLY))
    if failure:
        print(f"{command}: FAILED after {summary['wall_s']:.0f} s: {failure}", file=sys.stderr)
        return 1
    print(f"{command}: passed in {summary['wall_s']:.0f} s ({out / SUMMARY})")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run the full pipeline flow on a config (no server needed)")
    p.add_argument("--config", default="conf/pipeline/tiny.yaml", help="pipeline YAML")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. sft.max_steps=20")
    p.add_argument("--rl-row", default=None, help="RL ablation row (conf/rl/*.yaml) laid over the rl section")
    p.set_defaults(func=_run)
    p = subparsers.add_parser("reproduce", help="the miniature reproduction: SFT, the RL rows x seeds, Table 2 "
                                                "in miniature with 95 %% intervals (docs/miniature.md)")
    p.add_argument("--config", default="conf/pipeline/reproduce.yaml", help="pipeline YAML")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override, e.g. 'reproduce.seeds=[0]' or rl.max_steps=4")
    p.set_defaults(func=_reproduce)
    p = subparsers.add_parser("rehearse", help="a dress rehearsal of a GPU config on this CPU: its pipeline end to end, "
                                               "every process where it puts them, the tiny model and small sizes "
                                               "(exit 1: a stage or the device ledger failed)")
    p.add_argument("--config", default="conf/pipeline/paravt_8b.yaml", help="pipeline YAML")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override, applied to the real config and then to the rehearsal's")
    p.add_argument("--rl-row", default=None, help="RL ablation row (conf/rl/*.yaml) laid over the rl section")
    p.add_argument("--eval-replicas", type=int, default=2,
                   help="the evaluation's data-parallel replicas at most (each a vLLM engine in this machine's memory)")
    p.add_argument("--gpu-memory-gib", type=float, default=None,
                   help="the cards the ledger plans for, GiB (default: 80 GB, an H100 80GB)")
    p.set_defaults(func=_rehearse)
