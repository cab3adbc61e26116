"""`paravt run` with `eval.engine=openai` and no endpoint (issue #44 item 5), the server tier.

The tiny pipeline, shortened as in docs/hostile_inputs.md, evaluates base, SFT and RL each
on a real vLLM (CPU build, from the serve venv) that the evaluation starts on that
checkpoint, holds to it with the served-model check, and stops after its splits: three
checkpoints, three servers, three rows, and no server process left when `paravt run` ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.server

REPO = Path(__file__).resolve().parents[2]
SHORT = ["sft.max_steps=20", "sft.checkpoint_every=10", "rl.max_steps=2", "rl.checkpoint_every=1",
         "eval.max_samples_per_split=2", "eval.max_new_tokens=48", "rl.rollout.max_new_tokens=48",
         "rl.rollout.subagent_max_new_tokens=32", "eval.splits=[videomme,charades]"]


def marked_processes(mark: str) -> list[str]:
    """Command lines of the processes whose environment holds `mark` (what the run started)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if mark.encode() in (proc / "environ").read_bytes():
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


def test_paravt_run_serves_each_checkpoint_it_evaluates(serve_python, tmp_path):
    out, mark = tmp_path / "out", f"paravt-own-servers-{uuid.uuid4().hex}"
    sets = [f"run.output_dir={out}", *SHORT, "eval.engine=openai", "eval.server=vllm"]
    env = {**os.environ, "PARAVT_SERVE_PYTHON": serve_python, "PREFECT_HOME": str(tmp_path / "prefect"),
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "PARAVT_TEST_MARK": mark}
    for name in ("PARAVT_EVAL_ENDPOINT", "PARAVT_EVAL_MODEL_NAME"):
        env.pop(name, None)
    command = [sys.executable, "-m", "paravt_core.cli", "run", "--config", str(REPO / "conf/pipeline/tiny.yaml"),
               *(arg for value in sets for arg in ("--set", value))]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3600)
    output = done.stdout + done.stderr
    (tmp_path / "paravt-run.log").write_text(output)
    assert done.returncode == 0, output[-6000:]

    # Three checkpoints, three results folders, each evaluated by a server started on it.
    folders = sorted(p for p in (out / "eval").iterdir() if p.is_dir())
    assert len(folders) == 3, folders
    shas = {folder.name.split("-")[0] for folder in folders}
    assert len(shas) == 3
    for folder in folders:
        log = (folder / "server.log").read_text(errors="replace")
        assert f"paravt-tiny-{folder.name.split('-')[0]}" in log, f"{folder}: its server did not serve it"
        for split in ("videomme", "charades"):
            assert json.loads((folder / f"{split}.json").read_text())["summary"]["n"] == 2
    assert output.count("eval: starting a model server (vllm)") == 3, output[-6000:]  # its start is shown
    assert output.count("eval: stopped the model server") == 3
    table = output[output.index("seven-split evaluation:"):]
    assert all(f"\n{label} " in table or f"| {label} " in table for label in ("base", "sft")), table[:2000]

    left = marked_processes(mark)
    assert not left, f"processes of the run outlived it: {left}"
