"""`make install-gpu` picks a Python that requirements-gpu.txt resolves for, or says what to install."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="no make on this machine")


def _install_gpu(path: str, *args: str) -> subprocess.CompletedProcess:
    # -B: remake even where a GPU venv is installed; the interpreter check is the recipe's first line.
    return subprocess.run([MAKE, "-s", "-B", "-C", str(REPO), "install-gpu", *args], capture_output=True, text=True,
                          env={**os.environ, "PATH": path}, timeout=120)


def _fake_python(folder: Path, name: str) -> Path:
    """An interpreter that is not 3.11 or 3.12: it fails the version check as Python 3.10 would."""
    folder.mkdir(exist_ok=True)
    fake = folder / name
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    return fake


def test_a_plain_python3_is_not_taken_and_the_message_says_what_to_install(tmp_path):
    # A PATH whose only Python is python3 (Ubuntu 22.04's is 3.10): the default takes none.
    _fake_python(tmp_path / "bin", "python3")
    venv_before = (REPO / ".venv-gpu").exists()
    done = _install_gpu(str(tmp_path / "bin"))
    assert done.returncode != 0
    assert "needs Python 3.11 or 3.12" in done.stdout and "GPU_PYTHON is ''" in done.stdout
    assert "python3.11-venv" in done.stdout
    assert (REPO / ".venv-gpu").exists() == venv_before


def test_a_given_interpreter_of_another_version_is_refused_before_any_venv(tmp_path):
    fake = _fake_python(tmp_path / "bin", "python3.10")
    done = _install_gpu(os.environ["PATH"], f"GPU_PYTHON={fake}")
    assert done.returncode != 0 and f"GPU_PYTHON is '{fake}'" in done.stdout
