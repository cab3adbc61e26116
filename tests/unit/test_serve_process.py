"""`paravt eval serve` and `agent.server_process`: progress while starting, and no process left
behind when the command is interrupted, on a stand-in `vllm` package whose "server" forks a
worker of its own (as vLLM's engine core does)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from paravt_core.dist.launch import free_port
from tests.conftest import fake_vllm_package, process_alive, processes_gone, start_eval_serve

FAKE_SERVER = textwrap.dedent('''
    """A stand-in for `vllm serve` (imported as vLLM's CLI main): forks a worker, serves /health, records both pids."""
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


@pytest.fixture()
def fake_vllm(tmp_path: Path) -> Path:
    return fake_vllm_package(tmp_path / "fakepkgs", FAKE_SERVER)


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
        assert process_alive(server_pid) and process_alive(worker_pid)
        paravt.send_signal(sig)
        assert paravt.wait(timeout=60) == 0
        assert processes_gone([server_pid, worker_pid]), "the server or its worker outlived `paravt eval serve`"
        assert "stopping the server" in paravt.stderr.read()
    finally:
        if paravt.poll() is None:
            paravt.kill()


def test_start_server_reports_progress_and_a_server_that_dies_names_its_log(fake_vllm, tmp_path):
    from paravt_core.agent.server_launch import VLLM_CLI
    from paravt_core.agent.server_process import ServerStartError, start_server

    env = {**os.environ, "PYTHONPATH": str(fake_vllm), "FAKE_PIDS": str(tmp_path / "pids"), "FAKE_DELAY_S": "2.5"}
    port, seen = free_port(), []
    command = [sys.executable, "-c", VLLM_CLI, "serve", "m", "--host", "127.0.0.1", "--port", str(port)]
    server = start_server(command, f"http://127.0.0.1:{port}", 60, env=env, log_path=tmp_path / "server.log",
                          progress=seen.append, progress_every_s=1.0)
    try:
        assert seen and "waiting for" in seen[0] and "fake server: loading weights" in seen[-1]
        worker = int((tmp_path / "pids").read_text().split()[1])
    finally:
        server.kill()
    assert not server.alive() and processes_gone([worker])

    failing = [sys.executable, "-c", "import sys; print('no such model folder'); sys.exit(3)"]
    with pytest.raises(ServerStartError, match="(?s)exited with status 3.*no such model folder"):
        start_server(failing, f"http://127.0.0.1:{free_port()}", 30, log_path=tmp_path / "failing.log")


REPO = Path(__file__).resolve().parents[2]
TINY_CONFIG = str(REPO / "conf" / "pipeline" / "tiny.yaml")


def _serve_env(fake_vllm: Path, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{fake_vllm}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "FAKE_PIDS": str(tmp_path / "pids"), "FAKE_DELAY_S": "0"}


def _serve_args(model: Path, port: int, tmp_path: Path) -> list[str]:
    return ["--model", str(model), "--config", TINY_CONFIG, "--set", f"run.output_dir={tmp_path / 'out'}",
            "--python", sys.executable, "--server", "vllm", "--port", str(port), "--startup-timeout-s", "20"]


def test_eval_serve_on_port_0_serves_on_a_free_port_and_prints_it(fake_vllm, fake_checkpoint, tmp_path):
    from paravt_core.agent.server_process import server_healthy

    model = fake_checkpoint(tmp_path / "ckpt", "w")
    paravt, lines = start_eval_serve(_serve_args(model.path, 0, tmp_path), env=_serve_env(fake_vllm, tmp_path))
    try:
        endpoints = [re.fullmatch(r"endpoint: http://127\.0\.0\.1:(\d+)/v1\n", line) for line in lines]
        ports = [int(found.group(1)) for found in endpoints if found]
        assert len(ports) == 1 and ports[0] != 0, (lines, paravt.poll())
        assert server_healthy(f"http://127.0.0.1:{ports[0]}")
        paravt.send_signal(signal.SIGTERM)
        assert paravt.wait(timeout=60) == 0
    finally:
        if paravt.poll() is None:
            paravt.kill()


def test_eval_serve_refuses_a_port_in_use_before_starting_a_server(fake_vllm, fake_checkpoint, tmp_path, monkeypatch,
                                                                   capsys):
    from paravt_core.cli import main

    model = fake_checkpoint(tmp_path / "ckpt", "w")
    for name, value in _serve_env(fake_vllm, tmp_path).items():
        monkeypatch.setenv(name, value)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        code = main(["eval", "serve", *_serve_args(model.path, port, tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and f"port {port} on 127.0.0.1 is in use" in err and "--port 0" in err, err
    assert not (tmp_path / "pids").exists(), "a server was started"
    for bad in (-1, 65536):
        assert main(["eval", "serve", *_serve_args(model.path, bad, tmp_path)]) == 2
        assert f"port {bad} is not a TCP port" in capsys.readouterr().err


def test_eval_serve_refuses_a_folder_without_weights_before_starting_a_server(fake_vllm, fake_checkpoint, tmp_path):
    model = fake_checkpoint(tmp_path / "ckpt", "w")
    (model.path / "model.safetensors").unlink()
    # In a process of its own: before the check, the stand-in server started and served on.
    done = subprocess.run([sys.executable, "-m", "paravt_core.cli", "eval", "serve",
                           *_serve_args(model.path, 0, tmp_path)], env=_serve_env(fake_vllm, tmp_path), cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"{model.path}: no weights" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "pids").exists()


def test_eval_serve_names_a_missing_model_folder_not_an_unknown_alias(tmp_path, capsys):
    from paravt_core.cli import main

    missing = tmp_path / "no" / "model"
    assert main(["eval", "serve", *_serve_args(missing, 0, tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"model folder {missing}: it does not exist" in err and "alias '" not in err, err
