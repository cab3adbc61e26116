"""How far a long batch of jobs is: how many have ended, and about how long the rest will take.

The conclusive reproduction fans out 120-odd jobs (RL runs, SFT measurements) over a day on a
2-core host; its per-stage lines (steps, steps/s, ETA) say how one job goes, not the whole.
`JobTally` counts the jobs as they end, in any order and from any thread, and gives one line per
job for the flow's log (flows/fanout.py).

A job that ends within `PACE_MIN_S` counts as done but not toward the pace: a resumed run's
finished folders and cached evaluations answer in seconds, and would otherwise promise the rest
at the speed of a cache lookup. Where no job has run that long yet, no time left is given.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

PACE_MIN_S = 60.0  # shorter than any RL run or evaluation of the default miniature (minutes each)


def duration(seconds: float) -> str:
    """"42 s", "3.5 min" or "9.4 h"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def tally_line(label: str, seconds: float, done: int, total: int, worked: list[float],
               at_once: int | None) -> str:
    """The line for the job `label` that just ended after `seconds`: `done` of `total` ended so
    far, `worked` the durations of those that set the pace (at least `PACE_MIN_S`, this one
    included where it is), `at_once` how many run side by side (None where they run elsewhere,
    a work pool, and the time left is not estimated)."""
    line = f"{done} of {total} jobs done ({label} took {duration(seconds)})"
    left = total - done
    if left and worked and at_once:
        typical = statistics.median(worked)
        line += (f"; about {duration(left * typical / at_once)} left ({left} job{'s' * (left != 1)}, median job "
                 f"{duration(typical)}, {at_once} at a time)")
    return line


class JobTally:
    """Counts jobs as they end and hands each end's line to `say` (thread-safe)."""

    def __init__(self, total: int, at_once: int | None, say: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.at_once, self.say, self.clock = total, at_once, say, clock
        self.done = 0
        self.worked: list[float] = []
        self._lock = threading.Lock()

    def timed(self, label: str, work: Callable[[], T]) -> Callable[[], T]:
        """`work`, counted here when it returns (a job that raises is not done)."""
        def job() -> T:
            start = self.clock()
            result = work()
            self.ended(label, self.clock() - start)
            return result
        return job

    def ended(self, label: str, seconds: float) -> None:
        with self._lock:
            self.done += 1
            if seconds >= PACE_MIN_S:
                self.worked.append(seconds)
            line = tally_line(label, seconds, self.done, self.total, self.worked, self.at_once)
        self.say(line)
