"""`make rehearse-8b` (#60 Build item 1), the server tier: `paravt rehearse` runs paravt_8b.yaml's
own pipeline on this CPU, every process where the real run puts it, the tiny model and small
sizes in place of the 8B model and the real ones.

It holds the composition: 8 SFT ranks and 7 RL ranks (placed by CUDA_VISIBLE_DEVICES and
LOCAL_RANK), the vLLM rollout server on "GPU 7" with the weight push, the grammar check in its
own process, `keep_last` pruning, each checkpoint served for the evaluation through vLLM's
data-parallel launch, registration and promotion; and the device ledger, where every process
that would hold a card declared the 8B memory plan's bytes and no card was over-committed. No
process of the run outlives it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from test_pipeline_own_servers import marked_processes

pytestmark = pytest.mark.server
REPO = Path(__file__).resolve().parents[2]


def test_the_8b_config_rehearses_end_to_end_on_cpu(serve_python, tmp_path):
    from paravt_core.config import load_config
    from paravt_core.device_ledger import read_ledger

    out, mark = tmp_path / "rehearsal", f"paravt-rehearsal-{uuid.uuid4().hex}"
    env = {**os.environ, "PARAVT_SERVE_PYTHON": serve_python, "PREFECT_HOME": str(tmp_path / "prefect"),
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "PARAVT_TEST_MARK": mark}
    for name in ("PARAVT_EVAL_ENDPOINT", "PARAVT_EVAL_MODEL_NAME"):
        env.pop(name, None)
    command = [sys.executable, "-m", "paravt_core.cli", "rehearse", "--config",
               str(REPO / "conf/pipeline/paravt_8b.yaml"), "--set", f"run.output_dir={out}"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3600)
    output = done.stdout + done.stderr
    (tmp_path / "paravt-rehearse.log").write_text(output)
    assert done.returncode == 0, output[-8000:]
    summary = json.loads((out / "rehearsal.json").read_text())
    assert summary["status"] == "passed" and summary["planned_model"] == "Qwen/Qwen3-VL-8B-Instruct"
    assert "eval.gpus" in {c["key"] for c in summary["changes"]}  # the lowered count is said
    assert "eval.gpus  " in output and "passed in" in output

    # Every process where the 8B config puts it, each card within the plan.
    claims = read_ledger(out / "device_ledger.jsonl")
    by_role = {c.role: c for c in claims}
    assert {f"SFT rank {r}" for r in range(8)} | {f"RL rank {r}" for r in range(7)} <= set(by_role)
    assert [by_role[f"SFT rank {r}"].gpu for r in range(8)] == list(range(8))
    assert [by_role[f"RL rank {r}"].gpu for r in range(7)] == list(range(7))
    assert by_role["RL rollout server (vLLM)"].gpu == 7 and by_role["SFT grammar check"].gpu == 0
    assert by_role["SFT grammar check"].pid != summary["flow_pid"]
    servers = [c for c in claims if c.role.startswith("evaluation server")]
    assert sorted({c.gpu for c in servers}) == [0, 1] and len({c.pid for c in servers}) == 3  # base, SFT, RL
    assert all(c.end is not None for c in claims), [c for c in claims if c.end is None]
    # Retention: a checkpoint every step, the newest keep_last kept.
    cfg = load_config(REPO / "conf/pipeline/paravt_8b.yaml")
    for stage, keep in (("sft", cfg.sft.keep_last), ("rl", cfg.rl.keep_last)):
        steps = sorted(p.name for p in out.glob(f"{stage}/*/checkpoints/step*"))
        assert len(steps) == keep, (stage, steps)
    # Each checkpoint served with vLLM's data-parallel launch on its two "GPUs".
    folders = sorted(p for p in (out / "eval").iterdir() if p.is_dir())
    assert len(folders) == 3
    for folder in folders:
        log = (folder / "server.log").read_text(errors="replace")
        assert "'data_parallel_size': 2" in log and "Started 2 API server processes" in log, folder
    assert output.count("eval: stopped the model server") == 3
    assert "registered paravt-8b v1 (sft) and v2 (rl, candidate)" in output and "champion" in output
    assert not marked_processes(mark), "processes of the rehearsal outlived it"
