"""`paravt eval serve --model REF`: serve a checkpoint on 127.0.0.1 for the `openai` evaluator.

    paravt eval serve --model champion|candidate|sft|<version>|base|<model folder>
                      [--config FILE] [--port 30000] [--server auto|sglang|vllm]
                      [--python INTERPRETER] [--max-model-len N]

The server runs from its own interpreter, not the project's: vLLM and SGLang pin their own
torch and transformers, so they live in a venv of their own (`make install-serve` makes
`.venv-serve`). The interpreter is, first found: `--python`, `eval.server_python`, the
environment variable PARAVT_SERVE_PYTHON, the repository's `.venv-serve/bin/python`, and
last this interpreter.

Starts SGLang (or vLLM when SGLang is not installed there, or when asked for) on the
checkpoint's own folder, so the server renders with its chat template and processor
config; waits until it answers /health, printing progress; prints the endpoint and the
`paravt eval run` overrides that point at it, and serves until interrupted (Ctrl-C or
SIGTERM), then stops the server's whole process group (`agent.server_process`).

On a machine without a CUDA GPU (the CPU build of vLLM) the server gets the settings that
build needs: float32, eager mode, a bounded context (`--max-model-len`), 1 GiB of KV
cache (VLLM_CPU_KVCACHE_SPACE, kept when set) and no OpenMP thread pinning.

Exit status 2, with the reason on stderr, when no server is installed for the interpreter
or the model reference does not resolve.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from paravt_core.agent.server_process import ServerProcess, ServerStartError, start_server

INPUT_ERROR = 2
SERVERS = ("sglang", "vllm")
PYTHON_ENV = "PARAVT_SERVE_PYTHON"
SERVE_VENV = Path(__file__).resolve().parents[2] / ".venv-serve"
# Main-agent turns hold up to 64 overview frames plus 5 crops of up to 16 frames a round
# (SPEC §3, §7); vLLM caps images per prompt unless told.
MAX_IMAGES_PER_PROMPT = 512
CPU_MAX_MODEL_LEN = 16384
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


class ServeError(RuntimeError):
    """No server can be started as asked; the message names what is missing."""


@dataclass(frozen=True)
class ServerPython:
    """An interpreter that can run a server: what it has installed and whether it sees a GPU."""

    path: str
    installed: tuple[str, ...]
    cuda: bool


_PROBE = ("import importlib.util as u, json\n"
          "names = [n for n in ('sglang', 'vllm') if u.find_spec(n) is not None]\n"
          "try:\n    import torch\n    cuda = bool(torch.cuda.is_available())\n"
          "except Exception:\n    cuda = False\n"
          "print(json.dumps({'installed': names, 'cuda': cuda}))\n")


def server_python_path(asked: str | None = None, configured: str | None = None) -> str:
    """The server's interpreter: `asked`, `configured`, $PARAVT_SERVE_PYTHON, .venv-serve, this one."""
    for candidate in (asked, configured, os.environ.get(PYTHON_ENV)):
        if candidate:
            return candidate
    venv_python = SERVE_VENV / "bin" / "python"
    return str(venv_python) if venv_python.exists() else sys.executable


