"""The tiny RL row with `rl.overlap` 0 and 1 side by side: wall time per step (issue #65, Build item 4).

Both variants run the same row in child processes, interleaved (overlap0, overlap1, overlap0, ...),
on inputs built once by this process (`bench/rl_step.build_rl_inputs`: the tiny random-weight
Qwen3-VL, 16 multiple-choice prompts on a 40 s clip) with conf/pipeline/reproduce.yaml's RL section
(4 prompts x 4 rollouts a step, nFrames gating, sub-agents trained, KL to the reference) on one
rank, in process (`rl.worker.Trainer`, steps_only), and the same number of steps (so the same
samples and updates). The random model never writes a tool call, so each main agent's first turn
is scripted to two crop calls (`rl_step.ScriptedFirstTurn`), as in bench/rl_step.py.

- `overlap0`: the synchronous step (`Trainer.train_step`), the rank's --threads torch threads
  for everything (what a one-rank run gets on this host: its cores);
- `overlap0_1t` (when --threads is above 1): the synchronous step on one thread, the trainer's
  share under overlap1: tells the gain of overlapping from that of leaving a thread count
  which this machine's load makes slow (OpenMP threads wait for each other when one is preempted);
- `overlap1`: `rl.overlap: 1`, the worker's schedule (`rl/overlap.run_overlapped` with the
  trainer's `rollout_batch`, `learn` and `push_weights`, as `rl/worker._train_loop` calls it),
  the `hf` engine in its own process, the rank's --threads split between the two
  (`rl/overlap.thread_share`: one each on 2).

Per child: --steps + 2 steps; the first (overlap1 rolls its batch out before it trains, with
nothing beside it) and the last (overlap1 has no next batch to roll out beside it) are not timed,
the --steps between them are: wall seconds from one step's end to the next, CPU seconds of the
trainer and (overlap1) its engine process, and the trainer's own split of each step (`time_*`
of the step log: the rollout's wall time, the reference and policy passes with the update,
the trainer's and the engine's idle time within the step). The whole run's wall time (all
steps) and the start (models, engine, engine process) are printed too.

`--engine vllm` is the issue's own setting: `rl.rollout.engine: vllm`, the vLLM CPU server
(`make install-serve`) launched by the trainer as an RL run launches it, the server on core 0
(the process group inherits it; VLLM_CPU_OMP_THREADS_BIND=0 holds its one OpenMP thread there)
and the trainer on core 1, one torch thread. The rollout's client side (building requests, decoding
crops, encoding frames, reading replies; threads of the trainer's process) runs on the server's
core for the rollout's duration, in both variants (`--client trainer`: on the trainer's). Two
variants: `overlap0` (the synchronous step: each side idles while the other works) and
`overlap1`. Each child starts its own server (its start is in the start line, not in the steps)
and pushes the initial weights to it, as every RL run does.

Results must agree within a variant: every child of a variant logs the same RL metrics (timings
aside) and ends with the same weights (sha256 of the state dict); the two variants train on
different batches (overlap1 one step off-policy) and are not compared. The bench stops with
status 1 when they do not agree.

Run: `.venv/bin/python bench/overlap.py [--repeats 2] [--steps 4] [--threads 2] [--engine vllm]
[--client server|trainer] [--set KEY=VALUE ...]`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rl_step import ScriptedFirstTurn, _config, build_rl_inputs, child_result, single_rank_job

from paravt_core.agent.server_launch import ServeError, pick_server, probe_python, server_python_path
from paravt_core.rl.overlap import SPLIT_KEYS, StepSplit

REPO = Path(__file__).resolve().parents[1]
# name -> (settings, the rank's torch threads: None for --threads)
VARIANTS = {"overlap0": ([], None), "overlap0_1t": ([], 1), "overlap1": (["rl.overlap=1"], None)}
SERVER_CORE, TRAINER_CORE = 0, 1  # --engine vllm: a core each
# The step log's keys this bench reports (`rl/worker.Trainer.learn`, `rl/overlap.run_overlapped`).
PHASES = {"time_rollout_s": "rollout (its wall time, whenever it ran)", "time_reference_s": "reference pass",
          "time_train_s": "policy pass and update", "time_push_s": "push (before the next batch)",
          "time_trainer_idle_s": "trainer idle (waiting for a batch)",
          "time_rollout_idle_s": "engine idle (no batch to make)"}


def _cpu_s(engine_processes: list) -> float:
    """This process's CPU seconds and those of the engine's processes (`hf` in a process of its
    own under overlap1; a vLLM server's process group)."""
    total = time.process_time()
    for process in engine_processes:
        times = process.cpu_times()
        total += times.user + times.system
    return total


def _pin_process(cores: set[int]) -> None:
    """Every thread of this process onto `cores` (threads started later inherit their starter's)."""
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), cores)


