"""`pytest --cpu-report PATH` (tests/cpu_report.py): each test's CPU, its own and its children's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Two tests of known cost: one burns CPU in the pytest process, one in a child it waits for.
SUITE = '''
import subprocess, sys, time

def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass

def test_own():
    burn(0.6)

def test_child():
    burner = "import time\\nend = time.process_time() + 0.8\\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", burner], check=True)

def test_idle():
    time.sleep(0.3)
'''


def rows(report: Path) -> dict[str, tuple[float, float, float, float]]:
    out = {}
    for line in report.read_text().splitlines():
        fields = line.split()
        if "::" in line and not line.startswith("#"):
            out[fields[-1].split("::")[-1]] = tuple(float(f) for f in fields[:4])
    return out


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["plain", "xdist"])
def test_each_test_gets_its_own_and_its_childrens_cpu(tmp_path: Path, xdist: list[str]):
    (tmp_path / "test_costs.py").write_text(SUITE)
    report = tmp_path / "out" / "cpu.txt"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # The plugin as `make test` loads it: through tests/conftest.py's option, here with `-p`.
    result = subprocess.run([sys.executable, "-m", "pytest", str(tmp_path / "test_costs.py"), "-q", "-p",
                             "tests.cpu_report", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                             "--cpu-report", str(report), *(xdist or ["-p", "no:xdist"])],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    got = rows(report)
    assert set(got) == {"test_own", "test_child", "test_idle"}
    total, own, children, wall = got["test_own"]
    assert own >= 0.55 and children < 0.2 and total == pytest.approx(own + children, abs=0.11)
    total, own, children, wall = got["test_child"]
    assert children >= 0.75 and own < 0.5
    total, own, children, wall = got["test_idle"]
    assert total < 0.2 and wall >= 0.3
    assert list(got) == ["test_child", "test_own", "test_idle"]  # most expensive first
    assert "(outside tests" in report.read_text()
    assert not [p for p in report.parent.iterdir() if p != report]  # written whole, nothing left beside it
