"""The rank fork server (paravt_core/forkserver.py): a forked rank behaves as the
`python -u script.py` subprocess it replaces, and the suite's ranks really are forked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from paravt_core import forkserver
from tests.conftest import process_alive

REPO = Path(__file__).resolve().parents[2]

REPORT = textwrap.dedent("""
    import json, os, signal, sys
    print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "x": os.environ.get("X"),
                      "ppid": os.getppid(), "pgid": os.getpgid(0), "pid": os.getpid(),
                      "int": str(signal.getsignal(signal.SIGINT)), "int_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
                      "pipe_ignored": signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN,
                      "main": __name__, "file": __file__}))
    print("on stderr", file=sys.stderr)
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "raise":
        raise ValueError("planted")
    if mode == "exit":
        sys.exit(int(os.environ["CODE"]))
    if mode == "message":
        sys.exit("a message")
    if mode == "sleep":
        import time
        time.sleep(600)
    if mode == "interrupt":
        raise KeyboardInterrupt
""")


@pytest.fixture(scope="module")
def light_server(tmp_path_factory):
    """A server that preloads only `json`: it listens within a second."""
    folder = tmp_path_factory.mktemp("fs")
    with forkserver.start(folder / "s.sock", preload=("json",)) as server:
        yield server


def run(server, script: Path, args=(), env=None, group=None, cwd=None):
    """Fork `script` and return (its process, its stdout + stderr once it ended)."""
    read_fd, write_fd = os.pipe()
    proc = forkserver.spawn([sys.executable, "-u", str(script), *args], {**os.environ, **(env or {})},
                            stdin=0, stdout=write_fd, stderr=write_fd, process_group=group,
                            socket_path=server.socket_path, cwd=cwd)
    os.close(write_fd)
    assert proc is not None
    with open(read_fd) as reader:
        output = reader.read()
    proc.wait(timeout=60)
    return proc, output


def test_a_forked_script_sees_what_a_subprocess_would(light_server, tmp_path):
    script = tmp_path / "sub" / "report.py"
    script.parent.mkdir()
    script.write_text(REPORT)
    proc, output = run(light_server, script, ["a b"], env={"X": "set"}, cwd=tmp_path)
    report = json.loads(output.splitlines()[0])
    assert proc.returncode == 0
    assert report["argv"] == [str(script), "a b"] and report["cwd"] == str(tmp_path)
    assert report["path0"] == str(script.parent) and report["x"] == "set"
    assert report["ppid"] == light_server.proc.pid and report["pid"] == proc.pid
    assert report["main"] == "__main__" and report["file"] == str(script)
    assert report["pipe_ignored"]  # as CPython sets it at start
    assert "on stderr" in output
    # its own process group on request, as subprocess.Popen(process_group=0)
    proc, output = run(light_server, script, group=0)
    assert json.loads(output.splitlines()[0])["pgid"] == proc.pid


@pytest.mark.parametrize(("args", "env", "code", "printed"), [
    (["exit"], {"CODE": "3"}, 3, None),
    (["raise"], {}, 1, "ValueError: planted"),
    (["message"], {}, 1, "a message"),
    (["interrupt"], {}, -signal.SIGINT, "KeyboardInterrupt"),
    (["not compiled"], {}, 1, "SyntaxError"),
])
def test_exit_codes_are_a_subprocesss(light_server, tmp_path, args, env, code, printed):
    script = tmp_path / "report.py"
    script.write_text(REPORT if args != ["not compiled"] else "print(\n")
    proc, output = run(light_server, script, args, env=env)
    assert proc.returncode == code, output
    if printed:
        assert printed in output
    # the traceback starts at the script, as the interpreter prints it
    if args in (["raise"], ["not compiled"]):
        assert "runpy" not in output and "forkserver" not in output, output


def test_signals_reach_the_rank_and_a_killed_one_reports_the_signal(light_server, tmp_path):
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    read_fd, write_fd = os.pipe()
    proc = forkserver.spawn([sys.executable, "-u", str(script), "sleep"], dict(os.environ), stdin=0,
                            stdout=write_fd, stderr=write_fd, socket_path=light_server.socket_path)
    os.close(write_fd)
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    assert proc.poll() == -signal.SIGTERM
    os.close(read_fd)


def test_an_environment_the_server_was_not_started_with_gets_a_subprocess(light_server, tmp_path):
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    for name, value in (("HF_HOME", str(tmp_path)), ("OMP_NUM_THREADS", "7"), ("MALLOC_ARENA_MAX", "2")):
        env = {**os.environ, name: value}
        reasons: list[str] = []
        assert forkserver.spawn([sys.executable, "-u", str(script)], env, stdin=0, stdout=1, stderr=2,
                                socket_path=light_server.socket_path, on_fallback=reasons.append) is None, name
        assert reasons == [f"its environment differs from the fork server's in {name}"]
    # not a `python -u script.py` command: nothing to fork
    assert forkserver.spawn([sys.executable, "-u", "-m", "json.tool"], dict(os.environ), stdin=0, stdout=1,
                            stderr=2, socket_path=light_server.socket_path) is None


def test_variables_the_imports_set_agree_where_the_request_lacks_them():
    base = {"OMP_NUM_THREADS": "1", "TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor"}
    by_imports = {"TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor", "_MLFLOW_TELEMETRY_SESSION_ID": "a"}
    assert forkserver.env_differences({"OMP_NUM_THREADS": "1", "PATH": "/x"}, base, by_imports) == []
    # a launcher that imported torch has the same value; MLflow's session is not read at import
    assert forkserver.env_differences({"OMP_NUM_THREADS": "1", "TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor",
                                       "_MLFLOW_TELEMETRY_SESSION_ID": "b"}, base, by_imports) == []
    assert forkserver.env_differences({"OMP_NUM_THREADS": "1", "TORCHINDUCTOR_CACHE_DIR": "/elsewhere"}, base,
                                      by_imports) == ["TORCHINDUCTOR_CACHE_DIR"]
    assert forkserver.env_differences({"OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1", "PYTHONPATH": "/x"}, base,
                                      by_imports) == ["HF_HUB_OFFLINE", "OMP_NUM_THREADS"]
    # read when an op is built, from the child's own environment: a launcher that joined a process
    # group in process (the suite's in-process ranks) still forks its ranks
    assert forkserver.env_differences({"OMP_NUM_THREADS": "1", "TORCH_EXTENSIONS_DIR": "/venv/torch_extensions"},
                                      base, by_imports) == []


def test_a_server_whose_imports_fail_fails_the_launch_at_once_with_the_reason(tmp_path):
    server = forkserver.start(tmp_path / "s.sock", preload=("no_such_module_for_the_fork_server",),
                              ready_timeout=None)
    try:
        started = time.monotonic()
        with pytest.raises(OSError, match="failed to start:(.|\n)*no_such_module_for_the_fork_server"):
            forkserver.spawn([sys.executable, "-u", str(tmp_path / "x.py")], dict(os.environ), stdin=0, stdout=1,
                             stderr=2, socket_path=server.socket_path)
        assert time.monotonic() - started < 60  # not READY_WAIT_S
    finally:
        server.stop()
    with pytest.raises(RuntimeError, match="no_such_module_for_the_fork_server"):
        forkserver.start(tmp_path / "t.sock", preload=("no_such_module_for_the_fork_server",))


def test_an_optional_preload_that_is_not_installed_is_skipped_and_a_required_one_is_not(tmp_path):
    """`forkserver.OPTIONAL`: mlflow is preloaded where it is installed; on a machine without it (the
    GPU image) the server still starts. A required module that is absent still fails the launch."""
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    with forkserver.start(tmp_path / "s.sock", preload=("json", "?no_such_module_for_the_fork_server",
                                                         "?no_such_module_for_the_fork_server.sub")) as server:
        proc, output = run(server, script)
    assert proc.returncode == 0 and '"main": "__main__"' in output
    with pytest.raises(RuntimeError, match="no_such_module_for_the_fork_server"):
        forkserver.start(tmp_path / "t.sock", preload=("?json", "no_such_module_for_the_fork_server"))
    assert "?mlflow" in forkserver.DEFAULT_PRELOAD and "mlflow" not in forkserver.DEFAULT_PRELOAD


def test_a_socket_path_too_long_for_a_unix_socket_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match="too long for a Unix socket"):
        forkserver.start(tmp_path / ("x" * 120) / "s.sock")


LAUNCHER = textwrap.dedent("""
    import os, sys
    from paravt_core import forkserver
    proc = forkserver.spawn([sys.executable, "-u", sys.argv[2], "sleep"], dict(os.environ), stdin=0, stdout=1,
                            stderr=2, socket_path=sys.argv[1], process_group=0)
    print(proc.pid, flush=True)
    proc.wait()
