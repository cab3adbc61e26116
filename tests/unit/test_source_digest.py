"""Builder-code digests: a change to the code that builds an output renames its folder."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from paravt_core.refs import source_digest


def test_digest_follows_the_package_source(tmp_path, monkeypatch):
    package = tmp_path / "builderpkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "build.py").write_text("SIZE = 1\n")
    (package / "notes.txt").write_text("not code")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    first = source_digest("builderpkg")
    assert len(first) == 16 and source_digest("builderpkg") == first
    (package / "notes.txt").write_text("still not code")
    assert source_digest("builderpkg") == first
    only = source_digest("builderpkg", only=("sub/build.py",))
    (package / "__init__.py").write_text("# not the builder\n")
    assert source_digest("builderpkg", only=("sub/build.py",)) == only != source_digest("builderpkg")
    (package / "sub" / "build.py").write_text("SIZE = 2\n")
    assert source_digest("builderpkg") != first and source_digest("builderpkg", only=("sub/build.py",)) != only
    sys.modules.pop("builderpkg", None)


def test_unknown_package_is_named():
    with pytest.raises(ModuleNotFoundError, match="no_such_builder"):
        source_digest("no_such_builder")


def test_tiny_model_and_world_folders_carry_the_builder_digest(tmp_path):
    from paravt_core.config import load_config
    from paravt_core.data.mirror import world_dir as synth_world_dir
    from paravt_core.model.stage import base_model_dir

    cfg = load_config(Path(__file__).resolve().parents[2] / "conf/pipeline/tiny.yaml", [f"run.output_dir={tmp_path}"])
    from paravt_core.model.stage import BUILDER_FILES

    assert base_model_dir(cfg).name.endswith(source_digest("paravt_core.model", only=BUILDER_FILES))
    assert synth_world_dir(cfg).parent == tmp_path / "data"
