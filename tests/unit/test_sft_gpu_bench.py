"""bench/sft_gpu.py's #47 additions: the project's step profiled, each switch set against the first variant."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("sft_gpu", REPO / "bench" / "sft_gpu.py")
sft_gpu = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(sft_gpu)


def test_loss_difference_is_the_largest_relative_step_difference():
    assert sft_gpu.loss_difference([2.0, 4.0], [2.0, 4.0]) == 0.0
    assert sft_gpu.loss_difference([2.0, 4.0], [2.0, 4.2]) == pytest.approx(0.05)
    assert sft_gpu.loss_difference([2.0, 4.0], [2.0]) is None  # a run that stopped early is not compared


def test_the_47_switch_variants_are_the_base_variant_plus_one_switch_each():
    base = set(sft_gpu.VARIANTS["z2-fast-vb-w4"][1])
    for name, switch in (("pin", "sft.pin_memory=true"), ("bf16px", "sft.host_pixel_dtype=bfloat16"),
                         ("compile", "sft.compile_text_layers=true")):
        assert set(sft_gpu.VARIANTS[f"z2-fast-vb-w4-{name}"][1]) == base | {switch}
        assert switch in sft_gpu.VARIANTS["z2-fast-vb-w4-all"][1]


@pytest.mark.integration  # two DeepSpeed launches and an inductor compile on the CPU: 2-3 min here
def test_smoke_profiles_the_project_step_and_compares_the_switches_to_the_first_variant(tmp_path: Path):
    out, step_profile = tmp_path / "sft.json", tmp_path / "step.txt"
    done = subprocess.run([sys.executable, "bench/sft_gpu.py", "--smoke", "--variants", "cpu-z0,cpu-z0-switches",
                           "--steps", "3", "--accum", "2", "--rows", "4", "--out", str(out),
                           "--profile-step", str(step_profile)], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    variants = json.loads(out.read_text())["variants"]
    assert "vs_first_variant" not in variants["cpu-z0"]
    versus = variants["cpu-z0-switches"]["vs_first_variant"]
    assert versus["variant"] == "cpu-z0" and versus["rate"] > 0
    assert versus["max_loss_rel_diff"] < 1e-4  # the same samples train the same losses with the switches
    assert step_profile.read_text().startswith("one call under the profiler:")
