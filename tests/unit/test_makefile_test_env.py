"""`make test` and `make test-unit` run Python with bytecode writing on, whatever the environment says."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="no make on this machine")


@pytest.mark.parametrize("target", ["test", "test-unit"])
def test_the_test_targets_write_bytecode_under_pythondontwritebytecode(tmp_path: Path, target: str):
    """Each rank and CLI process the suite starts compiled the project's modules from source
    again where PYTHONDONTWRITEBYTECODE=1 (docs/speed.md, `make test`)."""
    # BIN's python: a real interpreter that prints whether it would write bytecode, instead of pytest.
    (tmp_path / "python").write_text(
        f'#!/bin/sh\nexec "{sys.executable}" -c "import sys; print(\'writes bytecode:\', '
        f'not sys.flags.dont_write_bytecode)"\n')
    (tmp_path / "python").chmod(0o755)
    # STAMP= : no install step before the recipe.
    done = subprocess.run([MAKE, "-s", "-C", str(REPO), target, "STAMP=", f"BIN={tmp_path}"], capture_output=True,
                          text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "writes bytecode: True"
