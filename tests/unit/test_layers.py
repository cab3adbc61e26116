"""The import layers of pyproject.toml's `[tool.importlinter]` hold (`lint-imports`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _lint_imports() -> list[str]:
    found = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert found, "lint-imports is not installed (import-linter is a dependency in pyproject.toml: make install)"
    return [found]


def test_the_layer_contracts_hold():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    done = subprocess.run([*_lint_imports(), "--no-cache"], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout and "4 kept" in done.stdout


MINIATURE = "from paravt_core.miniature import pretrain"


@pytest.mark.parametrize("module, line, expected", [
    ("paravt_core/sft/encode.py", MINIATURE, "paravt_core.sft.encode -> paravt_core.miniature.pretrain"),
    # The full pipeline's SFT task, as it was before the miniature plugged in through `extra=`.
    ("tasks/sft.py", MINIATURE, "tasks.sft -> paravt_core.miniature.pretrain"),
    # The registry below the evaluation: `paravt report` once lived in registry/ and imported eval/.
    ("paravt_core/registry/__init__.py", "from paravt_core.eval import report",
     "paravt_core.registry -> paravt_core.eval.report"),
    # The typed config below the model: the tiny model's spec once lived in model/tiny.py.
    ("paravt_core/config.py", "from paravt_core.model import tiny", "paravt_core.config -> paravt_core.model.tiny"),
])
def test_an_upward_import_breaks_a_contract(tmp_path: Path, module: str, line: str, expected: str):
    """The control: the same check on a copy of the library with one upward import fails, naming it."""
    for name in ("paravt_core", "flows", "tasks"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    importer = tmp_path / module
    importer.write_text(importer.read_text() + f"\n{line}  # noqa: E402,F401\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    done = subprocess.run([*_lint_imports(), "--no-cache"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode != 0
    assert expected in done.stdout
