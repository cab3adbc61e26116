"""The tiny RL step and the agentic evaluation: this tree against an older commit, side by side (issue #45).

Both trees run the same work in child processes, interleaved (old, new, old, new, ...),
with the same torch thread count, on inputs built once by this process:
- the tiny random-weight Qwen3-VL (`TinyModelSpec(seed=0)`, ~1.5 M parameters);
- RL: conf/pipeline/reproduce.yaml's RL section, its learning rate pinned (`PINNED`), the per-row
  path in `new` and `fast` (4 prompts x 4 rollouts, nFrames gating
  {2, 3, 4, 6}, 16-frame 1 fps crops, sub-agents trained, KL to the reference) on one rank,
  in process (`rl.worker.Trainer`, steps_only), 16 multiple-choice prompts on a 40 s clip;
- evaluation: the reproduction's eval settings (subagent tool mode, 6 overview frames,
  concurrency 16, greedy) on a --questions-row Video-MME-format split of the synthetic world.
The random model never writes a tool call, so each main agent's first turn is scripted to
two crop calls (as in bench/dispatch.py and bench/eval.py); the sub-agents and every other
turn run on the model. It never stops early either, so --main-tokens / --subagent-tokens
stand for the SFT policy's short turns (the reproduction allows 384 / 96).

Three variants run interleaved (old, new, fast, old, ...): `old` is the older tree, `new` this
tree as configured by default (its exact paths: `model.vision_dedupe: no_grad`), `fast` this
tree with the switches that change float rounding on as well (`model.vision_dedupe: always`,
`model.patch_embed: linear`, `model.prefill_attention: causal_rows`; docs/speed.md).

Per child: one warm-up RL step, then --steps timed steps (seconds per step), and one
warm-up evaluation, then one timed evaluation of the split. Wall and CPU seconds (the
child's process time: with one torch thread on a shared, loaded machine the steadier of the
two) are both reported. Both trees get `model.vision_attention: batched` (the old tree's RL
and evaluator ignore it; this tree applies it, docs/speed.md). Results must agree: the RL
metrics of every step (timings aside), the final policy weights (sha256 of the state
dict) and the evaluation's predictions of `old` and `new`; the bench stops with status 1
when they do not. `fast` is held to bounds instead: its largest metric and weight differences
from `old` and its share of equal predictions are printed.

`--kernels` says how far removing overhead alone could go: after its timed work each child runs
one more RL step and one more evaluation under torch.profiler and splits their CPU time into the
self time of the kernels of matrix products (mm, addmm, bmm, convolutions, forward and backward),
of attention (sdpa, forward and backward) and everything else (the profiler's own overhead
lands there). Old's unprofiled CPU seconds over a variant's product-and-attention seconds is
the largest ratio that variant could reach by cutting everything else to nothing while
computing the same products on the same tokens.

`--shared-prefix` adds a fourth variant, `shared`: this tree by default with `rl.shared_prefix: true`
(each group's shared prefix once in the policy and reference passes, issue #64; float rounding
only), interleaved with the others and held to bounds against `new` as `fast` is against `old`; with
--old also a fifth, `fast_shared` (both sets of switches), held to bounds against `fast`.

The RL step's wall time is also split into its phases as the trainer times them (rollout,
reference pass, policy pass with the update).

Old tree: `git worktree add --detach /tmp/h5-old 8f8d49a` (issue #45's baseline; issue #64's is
88dfe98, whose `paravt_core.dist` was one module), then
Run: `.venv/bin/python bench/rl_step.py --old /tmp/h5-old [--repeats 2] [--steps 2] [--threads 1] [--kernels]
[--shared-prefix]`.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SYSTEM = "You answer questions about videos. Call crop_video to look closer."
FIRST_TURN = ("<think>\nI should look closer.</think>\n"
              '<tool_call>{"name": "crop_video", "arguments": {"video_path": "v.mp4", "start_time": 2, '
              '"end_time": 10}}</tool_call>'
              '<tool_call>{"name": "crop_video", "arguments": {"video_path": "v.mp4", "start_time": 20, '
              '"end_time": 30}}</tool_call>')
SUBAGENT_MARK = "concise, factual summary"


def write_clip(path: Path, seconds: int = 40, fps: int = 2, size: tuple[int, int] = (240, 320)) -> Path:
    """A clip of a moving coloured block (content is irrelevant to the timing, its geometry is not)."""
    import av
    import numpy as np

    height, width = size
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(seconds * fps):
            image = np.full((height, width, 3), 40, dtype=np.uint8)
            x = (i * 9) % (width - 80)
            image[60:140, x:x + 80] = (200, (i * 5) % 256, 60)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


class ScriptedFirstTurn:
    """A main agent's first turn (its prompt holds no assistant turn yet) answers FIRST_TURN;
    sub-agents and later turns go to the model. Decided per request from its token ids."""

    def __init__(self, engine, tokenizer):
        self.engine, self.tokenizer = engine, tokenizer
        self.first_ids = tokenizer(FIRST_TURN, add_special_tokens=False)["input_ids"] + [
            tokenizer.convert_tokens_to_ids("<|im_end|>")]
        self.assistant = tokenizer("<|im_start|>assistant", add_special_tokens=False)["input_ids"]

    def _first_turn(self, request) -> bool:
        ids, n = request.prompt_ids, len(self.assistant)
        turns = sum(ids[i:i + n] == self.assistant for i in range(len(ids) - n + 1))
        return turns == 1 and SUBAGENT_MARK not in self.tokenizer.decode(ids[:400])

    def generate(self, requests, params):
        from paravt_core.agent.engine import Generation

        first = [self._first_turn(r) for r in requests]
        if not any(first):
            return self.engine.generate(requests, params)
        if not all(first):
            raise RuntimeError("the episodes of a batch are in lock step: all first turns or none")
        return [Generation(list(self.first_ids), [-1.0] * len(self.first_ids), "stop") for _ in requests]

    def update_weights(self, state_dict) -> None:
        self.engine.update_weights(state_dict)


def build_inputs(root: Path, questions: int) -> dict:
    """The model, the RL prompts and the eval split, built once with this tree's code."""
    from paravt_core.data import stage as data_stage

    inputs = build_rl_inputs(root)
    cfg = _config(REPO, root / "world", questions)
    data = data_stage.run(cfg, progress=False).eval
    return {**inputs, "eval_data": str(data.path), "eval_sha256": data.sha256}