""")


def test_a_rank_whose_launcher_dies_is_killed(light_server, tmp_path):
    """SIGKILL skips every cleanup of the launcher: the server sees its connection close."""
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(light_server.socket_path), str(script)],
                                stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    rank = next((int(line) for line in launcher.stdout if line.strip().isdigit()), None)
    assert rank is not None and process_alive(rank)
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 20
    while process_alive(rank) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not process_alive(rank)


def test_stopping_the_server_ends_its_ranks(tmp_path):
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    server = forkserver.start(tmp_path / "s.sock", preload=())
    proc = forkserver.spawn([sys.executable, "-u", str(script), "sleep"], dict(os.environ), stdin=0,
                            stdout=1, stderr=2, socket_path=server.socket_path)
    assert process_alive(proc.pid)
    server.stop()
    assert server.proc.returncode == 0 and not server.socket_path.exists()
    assert proc.wait(timeout=20) == -signal.SIGKILL
    assert not process_alive(proc.pid)


@pytest.mark.parametrize("ignored", [True, False], ids=["launcher-ignores", "launcher-handles"])
def test_sigint_is_ignored_by_the_rank_exactly_when_its_launcher_ignores_it(light_server, tmp_path, ignored):
    """An ignored disposition survives exec, so a subprocess rank of a background job without
    job control ignores SIGINT, and otherwise raises KeyboardInterrupt on it; a forked rank
    does the same, whatever the server's own disposition."""
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else signal.default_int_handler)
    try:
        _, output = run(light_server, script)
    finally:
        signal.signal(signal.SIGINT, previous)
    report = json.loads(output.splitlines()[0])
    assert report["int_ignored"] is ignored
    assert ignored or "default_int_handler" in report["int"]


