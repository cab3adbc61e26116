"""bench/shape_8b.py (issue #47 item 1) runs every case's code at the tiny shape on the CPU."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("shape_8b", REPO / "bench" / "shape_8b.py")
shape_8b = importlib.util.module_from_spec(SPEC)
sys.modules["shape_8b"] = shape_8b  # its dataclass looks its module up
SPEC.loader.exec_module(shape_8b)


def test_the_plan_figure_ratio_and_the_15_percent_flag():
    gib = shape_8b.GIB
    row = shape_8b.with_plan({"measured_gib": 23.0, "plan_parts": {"weights": 16 * gib, "activations": 4 * gib}})
    assert row["plan_gib"] == 20.0 and row["plan_parts_gib"] == {"weights": 16.0, "activations": 4.0}
    assert row["ratio"] == pytest.approx(1.15) and row["off"] is False  # 15 % is within
    assert shape_8b.with_plan({"measured_gib": 16.9, "plan_parts": {"weights": 20 * gib}})["off"] is True
    oom = shape_8b.with_plan({"status": "OOM at 79.1 GiB"})
    assert oom == {"status": "OOM at 79.1 GiB"}  # nothing measured, nothing planned: no ratio claimed


def test_the_cpu_mode_spawns_a_case_in_its_own_process_and_writes_its_row(tmp_path: Path):
    out = tmp_path / "shape.json"
    assert shape_8b.main(["--cpu", "--cases", "reference", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["cpu"] is True and list(result["cases"]) == ["reference"]
    row = result["cases"]["reference"]
    assert row["status"] == "ran (cpu: no device peak)" and row["seconds"] > 0
    assert row["measured_gib"] is None and "ratio" not in row  # no GPU figure is claimed on a CPU
    assert set(row["plan_parts_gib"]) == {"weights", "no-autograd live set", "logits chunk"}
    assert row["inputs"]["gradient_checkpointing"] is False and row["inputs"]["tokens"] == 128


def test_the_policy_and_grammar_cases_run_at_the_tiny_shape(tiny_model_dir: Path, tmp_path: Path, monkeypatch):
    """In this process (the spawning is the test above's): each case's code, and the rows it writes."""
    from paravt_core.agent import hf_engine

    capacities = []

    class Recorded(hf_engine.PreallocatedCache):
        def __init__(self, num_layers: int, capacity: int):
            capacities.append(capacity)
            super().__init__(num_layers, capacity)

    monkeypatch.setattr(hf_engine, "PreallocatedCache", Recorded)
    setup = shape_8b.Setup(cpu=True, tiny_dir=str(tiny_model_dir), work=str(tmp_path), tokens=128, frames=1,
                           grammar_steps=2)
    policy = shape_8b.run_case("rl-policy", setup)
    assert set(policy["plan_parts_gib"]) == {"weights", "gradients", "activations", "logits chunk"}
    assert policy["inputs"]["micro_batch"] == 2 and 0 < policy["inputs"]["scored_per_row"] < 128
    assert policy["params_built"] == policy["params_planned"]  # the plan counts the model the case built
    grammar = shape_8b.run_case("grammar", setup)
    assert set(grammar["plan_parts_gib"]) == {"weights", "KV cache", "prefill"}
    inputs = grammar["inputs"]
    # Every row generated all its tokens (the plan's KV cache is for full-length rows) from a
    # prompt of the plan's length.
    assert inputs["generated_tokens"] == inputs["rows"] * inputs["generated_per_row"] > 0
    assert inputs["generated_per_row"] == 2 < inputs["new_tokens"]  # stopped early, the cache sized for all
    assert inputs["prompt_tokens"] == inputs["plan_prompt_tokens"]
    assert capacities == [inputs["prompt_tokens"] + inputs["new_tokens"]]  # one generate, the plan's whole cache


@pytest.mark.integration  # a DeepSpeed launch on the CPU: 30-40 s
def test_the_cpu_mode_runs_two_zero3_offload_sft_steps(tmp_path: Path):
    out = tmp_path / "shape.json"
    assert shape_8b.main(["--cpu", "--cases", "sft-zero3-offload", "--out", str(out)]) == 0
    row = json.loads(out.read_text())["cases"]["sft-zero3-offload"]
    assert row["status"] == "ran (cpu: no device peak)", row
    assert row["inputs"]["steps"] == 2 and all(loss > 0 for loss in row["inputs"]["losses"])
    assert row["plan_parts_gib"]["optimizer"] == 0  # offloaded: the plan puts it on the host


def test_the_sft_case_is_skipped_on_a_card_under_120_gib_or_a_host_without_room(monkeypatch, tmp_path: Path):
    import psutil
    import torch

    from paravt_core.plan import QWEN3_VL_8B

    setup = shape_8b.Setup(cpu=False, tiny_dir="", work=str(tmp_path), tokens=6144, frames=64,
                           grammar_steps=None)
    cfg = shape_8b.pipeline_config(setup, ["sft.zero_stage=3", "sft.deepspeed.offload_optimizer=cpu"])
    assert shape_8b.host_bytes_needed(cfg, QWEN3_VL_8B) == 16 * QWEN3_VL_8B.params  # 12 + 4 bytes a parameter
    card = type("Card", (), {"total_memory": 80 * 2**30})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: card)
    assert "the card has 80 GiB" in shape_8b.sft_gate(setup, cfg, QWEN3_VL_8B)
    card.total_memory = 141 * 2**30
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("Memory", (), {"available": 120 * 2**30}))
    assert "the host has 120 GiB free" in shape_8b.sft_gate(setup, cfg, QWEN3_VL_8B)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("Memory", (), {"available": 200 * 2**30}))
    assert shape_8b.sft_gate(setup, cfg, QWEN3_VL_8B) is None


def test_a_case_over_its_limit_is_killed_with_the_processes_it_started(tmp_path: Path, monkeypatch):
    import os
    import time

    import psutil

    pid_file = tmp_path / "grandchild.pid"
    # A stand-in case process that starts a child of its own (as the SFT case launches a rank) and hangs.
    script = tmp_path / "hang.py"
    script.write_text("import subprocess, sys, time\n"
                      f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                      f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
                      "print('started', flush=True)\ntime.sleep(60)\n")
    monkeypatch.setattr(shape_8b, "__file__", str(script))
    started = time.perf_counter()
    row = shape_8b.spawn("grammar", tmp_path / "setup.json", tmp_path / "row.json", timeout_s=3)
    assert row["status"] == "timed out after 3 s" and "started" in row["log_tail"]
    assert time.perf_counter() - started < 30
    grandchild = int(pid_file.read_text())
    for _ in range(50):
        if not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.1)
    else:
        os.kill(grandchild, 9)
        raise AssertionError("the case's own child outlived the case's time limit")