def build_rl_inputs(root: Path) -> dict:
    """The tiny model and the RL prompts (16 multiple-choice questions on one 40 s clip)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from paravt_core.model.tiny import TinyModelSpec, build_tiny_model

    model = build_tiny_model(TinyModelSpec(seed=0), root / "tiny")
    clip = write_clip(root / "clip.mp4")
    rl = root / "rl"
    rl.mkdir()
    rows = []
    for i in range(16):
        question = (f"<video>\nQuestion {i}: what colour was the block?\nA. red\nB. blue\n"
                    "Answer with the option letter only.")
        rows.append({"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                     "videos": [{"video": f"file://{clip}"}],
                     "extra_info": json.dumps({"answer": "A", "question_type": "mcq", "question": question})})
    pq.write_table(pa.Table.from_pylist(rows), rl / "rl.parquet")
    return {"model": str(model), "rl": str(rl)}


MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mkldnn_convolution",
              "aten::_mkldnn_convolution", "aten::convolution_backward", "aten::_convolution"}
ATTENTION_OPS = {"aten::_scaled_dot_product_flash_attention_for_cpu",
                 "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}


class KernelSplit:
    """CPU seconds of a block, and under `--kernels` its profiler split: self CPU time of the matrix
    product kernels, of the attention kernels, and of everything else."""

    def __init__(self, profiled: bool):
        self.profiled, self.split = profiled, {}

    def __enter__(self):
        self.cpu, self.wall = time.process_time(), time.perf_counter()
        if self.profiled:
            from torch.profiler import ProfilerActivity, profile

            self.prof = profile(activities=[ProfilerActivity.CPU])
            self.prof.__enter__()
        return self

    def __exit__(self, *exc):
        if self.profiled:
            self.prof.__exit__(*exc)
        self.cpu_s, self.wall_s = time.process_time() - self.cpu, time.perf_counter() - self.wall
        if self.profiled and exc[0] is None:
            ops = [(e.key, e.self_cpu_time_total / 1e6) for e in self.prof.key_averages()]
            matmul = sum(t for key, t in ops if key in MATMUL_OPS)
            attention = sum(t for key, t in ops if key in ATTENTION_OPS)
            self.split = {"cpu_s": self.cpu_s, "matmul_s": matmul, "attention_s": attention,
                          "rest_s": self.cpu_s - matmul - attention}
        return False


# The trainer's own wall seconds of a step's three phases (rl.worker.Trainer.train_step's `time_*`).
PHASES = {"time_rollout_s": "rollout", "time_reference_s": "reference pass", "time_train_s": "policy pass and update"}
FAST = ["model.vision_dedupe=always", "model.patch_embed=linear", "model.prefill_attention=causal_rows"]
# The settings each variant of this tree adds (`old` runs the older tree as it is). `new` and `fast`
# keep the per-row path: reproduce.yaml turned `rl.shared_prefix` on after 88dfe98 (3451871).
PER_ROW = ["rl.shared_prefix=false"]
VARIANT_SETTINGS = {"old": [], "new": PER_ROW, "fast": [*FAST, *PER_ROW], "shared": ["rl.shared_prefix=true"],
                    "fast_shared": [*FAST, "rl.shared_prefix=true"]}
# Pinned in every child, both trees: reproduce.yaml's RL settings that moved since the baselines (its
# learning rate, 1e-4 until 3451871), so the trees train alike and `new` can be held to `old` bit for bit.
PINNED = ["rl.learning_rate=5.0e-5"]


def _config(tree: Path, out: Path, questions: int, main_tokens: int = 64, subagent_tokens: int = 48,
            extra: list[str] | None = None):
    from paravt_core.config import load_config

    return load_config(tree / "conf/pipeline/reproduce.yaml", [*PINNED, *(extra or []),
        f"run.output_dir={out}", "data.synth.train_videos=4", f"data.synth.eval_videos_per_split={questions}",
        f"data.synth.eval_rows_per_split={questions}", "data.synth.validation=false", "eval.splits=[videomme]",
        "model.pretrain.enabled=false", "model.pretrain.sft_replay_rows=0", "model.vision_attention=batched",
        "rl.max_steps=100",
        "rl.checkpoint_every=1000", f"rl.rollout.max_new_tokens={main_tokens}",
        f"rl.rollout.subagent_max_new_tokens={subagent_tokens}", f"eval.max_new_tokens={main_tokens}"])


def child(args) -> None:
    """Run in a child process with the tree under test first on PYTHONPATH; prints one JSON line."""
    import torch

    torch.set_num_threads(args.threads)
    if hasattr(importlib.import_module("paravt_core.dist"), "__path__"):  # this tree: a package
        from paravt_core.dist.launch import free_port
        from paravt_core.dist.rank import shutdown_distributed
    else:  # 88dfe98 and before: one module
        from paravt_core.dist import free_port, shutdown_distributed
    from paravt_core.eval import stage as eval_stage
    from paravt_core.eval.evaluator import EvalSettings, HFSampleRunner
    from paravt_core.refs import ArtifactRef
    from paravt_core.rl import worker as rl_worker

    inputs = json.loads(Path(args.inputs).read_text())
    tree = Path(args.tree)
    out = Path(args.out)
    cfg = _config(tree, out, args.questions, args.main_tokens, args.subagent_tokens, VARIANT_SETTINGS[args.variant])
    model_dir = Path(inputs["model"])
    job, init = single_rank_job(cfg, inputs, free_port)
    trainer = rl_worker.Trainer(job)
    trainer.engine = ScriptedFirstTurn(trainer.engine, trainer.processor.tokenizer)
    trainer.train_step(0)  # warm-up
    rows, step_s, step_cpu, step_split, phases = [], [], [], {}, []
    for step in range(1, args.steps + 1 + args.kernels):
        profiled = step > args.steps  # under --kernels, one more step, profiled, after the timed ones
        with KernelSplit(profiled) as timed:
            row = trainer.train_step(step)
        if profiled:
            step_split = timed.split
        else:
            step_s.append(timed.wall_s)
            step_cpu.append(timed.cpu_s)
            phases.append({k: v for k, v in row.items() if k in PHASES})
        rows.append({k: v for k, v in sorted(row.items()) if not k.startswith("time_")})
    state = trainer.policy.module.state_dict()
    torch.save({name: value.detach().cpu() for name, value in state.items()}, out / "weights.pt")
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].detach().cpu().contiguous().numpy().tobytes())
    shutdown_distributed()

    model = ArtifactRef(kind="model", path=model_dir, sha256=init.sha256)
    data = ArtifactRef(kind="eval_data", path=Path(inputs["eval_data"]), sha256=inputs["eval_sha256"])
    if importlib.util.find_spec("paravt_core.agent.hf_build"):  # this tree builds it from the config (#63)
        engine, processor = eval_stage.hf_engine(cfg, model)
    else:  # the baseline, from the dtype alone
        engine, processor = eval_stage.hf_engine(model, cfg.model.dtype)
    runner = HFSampleRunner(ScriptedFirstTurn(engine, processor.tokenizer), processor, EvalSettings.from_pipeline(cfg))
    eval_s, eval_cpu, predictions, eval_split = [], [], [], {}
    for attempt in ("warm-up", "timed", *(["profiled"] if args.kernels else [])):
        run_cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"output_dir": out / f"eval-{attempt}"})})
        with KernelSplit(attempt == "profiled") as timed:
            eval_stage.evaluate_prepared_split(run_cfg, model, data, "videomme", runner=runner, progress=False)
        if attempt == "profiled":
            eval_split = timed.split
            continue
        eval_s.append(timed.wall_s)
        eval_cpu.append(timed.cpu_s)
        records = json.loads(next((out / f"eval-{attempt}").rglob("videomme.json")).read_text())["samples"]
        predictions = [[r.get("id", r.get("sample_id")), r["response"]] for r in records]
    print("BENCH " + json.dumps({"rl_step_s": step_s, "rl_step_cpu_s": step_cpu, "rl_metrics": rows,
                                 "weights_sha256": digest.hexdigest(), "eval_s": eval_s[-1], "eval_cpu_s": eval_cpu[-1],
                                 "eval_predictions": predictions, "rl_step_split": step_split,
                                 "eval_split": eval_split, "rl_phase_s": phases}), flush=True)


def single_rank_job(cfg, inputs: dict, free_port):
    """(the RL job of one in-process rank on the bench's inputs, steps only; the SFT model's ref), with the
    rank's environment set. Imports from whichever tree the child runs (`free_port`: that tree's)."""
    from paravt_core.refs import ArtifactRef, content_hash
    from paravt_core.rl import stage

    model_dir = Path(inputs["model"])
    init = ArtifactRef(kind="sft_model", path=model_dir, sha256=content_hash(model_dir))
    rl_data = ArtifactRef(kind="rl_data", path=Path(inputs["rl"]), sha256=content_hash(Path(inputs["rl"])))
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                       "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ[key] = value
    return stage.make_job(cfg, init, rl_data, with_mlflow=False).model_copy(update={"steps_only": True}), init


def run_child(tree: Path, inputs: Path, out: Path, args) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": str(args.threads)}
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--tree", str(tree), "--inputs",
               str(inputs), "--out", str(out), "--threads", str(args.threads), "--steps", str(args.steps),
               "--questions", str(args.questions), "--main-tokens", str(args.main_tokens),
               "--subagent-tokens", str(args.subagent_tokens), "--variant", args.variant_of_child,
               *(["--kernels"] if args.kernels else [])]
    return child_result(command, env, f"bench/rl_step.py: the child on {tree}")


def child_result(command: list[str], env: dict[str, str], what: str) -> dict:
    """Run a bench child and return the JSON of its last `BENCH ` line; exit naming `what` when it fails."""
    done = subprocess.run(command, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    lines = [line for line in done.stdout.splitlines() if line.startswith("BENCH ")]
    if done.returncode != 0 or not lines:
        sys.exit(f"{what} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("BENCH "))


def print_phase_split(results: dict[str, list[dict]], first: str) -> None:
    """Where the RL step's wall time went: the trainer's own timing of its rollout, reference pass and
    policy pass with the update (medians over every timed step of every child), and each phase's
    ratio against the first variant; the step's rest (batching, logging) is the remainder."""
    names = list(results)
    print(f"| RL step phase, wall (median) | {' | '.join(f'{name} s' for name in names)} | "
          f"{' | '.join(f'{first} / {name}' for name in names if name != first)} |")
    print("|---" * (2 * len(names)) + "|")
    for key, label in PHASES.items():
        median = {name: statistics.median(p[key] for r in results[name] for p in r["rl_phase_s"]) for name in names}
        ratios = " | ".join(f"{median[first] / median[name]:.2f}x" for name in names if name != first)
        print(f"| {label} | {' | '.join(f'{median[name]:.2f}' for name in names)} | {ratios} |")


