"""Imports of the project's own modules sit at the top of their file (issue #63 item 3), and the
light entry points stay light.

An import inside a function carries its reason: `# lazy: ...` on the import's line or the line
above it, or one column-0 `# lazy: ...` comment in the module for all of its imports (a measured
import cost, a cycle, an optional dependency).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OWN = ("paravt_core", "flows", "tasks")
# Files whose bytes are part of a cache key (`refs.source_digest`: the synthetic world, the tiny
# model's builder, the miniature's pretraining rows and trainer, the data stage, the prompt
# wording): an edit, even one moving an import, gives their finished results new folders and
# runs them again. Their imports stay where they are until one of them changes for its own sake.
CACHE_KEYED = (
    "paravt_core/data/synth/", "paravt_core/data/stage.py", "paravt_core/model/tiny.py",
    "paravt_core/miniature/pretrain.py", "paravt_core/sft/dataset.py", "paravt_core/sft/encode.py",
    "paravt_core/sft/loader.py", "paravt_core/sft/loss.py", "paravt_core/sft/worker.py",
    "paravt_core/eval/splits.py", "paravt_core/eval/prompting.py", "paravt_core/eval/samples.py",
    "paravt_core/agent/prompts.py", "paravt_core/agent/media.py",
)
# Loaded by every `paravt` call or by a command's input checks, and never needed there.
HEAVY = ("torch", "transformers", "deepspeed", "mlflow", "prefect", "av")


def _own(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return bool(node.level) or (node.module or "").split(".")[0] in OWN
    return any(alias.name.split(".")[0] in OWN for alias in node.names)


def unexplained_imports(root: Path) -> list[str]:
    """`path:line` of each in-function import of the project's own modules without a reason."""
    found = []
    files = sorted([*root.glob("paravt_core/**/*.py"), *root.glob("flows/*.py"), *root.glob("tasks/*.py")])
    for path in files:
        rel = path.relative_to(root).as_posix()
        if rel.startswith(CACHE_KEYED):
            continue
        source = path.read_text()
        lines = source.splitlines()
        if any(line.startswith("# lazy:") for line in lines):
            continue

        def visit(node: ast.AST, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if in_function and isinstance(child, (ast.Import, ast.ImportFrom)) and _own(child):
                    above = lines[child.lineno - 2].strip() if child.lineno > 1 else ""
                    own_lines = lines[child.lineno - 1:child.end_lineno]
                    if not (above.startswith("# lazy:") or any("# lazy:" in line for line in own_lines)):
                        found.append(f"{rel}:{child.lineno}: {lines[child.lineno - 1].strip()}")
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        visit(ast.parse(source), False)
    return found


def test_the_projects_imports_are_at_the_top_or_say_why_not():
    assert unexplained_imports(REPO) == []


def test_the_cache_keyed_files_exist():
    for entry in CACHE_KEYED:
        assert (REPO / entry).exists(), f"{entry} is gone: drop it from CACHE_KEYED"


@pytest.mark.parametrize("source, flagged", [
    ("def f():\n    from paravt_core.config import load_config\n", True),
    ("def f():\n    from . import refs\n", True),
    ("def f():\n    import torch\n", False),  # third-party: not this check's business
    ("def f():\n    from paravt_core.config import load_config  # lazy: cycle config -> x -> config\n", False),
    ("def f():\n    # lazy: cycle config -> x -> config\n    from paravt_core.config import load_config\n", False),
    ("# lazy: the stage modules load torch\n\ndef f():\n    from paravt_core.config import load_config\n", False),
    ("from paravt_core.config import load_config\n", False),
])
def test_an_in_function_import_without_a_reason_is_found(tmp_path: Path, source: str, flagged: bool):
    """The control: a planted import inside a function, with and without its reason."""
    module = tmp_path / "paravt_core" / "planted.py"
    module.parent.mkdir()
    module.write_text(source)
    assert unexplained_imports(tmp_path) == (["paravt_core/planted.py:2: " + source.splitlines()[1].strip()]
                                             if flagged else [])


def _loaded_after(code: str) -> list[str]:
    """The HEAVY libraries a fresh interpreter holds after running `code` from the repository."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    probe = f"import sys\n{code}\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return eval(done.stdout.strip().splitlines()[-1])  # a printed list of names


def test_paravt_help_loads_no_model_or_workflow_library():
    assert _loaded_after("import paravt_core.cli as cli\ncli.build_parser()") == []


@pytest.mark.parametrize("argv", [
    ["plan", "--gpus", "8", "--gpu-memory-gib", "79"],
    ["preflight"],
    ["eval", "serve", "--model", "base"],
    ["miniature", "reading-probe", "--model", "nowhere"],
    ["miniature", "perception", "--model", "nowhere"],
])
def test_a_config_error_is_reported_before_any_model_library_loads(tmp_path: Path, argv: list[str]):
    bad = tmp_path / "bad.yaml"
    bad.write_text("run:\n  no_such_key: 1\n")
    code = (f"from paravt_core.cli import main\nassert main({argv!r} + ['--config', {str(bad)!r}]) == 2")
    assert _loaded_after(code) == []


# Imported by `paravt plan` / `preflight` / `eval serve`, and by `paravt miniature` before its input
# checks; each keeps its torch imports in the functions that run a model.
LIGHT_MODULES = ("paravt_core.plan", "paravt_core.preflight", "paravt_core.eval.served", "paravt_core.rl.cli",
                 "paravt_core.miniature.agent_probe", "paravt_core.miniature.branch_probe",
                 "paravt_core.miniature.caption_probe", "paravt_core.miniature.heldout_probe",
                 "paravt_core.miniature.opening_probe", "paravt_core.miniature.perception",
                 "paravt_core.miniature.reading_probe", "paravt_core.miniature.rollout_probe",
                 "paravt_core.miniature.advantage_split")


def test_the_light_modules_load_no_model_library():
    assert _loaded_after("\n".join(f"import {name}" for name in LIGHT_MODULES)) == []
