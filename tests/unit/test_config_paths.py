"""The shipped configs are found from any working directory (the commands' defaults and the
flows' parameters name them relative to the project root)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from paravt_core.config import PROJECT_ROOT, ConfigError, config_file, load_config


def test_a_shipped_config_loads_from_another_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert config_file("conf/pipeline/tiny.yaml") == PROJECT_ROOT / "conf/pipeline/tiny.yaml"
    cfg = load_config("conf/pipeline/tiny.yaml", rl_row="conf/rl/vanilla_grpo.yaml")
    assert cfg.model.is_tiny


def test_a_file_in_the_working_directory_wins_over_the_project_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf" / "pipeline").mkdir(parents=True)
    mine = tmp_path / "conf" / "pipeline" / "tiny.yaml"
    mine.write_text((PROJECT_ROOT / "conf/pipeline/tiny.yaml").read_text())
    assert config_file("conf/pipeline/tiny.yaml") == Path("conf/pipeline/tiny.yaml")


def test_a_config_found_nowhere_names_both_places(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=f"no-such.yaml does not exist in {tmp_path} nor in the project"):
        load_config("no-such.yaml")


def test_the_flows_import_and_refuse_in_one_line_from_another_working_directory(tmp_path):
    # The flows' default parameters load conf/pipeline/tiny.yaml when their module is imported:
    # from another folder that was a pydantic traceback before any command ran.
    out = subprocess.run([sys.executable, "-c", "import flows.full_pipeline, flows.ablations; print('ok')"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "PYTHONPATH": str(PROJECT_ROOT)})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
