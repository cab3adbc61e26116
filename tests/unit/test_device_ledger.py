"""The device ledger (`paravt_core/device_ledger.py`): claims, their lifetimes and the rehearsal's assertion."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from paravt_core.config import load_config
from paravt_core.device_ledger import (
    LEDGER_ENV,
    PLANNED_GPU_BYTES_ENV,
    PLANNED_MODEL_ENV,
    Claim,
    LedgerError,
    check_ledger,
    overcommits,
    physical_gpu,
    read_ledger,
)
from paravt_core.plan import declare_stage, stage_bytes

REPO = Path(__file__).resolve().parents[2]
GB = 10**9
CARD = 80 * GB
FLOW = 1000


def _8b_claims_bytes() -> tuple[int, int]:
    cfg = load_config(REPO / "conf/pipeline/paravt_8b.yaml")
    base = "Qwen/Qwen3-VL-8B-Instruct"
    return stage_bytes(cfg, "SFT grammar check", base, CARD), stage_bytes(cfg, "RL policy pass", base, CARD)


def test_the_grammar_check_in_the_flow_process_fails_the_ledger_beside_rl_rank_0():
    """#60 finding 1 at the 8B plan's figures: the check's ~53 GB stays in the flow process for the
    whole run, and RL rank 0 then plans ~57 GB on the same card."""
    grammar, rl = _8b_claims_bytes()
    assert grammar > 50 * GB and rl > 50 * GB and grammar + rl > CARD
    today = [Claim("SFT grammar check", FLOW, 0, grammar, start=10.0),
             Claim("RL rank 0", 2001, 0, rl, start=20.0, end=30.0)]
    with pytest.raises(LedgerError) as err:
        check_ledger(today, CARD, flow_pid=FLOW)
    message = str(err.value)
    assert f"the flow process (pid {FLOW}) holds" in message and "run that stage in a process of its own" in message
    assert "GPU 0: SFT grammar check (pid 1000" in message and "RL rank 0 (pid 2001" in message
    # In a process of its own the check's claim ends with it, before RL starts.
    fixed = [Claim("SFT grammar check", 3001, 0, grammar, start=10.0, end=15.0), today[1]]
    check_ledger(fixed, CARD, flow_pid=FLOW)


def test_overcommit_needs_two_live_processes_on_one_card():
    alone = [Claim("evaluation server", 1, 0, 90 * GB, start=0.0)]  # one process: the plan's row says
    assert overcommits(alone, CARD) == []
    other_card = [Claim("a", 1, 0, 60 * GB, 0.0), Claim("b", 2, 1, 60 * GB, 0.0)]
    assert overcommits(other_card, CARD) == []
    killed = [Claim("a", 1, 0, 60 * GB, 0.0), Claim("b", 2, 0, 30 * GB, 5.0)]  # a never released: still there
    (line,) = overcommits(killed, CARD)
    assert line.startswith("GPU 0: a (pid 1, 60.0 GB) + b (pid 2, 30.0 GB) = 90.0 GB at once")
    assert overcommits([Claim("a", 1, 0, 40 * GB, 0.0), Claim("b", 2, 0, 40 * GB, 1.0)], CARD) == []


def test_a_declaring_process_writes_its_claim_and_closes_it_at_exit(tmp_path: Path):
    ledger = tmp_path / "ledger.jsonl"
    env = {**os.environ, LEDGER_ENV: str(ledger), "CUDA_VISIBLE_DEVICES": "5,6", "PYTHONPATH": str(REPO)}
    code = "from paravt_core.device_ledger import declare; declare('x', [1], 123)"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    (claim,) = read_ledger(ledger)
    assert (claim.role, claim.gpu, claim.planned_bytes) == ("x", 1, 123) and claim.end is not None
    assert physical_gpu(1, {"CUDA_VISIBLE_DEVICES": "5,6"}) == 6 and physical_gpu(0, {}) == 0


def test_without_a_ledger_nothing_is_planned_or_written(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(LEDGER_ENV, raising=False)
    declare_stage("SFT grammar check", "no such row", None, tmp_path / "no-model")  # would raise if it planned


def test_a_rehearsal_plans_the_real_model_on_the_real_card(tmp_path: Path, monkeypatch):
    """The tiny model stands in for model.base; the claims are the 8B run's."""
    cfg = load_config(REPO / "conf/pipeline/paravt_8b.yaml")
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(LEDGER_ENV, str(ledger))
    monkeypatch.setenv(PLANNED_MODEL_ENV, "Qwen/Qwen3-VL-8B-Instruct")
    monkeypatch.setenv(PLANNED_GPU_BYTES_ENV, str(CARD))
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    declare_stage("RL rank 3", "RL policy pass", cfg, tmp_path / "tiny")
    (claim,) = read_ledger(ledger)
    assert claim.gpu == 3 and claim.planned_bytes == _8b_claims_bytes()[1]
    with pytest.raises(LedgerError, match="has no row 'nothing'"):
        stage_bytes(cfg, "nothing", "Qwen/Qwen3-VL-8B-Instruct", CARD)