def print_kernel_split(results: dict[str, list[dict]]) -> None:
    """Under --kernels: the profiled CPU seconds split by kernel, medians over the children, and the
    ratio each variant could reach with everything but its products and attention cut to nothing
    (against the first variant's unprofiled, timed CPU seconds: old, or new without --old)."""
    print("| block | variant | profiled CPU s | matrix products s | attention s | everything else s | "
          "old (unprofiled) / (products + attention) |")
    print("|---|---|---|---|---|---|---|")
    for label, key in (("RL step", "rl_step_split"), ("evaluation", "eval_split")):
        medians = {}
        for name in results:
            splits = [s for r in results[name] for s in _as_list(r[key])]
            medians[name] = {k: statistics.median(s[k] for s in splits) for k in splits[0]}
        timed_key = "rl_step_cpu_s" if key == "rl_step_split" else "eval_cpu_s"
        old_cpu = statistics.median(s for r in results[next(iter(results))] for s in _as_list(r[timed_key]))
        for name, m in medians.items():
            bound = old_cpu / (m["matmul_s"] + m["attention_s"])
            print(f"| {label} | {name} | {m['cpu_s']:.2f} | {m['matmul_s']:.2f} | {m['attention_s']:.2f} | "
                  f"{m['rest_s']:.2f} | {bound:.2f}x |")


