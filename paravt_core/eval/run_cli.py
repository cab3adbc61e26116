"""`paravt eval run`: evaluate one model on the prepared SPEC §7 splits, without Prefect.

    paravt eval run --config conf/pipeline/tiny.yaml [--set eval.concurrency=4]
                    --model champion|candidate|sft|<version>|base|<model folder>
                    [--split videomme --split charades] [--label rl]

Reads the splits the data stage prepared under `<output_dir>/data/eval/`, evaluates into
`<output_dir>/eval/<model>-<settings>/` (resuming from the split logs) and prints the
Table-1-shaped table. It holds the output directory's run lock (`paravt_core.run_lock`),
so it is refused while another run uses that directory. With `eval.engine=openai` and no
endpoint it serves the model itself for the run (`eval/served.py`). Exit status 2 when the
config, the model reference or the prepared data is not usable, no server can be started
as configured (none installed), or the directory is in use; 1 when the server of
`eval.engine=openai` fails (its own one does not start, no answer by the request deadline,
an HTTP error, or a reply that is not a chat completion: `eval/openai_engine.py`); finished
samples are kept and a re-run resumes. Either way the reason is on stderr.
"""

from __future__ import annotations

import argparse
import sys

from paravt_core.agent.server_process import ServerStartError
from paravt_core.config import ConfigError, load_config
from paravt_core.eval import stage
from paravt_core.eval.evaluator import EvalError
from paravt_core.eval.models import ModelReferenceError, resolve_model
from paravt_core.eval.openai_engine import ChatError
from paravt_core.layout import eval_dir
from paravt_core.refs import ArtifactRef, content_hash
from paravt_core.run_lock import OutputDirBusy, hold_output_dir

INPUT_ERROR = 2
SERVER_FAILED = 1


def run_command(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config, args.set)
        root = eval_dir(cfg)
        if not root.is_dir():
            raise EvalError(f"no prepared evaluation splits under {root}; run the data stage first "
                            "(the paravt-data flow, or `paravt run`)")
        with hold_output_dir(cfg.run.output_dir, "paravt eval run"):
            data = ArtifactRef(kind="eval_data", path=root.resolve(), sha256=content_hash(root))
            resolved = resolve_model(cfg, args.model)
            report = stage.run(cfg, resolved.artifact, data, args.label or resolved.label, args.splits,
                               notify=lambda line: print(f"paravt eval run: {line}", file=sys.stderr, flush=True))
    except (ConfigError, ModelReferenceError, EvalError, OutputDirBusy) as exc:
        print(f"paravt eval run: {exc}", file=sys.stderr)
        return INPUT_ERROR
    except ServerStartError as exc:
        print(f"paravt eval run: the model server did not start: {exc}", file=sys.stderr)
        return SERVER_FAILED
    except ChatError as exc:  # the server's fault, not the input's
        print(f"paravt eval run: {exc}", *getattr(exc, "__notes__", ()), sep="\n", file=sys.stderr)
        return SERVER_FAILED
    print(stage.format_table({report.label: report}))
    print(f"results: {report.results_dir}")
    return 0