RANK = textwrap.dedent("""
    import os, sys, torch
    import torch.distributed as dist
    from paravt_core.dist.rank import init_distributed, shutdown_distributed
    rank, world, _ = init_distributed()
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 4)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(100 * step + rank))
        loss = layer(x).square().mean()
        loss.backward()
        for p in layer.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()
        optimizer.zero_grad()
    digest = torch.cat([p.detach().flatten() for p in layer.parameters()]).numpy().tobytes().hex()
    # one write per line: two ranks share the pipe, and print() writes the line and its end apart
    sys.stdout.write(f"rank {rank} ppid {os.getppid()} threads {torch.get_num_threads()} weights {digest}\\n")
    shutdown_distributed()
""")


def test_the_suites_ranks_are_forked_and_train_as_subprocess_ranks_do(rank_forkserver, tmp_path, monkeypatch):
    """Under this suite `launch_workers` forks its ranks from the session's server (else the
    suite silently pays every rank's imports again), and two ranks trained that way end with
    the same weights, bit for bit, as two subprocess ranks."""
    from paravt_core.dist.launch import launch_workers

    if rank_forkserver is None:
        pytest.skip("PARAVT_TEST_FORKSERVER=0: every rank is a subprocess")
    script = tmp_path / "rank.py"
    script.write_text(RANK)

    def ranks() -> dict[int, list[str]]:
        lines: list[str] = []
        launch_workers(script, [], 2, log_line=lines.append, env={"PYTHONPATH": str(REPO)}, timeout_s=300,
                       threads_per_rank=int(os.environ.get("OMP_NUM_THREADS", "1")))  # the server's (conftest)
        found = {int(line.split()[1]): line.split() for line in lines if line.startswith("rank ")}
        assert sorted(found) == [0, 1], lines[-20:]
        return found

    forked = ranks()
    assert {int(words[3]) for words in forked.values()} == {rank_forkserver.proc.pid}
    monkeypatch.delenv(forkserver.SOCKET_ENV)
    started = ranks()
    assert {int(words[3]) for words in started.values()} == {os.getpid()}
    for rank in (0, 1):
        assert forked[rank][5] == started[rank][5]  # threads
        assert forked[rank][7] == started[rank][7]  # weights
