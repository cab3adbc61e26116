"""`paravt eval serve --model REF`: serve a checkpoint on 127.0.0.1 for the `openai` evaluator.

    paravt eval serve --model champion|candidate|sft|<version>|base|<model folder>
                      [--config FILE] [--port 30000] [--server auto|sglang|vllm]
                      [--python INTERPRETER] [--max-model-len N]

The server runs from its own interpreter, not the project's (`agent/server_launch.py`):
first found of `--python`, `eval.server_python`, $PARAVT_SERVE_PYTHON and the repository's
`.venv-serve/bin/python` (`make install-serve`), else this interpreter.

Starts SGLang (or vLLM when SGLang is not installed there, or when asked for) on the
checkpoint's own folder, so the server renders with its chat template and processor
config, or, where that config lacks the configuration's pixel bounds (a downloaded base
model), on a copy linking its weights with the bounds written in
(`agent.served_model.served_folder`, as the evaluation's own server); waits until it
answers /health, printing progress; prints the endpoint and the
`paravt eval run` overrides that point at it, and serves until interrupted (Ctrl-C or
SIGTERM), then stops the server's whole process group (`agent.server_process`).

Without a CUDA GPU (vLLM's CPU build) the server gets that build's settings (float32, eager,
a bounded `--max-model-len`; `agent/server_launch.py`).

Before anything starts, the model folder is checked whole (`model/integrity.py`: config,
every weight file, safetensors headers, the recorded sizes and sha256) and the port free on
127.0.0.1; `--port 0` serves on a free port picked then (`server_launch.serving_port`).

Exit status 2, with the reason on stderr, when no server is installed for the interpreter,
the model reference does not resolve, the model folder is not whole, or the port is not a
free TCP port; 1 when the server fails to start.
"""

from __future__ import annotations

import argparse
import signal
import sys

from paravt_core.agent.served_model import served_folder, served_model_name
from paravt_core.agent.server_launch import (
    CPU_MAX_MODEL_LEN,
    PYTHON_ENV,
    SERVERS,
    ServeError,
    launch,
    server_python_path,
    serving_port,
)
from paravt_core.agent.server_process import ServerProcess, ServerStartError
from paravt_core.config import ConfigError, load_config
from paravt_core.model.integrity import ModelFolderError, verify_model_dir

# lazy: every `paravt` call imports this module (cli.build_parser), so its commands import what
# they run inside their function: the imports at the top measured +0.17 s on `paravt --help`
# (0.89 -> 1.06 s, min of 8 runs), and some of these modules load torch or Prefect.

INPUT_ERROR = 2


def register(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="serve a checkpoint on 127.0.0.1 (SGLang or vLLM) for eval.engine=openai")
    serve.add_argument("--config", default="conf/pipeline/tiny.yaml", help="pipeline YAML (resolves --model)")
    serve.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    serve.add_argument("--model", required=True,
                       help='MLflow alias (champion, candidate, sft), version number, "base" or a model folder')
    serve.add_argument("--port", type=int, default=30000, help="port on 127.0.0.1 (0: a free one, picked at start)")
    serve.add_argument("--server", choices=("auto", *SERVERS), default="auto")
    serve.add_argument("--python", default=None,
                       help=f"the server's interpreter (default: eval.server_python, ${PYTHON_ENV}, .venv-serve)")
    serve.add_argument("--max-model-len", type=int, default=None,
                       help=f"context length (default: the model's; {CPU_MAX_MODEL_LEN} on CPU)")
    serve.add_argument("--startup-timeout-s", type=float, default=900.0)
    serve.set_defaults(func=serve_command)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


# Both signals are handled here, not left to Python's defaults: a shell that starts a job in
# the background without job control sets SIGINT (and SIGQUIT) to ignored, an ignored
# disposition survives exec, and Python then installs no KeyboardInterrupt handler, so a
# background `paravt eval serve` would not stop on SIGINT at all (issue #45).
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def serve_command(args: argparse.Namespace) -> int:
    from paravt_core.eval.models import ModelReferenceError, resolve_model
    from paravt_core.eval.served import served_work_dir

    def progress(line: str) -> None:
        print(f"paravt eval serve: {line}", file=sys.stderr, flush=True)

    try:
        cfg = load_config(args.config, args.set)
        model = resolve_model(cfg, args.model).artifact
        verify_model_dir(model.path)  # here, not in the server's log after minutes of start-up
        port = serving_port(args.port)
        python = server_python_path(args.python, cfg.eval.server_python)
        # The configuration's pixel bounds, as the evaluation's own server (`eval/served.py`).
        folder = served_folder(model.path, cfg.video, served_work_dir(cfg, model))
    except (ConfigError, ModelReferenceError, ModelFolderError, ServeError) as exc:
        print(f"paravt eval serve: {exc}", file=sys.stderr)
        return INPUT_ERROR
    except (OSError, ValueError) as exc:  # a processor config transformers cannot read, a full disk
        print(f"paravt eval serve: cannot write the pixel-bounded copy of {model.path} to serve: {exc}",
              file=sys.stderr)
        return INPUT_ERROR
    name = served_model_name(cfg.model.registered_name, model.sha256)  # what `eval run` checks (issue #48)
    previous = {sig: signal.signal(sig, _interrupt) for sig in _STOP_SIGNALS}
    running: ServerProcess | None = None
    try:
        progress(f"starting a server on {folder} with {python}")
        server, running = launch(folder, name, port=port, server=args.server, python=python,
                                 max_model_len=args.max_model_len, startup_timeout_s=args.startup_timeout_s,
                                 dtype=cfg.model.dtype, progress=progress)
        endpoint = f"{running.url}/v1"
        print(f"{server} serves {model.path} (sha256 {model.sha256[:12]}) as {name!r}")
        print(f"endpoint: {endpoint}")
        print(f"evaluate: paravt eval run --model {args.model} --set eval.engine=openai --set eval.endpoint={endpoint} "
              f"--set eval.served_model_name={name}", flush=True)
        return running.process.wait()
    except ServeError as exc:
        print(f"paravt eval serve: {exc}", file=sys.stderr)
        return INPUT_ERROR
    except ServerStartError as exc:
        print(f"paravt eval serve: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        progress("stopping the server")
        return 0
    finally:
        # A second Ctrl-C while the group is being stopped must not cut the stop short
        # (`stop` is bounded: SIGTERM, then SIGKILL after its grace period).
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        if running is not None:
            running.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
