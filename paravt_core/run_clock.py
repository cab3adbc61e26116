"""How long a command has run, summed over its invocations, from its own heartbeats.

A long reproduction is resumed: stopped (a session ends, a machine goes back), started again,
each stage going on from its cache or checkpoint. Its wall time from first start to report is
then not its running time, and a figure put together by hand from logs is not the command's own.
`RunClock` keeps one record per invocation in a folder: a heartbeat thread adds the time since its
last beat every `PERIOD_S`, unless more than `GAP_S` went by (the process was stopped, SIGSTOP
or a suspended machine), which it counts apart as left out, with up to a period of running
before the stop. An invocation killed outright keeps what its last beat wrote: at most one
period is lost. Each record names the machine it ran on (`machine`: cores, CPU, and the card
where stages train on one), since a running time is one kind of machine's. `read_clock` sums the
folder.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from paravt_core import provenance
from paravt_core.atomic import atomic_write_text
from paravt_core.job_tally import duration

PERIOD_S = 30.0
GAPS = 3  # a beat more than this many periods late: the process did not run in between
GAP_S = GAPS * PERIOD_S


class ClockError(ValueError):
    """A clock record that cannot be read, naming the file."""


@dataclass(frozen=True)
class ClockSummary:
    """What the invocations recorded in one clock folder add up to."""

    running_s: float  # summed heartbeat time of every invocation
    left_out_s: float  # time inside invocations between beats more than GAP_S apart
    invocations: int
    hosts: tuple[str, ...]  # host names (a fresh VM is often named as the last one was)
    first_start: str  # UTC, ISO 8601
    last_beat: str
    machines: tuple[str, ...] = ()  # the kinds of machine the invocations ran on (`machine`)
    unrecorded: int = 0  # invocations whose record names no machine (written before it did)
    parts: int = 1  # the clock folders summed: one per part of a profile run in parts (`combined`)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str, where: str) -> ClockSummary:
        try:
            data = json.loads(text)
            return cls(**{**data, "hosts": tuple(data["hosts"]), "machines": tuple(data.get("machines", ()))})
        except (ValueError, TypeError, KeyError) as error:
            raise ClockError(f"{where}: not a running-time summary ({error}); remove it or write the report "
                             "again with `paravt reproduce`") from None


def combined(summaries: list[ClockSummary]) -> ClockSummary:
    """One summary of a profile run in parts (each a set of its SFT builds with a clock folder
    of its own, merged by `paravt miniature report --from A --from B`): the parts' times added."""
    if not summaries:
        raise ValueError("combined: no running time to add up")
    return ClockSummary(running_s=sum(s.running_s for s in summaries), left_out_s=sum(s.left_out_s for s in summaries),
                        invocations=sum(s.invocations for s in summaries),
                        hosts=tuple(sorted({h for s in summaries for h in s.hosts})),
                        first_start=min(s.first_start for s in summaries),
                        last_beat=max(s.last_beat for s in summaries),
                        machines=tuple(sorted({m for s in summaries for m in s.machines})),
                        unrecorded=sum(s.unrecorded for s in summaries), parts=sum(s.parts for s in summaries))


def machine() -> str:
    """The kind of machine this invocation runs on, as far as it sets the running time: its
    cores and CPU (`provenance.cpu_model`) and, where the stages train on a card
    (`provenance.training_device`), the card, e.g. "2 cores, AMD EPYC (AuthenticAMD family 23
    model 1)"."""
    device = provenance.training_device()
    card = f", {provenance.accelerator_model(device)}" if device.startswith("cuda") else ""
    return f"{os.cpu_count()} cores, {provenance.cpu_model()}{card}"


def _utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")