def _on_core(rollout, core: int, back: int):
    """`rollout` with the calling thread, and every thread it starts (the client's request pool,
    the decoders'), on `core` for the call's duration, then back on `back`."""
    def pinned(step: int):
        os.sched_setaffinity(0, {core})  # 0: the calling thread alone (Linux)
        try:
            return rollout(step)
        finally:
            os.sched_setaffinity(0, {back})
    return pinned


def _engine_processes(trainer) -> list:
    """psutil handles of the processes that generate this child's rollouts (none when in process)."""
    import psutil

    server = trainer.rollout_backend.server
    if server is not None:  # the vLLM server the trainer launched: its leader and every child
        leader = psutil.Process(server.process.pid)
        return [leader, *leader.children(recursive=True)]
    process = getattr(trainer.rollout_backend.engine, "process", None)
    return [psutil.Process(process.pid)] if process is not None else []


def child(args) -> None:
    """One run of a variant; prints one JSON line."""
    import torch

    from paravt_core.dist.launch import free_port
    from paravt_core.dist.rank import shutdown_distributed
    from paravt_core.rl import worker as rl_worker
    from paravt_core.rl.overlap import run_overlapped

    torch.set_num_threads(args.threads)
    inputs = json.loads(Path(args.inputs).read_text())
    out = Path(args.out)
    settings = [*VARIANTS[args.variant][0], *args.set]
    if args.engine == "vllm":
        settings.append("rl.rollout.engine=vllm")
        # The server the trainer launches inherits this process's core; its OpenMP thread is bound there.
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(SERVER_CORE)
        _pin_process({SERVER_CORE})
    cfg = _config(REPO, out, 1, args.main_tokens, args.subagent_tokens, settings)
    job, _ = single_rank_job(cfg, inputs, free_port)
    begun = time.perf_counter()
    trainer = rl_worker.Trainer(job)
    start_s = time.perf_counter() - begun
    if args.engine == "vllm":
        _pin_process({TRAINER_CORE})
        if args.client == "server":
            trainer.rollout_batch = _on_core(trainer.rollout_batch, SERVER_CORE, TRAINER_CORE)
    trainer.engine = ScriptedFirstTurn(trainer.engine, trainer.processor.tokenizer)
    engine_processes = _engine_processes(trainer)
    marks, cpu, rows = [time.perf_counter()], [_cpu_s(engine_processes)], []

    def finish(step: int, row: dict, following) -> None:
        rows.append(row)
        marks.append(time.perf_counter())
        cpu.append(_cpu_s(engine_processes))

    steps = args.steps + 2
    if cfg.rl.overlap:
        def train(step: int, batch) -> dict:
            prompts, episodes = batch.data
            return trainer.learn(step, prompts, episodes, batch.seconds, push=False)

        run_overlapped(0, steps, 0, None, trainer.rollout_batch, train, trainer.push_overlapped, finish)
    else:
        for step in range(steps):
            finish(step, trainer.train_step(step), None)
    threads = {"trainer": torch.get_num_threads(),
               "engine": f"server on core {SERVER_CORE}" if args.engine == "vllm" else trainer.rollout_threads}
    state = trainer.policy.module.state_dict()
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].detach().cpu().contiguous().numpy().tobytes())
    trainer.rollout_backend.close()
    shutdown_distributed()
    step_s = [b - a for a, b in zip(marks, marks[1:])]
    step_cpu = [b - a for a, b in zip(cpu, cpu[1:])]
    print("BENCH " + json.dumps({
        "step_s": step_s[1:-1], "step_cpu_s": step_cpu[1:-1], "run_s": marks[-1] - marks[0], "start_s": start_s,
        "phases": [{k: row[k] for k in PHASES} for row in rows[1:-1]], "threads": threads,
        "metrics": [{k: v for k, v in sorted(row.items()) if not k.startswith("time_")} for row in rows],
        "weights_sha256": digest.hexdigest()}), flush=True)


def run_child(inputs: Path, out: Path, variant: str, args) -> dict:
    threads = VARIANTS[variant][1] or args.threads
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(threads)}
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--inputs", str(inputs), "--out", str(out),
               "--threads", str(threads), "--steps", str(args.steps), "--main-tokens", str(args.main_tokens),
               "--subagent-tokens", str(args.subagent_tokens), "--variant", variant, "--engine", args.engine,
               "--client", args.client, *(f"--set={setting}" for setting in args.set)]
    return child_result(command, env, f"bench/overlap.py: the {variant} child")


