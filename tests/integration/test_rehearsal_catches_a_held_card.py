"""#60 Done when: the rehearsal fails when the grammar check's memory stays in the flow process.

`paravt rehearse` of the 8B config, cut to one rank per stage, with the grammar check as it was
at 88dfe98 (run in the flow process): the check declares the 8B plan's grammar-check row
(~53 GB and the reserve) of GPU 0 for the flow process, and RL rank 0 then cannot have its own
claim beside it on the 80 GB card. The rehearsal stops there,
naming both, as the real run would have run out of memory hours in. (The composition as shipped
passes the same rehearsal end to end in the server tier: tests/server/test_rehearse_8b.py.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_the_rehearsal_fails_when_the_grammar_check_holds_gpu_0_in_the_flow_process(prefect_harness, tmp_path,
                                                                                     monkeypatch, capsys):
    from paravt_core.cli import main
    from paravt_core.sft import grammar

    def in_the_flow_process(cfg, base_dir, sft_dir, sft_rows_dir, eval_dir, work_dir, log_line=print, **_):
        return grammar.run(cfg, base_dir, sft_dir, sft_rows_dir, eval_dir)  # 88dfe98: no process of its own

    monkeypatch.setattr(grammar, "run_in_own_process", in_the_flow_process)
    out = tmp_path / "rehearsal"
    sets = [f"run.output_dir={out}", "sft.num_ranks=1", "sft.data_workers=0", "rl.num_ranks=1",
            "rl.prompts_per_step=1", "rl.rollout.engine=hf", "eval.engine=hf", "eval.splits=[videomme]",
            "eval.gpus=[]"]
    code = main(["rehearse", "--config", str(REPO / "conf/pipeline/paravt_8b.yaml"),
                 *(arg for value in sets for arg in ("--set", value))])
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert code == 1, output[-4000:]
    summary = json.loads((out / "rehearsal.json").read_text())
    assert summary["status"] == "failed" and summary["flow_pid"] == os.getpid()
    # The stage that could not have its memory names the flow process's claim beside it.
    assert f"SFT grammar check (pid {os.getpid()}" in summary["failure"], summary["failure"][-3000:]
    assert "RL rank 0" in summary["failure"] and "over the card's 80.0 GB" in summary["failure"]
    assert "FAILED after" in output and "device ledger (planned, Qwen/Qwen3-VL-8B-Instruct)" in output
    # RL never trained: it failed when its rank claimed the card, before a step.
    assert not list(out.glob("rl/*/checkpoints/step*"))
