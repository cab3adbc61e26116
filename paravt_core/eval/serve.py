"""`paravt eval serve --model REF`: serve a checkpoint on 127.0.0.1 for the `openai` evaluator.

    paravt eval serve --model champion|candidate|sft|<version>|base|<model folder>
                      [--config FILE] [--port 30000] [--server auto|sglang|vllm]

Starts SGLang (or vLLM when SGLang is not installed, or when asked for) on the checkpoint's
own folder, so the server renders with its chat template and processor config; waits until
it answers /health, prints the endpoint and the `paravt eval run` overrides that point at
it, and serves until interrupted. `paravt eval run` then checks the server's rendering
against ours at start (`openai_engine.check_server_rendering`).

Exit status 2, with the reason on stderr, when neither server is installed or the model
reference does not resolve.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

INPUT_ERROR = 2
SERVERS = ("sglang", "vllm")
# Main-agent turns hold up to 64 overview frames plus 5 crops of up to 16 frames a round
# (SPEC §3, §7); vLLM caps images per prompt unless told.
MAX_IMAGES_PER_PROMPT = 512


class ServeError(RuntimeError):
    """No server can be started as asked; the message names what is missing."""


def pick_server(asked: str) -> str:
    """The server to start: `asked`, or with "auto" SGLang, else vLLM, whichever is installed."""
    installed = [name for name in SERVERS if importlib.util.find_spec(name) is not None]
    if asked != "auto":
        if asked not in installed:
            raise ServeError(f"{asked} is not installed; install the GPU profile (`pip install -e '.[gpu]'`) or pick "
                             f"--server {'/'.join(installed) or 'auto'}")
        return asked
    if not installed:
        raise ServeError("neither SGLang nor vLLM is installed, so no server can serve the checkpoint; install the GPU "
                         "profile (`pip install -e '.[gpu]'`) on a CUDA machine, or evaluate with eval.engine=hf")
    return installed[0]


def server_command(server: str, model_path: Path, port: int, served_model_name: str) -> list[str]:
    """The command line that serves `model_path` on 127.0.0.1:`port` under `served_model_name`."""
    if server == "sglang":
        return [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_path), "--host", "127.0.0.1",
                "--port", str(port), "--served-model-name", served_model_name]
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_path),
            "--host", "127.0.0.1", "--port", str(port), "--served-model-name", served_model_name,
            "--limit-mm-per-prompt", f'{{"image": {MAX_IMAGES_PER_PROMPT}}}']


def register(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="serve a checkpoint on 127.0.0.1 (SGLang or vLLM) for eval.engine=openai")
    serve.add_argument("--config", default="conf/pipeline/tiny.yaml", help="pipeline YAML (resolves --model)")
    serve.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    serve.add_argument("--model", required=True,
                       help='MLflow alias (champion, candidate, sft), version number, "base" or a model folder')
    serve.add_argument("--port", type=int, default=30000)
    serve.add_argument("--server", choices=("auto", *SERVERS), default="auto")
    serve.add_argument("--startup-timeout-s", type=float, default=900.0)
    serve.set_defaults(func=serve_command)


def serve_command(args: argparse.Namespace) -> int:
    from paravt_core.agent.sglang_engine import wait_until_healthy
    from paravt_core.config import ConfigError, load_config
    from paravt_core.eval.models import ModelReferenceError, resolve_model

    try:
        server = pick_server(args.server)
        cfg = load_config(args.config, args.set)
        model = resolve_model(cfg, args.model).artifact
    except (ServeError, ConfigError, ModelReferenceError) as exc:
        print(f"paravt eval serve: {exc}", file=sys.stderr)
        return INPUT_ERROR
    name = f"{cfg.model.registered_name}-{model.sha256[:12]}"
    command = server_command(server, Path(model.path), args.port, name)
    running = wait_until_healthy(command, f"http://127.0.0.1:{args.port}", args.startup_timeout_s)
    endpoint = f"{running.url}/v1"
    print(f"{server} serves {model.path} (sha256 {model.sha256[:12]}) as {name!r}")
    print(f"endpoint: {endpoint}")
    print(f"evaluate: paravt eval run --model {args.model} --set eval.engine=openai --set eval.endpoint={endpoint} "
          f"--set eval.served_model_name={name}", flush=True)
    try:
        return running.process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        running.stop()
