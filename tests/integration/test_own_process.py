"""`paravt_core/own_process.py`: a library call in a child process, its result or its failure."""

from __future__ import annotations

import json

import pytest

from paravt_core.own_process import call_in_own_process

pytestmark = pytest.mark.integration


def test_the_call_runs_in_another_process_and_returns_its_text(tmp_path):
    lines = []
    pid = call_in_own_process("os:getenv", "RANK", tmp_path, lines.append)  # a launched rank's RANK: "0"
    assert pid == "0"
    assert json.loads((tmp_path / "os_getenv.job.json").read_text())["target"] == "os:getenv"
    assert call_in_own_process("json:dumps", "text", tmp_path) == '"text"'


def test_a_failing_call_raises_with_its_last_lines(tmp_path):
    with pytest.raises(RuntimeError, match=r"own_process.py exited with code 1; last output:\n(.|\n)*AttributeError"):
        call_in_own_process("json:no_such_function", "{}", tmp_path, lambda line: None)
    assert not (tmp_path / "json_no_such_function.result.json").exists()


def test_the_call_runs_on_the_calling_threads_torch_thread_count(tmp_path):
    """A fan-out job sets its thread budget per thread (flows/fanout.py `run_row`); the call it
    makes in a process of its own runs on that budget, as it did in process, not on every core."""
    import threading

    import torch

    seen = {}

    def job() -> None:
        torch.set_num_threads(1)
        seen["threads"] = call_in_own_process("os:getenv", "OMP_NUM_THREADS", tmp_path / "one")

    thread = threading.Thread(target=job)
    thread.start()
    thread.join()
    assert seen["threads"] == "1"
    assert call_in_own_process("os:getenv", "OMP_NUM_THREADS", tmp_path / "main") == str(torch.get_num_threads())
