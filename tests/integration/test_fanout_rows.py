"""RL rows fanned out over Prefect (issue #45 item 5): rows really run at once, come back in
order, on their own thread budget; the RL ranks get that budget."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from paravt_core.config import FanoutConfig

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_rows_run_at_once_and_come_back_in_order(prefect_harness, task_runs):
    """Two rows that can only finish together (a barrier both must reach) finish fanned out;
    each ran on its thread budget while the flow's own thread kept its count."""
    import torch
    from prefect import flow

    from flows.fanout import fan_out

    meet = threading.Barrier(2, timeout=60)

    def row(name: str, delay: float):
        def work():
            import time

            meet.wait()
            time.sleep(delay)  # the first row given finishes last
            return name, torch.get_num_threads()
        return work

    gathered: list[str] = []

    @flow
    def two_rows() -> list:
        before = torch.get_num_threads()
        results = fan_out([("a", row("a", 0.5)), ("b", row("b", 0.0))],
                          FanoutConfig(max_concurrent=2, threads_per_run=1),
                          lambda label, result: gathered.append(label))
        return [results, before, torch.get_num_threads()]

    state = two_rows(return_state=True)
    results, before, after = state.result()
    assert results == [("a", 1), ("b", 1)] and gathered == ["a", "b"]
    assert after == before  # the budget was set in the rows' threads only
    assert len(task_runs(state.state_details.flow_run_id)["fanned-out"]) == 2


def test_one_at_a_time_keeps_the_given_order(prefect_harness, monkeypatch):
    from prefect import flow

    from flows import fanout
    from flows.fanout import fan_out

    said: list[str] = []

    class Logger:  # the run's own logger, which also keeps what the fan-out says
        def info(self, message: str, *args) -> None:
            said.append(message % args)
            fanout_logger().info(message, *args)

    fanout_logger = fanout.get_run_logger
    monkeypatch.setattr(fanout, "get_run_logger", Logger)

    started: list[str] = []
    running = threading.Lock()

    def row(name: str):
        def work():
            assert running.acquire(blocking=False), "two rows ran at once with max_concurrent 1"
            started.append(name)
            running.release()
            return name
        return work

    @flow
    def three_rows() -> list:
        return fan_out([(n, row(n)) for n in "abc"], FanoutConfig())

    assert three_rows() == ["a", "b", "c"] and started == ["a", "b", "c"]
    # one line per job as it ends, counting them (no time left: none ran long enough to set a pace)
    assert [line.split(" took ")[0] for line in said] == [f"fan-out: {n} of 3 jobs done ({label}"
                                                         for n, label in enumerate("abc", 1)]
    assert not any("left" in line for line in said)


WORKER = """
import torch
print(f"rank threads {torch.get_num_threads()}", flush=True)
"""


def test_the_thread_budget_reaches_the_launched_ranks(tmp_path, monkeypatch):
    """OMP_NUM_THREADS set for the whole process (here 2) gives way to a run's own budget."""
    from paravt_core.dist.launch import launch_workers

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    lines: list[str] = []
    launch_workers(script, [], num_ranks=1, log_line=lines.append, threads_per_rank=1, env={"PYTHONPATH": str(REPO)})
    assert "rank threads 1" in lines, lines[-20:]
    lines.clear()
    launch_workers(script, [], num_ranks=1, log_line=lines.append, env={"PYTHONPATH": str(REPO)})
    assert "rank threads 2" in lines, lines[-20:]
