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


def test_dry_run_passes_with_the_wheels_and_prints_every_step_of_the_47_proof(tmp_path: Path, capsys):
    wheels = _wheels(tmp_path / "whl", WHEELS)
    assert gpu_check.main(["--out", str(tmp_path / "out"), "--wheels", str(wheels), "--dry-run", "--no-exercise"]) == 0
    printed = capsys.readouterr().out
    for step in ("install", "probe", "shape-8b", "sft"):
        assert f" {step} (" in printed
    assert " rl (" not in printed and " test-gpu (" not in printed  # issue #36's steps, not #47's
    sft = next(line for line in printed.splitlines() if line.strip().startswith("sft ("))
    assert ("bench/sft_gpu.py --variants z2-fast-vb-w4,z2-fast-vb-w4-pin,z2-fast-vb-w4-bf16px,z2-fast-vb-w4-compile "
            in sft and "--profile-step" in sft)
    shape = next(line for line in printed.splitlines() if line.strip().startswith("shape-8b ("))
    assert "bench/shape_8b.py --cases rl-policy,reference,grammar " in shape and "--grammar-steps 256" in shape
    total = sum(int(v) for k, v in (i.split("=") for i in gpu_check.DEFAULT_LIMITS.split(","))
                if k in ("install", "probe", "shape-8b", "sft"))
    assert f"limits {total} s of a 540 s budget" in printed and total <= 540
    # The shape step's cases fit inside its own limit, with room to start and build the tiny kit.
    cases = dict(i.split("=") for i in gpu_check.SHAPE_CASE_LIMITS.split(","))
    assert sum(int(cases[c]) for c in gpu_check.DEFAULT_SHAPE_CASES.split(",")) + 10 <= int(
        dict(i.split("=") for i in gpu_check.DEFAULT_LIMITS.split(","))["shape-8b"])


def test_dry_run_of_the_36_steps_prints_the_gpu_tier_side_by_side(tmp_path: Path, capsys):
    wheels = _wheels(tmp_path / "whl", WHEELS)
    assert gpu_check.main(["--out", str(tmp_path / "out"), "--wheels", str(wheels), "--dry-run", "--no-exercise",
                           "--steps", "probe,test-gpu,sft,rl", "--limits", "sft=235"]) == 0
    printed = capsys.readouterr().out
    for step in ("install", "probe", "sft", "rl", "test-gpu"):
        assert f" {step} (" in printed
    assert "tests/integration/test_sft_packing.py" in printed  # the gpu tier's files, found by their marker
    shards = [line for line in printed.splitlines() if line.strip().startswith("test-gpu (")]
    assert len(shards) == len(gpu_check.TEST_SHARDS) == 5  # side by side
    assert "limits 540 s of a 540 s budget" in printed  # the limit given replaced sft's default alone


def test_dry_run_exercises_each_chosen_benchmark_on_the_cpu_and_names_a_failing_log(tmp_path: Path, capsys,
                                                                                    monkeypatch):
    wheels = _wheels(tmp_path / "whl", WHEELS)
    ran = []

    def fake(code: int):
        return lambda out: ran.append(out) or ["-c", f"import sys; print('cpu mode'); sys.exit({code})"]

    monkeypatch.setattr(gpu_check, "CPU_EXERCISES", {"shape-8b": fake(0), "sft": fake(3)})
    args = ["--out", str(tmp_path / "out"), "--wheels", str(wheels), "--dry-run"]
    assert gpu_check.main(args) == 1
    printed = capsys.readouterr().out
    assert len(ran) == 2 and all(out == tmp_path / "out" / "dry-run" for out in ran)
    assert "problem: sft's CPU mode exited 3; see" in printed and "sft.log: cpu mode" in printed
    assert "shape-8b's CPU mode" not in printed
    ran.clear()
    assert gpu_check.main([*args, "--steps", "probe,shape-8b"]) == 0 and len(ran) == 1  # only the chosen ones


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
    assert gpu_check.main(["--out", str(tmp_path / "out"), "--wheels", str(wheels), "--dry-run", "--no-exercise"]) == 1
    assert problem in capsys.readouterr().out


def test_dry_run_refuses_limits_over_budget_and_unknown_variants(tmp_path: Path, capsys):
    wheels = _wheels(tmp_path / "whl", WHEELS)
    args = ["--out", str(tmp_path / "out"), "--wheels", str(wheels), "--dry-run", "--no-exercise"]
    assert gpu_check.main([*args, "--budget-s", "300"]) == 1
    assert "over the 300 s budget" in capsys.readouterr().out
    assert gpu_check.main([*args, "--sft-variants", "z2,z9"]) == 1
    assert "unknown SFT variant(s) ['z9']" in capsys.readouterr().out
    assert gpu_check.main([*args, "--shape-cases", "rl-policy,train-9b"]) == 1
    assert "unknown shape-8b case(s) ['train-9b']" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main([*args, "--steps", "probe,bake"])
    assert exit_.value.code == 2 and "unknown step(s) ['bake']" in capsys.readouterr().err


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
