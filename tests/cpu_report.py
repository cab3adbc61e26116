"""`pytest --cpu-report PATH`: the CPU seconds each test cost, its own and its children's.

On a shared machine wall times follow the neighbours; CPU time does not, so this is what a
speed-up of the suite is measured in (issue #45, docs/speed.md). Per test, the deltas of
`getrusage(RUSAGE_SELF)` (the test process, all its threads) and `getrusage(RUSAGE_CHILDREN)`
(every child process once it has been reaped, with its own reaped children, and the ranks this
process had forked by the fork server, paravt_core/forkserver.py) over setup, call and teardown. A child still running when the test ends (a session fixture's server) is counted
in the test during which it is reaped, and CPU outside any test (collection, imports) is a row
of its own. Under pytest-xdist each worker measures its tests and the controller writes the
table.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import pytest

_KEY = "cpu_report"


def _cpu() -> tuple[float, float]:
    """(this process's user + system CPU seconds, its reaped children's)."""
    from paravt_core.forkserver import forked_cpu_seconds

    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, children.ru_utime + children.ru_stime + forked_cpu_seconds()


class CpuReport:
    def __init__(self, path: Path, config: pytest.Config):
        self.path, self.config = path, config
        self.rows: dict[str, tuple[float, float, float]] = {}  # node id -> (self s, children s, wall s)
        self.started: dict[str, tuple[float, float, float]] = {}
        self.outside: dict[str, tuple[float, float]] = {}  # worker id -> CPU outside its tests

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> None:
        self.started[item.nodeid] = (*_cpu(), time.monotonic())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call):
        outcome = yield
        if call.when != "teardown" or item.nodeid not in self.started:
            return
        own0, children0, wall0 = self.started.pop(item.nodeid)
        own, children = _cpu()
        outcome.get_result().user_properties.append(
            (_KEY, (own - own0, children - children0, time.monotonic() - wall0)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for key, value in report.user_properties:
            if key == _KEY and report.when == "teardown":
                self.rows[report.nodeid] = tuple(value)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # A worker (or a run without xdist) reports the CPU its process spent outside tests:
        # the xdist controller gets it through workeroutput, a plain run keeps it here.
        own, children = _cpu()
        outside = (own - sum(r[0] for r in self.rows.values()), children - sum(r[1] for r in self.rows.values()))
        if hasattr(self.config, "workeroutput"):
            self.config.workeroutput[_KEY] = outside
            return
        if self.outside:  # the xdist controller: its children are the workers, counted already
            self.outside["controller"] = (own, 0.0)
        else:
            self.outside["main"] = outside
        self.write()

    @pytest.hookimpl(optionalhook=True)  # an xdist hook; the plugin works without xdist too
    def pytest_testnodedown(self, node, error) -> None:
        if _KEY in getattr(node, "workeroutput", {}):
            self.outside[node.gateway.id] = tuple(node.workeroutput[_KEY])

    def write(self) -> None:
        rows = sorted(self.rows.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
        lines = ["# CPU seconds per test (`pytest --cpu-report`): total = own process + reaped children",
                 f"{'total':>9} {'own':>9} {'children':>9} {'wall':>9}  test"]
        for nodeid, (own, children, wall) in rows:
            lines.append(f"{own + children:9.1f} {own:9.1f} {children:9.1f} {wall:9.1f}  {nodeid}")
        tests_cpu = sum(own + children for own, children, _ in self.rows.values())
        outside = sum(own + children for own, children in self.outside.values())
        lines.append(f"{tests_cpu:9.1f} {'':>9} {'':>9} {'':>9}  (all {len(rows)} tests)")
        lines.append(f"{outside:9.1f} {'':>9} {'':>9} {'':>9}  (outside tests: collection, imports, session fixtures"
                     f" reaped after the last test; pytest processes: {len(self.outside)})")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}.partial")
        partial.write_text("\n".join(lines) + "\n")
        os.replace(partial, self.path)  # a reader never sees half a table


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-report", metavar="PATH", default=None, type=Path,
                     help="write the CPU seconds each test cost (own process + reaped children) to PATH, "
                          "most expensive first")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--cpu-report", default=None)
    if path is not None:
        config.pluginmanager.register(CpuReport(Path(path).resolve(), config), "paravt-cpu-report")
