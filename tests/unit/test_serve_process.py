"""`paravt eval serve` and `agent.server_process`: progress while starting, and no process left
behind when the command is interrupted, on a stand-in `vllm` package whose "server" forks a
worker of its own (as vLLM's engine core does)."""

from __future__ import annotations

import os
import signal
import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import start_eval_serve

FAKE_SERVER = textwrap.dedent('''
    """A stand-in for vLLM's api_server: forks a worker, serves /health, records both pids."""
    import argparse, http.server, os, subprocess, sys, time
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int)
    parser.add_argument("--host")
    args, _ = parser.parse_known_args()
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.environ["FAKE_PIDS"], "w") as f:
        f.write(f"{os.getpid()} {worker.pid}")
    print("fake server: loading weights", flush=True)
    time.sleep(float(os.environ.get("FAKE_DELAY_S", "0")))
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *a):
            pass
    http.server.HTTPServer((args.host, args.port), Health).serve_forever()
''')


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture()
def fake_vllm(tmp_path: Path) -> Path:
    root = tmp_path / "fakepkgs"
    module = root / "vllm" / "entrypoints" / "openai"
    module.mkdir(parents=True)
    for folder in (root / "vllm", root / "vllm" / "entrypoints", module):
        (folder / "__init__.py").write_text("")
    (module / "api_server.py").write_text(FAKE_SERVER)
    return root


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def _gone(pids: list[int], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.mark.parametrize("background", [False, True], ids=["foreground", "background-launch"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_eval_serve_stops_the_server_and_its_workers(fake_vllm, fake_checkpoint, tmp_path, sig, background):
    """Also when started as a background job without job control, which ignores SIGINT: the
    command handles SIGINT itself rather than relying on Python's default handler."""
    model = fake_checkpoint(tmp_path / "ckpt", "w")
    pids_file = tmp_path / "pids"
    env = {**os.environ, "PYTHONPATH": f"{fake_vllm}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "FAKE_PIDS": str(pids_file), "FAKE_DELAY_S": "0"}
    port = free_port()
    paravt, lines = start_eval_serve(["--model", str(model.path), "--python", sys.executable, "--server", "vllm",
                                      "--port", str(port), "--startup-timeout-s", "60"], env=env,
                                     background=background)
    try:
        assert any(line == f"endpoint: http://127.0.0.1:{port}/v1\n" for line in lines), lines
        server_pid, worker_pid = map(int, pids_file.read_text().split())
        assert _alive(server_pid) and _alive(worker_pid)
        paravt.send_signal(sig)
        assert paravt.wait(timeout=60) == 0
        assert _gone([server_pid, worker_pid]), "the server or its worker outlived `paravt eval serve`"
        assert "stopping the server" in paravt.stderr.read()
    finally:
        if paravt.poll() is None:
            paravt.kill()


def test_start_server_reports_progress_and_a_server_that_dies_names_its_log(fake_vllm, tmp_path):
    from paravt_core.agent.server_process import ServerStartError, start_server

    env = {**os.environ, "PYTHONPATH": str(fake_vllm), "FAKE_PIDS": str(tmp_path / "pids"), "FAKE_DELAY_S": "2.5"}
    port, seen = free_port(), []
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port)]
    server = start_server(command, f"http://127.0.0.1:{port}", 60, env=env, log_path=tmp_path / "server.log",
                          progress=seen.append, progress_every_s=1.0)
    try:
        assert seen and "waiting for" in seen[0] and "fake server: loading weights" in seen[-1]
        worker = int((tmp_path / "pids").read_text().split()[1])
    finally:
        server.kill()
    assert not server.alive() and _gone([worker])

    failing = [sys.executable, "-c", "import sys; print('no such model folder'); sys.exit(3)"]
    with pytest.raises(ServerStartError, match="(?s)exited with status 3.*no such model folder"):
        start_server(failing, f"http://127.0.0.1:{free_port()}", 30, log_path=tmp_path / "failing.log")
