"""The GPU proof in one command: every GPU-side path of the project, timed, logs under one folder.

On an offline GPU machine prepared as ../shared/GPU.md says (Python 3.12, CUDA torch and
transformers present; the project's other packages brought as wheels in `--wheels`), run from
the repository root:

    python3 scripts/gpu_check.py --out $OUT            # make gpu-check OUT=...
    .venv/bin/python scripts/gpu_check.py --out /tmp/x --dry-run   # on CPU (make gpu-check-dry)

Steps, each with its own time limit so that one stall cannot eat the others' time, each
logged to OUT/<step>.log, with GPU utilization and memory sampled beside them into
OUT/smi.csv (`nvidia-smi -lms 500`):
1. install: the wheels into a private target folder (`--site`), put on PYTHONPATH;
2. probe: versions (torch, CUDA, cuDNN, transformers, deepspeed, liger-kernel) and the card;
3. test-gpu: the `gpu` test tier (`make test-gpu`'s files), the `hf` evaluator on generated
   samples among them, in five pytest processes side by side (`TEST_SHARDS`, logs test-gpu.log,
   test-gpu-2.log, ...); a failure's traceback is logged as it happens;
4. shape-8b: `bench/shape_8b.py`, issue #47 item 1: the 8B shape's RL policy pass, reference
   pass and grammar-check generate, peak memory beside the memory plan's figure for each
   (OUT/shape_8b.json; the H200-only ZeRO-3 offload SFT case with `--shape-cases`);
5. sft: `bench/sft_gpu.py` at the 2B shape, the switch sets of `--sft-variants` beside the
   stock transformers ceiling (tokens/s, MFU, GPU busy %, peak memory), with profiles of one
   stock micro-step (OUT/sft_profile.txt) and of the first variant's own step
   (OUT/sft_step_profile.txt);
6. rl: `bench/rl_gpu.py`, two PARA-GRPO steps at the 2B shape in bf16 on the `hf` engine.
`--steps` picks them: by default issue #47's proof (probe, shape-8b, sft); issue #36's was
probe, test-gpu, sft, rl. OUT/summary.json gathers each step's status, seconds and the
benchmarks' JSON; OUT/summary.md is the same as a table. The exit status is 0 only when every
step passed.

--dry-run runs nothing on a GPU: it checks that the wheels are there and named for the
target (cp312 / abi3 / py3, manylinux x86_64), that every file a step names exists, that
the commands are formed, and that the time limits fit the budget; then it runs the chosen
benchmarks' CPU modes with this interpreter (`shape_8b.py --cpu`, `sft_gpu.py --smoke` with
the CPU switch variants; logs and JSON under OUT/dry-run/), so every line of their code runs
before a device call (`--no-exercise` skips that: the static checks alone).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What the GPU image lacks that the GPU paths import (../shared/GPU.md), by wheel name prefix.
REQUIRED_WHEELS = ("deepspeed", "hjson", "pydantic", "pydantic_core", "annotated_types", "typing_inspection", "av",
                   "liger_kernel")
# python-abi-platform tags that install on CPython 3.12, x86_64 Linux.
WHEEL_TAG = re.compile(r"-(cp312-cp312|cp3\d+-abi3|py3-none|py2\.py3-none)-(any|manylinux\S*x86_64)\.whl$")
# Issue #47: the project's best step, then each switch alone against it (docs/gpu_check.md).
DEFAULT_SFT_VARIANTS = "z2-fast-vb-w4,z2-fast-vb-w4-pin,z2-fast-vb-w4-bf16px,z2-fast-vb-w4-compile"
STEPS = ("probe", "test-gpu", "shape-8b", "sft", "rl")
DEFAULT_STEPS = "probe,shape-8b,sft"  # issue #47's proof; #36's: probe,test-gpu,sft,rl
DEFAULT_SHAPE_CASES = "rl-policy,reference,grammar"  # + sft-zero3-offload on an H200 (its own call)
# Estimated, not yet measured: the sft step at 65 s per variant (the third session's) + 40 s of
# compilation + the ceiling's 60 s; the 8B cases at ~25 s each to start and build + their runs.
DEFAULT_LIMITS = "install=5,probe=25,test-gpu=165,shape-8b=170,sft=335,rl=110"
SHAPE_CASE_LIMITS = "rl-policy=45,reference=35,grammar=75,sft-zero3-offload=300"
GRAMMAR_STEPS = 256  # of the grammar call's 2,048: its cache is allocated whole at the prefill
PROBE = """
import json, torch
info = {"python": __import__("sys").version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(), "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "gpu_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else None}
for name in ("transformers", "deepspeed", "liger_kernel", "triton", "av", "pydantic", "tokenizers", "huggingface_hub"):
    try:
        module = __import__(name)
        info[name] = getattr(module, "__version__", "?")
    except Exception as exc:
        info[name] = f"missing: {exc}"
