"""The evaluation's own model server: one per checkpoint, started when needed, stopped after.

With `eval.engine: openai` and no endpoint (neither `eval.endpoint` nor
PARAVT_EVAL_ENDPOINT), the stage serves the checkpoint it evaluates (issue #44): a fixed
endpoint would refuse connections after a day of training, or answer for whatever it
happens to serve. `ServerOnDemand` is held around one checkpoint's splits (`stage.run`):

1. nothing starts until a sample is left to run (`LazyRunner` asks), so splits already
   finished are re-summarized without a server;
2. then `agent.server_launch.launch` starts SGLang or vLLM (`eval.server`) from the serve
   interpreter (`eval.server_python`, $PARAVT_SERVE_PYTHON, `.venv-serve`) on the folder
   `agent.served_model.served_folder` gives, as for the RL rollout servers: the checkpoint's
   own folder when its processor config holds `video.min_pixels`/`max_pixels` (every export
   writes them), else a copy linking the same weights with those bounds written in (a
   downloaded base model's processor would upscale every frame to 65,536 pixels, where the
   protocol caps them at 50,176: SPEC §1, §3; issue #60 finding 2). It serves on a free
   loopback port, under `served_model_name` (it carries the sha256[:12]);
   `stage.open_runner` then checks it as any server, before the first sample: what it
   serves (`agent.served_model.check_served_model`), its served log-probabilities against
   the local model's (`agent.policy_probe`), and its rendering against the configuration's
   pixel bounds (`eval.openai_engine.check_server_rendering`);
3. on leaving, also on an error, Ctrl-C, or a Prefect retry's failed attempt, the server's
   whole process group is stopped (`agent.server_process`).

GPUs: the server gets `eval.gpus` as CUDA_VISIBLE_DEVICES and serves one data-parallel
replica on each (vLLM `--data-parallel-size`, SGLang `--dp-size`), behind one endpoint that
spreads the requests itself; so one client and one served-model check cover them all, and
`eval.concurrency` samples per replica are kept in flight. We chose the server's own data
parallelism over one server per GPU with our own dispatch: the same checkpoint on every
replica, one port and one process group to stop. Without `eval.gpus`, one replica (on the
server's default device, or the CPU build without a GPU).

The server's log goes to `<results dir>/server.log` (appended, one start after another).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from paravt_core.agent.served_model import served_folder, served_model_name
from paravt_core.agent.server_launch import ServeError, launch, server_python_path, serving_port
from paravt_core.config import PipelineConfig
from paravt_core.device_ledger import LedgerError, declare_server, physical_gpu, release
from paravt_core.plan import SERVER_FRACTION, VLLM_FRACTION
from paravt_core.refs import ArtifactRef

# lazy: the evaluator loads torch (2.3 s, via agent.context) for one exception class;
# `paravt eval serve` runs without it.

logger = logging.getLogger(__name__)

ENDPOINT_ENV = "PARAVT_EVAL_ENDPOINT"


@dataclass(frozen=True)
class Served:
    """A server serving one checkpoint: its OpenAI API root, the name requests send, and how
    many data-parallel replicas answer behind it."""

    endpoint: str
    model_name: str
    replicas: int


def serves_its_own(cfg: PipelineConfig) -> bool:
    """Whether the evaluation starts its own server: `openai` engine, no endpoint given."""
    return cfg.eval.engine == "openai" and not cfg.eval.endpoint and not os.environ.get(ENDPOINT_ENV)


def served_work_dir(cfg: PipelineConfig, model: ArtifactRef) -> Path:
    """Where a server this stage (or `paravt eval serve`) starts keeps the pixel-bounded copy of
    `model` it may serve (`agent.served_model.served_folder`)."""
    return Path(cfg.run.output_dir) / "eval" / f"served-{model.sha256[:12]}"


class ServerOnDemand:
    """A context manager around one checkpoint's evaluation; `get()` starts its server the
    first time, leaving stops it (module docstring)."""

    def __init__(self, cfg: PipelineConfig, model: ArtifactRef, log_path: Path | None = None,
                 notify: Callable[[str], None] | None = None, work_dir: Path | None = None):
        """`notify` gets the start, its progress and the stop, one line each (default: this
        module's logger at INFO, which a Prefect run or the CLI does not show by itself);
        `work_dir` holds the pixel-bounded copy the server may serve (default: the log's
        folder, else `served_work_dir`)."""
        self.cfg, self.model, self.log_path = cfg, model, log_path
        self.work_dir = work_dir or (log_path.parent if log_path else served_work_dir(cfg, model))
        self.notify = notify or logger.info
        self.starts = 0
        self._running = None  # agent.server_process.ServerProcess
        self._served: Served | None = None

    def __enter__(self) -> ServerOnDemand:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def get(self) -> Served:
        """The running server, started now when it is not running.

        Raises:
            EvalError: no server can be started as configured (no interpreter, no SGLang or
                vLLM there, a server it lacks asked for); the message says what to install.
            ServerStartError: the server exited during start-up or was not healthy in time
                (the tail of its log attached).
        """
        return self._served or self._start()

    def _start(self) -> Served:
        from paravt_core.eval.evaluator import EvalError

        ev = self.cfg.eval
        name = served_model_name(self.cfg.model.registered_name, self.model.sha256)
        replicas = max(len(ev.gpus), 1)
        env = {"CUDA_VISIBLE_DEVICES": ",".join(str(gpu) for gpu in ev.gpus)} if ev.gpus else None
        on = f"GPUs {list(ev.gpus)} ({replicas} replicas)" if ev.gpus else "its default device"
        try:
            python = server_python_path(None, ev.server_python)
            port = serving_port(0)
            self.notify(f"eval: starting a model server ({ev.server}) for {self.model.path} (sha256 "
                        f"{self.model.sha256[:12]}) on {on} with {python}; log {self.log_path}")
            started = time.monotonic()
            folder = served_folder(self.model.path, self.cfg.video, self.work_dir)
            server, self._running = launch(folder, name, port=port, server=ev.server, python=python,
                                           startup_timeout_s=ev.server_startup_timeout_s, log_path=self.log_path,
                                           data_parallel=replicas, extra_env=env, dtype=self.cfg.model.dtype,
                                           progress=self.notify)
        except ServeError as exc:
            raise EvalError(f"eval.engine=openai with no eval.endpoint starts a server for {self.model.path}, and "
                            f"cannot: {exc}") from exc
        self._hold_in_ledger(server)
        self.starts += 1
        self._served = Served(f"{self._running.url}/v1", name, replicas)
        self.notify(f"eval: {server} serves {self.model.path} as {name!r} at {self._served.endpoint} (started in "
                    f"{time.monotonic() - started:.0f} s)")
        return self._served

    def _hold_in_ledger(self, server: str) -> None:
        """The device ledger (rehearsals, `device_ledger.py`): the server holds its static share of
        each of `eval.gpus` (none: the card it inherits as `cuda:0`), at vLLM's default
        `gpu_memory_utilization` or SGLang's pool; a claim the cards cannot hold stops it."""
        fraction = SERVER_FRACTION if server == "sglang" else VLLM_FRACTION
        try:
            declare_server(f"evaluation server ({server})", self._running.process.pid, list(self.cfg.eval.gpus) or [physical_gpu(0)],
                           fraction)
        except LedgerError:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the server's whole process group, if one was started; idempotent."""
        running, self._running, self._served = self._running, None, None
        if running is not None:
            running.stop()
            release(running.process.pid)  # the device ledger (rehearsals): its cards are free again
            self.notify(f"eval: stopped the model server for {self.model.path}")