def _as_list(value) -> list[float]:
    return value if isinstance(value, list) else [value]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, help="the older tree (a worktree of the baseline commit)")
    parser.add_argument("--repeats", type=int, default=2, help="child runs per tree, interleaved")
    parser.add_argument("--steps", type=int, default=2, help="timed RL steps per child (after one warm-up step)")
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--main-tokens", type=int, default=64)
    parser.add_argument("--subagent-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kernels", action="store_true",
                        help="after the timed work, one more step and evaluation under torch.profiler, their CPU time "
                        "split by kernel (module docstring)")
    parser.add_argument("--shared-prefix", action="store_true",
                        help="a fourth variant, this tree with rl.shared_prefix: true (module docstring)")
    parser.add_argument("--variants", help="run only these variants (comma-separated; `old` and `new` always run: "
                        "they are the exactness check), e.g. old,new,shared")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    parser.add_argument("--inputs", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="new", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0
    if args.old is None and args.shared_prefix:  # the switch alone: new against shared, this tree only
        trees = {"new": REPO, "shared": REPO}
    elif args.old is None or not (args.old / "paravt_core").is_dir():
        print("bench/rl_step.py: --old must be a checkout of the baseline (git worktree add --detach /tmp/h2-old "
              "8f8d49a), or give --shared-prefix alone", file=sys.stderr)
        return 2
    else:
        trees = {"old": args.old.resolve(), "new": REPO, "fast": REPO,
                 **({"shared": REPO, "fast_shared": REPO} if args.shared_prefix else {})}
    if args.variants:
        wanted = {"new", *(["old"] if "old" in trees else []), *args.variants.split(",")}
        unknown = wanted - set(trees)
        if unknown:
            print(f"bench/rl_step.py: --variants names {sorted(unknown)}, not among this run's {list(trees)}",
                  file=sys.stderr)
            return 2
        trees = {name: tree for name, tree in trees.items() if name in wanted}
    first = next(iter(trees))  # the baseline of the ratios and of the exactness check
    with tempfile.TemporaryDirectory(prefix="paravt-bench-rl-step-") as tmp:
        root = Path(tmp)
        inputs = root / "inputs.json"
        inputs.write_text(json.dumps(build_inputs(root, args.questions)))
        print(f"torch threads {args.threads}, {args.steps} timed RL steps and one evaluation of {args.questions} "
              f"questions per child, {args.repeats} children per tree interleaved; load average "
              f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
        results: dict[str, list[dict]] = {name: [] for name in trees}
        weights: dict[str, object] = {}
        for repeat in range(args.repeats):
            for name, tree in trees.items():
                args.variant_of_child = name
                result = run_child(tree, inputs, root / f"{name}-{repeat}", args)
                results[name].append(result)
                weights.setdefault(name, torch.load(root / f"{name}-{repeat}" / "weights.pt"))
                print(f"  {name} #{repeat}: RL s/step {[round(s, 2) for s in result['rl_step_s']]} (CPU "
                      f"{[round(s, 2) for s in result['rl_step_cpu_s']]}), eval {result['eval_s']:.2f} s (CPU "
                      f"{result['eval_cpu_s']:.2f})", flush=True)
    reference = results[first][0]
    # Metrics both trees log (a later tree logs more, e.g. the decision token's split, #62); the ones only
    # one tree has are named below the table.
    shared_keys = set(reference["rl_metrics"][0]) & set(results["new"][0]["rl_metrics"][0])
    same = all([{k: row[k] for k in shared_keys} for row in r["rl_metrics"]] ==
               [{k: row[k] for k in shared_keys} for row in reference["rl_metrics"]] and
               r["weights_sha256"] == reference["weights_sha256"] and
               r["eval_predictions"] == reference["eval_predictions"] for r in results[first] + results["new"])
    others = [name for name in trees if name != first]
    print(f"| measure (median) | {' | '.join(f'{name} s' for name in trees)} | "
          f"{' | '.join(f'{first} / {name}' for name in others)} |")
    print("|---" * (len(trees) + len(others) + 1) + "|")
    for label, key in (("RL step, wall", "rl_step_s"), ("RL step, CPU", "rl_step_cpu_s"),
                       (f"evaluation of {args.questions}, wall", "eval_s"),
                       (f"evaluation of {args.questions}, CPU", "eval_cpu_s")):
        median = {name: statistics.median(s for r in results[name] for s in _as_list(r[key])) for name in trees}
        times = " | ".join(f"{median[name]:.2f}" for name in trees)
        ratios = " | ".join(f"{median[first] / median[name]:.2f}x" for name in others)
        print(f"| {label} | {times} | {ratios} |")
    print_phase_split(results, first)
    if args.kernels:
        print_kernel_split(results)
    only = sorted(set(results["new"][0]["rl_metrics"][0]) ^ set(reference["rl_metrics"][0]))
    if only:
        print(f"RL metrics logged by one tree only (not compared): {', '.join(only)}")
    print(f"same results, new against {first} (RL metrics of every step, final weights, eval predictions): "
          f"{'yes' if same else 'NO'}")
    for name, against in (("fast", "old"), ("shared", "new"), ("fast_shared", "fast")):
        if against not in results:
            continue
        for r in results.get(name, []):
            base = results[against][0]
            metric_gap = max(abs(a[k] - b[k]) for a, b in zip(r["rl_metrics"], base["rl_metrics"]) for k in a if k in b)
            weight_gap = max(float((weights[name][k] - weights[against][k]).abs().max()) for k in weights[against])
            equal = sum(a == b for a, b in zip(r["eval_predictions"], base["eval_predictions"]))
            print(f"{name} against {against}: largest RL metric difference {metric_gap:.3g}, largest weight "
                  f"difference {weight_gap:.3g} after {args.steps + 1 + args.kernels} steps, {equal} of "
                  f"{len(r['eval_predictions'])} predictions equal")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
