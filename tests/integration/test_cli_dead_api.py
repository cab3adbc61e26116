"""Issue #33 item 7: with the Prefect API killed mid-run, `paravt run`'s flow runner gives up
within a minute, still prints the run's summary, and leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    from types import SimpleNamespace

    from flows import cli
    cli._prefect_environment()  # what `paravt run` does before Prefect is imported

    from prefect import flow, task
    from prefect.server.api.server import SubprocessASGIServer

    from flows.progress import PROGRESS

    @task
    def stage(i):
        time.sleep(0.5)
        return i

    @flow
    def toy(params):
        for i in range(6):
            stage(i)
            PROGRESS.stage(f"stage {i}", f"/out/{i}")
            if i == 1:
                server = SubprocessASGIServer._instances[None].server_process
                server.kill()
                server.wait()
                print(f"KILLED {time.time()}", flush=True)
            if i == 2 and sys.argv[2] == "fail":
                raise RuntimeError("stage 2 broke")
        return PROGRESS.finish({"result": "six stages"})

    cfg = SimpleNamespace(run=SimpleNamespace(output_dir=Path(sys.argv[1])))
    try:
        cli._flow_in_process("toy run", toy, None, cfg, lambda outputs: print(f"SUMMARY {outputs}", flush=True))
    except cli.ApiGone as gone:
        cli._ended(gone.status)
    print("finished with a live API", flush=True)
''')


def _run_toy(tmp_path: Path, mode: str) -> tuple[subprocess.CompletedProcess, float]:
    """(the finished toy run, seconds from the server's kill to the run's end)."""
    script = tmp_path / "toy_run.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PYTHONPATH=str(REPO),
               PREFECT_RESULTS_LOCAL_STORAGE_PATH=str(tmp_path / "results"))
    # stdin from /dev/null: under pytest-xdist this process's stdin is its channel to the controller
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "out"), mode], cwd=REPO, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    ended = time.time()
    killed = [float(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("KILLED")]
    assert killed, proc.stderr[-3000:]
    return proc, ended - killed[0]


def test_a_dead_prefect_api_ends_the_run_within_a_minute_with_its_summary(tmp_path: Path):
    proc, seconds = _run_toy(tmp_path, "finish")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SUMMARY {'result': 'six stages'}" in proc.stdout  # the body went on and its result is shown
    assert "the Prefect API stopped answering during the run" in proc.stderr
    assert "finished with a live API" not in proc.stdout
    assert seconds < 60, f"{seconds:.0f} s from the kill to the end"


def test_a_run_stopped_early_with_the_api_gone_lists_its_finished_stages(tmp_path: Path):
    proc, seconds = _run_toy(tmp_path, "fail")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "SUMMARY" not in proc.stdout and "toy run stopped before its end" in proc.stdout
    listed = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("  stage ")]
    assert listed == ["0", "1", "2"]  # stage 2 was recorded, then the body broke
    assert seconds < 60, f"{seconds:.0f} s from the kill to the end"


SLOW_START = textwrap.dedent('''
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    from flows import cli
    cli._prefect_environment()

    from prefect import flow

    @flow
    def toy(params):
        return {"result": "never"}

    cfg = SimpleNamespace(run=SimpleNamespace(output_dir=Path(sys.argv[1])))
    try:
        cli._flow_in_process("toy run", toy, None, cfg, print)
    except cli.ApiGone as gone:
        cli._ended(gone.status)
''')


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/environ").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


def test_a_temporary_server_too_slow_to_start_does_not_outlive_the_command(tmp_path: Path):
    """Prefect gives up on a temporary server that has not answered in time but leaves it
    running; the command ends through `_ended` (os._exit), so its watcher must end the server."""
    script = tmp_path / "slow_start.py"
    script.write_text(SLOW_START)
    home = tmp_path / "prefect-home-slow-start"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PYTHONPATH=str(REPO), PREFECT_RESULTS_LOCAL_STORAGE_PATH=str(tmp_path / "r"),
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="1")  # no server starts in 1 s
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "out")], cwd=REPO, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert "the Prefect API stopped answering" in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 1
    deadline = time.monotonic() + 30  # the watcher polls once a second, then SIGTERM, SIGKILL after 5 s
    while (left := _processes_with(f"PREFECT_HOME={home}")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"processes of the command still alive: {left}"
