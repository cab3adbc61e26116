"""What `paravt run` / `paravt reproduce` set in Prefect's settings before importing it (flows/cli.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
READ = ("from flows import cli; cli._prefect_environment(); "
        "from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS as t, "
        "PREFECT_CLIENT_MAX_RETRIES as r; print(t.value(), r.value())")


def _read(tmp_path: Path, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    clean.update(PREFECT_HOME=str(tmp_path / "home"), PYTHONPATH=str(REPO), **env)
    out = subprocess.run([sys.executable, "-c", READ], cwd=tmp_path, env=clean, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


def test_the_temporary_server_gets_minutes_to_start_and_the_client_two_retries(tmp_path):
    # Prefect's own 20 s start-up limit killed `paravt reproduce` before its first stage on a busy machine
    assert _read(tmp_path) == ["180", "2"]


def test_the_environment_still_decides(tmp_path):
    assert _read(tmp_path, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="7", PREFECT_CLIENT_MAX_RETRIES="4") == \
        ["7", "4"]
