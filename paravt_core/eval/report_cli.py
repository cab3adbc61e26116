"""`paravt report --experiment NAME`: Table-1/Table-2 shaped report and fτ/κ plots from MLflow
(the miniature reproduction's own report: `paravt miniature report`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from paravt_core.atomic import output_folder
from paravt_core.config import load_config

# lazy: every `paravt` call imports this module (cli.build_parser), so its commands import what
# they run inside their function: the imports at the top measured +0.17 s on `paravt --help`
# (0.89 -> 1.06 s, min of 8 runs), and some of these modules load torch or Prefect.


def _report(args: argparse.Namespace) -> int:
    from paravt_core.eval.experiment_report import ExperimentNotFound, write_report

    uri = args.tracking_uri or load_config(args.config).mlflow_uri()
    out = Path(args.out or f"outputs/report/{args.experiment}")
    try:
        path = write_report(uri, args.experiment, out)
    except ExperimentNotFound as exc:
        print(f"paravt report: {exc}", file=sys.stderr)
        return 2
    print(path.read_text())
    print(f"report written to {path} (plots beside it) and logged to MLflow ({uri})")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report", help="Markdown tables and fτ/κ plots of an MLflow experiment")
    p.add_argument("--experiment", required=True, help="MLflow experiment name (mlflow.experiment in the config)")
    p.add_argument("--config", default="conf/pipeline/tiny.yaml", help="pipeline YAML whose MLflow store to read")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (overrides the config's)")
    p.add_argument("--out", default=None, type=output_folder,
                   help="output folder (default outputs/report/<experiment>)")
    p.set_defaults(func=_report)