def probe_python(path: str) -> ServerPython:
    """What `path` has installed (sglang, vllm) and whether its torch sees a CUDA GPU.

    Raises:
        ServeError: the interpreter does not exist or does not run.
    """
    if path != sys.executable and not Path(path).exists():
        raise ServeError(f"the server interpreter {path} does not exist; run `make install-serve` (it makes "
                         f"{SERVE_VENV}/bin/python) or name one with --python / eval.server_python / {PYTHON_ENV}")
    try:
        done = subprocess.run([path, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServeError(f"the server interpreter {path} does not run: {exc}") from exc
    if done.returncode != 0:
        raise ServeError(f"the server interpreter {path} failed its probe: {done.stderr.strip()[-500:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return ServerPython(path, tuple(found["installed"]), bool(found["cuda"]))


def pick_server(asked: str, python: ServerPython) -> str:
    """The server to start: `asked`, or with "auto" SGLang, else vLLM, whichever `python` has."""
    if asked != "auto":
        if asked not in python.installed:
            raise ServeError(f"{asked} is not installed for {python.path}; run `make install-serve` (vLLM, its own "
                             f"venv) or pick --server {'/'.join(python.installed) or 'auto'}")
        return asked
    if not python.installed:
        raise ServeError(f"neither SGLang nor vLLM is installed for {python.path}, so no server can serve the "
                         "checkpoint; run `make install-serve` (vLLM in .venv-serve, the CPU build without a GPU), "
                         "or evaluate with eval.engine=hf")
    return python.installed[0]


def server_command(server: str, model_path: Path, port: int, served_model_name: str, *, python: str | None = None,
                   cpu: bool = False, max_model_len: int | None = None, extra: Sequence[str] = ()) -> list[str]:
    """The command line that serves `model_path` on 127.0.0.1:`port` under `served_model_name`."""
    python = python or sys.executable
    if server == "sglang":
        command = [python, "-m", "sglang.launch_server", "--model-path", str(model_path), "--host", "127.0.0.1",
                   "--port", str(port), "--served-model-name", served_model_name]
        if max_model_len:
            command += ["--context-length", str(max_model_len)]
        return command + list(extra)
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_path),
               "--host", "127.0.0.1", "--port", str(port), "--served-model-name", served_model_name,
               "--limit-mm-per-prompt", f'{{"image": {MAX_IMAGES_PER_PROMPT}}}']
    if cpu:
        command += ["--dtype", "float32", "--enforce-eager"]
    if max_model_len or cpu:
        command += ["--max-model-len", str(max_model_len or CPU_MAX_MODEL_LEN)]
    return command + list(extra)


def server_env(server: str, cpu: bool) -> dict[str, str]:
    """The server's environment: ours, offline (the checkpoint is a local folder), and the
    CPU build's settings where it runs on CPU (values already set are kept)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if server == "vllm" and cpu:
        for name, value in CPU_ENV.items():
            env.setdefault(name, value)
    return env


def launch(model_path: Path, served_model_name: str, *, port: int, server: str = "auto", python: str | None = None,
           max_model_len: int | None = None, startup_timeout_s: float = 900.0, log_path: Path | None = None,
           extra: Sequence[str] = (), progress: Callable[[str], None] | None = None) -> tuple[str, ServerProcess]:
    """Start a server on `model_path` and return (its name, the healthy process).

    Raises:
        ServeError: no interpreter or no server package.
        ServerStartError: the server exited or never became healthy (its log's tail attached).
    """
    interpreter = probe_python(server_python_path(python))
    name = pick_server(server, interpreter)
    cpu = not interpreter.cuda
    command = server_command(name, model_path, port, served_model_name, python=interpreter.path, cpu=cpu,
                             max_model_len=max_model_len, extra=extra)
    running = start_server(command, f"http://127.0.0.1:{port}", startup_timeout_s, env=server_env(name, cpu),
                           log_path=log_path, progress=progress)
    return name, running


def register(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="serve a checkpoint on 127.0.0.1 (SGLang or vLLM) for eval.engine=openai")
    serve.add_argument("--config", default="conf/pipeline/tiny.yaml", help="pipeline YAML (resolves --model)")
    serve.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    serve.add_argument("--model", required=True,
                       help='MLflow alias (champion, candidate, sft), version number, "base" or a model folder')
    serve.add_argument("--port", type=int, default=30000)
    serve.add_argument("--server", choices=("auto", *SERVERS), default="auto")
    serve.add_argument("--python", default=None,
                       help=f"the server's interpreter (default: eval.server_python, ${PYTHON_ENV}, .venv-serve)")
    serve.add_argument("--max-model-len", type=int, default=None,
                       help=f"context length (default: the model's; {CPU_MAX_MODEL_LEN} on CPU)")
    serve.add_argument("--startup-timeout-s", type=float, default=900.0)
    serve.set_defaults(func=serve_command)


def _stop_on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt


def serve_command(args: argparse.Namespace) -> int:
    from paravt_core.config import ConfigError, load_config
    from paravt_core.eval.models import ModelReferenceError, resolve_model

    def progress(line: str) -> None:
        print(f"paravt eval serve: {line}", file=sys.stderr, flush=True)

    try:
        cfg = load_config(args.config, args.set)
        model = resolve_model(cfg, args.model).artifact
        python = server_python_path(args.python, cfg.eval.server_python)
    except (ConfigError, ModelReferenceError) as exc:
        print(f"paravt eval serve: {exc}", file=sys.stderr)
        return INPUT_ERROR
    name = f"{cfg.model.registered_name}-{model.sha256[:12]}"
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    running: ServerProcess | None = None
    try:
        progress(f"starting a server on {model.path} with {python}")
        server, running = launch(Path(model.path), name, port=args.port, server=args.server, python=python,
                                 max_model_len=args.max_model_len, startup_timeout_s=args.startup_timeout_s,
                                 progress=progress)
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
        if running is not None:
            running.stop()
        signal.signal(signal.SIGTERM, previous)
