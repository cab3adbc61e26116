"""One run per output directory (`paravt_core.run_lock`): a second run is refused with the
holder's pid and start time; a lock left by a dead run is taken over."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from paravt_core.run_lock import LOCK_FILE, OutputDirBusy, hold_output_dir, read_holder

REPO = Path(__file__).resolve().parents[2]


def start_holder(output_dir: Path) -> subprocess.Popen:
    """Another process holding the directory's lock until killed."""
    code = textwrap.dedent(f"""
        import sys, time
        from paravt_core.run_lock import hold_output_dir
        with hold_output_dir({str(output_dir)!r}, "paravt run"):
            print("held", flush=True)
            time.sleep(120)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    assert holder.stdout.readline().strip() == "held"
    return holder


@pytest.fixture()
def holder(tmp_path):
    process = start_holder(tmp_path / "out")
    yield process
    if process.poll() is None:
        process.kill()
        process.wait()


def test_a_second_run_is_refused_with_the_holders_pid_and_start_time(tmp_path, holder):
    with pytest.raises(OutputDirBusy, match=rf"in use by another run: pid {holder.pid} on .* \(started 20\d\d-"):
        with hold_output_dir(tmp_path / "out", "paravt eval run"):
            pass
    assert read_holder(tmp_path / "out")["pid"] == holder.pid


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path, holder, caplog):
    holder.kill()
    holder.wait()
    assert read_holder(tmp_path / "out")["pid"] == holder.pid  # the record outlives the process
    with caplog.at_level(logging.WARNING), hold_output_dir(tmp_path / "out", "paravt run"):
        assert read_holder(tmp_path / "out")["pid"] == os.getpid()
    assert f"stale lock left by pid {holder.pid}" in caplog.text
    assert (tmp_path / "out" / LOCK_FILE).read_text() == ""  # released cleanly: no holder record


def test_the_lock_is_reentrant_within_a_process(tmp_path):
    with hold_output_dir(tmp_path, "outer"), hold_output_dir(tmp_path, "inner"):
        assert read_holder(tmp_path)["what"] == "outer"
    with hold_output_dir(tmp_path, "again"):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["what"] == "again"


def test_paravt_eval_run_is_refused_on_a_busy_output_dir(tmp_path, holder, capsys):
    from paravt_core.eval.run_cli import run_command

    (tmp_path / "out" / "data" / "eval").mkdir(parents=True)
    args = argparse.Namespace(config="conf/pipeline/tiny.yaml", set=[f"run.output_dir={tmp_path / 'out'}"],
                              model="base", splits=None, label=None)
    assert run_command(args) == 2
    assert f"in use by another run: pid {holder.pid}" in capsys.readouterr().err


def test_paravt_run_is_refused_on_a_busy_output_dir(tmp_path, holder, capsys):
    from flows.cli import _run

    args = argparse.Namespace(config="conf/pipeline/tiny.yaml", set=[f"run.output_dir={tmp_path / 'out'}"],
                              rl_row=None)
    assert _run(args) == 2
    assert f"in use by another run: pid {holder.pid}" in capsys.readouterr().err


@pytest.mark.parametrize("command, config", [("run", "conf/pipeline/tiny.yaml"),
                                             ("reproduce", "conf/pipeline/reproduce.yaml")])
def test_in_process_flows_refuse_a_busy_output_dir_in_one_line(command, config, tmp_path: Path, holder, capsys):
    from paravt_core.cli import main

    code = main([command, "--config", config, "--set", f"run.output_dir={tmp_path / 'out'}"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"paravt {command}: ") and "in use by another run" in err[0]


def test_deleting_the_lock_file_under_a_running_run_does_not_let_a_second_one_in(tmp_path, holder):
    """#61: the lock was the file's alone; with it deleted, a second run locked a new file and went in."""
    (tmp_path / "out" / LOCK_FILE).unlink()
    code = textwrap.dedent(f"""
        from paravt_core.run_lock import OutputDirBusy, hold_output_dir
        try:
            with hold_output_dir({str(tmp_path / "out")!r}, "paravt run"):
                print("entered")
        except OutputDirBusy as busy:
            print("refused:", busy)
    """)
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert second.stdout.startswith(f"refused: {tmp_path / 'out'} is in use by another run"), second
    holder.kill()
    holder.wait()
    with hold_output_dir(tmp_path / "out", "paravt run"):  # the dead holder's locks went with it
        assert read_holder(tmp_path / "out")["pid"] == os.getpid()
