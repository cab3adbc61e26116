"""The `hf` rollout engine in a process of its own, so its generation runs beside training (issue #65).

`HFProcessEngine` is a `RolloutEngine` (`agent/engine.py`): the RL ranks' rollout (`run_episodes`)
calls its `generate` and the trainer its `update_weights`, as they call a server's engine; here
the engine is the `hf` one the config builds (`agent/hf_build.build_hf_engine`, use "rollout",
the same model options and thread count as the in-process engine and `paravt rl-replay`), in a
child interpreter started with `python -m paravt_core.agent.hf_process`. With `rl.overlap: 1`
(`rl/overlap.py`) the trainer rolls out the next step's batch in a background thread while it
trains; this process does the generating, so on CPU the two really run at the same time.

The child connects back over a socket of the parent's (`multiprocessing.connection`, with a
random key); every message is a plain pickle (tensors by value, nothing shared), one request
and its answer at a time. An error in the child comes back as `HFProcessError` with its text;
a child that died is reported with its exit code. The child ends when told to (`close`) or
when the parent's end of the connection goes away (a killed trainer leaves no engine behind).
"""

from __future__ import annotations

import os
import pickle
import re
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

from paravt_core.agent.engine import Generation, GenerationRequest, SamplingParams, VisionInputs

START_TIMEOUT_S = 600.0  # to import torch and transformers and load the model


class HFProcessError(RuntimeError):
    """The engine process failed a request or is gone; the message says which and why."""


