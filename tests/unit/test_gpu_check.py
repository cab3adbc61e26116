"""`make gpu-check --dry-run` (scripts/gpu_check.py) checks the GPU proof's own logic on CPU."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(SPEC)
sys.modules["gpu_check"] = gpu_check  # its dataclass looks its module up
SPEC.loader.exec_module(gpu_check)

WHEELS = ["deepspeed-0.19.8-py3-none-any.whl", "hjson-3.1.0-py3-none-any.whl", "pydantic-2.14.3-py3-none-any.whl",
          "pydantic_core-2.50.4-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
          "annotated_types-0.8.0-py3-none-any.whl", "typing_inspection-0.4.5-py3-none-any.whl",
          "av-18.1.0-cp311-abi3-manylinux_2_28_x86_64.whl", "liger_kernel-0.8.5-py3-none-any.whl"]


def _wheels(folder: Path, names: list[str]) -> Path:
    folder.mkdir()
    for name in names:
        (folder / name).write_bytes(b"")
    return folder


def test_dry_run_passes_with_the_wheels_and_prints_every_step(tmp_path: Path, capsys):
    wheels = _wheels(tmp_path / "whl", WHEELS)
    assert gpu_check.main(["--out", str(tmp_path / "out"), "--wheels", str(wheels), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    for step in ("install", "probe", "sft", "rl", "test-gpu"):
        assert f" {step} (" in printed
    assert "bench/sft_gpu.py --variants z2-fast-vb-w4,z3-fast-vb-w4 " in printed
    assert "tests/integration/test_sft_packing.py" in printed  # the gpu tier's files, found by their marker
    shards = [line for line in printed.splitlines() if line.strip().startswith("test-gpu (")]
    assert len(shards) == len(gpu_check.TEST_SHARDS) == 5  # side by side


# One process collects the gpu tier once without -k and once per shard expression: pytest's own
# -k, the test modules imported once instead of in six processes.
COLLECT = """
import json, sys
import pytest

class Collected:
    def pytest_collection_finish(self, session):
        self.ids = [item.nodeid for item in session.items]

files, expressions, out = json.loads(sys.argv[1])
found = []
for extra in [[], *[["-k", e] for e in expressions]]:
    grab = Collected()
    code = pytest.main([*files, "-m", "gpu", *extra, "--collect-only", "-q", "-p", "no:cacheprovider"], plugins=[grab])
    if code != 0:
        sys.exit(f"collection {extra} ended with {code}")
    found.append(grab.ids)
open(out, "w").write(json.dumps(found))
"""


def test_the_shards_split_the_gpu_tier_without_gap_or_overlap(tmp_path):
    import json
    import subprocess

    files = [str(p.relative_to(REPO)) for p in gpu_check.gpu_test_files()]
    out = tmp_path / "collected.json"
    done = subprocess.run([sys.executable, "-c", COLLECT, json.dumps([files, list(gpu_check.TEST_SHARDS), str(out)])],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    everything, *shards = json.loads(out.read_text())
    assert all(shards) and sorted(sum(shards, [])) == sorted(everything) and len(everything) >= 10


@pytest.mark.parametrize("change, problem", [
    (lambda names: [n for n in names if not n.startswith("liger")], "no liger_kernel wheel"),
    (lambda names: [*names, "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"], "not a wheel for CPython 3.12"),
])
def test_dry_run_names_a_missing_or_wrong_wheel(tmp_path: Path, capsys, change, problem):
    wheels = _wheels(tmp_path / "whl", change(WHEELS))
    assert gpu_check.main(["--out", str(tmp_path / "out"), "--wheels", str(wheels), "--dry-run"]) == 1
    assert problem in capsys.readouterr().out


def test_dry_run_refuses_limits_over_budget_and_unknown_variants(tmp_path: Path, capsys):
    wheels = _wheels(tmp_path / "whl", WHEELS)
    args = ["--out", str(tmp_path / "out"), "--wheels", str(wheels), "--dry-run"]
    assert gpu_check.main([*args, "--budget-s", "300"]) == 1
    assert "over the 300 s budget" in capsys.readouterr().out
    assert gpu_check.main([*args, "--sft-variants", "z2,z9"]) == 1
    assert "unknown SFT variant(s) ['z9']" in capsys.readouterr().out


def test_side_by_side_commands_share_the_limit_and_each_failure_is_named(tmp_path: Path):
    ok = ["python3", "-c", "print('first')"]
    bad = ["python3", "-c", "import sys; print('second'); sys.exit(3)"]
    slow = ["python3", "-c", "import time; time.sleep(30)"]
    env = {"PATH": "/usr/bin:/bin"}
    assert gpu_check.run_step(gpu_check.Step("pair", ok, 20, also=[ok]), tmp_path, env)["status"] == "passed"
    row = gpu_check.run_step(gpu_check.Step("pair", ok, 20, also=[bad]), tmp_path, env)
    assert row["status"] == "pair.log: passed; pair-2.log: failed (exit 3)"
    assert row["log"] == ["pair.log", "pair-2.log"] and "second" in (tmp_path / "pair-2.log").read_text()
    row = gpu_check.run_step(gpu_check.Step("pair", slow, 1, also=[slow]), tmp_path, env)
    assert row["status"].count("timed out after 1 s") == 2 and row["seconds"] < 10  # one limit for both


def test_a_step_that_overruns_its_limit_is_killed_and_reported(tmp_path: Path):
    step = gpu_check.Step("slow", ["python3", "-c", "import time; print('started', flush=True); time.sleep(30)"], 1)
    row = gpu_check.run_step(step, tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert row["status"] == "timed out after 1 s" and row["seconds"] < 10
    assert "started" in (tmp_path / "slow.log").read_text()