print(json.dumps(info, indent=2))
# The project's code follows the transformers it pins: on the image's 5.17, Qwen3-VL's vision features
# come back unsplit and the vision dedupe fails ("'tuple' object has no attribute 'to'", 2026-11-30).
pinned = next(line.split("==")[1].strip() for line in open("requirements.lock") if line.startswith("transformers=="))
if info["transformers"] != pinned:
    raise SystemExit(f"transformers {info['transformers']} here, the project pins {pinned} (requirements.lock): bring "
                     f"its wheel in --wheels (pip download --no-deps transformers=={pinned}, pure Python, 13 MB)")
"""


@dataclass
class Step:
    name: str
    argv: list[str]
    timeout_s: int
    needs: list[Path] = field(default_factory=list)  # files the step reads (checked by --dry-run)
    result: Path | None = None  # JSON the step writes
    also: list[list[str]] = field(default_factory=list)  # commands run beside `argv`, each its own log


# The gpu tier in five pytest processes side by side (16 CPU cores, tiny models beside one 2B
# one). Measured on an H100 (docs/gpu_check.md): side by side 128-132 s in all; each bf16
# kill-and-resume SFT test 64-73 s (two DeepSpeed launches), the 2B SFT step 106-108 s, the rest 51 s.
TEST_SHARDS = ("resumes_after_a_kill and [0]", "resumes_after_a_kill and [2]", "resumes_after_a_kill and [3]",
               "2b_shape", "not resumes_after_a_kill and not 2b_shape")


def gpu_test_files() -> list[Path]:
    """The test files holding `gpu`-marked tests (others may import packages the GPU image lacks)."""
    return sorted(p for p in (REPO / "tests").rglob("test_*.py") if "pytest.mark.gpu" in p.read_text())


def plan(out: Path, python: str, sft_variants: str, limits: dict[str, int],
         shape_cases: str = DEFAULT_SHAPE_CASES) -> list[Step]:
    tests = gpu_test_files()
    shards = [[python, "-m", "pytest", *[str(t.relative_to(REPO)) for t in tests], "-m", "gpu", "-k", shard, "-rs",
               "-p", "no:cacheprovider", "--tb=short", "--durations=15", f"--junitxml={out / f'test_gpu_{i}.xml'}"]
              for i, shard in enumerate(TEST_SHARDS)]
    return [
        Step("probe", [python, "-c", PROBE], limits["probe"]),
        Step("test-gpu", *shards[:1], limits["test-gpu"], tests, also=shards[1:]),
        Step("shape-8b", [python, "bench/shape_8b.py", "--cases", shape_cases, "--case-limits", SHAPE_CASE_LIMITS,
                          "--grammar-steps", str(GRAMMAR_STEPS), "--out", str(out / "shape_8b.json")],
             limits["shape-8b"], [REPO / "bench/shape_8b.py"], out / "shape_8b.json"),
        Step("sft", [python, "bench/sft_gpu.py", "--variants", sft_variants, "--steps", "3",
                     "--out", str(out / "sft_gpu.json"), "--profile", str(out / "sft_profile.txt"),
                     "--profile-step", str(out / "sft_step_profile.txt")], limits["sft"], [REPO / "bench/sft_gpu.py"],
             out / "sft_gpu.json"),
        Step("rl", [python, "bench/rl_gpu.py", "--steps", "2", "--out", str(out / "rl_gpu.json")], limits["rl"],
             [REPO / "bench/rl_gpu.py"], out / "rl_gpu.json"),
    ]


def wheel_problems(wheels: Path) -> list[str]:
    if not wheels.is_dir():
        return [f"no wheel folder {wheels} (build it as ../shared/GPU.md says)"]
    files = sorted(wheels.glob("*.whl"))
    problems = [f"{f.name}: not a wheel for CPython 3.12 on manylinux x86_64" for f in files
                if not WHEEL_TAG.search(f.name)]
    names = {f.name.split("-")[0].lower() for f in files}
    problems += [f"no {name} wheel in {wheels}" for name in REQUIRED_WHEELS if name not in names]
    size = sum(f.stat().st_size for f in files)
    if size > 60 * 2**20:
        problems.append(f"wheels total {size / 2**20:.0f} MiB; the device tool carries 64 MiB per call in all")
    return problems


def run_step(step: Step, out: Path, env: dict[str, str]) -> dict:
    """Run the step's command(s) side by side under one time limit; passed when every one exits 0."""
    commands = [step.argv, *step.also]
    logs = [out / (f"{step.name}.log" if i == 0 else f"{step.name}-{i + 1}.log") for i in range(len(commands))]
    started = time.perf_counter()
    procs = []
    for argv, log in zip(commands, logs):
        print(f"== {step.name} (limit {step.timeout_s} s): {shlex.join(argv)[:200]}", flush=True)
        with open(log, "w") as f:
            procs.append(subprocess.Popen(argv, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                                          start_new_session=True))
    statuses = []
    for proc in procs:
        left = max(0.0, step.timeout_s - (time.perf_counter() - started))
        try:
            statuses.append("passed" if proc.wait(timeout=left) == 0 else f"failed (exit {proc.returncode})")
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            statuses.append(f"timed out after {step.timeout_s} s")
    seconds = time.perf_counter() - started
    failed = [status for status in statuses if status != "passed"]
    status = "passed" if not failed else failed[0] if len(statuses) == 1 else "; ".join(
        f"{log.name}: {st}" for log, st in zip(logs, statuses))
    print(f"   {step.name}: {status} in {seconds:.0f} s", flush=True)
    for log in logs:
        tail = log.read_text(errors="replace").splitlines()[-25:]
        print("\n".join(f"   | {line}" for line in tail), flush=True)
    row = {"status": status, "seconds": round(seconds, 1), "log": logs[0].name if len(logs) == 1 else
           [log.name for log in logs]}
    if step.result is not None and step.result.is_file():
        row["result"] = json.loads(step.result.read_text())
    return row


