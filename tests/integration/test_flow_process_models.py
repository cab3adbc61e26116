"""#60 finding 1: the tasks that load a model (the SFT grammar check, an `hf` evaluation) do so
in a process of their own, never in the flow process, where PyTorch's caching allocator would
keep that GPU memory for the whole run beside the next stage (RL rank 0 on GPU 0)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def loads_no_model_here(monkeypatch, ledger: Path) -> None:
    """Any model this (the flow's) process loads fails the test; what a child loads is declared
    in `ledger`. Both go through these; a child process is not patched."""

    def loaded_here(*args, **kwargs):
        raise AssertionError("a model was loaded in the flow process")

    from paravt_core.device_ledger import LEDGER_ENV

    monkeypatch.setattr("paravt_core.model.loading.load_model", loaded_here)
    monkeypatch.setenv(LEDGER_ENV, str(ledger))


def test_the_grammar_task_loads_no_model_in_the_flow_process_and_its_claim_ends_with_its_process(
        prefect_harness, tiny_model_dir: Path, tmp_path: Path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from paravt_core.config import load_config
    from paravt_core.device_ledger import check_ledger, read_ledger
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

    ledger = tmp_path / "ledger.jsonl"
    loads_no_model_here(monkeypatch, ledger)
    out = sft_grammar(cfg, model, model, data)

    assert 0.0 <= out["grammar_rate_sft"] <= 1.0 and out["set_aside"] == []
    claims = read_ledger(ledger)
    assert [c.role for c in claims] == ["SFT grammar check"]  # one claim for both models, one after the other
    assert all(c.pid != os.getpid() and c.gpu == 0 and c.end is not None for c in claims)
    check_ledger(claims, gpu_bytes=80 * 10**9, flow_pid=os.getpid())


def test_the_hf_evaluation_task_loads_no_model_in_the_flow_process(prefect_harness, tiny_model_dir: Path,
                                                                   tmp_path: Path, monkeypatch):
    from paravt_core.config import load_config
    from paravt_core.device_ledger import check_ledger, read_ledger
    from paravt_core.eval.stage import results_dir
    from paravt_core.refs import ArtifactRef, content_hash
    from tasks.eval import eval_model
    from tests.conftest import write_mcq_split

    eval_dir = tmp_path / "eval"
    write_mcq_split(eval_dir, ["What is shown?"])
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", [
        f"run.output_dir={tmp_path / 'out'}", "eval.engine=hf", "eval.nframes=2", "video.nframes=2",
        "video.max_pixels=3072", "eval.max_new_tokens=8", "eval.max_turns=1", "mlflow.enabled=false"])
    model = ArtifactRef(kind="model", path=tiny_model_dir, sha256=content_hash(tiny_model_dir))
    eval_data = ArtifactRef(kind="eval_data", path=eval_dir, sha256=content_hash(eval_dir))
    ledger = tmp_path / "ledger.jsonl"
    loads_no_model_here(monkeypatch, ledger)
    report = eval_model(cfg, model, eval_data, "base", ("lvbench",))

    assert report.summaries["lvbench"]["n"] == 1 and report.results_dir == results_dir(cfg, model)
    (claim,) = read_ledger(ledger)
    assert claim.role == "evaluation (hf)" and claim.pid != os.getpid() and claim.end is not None
    check_ledger([claim], gpu_bytes=80 * 10**9, flow_pid=os.getpid())