class RunClock:
    """The record of this invocation in `folder`, kept while the `with` block runs."""

    def __init__(self, folder: Path, period_s: float = PERIOD_S, monotonic=time.monotonic, wall=time.time,
                 on: str | None = None):
        self.folder, self.period_s, self.monotonic, self.wall = Path(folder), period_s, monotonic, wall
        self.on = on  # the machine (`machine()` where None)
        self.gap_s = GAPS * period_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> RunClock:
        started = self.wall()
        host = socket.gethostname()
        stamp = datetime.fromtimestamp(started, timezone.utc).strftime("%Y%m%dT%H%M%S")
        self.path = self.folder / f"{stamp}-{host}-{os.getpid()}.json"
        self.record = {"host": host, "machine": self.on or machine(), "pid": os.getpid(), "started": _utc(started),
                       "last_beat": _utc(started),
                       "running_s": 0.0, "left_out_s": 0.0, "status": "running"}
        self._last = self.monotonic()
        self._write()
        self._thread = threading.Thread(target=self._beat_until_stopped, name="run-clock", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind, error, trace) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.beat(status="failed" if kind else "completed")

    def _beat_until_stopped(self) -> None:
        while not self._stop.wait(self.period_s):
            self.beat()

    def beat(self, status: str | None = None) -> None:
        """Add the time since the last beat (or count it left out, where more than three periods
        went by) and write the record; `status` says the invocation ended, and how."""
        with self._lock:
            now = self.monotonic()
            since, self._last = now - self._last, now
            key = "running_s" if since <= self.gap_s else "left_out_s"
            self.record[key] += since
            self.record["last_beat"] = _utc(self.wall())
            if status:
                self.record["status"] = status
            self._write()

    def running_now(self) -> float:
        """This invocation's running time so far, stops left out: a clock for timing its jobs
        (`job_tally.JobTally`) that does not count a stop as work. Time since the last beat
        counts once the beat is due within the gap; a longer one is the stop's."""
        with self._lock:
            since = self.monotonic() - self._last
            return self.record["running_s"] + (since if since <= self.gap_s else 0.0)

    def _write(self) -> None:
        atomic_write_text(self.path, json.dumps(self.record, indent=1))


def read_clock(folder: Path) -> ClockSummary | None:
    """The sum of the invocation records in `folder`; None where there are none.

    Raises:
        ClockError: a record is not what `RunClock` writes (naming the file).
    """
    records = []
    for path in sorted(Path(folder).glob("*.json")) if Path(folder).is_dir() else []:
        try:
            record = json.loads(path.read_text())
            records.append((float(record["running_s"]), float(record["left_out_s"]), str(record["host"]),
                            str(record["started"]), str(record["last_beat"]), record.get("machine")))
        except (OSError, ValueError, TypeError, KeyError) as error:
            raise ClockError(f"{path}: not a run-clock record ({error}); remove it (that invocation's time is "
                             "then not counted)") from None
    if not records:
        return None
    return ClockSummary(running_s=sum(r[0] for r in records), left_out_s=sum(r[1] for r in records),
                        invocations=len(records), hosts=tuple(sorted({r[2] for r in records})),
                        first_start=min(r[3] for r in records), last_beat=max(r[4] for r in records),
                        machines=tuple(sorted({str(r[5]) for r in records if r[5]})),
                        unrecorded=sum(not r[5] for r in records))


def clock_markdown(summary: ClockSummary, command: str) -> str:
    """One line for a report: the running time and what it is made of."""
    kinds = len(summary.machines)
    on = ("on machines not recorded" if not kinds else f"on {summary.machines[0]}" if kinds == 1 else
          f"on {kinds} kinds of machine ({'; '.join(summary.machines)}), so not one kind's time")
    if kinds and summary.unrecorded:
        on += f" ({summary.unrecorded} invocation{'s' * (summary.unrecorded != 1)} recorded no machine)"
    config = ("with this config" if summary.parts == 1 else
              f"in {summary.parts} parts (sets of SFT builds, each with a config and clock of its own), added up")
    line = (f"Running time: {duration(summary.running_s)} over {summary.invocations} "
            f"invocation{'s' * (summary.invocations != 1)} of `{command}` {config} "
            f"({summary.first_start} to {summary.last_beat}), {on}; from its heartbeats, stages found in an "
            "earlier command's cache taking only the time to find them.")
    if summary.parts > 1:
        line += (" A part started on a machine without another part's cache built the world and pretraining "
                 "again, which this sum then counts once per such part.")
    if summary.left_out_s:
        line += (f" {duration(summary.left_out_s)} inside invocations is left out: the process did not run "
                 f"(stopped or suspended) for more than {GAP_S:.0f} s at a time.")
    return line
