"""The running time over a command's invocations, from its own heartbeats (paravt_core/run_clock.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from paravt_core.run_clock import ClockError, ClockSummary, RunClock, clock_markdown, machine, read_clock

REPO = Path(__file__).resolve().parents[2]


class Clocks:
    """A monotonic and a wall clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1_796_000_000.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now


def test_beats_add_up_and_a_long_gap_is_left_out(tmp_path):
    clocks = Clocks()
    with RunClock(tmp_path, period_s=3600, monotonic=clocks.monotonic, wall=clocks.wall) as clock:
        for step in (30, 30, 4000, 30):  # the third gap: the process stopped for an hour
            clocks.now += step
            clock.beat()
        clocks.now += 10
    record = json.loads(clock.path.read_text())
    assert record["running_s"] == 30 + 30 + 4000 + 30 + 10 and record["left_out_s"] == 0  # a period of an hour
    assert record["status"] == "completed"

    clocks.now += 100_000
    with RunClock(tmp_path / "short", period_s=30, monotonic=clocks.monotonic, wall=clocks.wall) as clock:
        for step in (30, 30, 4000, 30):
            clocks.now += step
            clock.beat()
    record = json.loads(clock.path.read_text())
    assert (record["running_s"], record["left_out_s"]) == (90, 4000)


def test_a_job_timed_on_the_run_clock_leaves_a_stop_out(tmp_path):
    """The progress lines time their jobs on `running_now`: a build during which the process
    was stopped for an hour took its running time, not the hour."""
    from paravt_core.job_tally import JobTally

    clocks = Clocks()
    said: list[str] = []
    with RunClock(tmp_path, period_s=30, monotonic=clocks.monotonic, wall=clocks.wall) as clock:
        tally = JobTally(2, 1, said.append, clock=clock.running_now)

        def build() -> None:
            for step in (30, 30, 3600, 30):  # stopped for an hour after a minute
                clocks.now += step
                clock.beat()
            clocks.now += 20  # running since the last beat, not yet beaten
            assert clock.running_now() == 30 + 30 + 30 + 20

        tally.timed("sft0", build)()
    assert said == ["1 of 2 jobs done (sft0 took 1.8 min); about 1.8 min left (1 job, median job 1.8 min, 1 at a time)"]


def test_the_folder_sums_its_invocations_and_a_failed_one_counts(tmp_path):
    clocks = Clocks()
    with RunClock(tmp_path, period_s=30, monotonic=clocks.monotonic, wall=clocks.wall) as clock:
        clocks.now += 60
        clock.beat()
    first = clock.path
    clocks.now += 7200  # between invocations: not running, not counted anywhere
    with pytest.raises(RuntimeError, match="killed"):
        with RunClock(tmp_path, period_s=30, monotonic=clocks.monotonic, wall=clocks.wall) as clock:
            clocks.now += 45
            clock.beat()
            raise RuntimeError("killed")
    assert json.loads(clock.path.read_text())["status"] == "failed" and clock.path != first
    summary = read_clock(tmp_path)
    assert (summary.running_s, summary.left_out_s, summary.invocations) == (105, 0, 2)
    assert summary.first_start == "2026-11-30T00:53:20+00:00" and summary.last_beat == "2026-11-30T02:55:05+00:00"
    assert ClockSummary.from_json(summary.to_json(), "x") == summary
    assert read_clock(tmp_path / "none") is None


EPYC = "2 cores, AMD EPYC (AuthenticAMD family 23 model 1)"


def test_the_report_line_says_what_the_time_is_made_of():
    summary = ClockSummary(running_s=33840, left_out_s=600, invocations=5, hosts=("vm",),
                           first_start="2026-12-01T01:29:00+00:00", last_beat="2026-12-02T10:02:00+00:00",
                           machines=(EPYC,))
    line = clock_markdown(summary, "paravt reproduce")
    assert line.startswith("Running time: 9.4 h over 5 invocations of `paravt reproduce` with this config "
                           f"(2026-12-01T01:29:00+00:00 to 2026-12-02T10:02:00+00:00), on {EPYC}; from its")
    assert "10.0 min inside invocations is left out" in line
    assert "left out" not in clock_markdown(ClockSummary(60, 0, 1, ("a", "b"), "s", "e"), "c")
    assert "), on machines not recorded;" in clock_markdown(ClockSummary(60, 0, 1, ("vm",), "s", "e"), "c")


def test_the_machines_are_told_apart_by_kind_not_host_name(tmp_path):
    """Every session's VM here is called "vm": the records name the machine's kind, and a time
    put together on several kinds says so; a record from before the machine was recorded is
    counted and said."""
    clocks = Clocks()
    for on in (EPYC, EPYC, "16 cores, Intel Xeon (GenuineIntel family 6 model 143), NVIDIA H200 (CUDA 13.0, "
               "cuDNN 91002)", None):
        with RunClock(tmp_path, period_s=30, monotonic=clocks.monotonic, wall=clocks.wall, on=on) as clock:
            clocks.now += 60
        if on is None:  # as RunClock wrote it before it recorded the machine
            record = json.loads(clock.path.read_text())
            assert record.pop("machine") == machine()
            clock.path.write_text(json.dumps(record))
    summary = read_clock(tmp_path)
    assert (summary.invocations, len(summary.hosts), len(summary.machines), summary.unrecorded) == (4, 1, 2, 1)
    line = clock_markdown(summary, "c")
    assert "on 2 kinds of machine (16 cores, Intel Xeon" in line and f"; {EPYC}), so not one kind's time" in line
    assert "(1 invocation recorded no machine)" in line
    assert ClockSummary.from_json(summary.to_json(), "x") == summary
    older = json.loads(summary.to_json())  # a running_time.json from before the machines
    del older["machines"], older["unrecorded"]
    assert ClockSummary.from_json(json.dumps(older), "x").machines == ()


def test_this_machine_is_its_cores_and_cpu():
    from paravt_core.provenance import cpu_model

    assert machine().startswith(f"{os.cpu_count()} cores, {cpu_model()}")


def test_a_damaged_record_is_named(tmp_path):
    (tmp_path / "20261201T000000-vm-1.json").write_text("{")
    with pytest.raises(ClockError, match=r"20261201T000000-vm-1.json: not a run-clock record"):
        read_clock(tmp_path)
    with pytest.raises(ClockError, match=r"running_time.json: not a running-time summary"):
        ClockSummary.from_json('{"running_s": 1}', "running_time.json")


CHILD = """
import sys, time
from paravt_core.run_clock import RunClock
with RunClock(sys.argv[1], period_s=0.5) as clock:
    print(clock.path, flush=True)
    time.sleep(float(sys.argv[2]))
"""


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")
def test_a_real_stop_is_left_out_and_the_running_time_kept(tmp_path):
    """A process stopped by SIGSTOP for about 4 s, its heartbeat thread with it: the stop is
    left out (with at most a period of running before it), the rest counted."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), "7"], env=env, stdout=subprocess.PIPE,
                             text=True)
    path = Path(child.stdout.readline().strip())
    started = time.monotonic()
    time.sleep(1.5)
    child.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    time.sleep(4.0)
    child.send_signal(signal.SIGCONT)
    stop = time.monotonic() - stopped  # as long as this process's own sleep took
    assert child.wait(timeout=60) == 0
    whole = time.monotonic() - started
    record = json.loads(path.read_text())
    assert record["status"] == "completed"
    assert stop - 0.2 < record["left_out_s"] < stop + 0.5 + 0.5, (record, stop)  # period 0.5 s, and slack
    assert 1.0 < record["running_s"] < whole - stop + 0.2, (record, whole, stop)
