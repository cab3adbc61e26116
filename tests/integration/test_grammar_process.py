"""#60 finding 1: the SFT grammar check loads its models in a process of its own, never in the
flow process, where PyTorch's caching allocator would keep that GPU memory beside RL rank 0."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_the_grammar_task_loads_no_model_in_the_flow_process_and_its_claim_ends_with_its_process(
        prefect_harness, tiny_model_dir: Path, tmp_path: Path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from paravt_core.config import load_config
    from paravt_core.device_ledger import LEDGER_ENV, check_ledger, read_ledger
    from paravt_core.refs import ArtifactRef, content_hash
    from tasks.sft import sft_grammar
    from tests.conftest import write_mcq_split

    eval_dir = tmp_path / "eval"
    write_mcq_split(eval_dir, ["What is shown?", "What happens next?"])
    rows_dir = tmp_path / "rows"
    rows_dir.mkdir()
    messages = [{"role": "system", "content": "SYSTEM"}, {"role": "user", "content": "q"},
                {"role": "assistant", "content": "<think>x</think><answer>A</answer>"}]
    pq.write_table(pa.table({"messages": [json.dumps(messages)]}), rows_dir / "rows.parquet")
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", [
        f"run.output_dir={tmp_path / 'out'}", "video.nframes=2", "video.max_pixels=3072",
        "rl.rollout.max_new_tokens=8", "rl.rollout.max_turns=1", "mlflow.enabled=false"])
    model = ArtifactRef(kind="model", path=tiny_model_dir, sha256=content_hash(tiny_model_dir))
    data = SimpleNamespace(sft=ArtifactRef(kind="sft_data", path=rows_dir, sha256="r" * 64),
                           eval=ArtifactRef(kind="eval_data", path=eval_dir, sha256=content_hash(eval_dir)))

    def loaded_here(*args, **kwargs):
        raise AssertionError("the grammar check loaded a model in the flow process")

    # What this process loads goes through these; the check's own process is not patched.
    monkeypatch.setattr("paravt_core.model.loading.load_model", loaded_here)
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(LEDGER_ENV, str(ledger))
    out = sft_grammar(cfg, model, model, data)

    assert 0.0 <= out["grammar_rate_sft"] <= 1.0 and out["set_aside"] == []
    claims = read_ledger(ledger)
    assert [c.role for c in claims] == ["SFT grammar check", "SFT grammar check"]  # base, then SFT model
    assert {c.pid for c in claims} != {os.getpid()} and all(c.gpu == 0 and c.end is not None for c in claims)
    check_ledger(claims, gpu_bytes=80 * 10**9, flow_pid=os.getpid())