def print_table(results: dict[str, list[dict]], steps: int) -> None:
    """Medians over every timed step of every child of a variant, and overlap1's ratio to each other."""
    def median(name: str, pick) -> float:
        return statistics.median(value for r in results[name] for value in pick(r))

    measures = [("step, wall", lambda r: r["step_s"]), ("step, CPU (trainer + engine process)",
                                                       lambda r: r["step_cpu_s"])]
    measures += [(label, lambda r, key=key: [p[key] for p in r["phases"]]) for key, label in PHASES.items()]
    measures += [(f"whole run of {steps + 2} steps, wall", lambda r: [r["run_s"]]),
                 ("start (models, engine), wall", lambda r: [r["start_s"]])]
    names = list(results)
    others = [name for name in names if name != "overlap1"]
    print(f"| seconds (median) | {' | '.join(names)} | {' | '.join(f'overlap1 / {name}' for name in others)} |")
    print("|---" + "|---:" * (len(names) + len(others)) + "|")
    for label, pick in measures:
        value = {name: median(name, pick) for name in names}
        ratios = " | ".join(f"{value['overlap1'] / value[name]:.2f}x" if value[name] > 0 else "-" for name in others)
        print(f"| {label} | {' | '.join(f'{value[name]:.2f}' for name in names)} | {ratios} |")
    # `paravt plan --step-log`'s estimate from each synchronous variant's phases, beside what overlap1 took
    estimates = []
    for name in others:
        split = StepSplit(*(median(name, lambda r, key=key: [p[key] for p in r["phases"]]) for key in SPLIT_KEYS),
                          steps=(2, steps + 1))
        estimates.append(f"{split.overlapped:.2f} s from {name}'s phases")
    print(f"overlap1's step as `paravt plan --step-log` estimates it: {', '.join(estimates)}; measured "
          f"{median('overlap1', lambda r: r['step_s']):.2f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="child runs per variant, interleaved")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per child (after one, before one untimed)")
    parser.add_argument("--threads", type=int, default=2, help="the rank's torch threads (overlap1 splits them)")
    parser.add_argument("--main-tokens", type=int, default=64)
    parser.add_argument("--subagent-tokens", type=int, default=48)
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf",
                        help="vllm: the vLLM CPU server on core 0, the trainer on core 1 (one thread)")
    parser.add_argument("--client", choices=("server", "trainer"), default="server",
                        help="--engine vllm: the core the rollout's client side runs on (building requests, "
                             "decoding crops, encoding frames, reading replies): the server's (the rollout side "
                             "on one core, the trainer on the other) or the trainer's")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config setting for every variant (repeatable), e.g. rl.shared_prefix=true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--inputs", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="overlap0", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0
    for setting in args.set:  # what the variants and --engine set are the bench's to set
        if setting.split("=", 1)[0].strip() in ("rl.overlap", "rl.rollout.engine"):
            parser.error(f"--set {setting}: the variants set rl.overlap and --engine sets rl.rollout.engine")
    if args.engine == "vllm":
        if not {SERVER_CORE, TRAINER_CORE} <= os.sched_getaffinity(0):
            sys.exit(f"bench/overlap.py --engine vllm: needs cores {SERVER_CORE} and {TRAINER_CORE} (a core for the "
                     f"server, one for the trainer); this process may run on {sorted(os.sched_getaffinity(0))}")
        try:
            pick_server("vllm", probe_python(server_python_path()))
        except ServeError as error:
            sys.exit(f"bench/overlap.py --engine vllm: {error}")
        args.threads = 1
    with tempfile.TemporaryDirectory(prefix="paravt-bench-overlap-") as tmp:
        root = Path(tmp)
        inputs = root / "inputs.json"
        inputs.write_text(json.dumps(build_rl_inputs(root)))
        print(f"the rank's torch threads {args.threads}, {args.steps} timed RL steps per child (of {args.steps + 2}), "
              f"{args.repeats} children per variant interleaved; load average {os.getloadavg()[0]:.2f} on "
              f"{os.cpu_count()} CPUs", flush=True)
        names = [name for name in VARIANTS if name != "overlap0_1t" or args.threads > 1]
        where = (f"vLLM CPU server on core {SERVER_CORE}, trainer on core {TRAINER_CORE}, the rollout's client on "
                 f"core {SERVER_CORE if args.client == 'server' else TRAINER_CORE}")
        print(f"engine: {where if args.engine == 'vllm' else 'hf'}; settings for every variant: {args.set or 'none'}",
              flush=True)
        results: dict[str, list[dict]] = {name: [] for name in names}
        for repeat in range(args.repeats):
            for name in names:
                result = run_child(inputs, root / f"{name}-{repeat}", name, args)
                results[name].append(result)
                print(f"  {name} #{repeat} (threads {result['threads']}): s/step "
                      f"{[round(s, 2) for s in result['step_s']]} (CPU {[round(s, 2) for s in result['step_cpu_s']]}), "
                      f"run {result['run_s']:.1f} s, start {result['start_s']:.1f} s", flush=True)
    print_table(results, args.steps)
    same = {name: all(r["metrics"] == runs[0]["metrics"] and r["weights_sha256"] == runs[0]["weights_sha256"]
                      for r in runs) for name, runs in results.items()}
    print("same results within each variant (RL metrics of every step, final weights): "
          + ", ".join(f"{name} {'yes' if ok else 'NO'}" for name, ok in same.items()))
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
