"""The fan-out's tally of ended jobs (paravt_core/job_tally.py): counts and the time left."""

from __future__ import annotations

import threading

import pytest

from paravt_core.job_tally import PACE_MIN_S, JobTally, duration, tally_line


def test_durations_read_in_the_unit_that_fits():
    assert [duration(s) for s in (42, 89.4, 210, 5339, 5400, 33840)] == [
        "42 s", "89 s", "3.5 min", "89.0 min", "1.5 h", "9.4 h"]


def test_the_time_left_is_the_jobs_left_at_the_median_job_over_those_at_once():
    line = tally_line("paragrpo-seed3", 2400.0, 10, 130, [1800.0, 2400.0, 3000.0], 2)
    assert line == ("10 of 130 jobs done (paragrpo-seed3 took 40.0 min); about 40.0 h left (120 jobs, "
                    "median job 40.0 min, 2 at a time)")
    # a work pool's (how many run at once is not ours to say), or nothing run yet: no estimate
    assert tally_line("a", 2400.0, 1, 3, [2400.0], None) == "1 of 3 jobs done (a took 40.0 min)"
    assert tally_line("a", 3.0, 1, 3, [], 2) == "1 of 3 jobs done (a took 3 s)"
    assert tally_line("c", 2400.0, 3, 3, [2400.0], 2) == "3 of 3 jobs done (c took 40.0 min)"


def test_jobs_that_end_in_seconds_do_not_set_the_pace():
    """A resumed run's finished jobs end in seconds: counted, but the rest are not promised at that speed."""
    now = [0.0]
    said: list[str] = []
    tally = JobTally(4, 2, said.append, clock=lambda: now[0])

    def job(seconds: float, value: str):
        def work() -> str:
            now[0] += seconds
            return value
        return work

    assert tally.timed("cached", job(2.0, "x"))() == "x"
    assert tally.timed("run1", job(1200.0, "y"))() == "y"
    assert said == ["1 of 4 jobs done (cached took 2 s)",
                    "2 of 4 jobs done (run1 took 20.0 min); about 20.0 min left (2 jobs, median job 20.0 min, 2 at a time)"]
    assert tally.worked == [1200.0] and PACE_MIN_S > 2.0


def test_a_job_that_raises_is_not_done():
    said: list[str] = []
    tally = JobTally(2, 1, said.append)

    def fails():
        raise RuntimeError("row failed")

    with pytest.raises(RuntimeError, match="row failed"):
        tally.timed("bad", fails)()
    assert tally.done == 0 and said == []


def test_jobs_ending_on_many_threads_are_each_counted_once():
    said: list[str] = []
    tally = JobTally(64, 8, said.append)
    threads = [threading.Thread(target=tally.timed(f"job{i}", lambda: None)) for i in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert tally.done == 64
    assert sorted(int(line.split(" of ")[0]) for line in said) == list(range(1, 65))
