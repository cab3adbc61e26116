"""DeepSpeed's run-time ops are built in the rank's own venv (`dist.rank.own_extensions_dir`)."""

from __future__ import annotations

import sys
from pathlib import Path

from paravt_core.dist import rank


def test_a_venv_keeps_its_own_ops_and_a_set_folder_is_kept(monkeypatch, tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    monkeypatch.delenv(rank.EXTENSIONS_ENV, raising=False)
    monkeypatch.setattr(sys, "prefix", str(venv))
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    rank.own_extensions_dir()
    assert Path(rank.os.environ[rank.EXTENSIONS_ENV]) == venv / "torch_extensions"

    monkeypatch.setenv(rank.EXTENSIONS_ENV, str(tmp_path / "mine"))
    rank.own_extensions_dir()
    assert rank.os.environ[rank.EXTENSIONS_ENV] == str(tmp_path / "mine")


def test_outside_a_venv_or_read_only_torch_keeps_its_folder(monkeypatch, tmp_path):
    monkeypatch.delenv(rank.EXTENSIONS_ENV, raising=False)
    monkeypatch.setattr(sys, "prefix", "/usr")
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    rank.own_extensions_dir()
    assert rank.EXTENSIONS_ENV not in rank.os.environ

    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setattr(sys, "prefix", str(locked))
    monkeypatch.setattr(rank.os, "access", lambda path, mode: False)
    rank.own_extensions_dir()
    assert rank.EXTENSIONS_ENV not in rank.os.environ