def test_a_claim_the_card_cannot_hold_fails_when_it_is_made_not_at_the_end(tmp_path: Path, monkeypatch):
    """The rehearsal fails at the stage that would run out of memory, naming what holds the card;
    a claim of a process that has ended (or was killed) no longer counts."""
    from paravt_core.device_ledger import declare, release

    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(PLANNED_GPU_BYTES_ENV, str(CARD))
    holder, rank0 = (subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2))
    try:
        declare("SFT grammar check", [0], 61 * GB, ledger, pid=holder.pid)
        with pytest.raises(LedgerError) as err:
            declare("RL rank 0", [0], 65 * GB, ledger, pid=rank0.pid)
        assert f"SFT grammar check (pid {holder.pid}, 61.0 GB) + RL rank 0 (pid {rank0.pid}" in str(err.value)
        assert "process of its own" in str(err.value)
        declare("RL rank 1", [1], 65 * GB, ledger)  # another card: room
    finally:
        for process in (holder, rank0):  # the failed rank ends (its claim with it), as the holder does
            process.kill()
            process.wait()
    declare("RL rank 0 (again)", [0], 65 * GB, ledger)  # the holder is gone, its memory with it
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        declare("evaluation server", [1], 70 * GB, ledger, pid=server.pid)
        raise AssertionError("two live claims of 65 and 70 GB on GPU 1 were accepted")
    except LedgerError:
        pass
    release(server.pid, ledger)  # a stopped server's claim ends at its release, while this process lives on
    server.kill()
    server.wait()
    ended = {c.role: c.end for c in read_ledger(ledger)}
    assert ended["evaluation server"] is not None and ended["RL rank 1"] is None


def test_a_rank_stopped_by_a_signal_has_its_claim_closed_by_its_launcher(tmp_path: Path, monkeypatch):
    """SIGTERM (how the launcher stops the other ranks when one fails) runs no atexit: the
    launcher closes each rank's claim when it reaps it, or a failed and retried stage would
    hold its card in the ledger for the rest of the run."""
    from paravt_core.dist.launch import launch_workers

    ledger = tmp_path / "ledger.jsonl"
    script = tmp_path / "rank.py"
    script.write_text("import os, signal\nfrom paravt_core.device_ledger import declare\n"
                      "declare('RL rank 0', [0], 1)\nos.kill(os.getpid(), signal.SIGTERM)\n")
    for key, value in {LEDGER_ENV: str(ledger), PLANNED_GPU_BYTES_ENV: str(CARD), "PYTHONPATH": str(REPO)}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(RuntimeError, match="killed by SIGTERM"):
        launch_workers(script, [], 1, log_line=lambda line: None)
    (claim,) = read_ledger(ledger)
    assert claim.role == "RL rank 0" and claim.end is not None


def test_a_servers_claim_ends_at_its_release_or_with_the_process_that_started_it(tmp_path: Path):
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text(
        '{"event": "hold", "role": "RL rollout server (vLLM)", "pid": 20, "gpu": 7, "planned_bytes": 5, "time": 1, "by": 10}\n'
        '{"event": "hold", "role": "evaluation server (vllm)", "pid": 30, "gpu": 0, "planned_bytes": 5, "time": 2, "by": 1}\n'
        '{"event": "release", "pid": 10, "time": 4}\n{"event": "release", "pid": 10, "time": 9}\n')
    rollout, evaluation = read_ledger(ledger)
    assert rollout.end == 4.0  # rank 0 (pid 10) ended; its server got SIGTERM with it; the first release counts
    assert evaluation.end is None  # the flow process (1) lives on, and the server was never released