def _send(conn: Connection, value: Any) -> None:
    conn.send_bytes(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def _receive(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


class HFProcessEngine:
    """The `hf` rollout engine of `cfg` on `init_model`, run in a child process (module docstring).

    Args:
        cfg: the run's `PipelineConfig` (its `model.*` options and `rl.shared_prefix` build the engine).
        init_model: the checkpoint the engine starts from (the RL stage's init model).
        device: where the child puts its copy ("cpu", "cuda:0").
        threads: the child's torch and OpenMP threads (its OMP_NUM_THREADS and `torch.set_num_threads`:
            its share of the rank's, `rl/overlap.thread_share`), which the draws log records for replay.
    """

    def __init__(self, cfg: Any, init_model: Path, device: str, threads: int):
        self._lock = threading.Lock()
        self._folder = tempfile.TemporaryDirectory(prefix="paravt-hf-engine-")
        key = secrets.token_bytes(32)
        listener = Listener(str(Path(self._folder.name) / "socket"), family="AF_UNIX", authkey=key)
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
               "PARAVT_HF_ENGINE_KEY": key.hex(), "OMP_NUM_THREADS": str(int(threads))}
        self.process = subprocess.Popen([sys.executable, "-m", "paravt_core.agent.hf_process", listener.address],
                                        env=env, stdin=subprocess.DEVNULL)
        try:
            self._conn = self._accept(listener)
        finally:
            listener.close()
        try:
            self._call("start", cfg, str(init_model), device, int(threads))
        except HFProcessError:
            self.close()  # a child that could not build the engine is not left waiting
            raise

    def _accept(self, listener: Listener) -> Connection:
        """The child's connection, or `HFProcessError` when it exits or does not connect in time."""
        box: list[Connection] = []
        waiter = threading.Thread(target=lambda: box.append(listener.accept()), daemon=True)
        waiter.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while waiter.is_alive() and self.process.poll() is None and time.monotonic() < deadline:
            waiter.join(timeout=0.5)
        if not box:
            self.process.kill()
            raise HFProcessError(f"the hf rollout engine process did not connect (exit code "
                                 f"{self.process.poll()}); its output above says why")
        return box[0]

    def _call(self, op: str, *args: Any) -> Any:
        with self._lock:
            try:
                _send(self._conn, (op, args))
                status, value = _receive(self._conn)
            except (EOFError, OSError) as error:
                raise HFProcessError(f"the hf rollout engine process is gone (exit code {self.process.poll()}) "
                                     f"during {op}: {error}; its output above says why") from None
        if status != "ok":
            raise HFProcessError(f"the hf rollout engine process failed {op}: {value}")
        return value

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
        # `frames` are for engines that process images themselves; the hf engine reads the tensors.
        sent = [GenerationRequest(r.prompt_ids, VisionInputs(*(getattr(r.vision, n) for n in VisionInputs.TENSORS)))
                for r in requests]
        return self._call("generate", sent, params)

    def update_weights(self, state_dict: dict[str, Any]) -> None:
        self._call("update_weights", {name: tensor.detach().cpu() for name, tensor in dict(state_dict).items()})

    def threads(self) -> dict[str, int]:
        """The child's thread counts (`_threads`): what it really computes at."""
        return self._call("threads")

    def close(self) -> None:
        """Stop the child (told to; killed if it does not end within a minute)."""
        if self.process.poll() is None:
            try:
                self._call("close")
            except HFProcessError:
                pass
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._conn.close()
        self._folder.cleanup()


def serve(address: str, key: bytes) -> None:
    """The child: build the engine when told to start, then answer requests until closed."""
    conn = Client(address, family="AF_UNIX", authkey=key)
    engine = None
    while True:
        try:
            op, args = _receive(conn)
        except (EOFError, OSError):
            return  # the trainer is gone
        try:
            if op == "close":
                _send(conn, ("ok", None))
                return
            if op == "start":
                engine = _build(*args)
                result = None
            elif engine is None:
                raise HFProcessError(f"{op} before start")
            elif op == "generate":
                result = engine.generate(*args)
            elif op == "update_weights":
                result = engine.update_weights(*args)
            elif op == "threads":
                result = _threads()
            else:
                raise HFProcessError(f"unknown request {op!r}")
        except Exception as error:  # every failure goes back to the trainer, which raises it
            _send(conn, ("error", f"{type(error).__name__}: {error}"))
            continue
        _send(conn, ("ok", result))


def _threads() -> dict[str, int]:
    """What this process computes at: torch's intra-op threads, the OpenMP and MKL pools' sizes
    (`torch.__config__.parallel_info`), and how many of its OS threads did work in a parallel
    matrix product (their CPU ticks in /proc grew by 2 or more)."""
    import torch

    def ticks() -> dict[str, int]:
        out = {}
        for task in os.listdir("/proc/self/task"):
            try:
                fields = Path(f"/proc/self/task/{task}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # a thread that ended meanwhile
                continue
            out[task] = int(fields[11]) + int(fields[12])  # utime + stime (stat fields 14 and 15)
        return out

    a = torch.randn(1024, 1024)
    a @ a  # the pool's threads are started by the first parallel region
    before = ticks()
    for _ in range(8):
        a @ a
    after = ticks()
    busy = sum(after[task] - before.get(task, 0) >= 2 for task in after)
    found = dict(re.findall(r"^\s*(\w+)\(\) : (\d+)\s*$", torch.__config__.parallel_info(), re.MULTILINE))
    return {"torch": torch.get_num_threads(), "omp": int(found.get("omp_get_max_threads", -1)),
            "mkl": int(found.get("mkl_get_max_threads", -1)), "busy": busy}


def _build(cfg: Any, init_model: str, device: str, threads: int):
    import torch

    # The trainer's side of this module (HFProcessEngine) only sends requests; the engine's own
    # process builds the model and needs transformers and the model builder.
    # lazy: loaded in the engine's process only (above)
    from paravt_core.agent.hf_build import build_hf_engine
    # lazy: loaded in the engine's process only (above)
    from paravt_core.model.loading import build_model, load_processor

    torch.set_num_threads(threads)
    model = build_model(cfg.model, Path(init_model), device=device).eval()
    return build_hf_engine(cfg, model, load_processor(Path(init_model)), "rollout")


if __name__ == "__main__":
    serve(sys.argv[1], bytes.fromhex(os.environ.pop("PARAVT_HF_ENGINE_KEY")))