# The benchmarks' CPU modes, run by --dry-run for the steps chosen: the same code at the tiny shape
# (every case of shape_8b, the H200 one included: its gate is for GPUs).
CPU_EXERCISES = {
    "shape-8b": lambda out: ["bench/shape_8b.py", "--cpu", "--grammar-steps", "2", "--out", str(out / "shape_8b.json")],
    "sft": lambda out: ["bench/sft_gpu.py", "--smoke", "--variants", "cpu-z0,cpu-z0-switches", "--steps", "3",
                               "--accum", "2", "--rows", "4", "--out", str(out / "sft_gpu.json"),
                               "--profile", str(out / "sft_profile.txt"),
                               "--profile-step", str(out / "sft_step_profile.txt")],
}


def exercise_on_cpu(steps: list[str], out: Path) -> list[str]:
    """Run the CPU mode of each chosen benchmark with this interpreter; the problems found, each
    naming its log."""
    out.mkdir(parents=True, exist_ok=True)
    problems = []
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    for name in steps:
        if name not in CPU_EXERCISES:
            continue
        argv = [sys.executable, *CPU_EXERCISES[name](out)]
        log = out / f"{name}.log"
        print(f"  exercising {name} on the CPU: {shlex.join(argv)}", flush=True)
        started = time.perf_counter()
        with open(log, "w") as f:
            code = subprocess.run(argv, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
        print(f"    exit {code} in {time.perf_counter() - started:.0f} s (log {log})", flush=True)
        if code != 0:
            tail = log.read_text(errors="replace").splitlines()[-5:]
            problems.append(f"{name}'s CPU mode exited {code}; see {log}: " + " / ".join(tail))
    return problems


def summary_table(summary: dict) -> str:
    lines = ["| step | status | seconds |", "|---|---|---|"]
    lines += [f"| {name} | {row['status']} | {row['seconds']} |" for name, row in summary["steps"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="every log and result goes here")
    parser.add_argument("--wheels", type=Path, default=REPO / ".whl")
    parser.add_argument("--site", type=Path, default=Path("/tmp/site"), help="where the wheels are installed")
    parser.add_argument("--python", default="python3")
    parser.add_argument("--sft-variants", default=DEFAULT_SFT_VARIANTS)
    parser.add_argument("--budget-s", type=int, default=540, help="the whole check must fit in this (9 minutes)")
    parser.add_argument("--steps", default=DEFAULT_STEPS, help=f"comma-separated, of {list(STEPS)} (install always)")
    parser.add_argument("--shape-cases", default=DEFAULT_SHAPE_CASES,
                        help="bench/shape_8b.py's cases (sft-zero3-offload: an H200, in a call of its own)")
    parser.add_argument("--limits", default=DEFAULT_LIMITS,
                        help="seconds per step, name=seconds,... (those given replace the defaults)")
    parser.add_argument("--skip", default="", help="comma-separated steps to leave out")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--no-exercise", action="store_true", help="--dry-run without the benchmarks' CPU runs")
    args = parser.parse_args(argv)
    try:
        limits = {k: int(v) for k, v in (item.split("=") for item in f"{DEFAULT_LIMITS},{args.limits}".split(","))}
    except ValueError:
        parser.error(f"--limits {args.limits!r}: give name=seconds pairs separated by commas")
    chosen = [s for s in args.steps.split(",") if s]
    unknown = sorted(set(chosen + list(limits)) - set(STEPS) - {"install"})
    if unknown:
        parser.error(f"unknown step(s) {unknown}; the steps are install, {', '.join(STEPS)}")
    skip = {s for s in args.skip.split(",") if s}
    args.out.mkdir(parents=True, exist_ok=True)
    steps = [s for s in plan(args.out, args.python, args.sft_variants, limits, args.shape_cases)
             if s.name in chosen and s.name not in skip]
    install = [args.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target",
               str(args.site), *map(str, sorted(args.wheels.glob("*.whl")))]

    problems = wheel_problems(args.wheels)
    problems += [f"step {s.name}: {p} is missing" for s in steps for p in s.needs if not p.exists()]
    total = limits["install"] + sum(s.timeout_s for s in steps)
    if total > args.budget_s:
        problems.append(f"the steps' limits add up to {total} s, over the {args.budget_s} s budget")
    from importlib.util import find_spec

    sys.path.insert(0, str(REPO / "bench"))
    if find_spec("sft_gpu") is not None:
        import sft_gpu

        unknown = sorted(set(args.sft_variants.split(",")) - set(sft_gpu.VARIANTS))
        if unknown:
            problems.append(f"unknown SFT variant(s) {unknown}; bench/sft_gpu.py has {sorted(sft_gpu.VARIANTS)}")
    if find_spec("shape_8b") is not None:
        import shape_8b

        unknown = sorted(set(args.shape_cases.split(",")) - set(shape_8b.CASES))
        if unknown:
            problems.append(f"unknown shape-8b case(s) {unknown}; bench/shape_8b.py has {list(shape_8b.CASES)}")
    if args.dry_run:
        print(f"dry run: {len(steps) + 1} steps, limits {total} s of a {args.budget_s} s budget")
        for s in [Step("install", install, limits["install"]), *steps]:
            for argv in [s.argv, *s.also]:
                shown = [a if a != PROBE else "<version probe>" for a in argv]
                print(f"  {s.name:>8} ({s.timeout_s:>3} s): {shlex.join(shown)}")
        if not args.no_exercise:  # the wheels are the GPU machine's concern; the code runs here anyway
            problems += exercise_on_cpu([s.name for s in steps], args.out / "dry-run")
        for p in problems:
            print(f"problem: {p}")
        return 1 if problems else 0
    for p in problems:
        print(f"warning: {p}", flush=True)

    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               PARAVT_FAILURES_AT_ONCE="1")  # tests/conftest.py: a failure's traceback as it happens
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(args.site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    smi = None
    try:
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,utilization.gpu,memory.used",
                                "--format=csv", "-lms", "500"], stdout=open(args.out / "smi.csv", "w"),
                               stderr=subprocess.DEVNULL)
    except FileNotFoundError:
        print("warning: no nvidia-smi; no utilization trace", flush=True)
    summary = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "steps": {}}
    try:
        for step in [Step("install", install, limits["install"]), *steps]:
            summary["steps"][step.name] = run_step(step, args.out, env)
            (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
            if step.name == "install" and summary["steps"]["install"]["status"] != "passed":
                break
    finally:
        if smi is not None:
            smi.terminate()
    (args.out / "summary.md").write_text(summary_table(summary))
    print(summary_table(summary))
    return 0 if all(row["status"] == "passed" for row in summary["steps"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
