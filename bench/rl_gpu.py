"""PARA-GRPO steps on one GPU at the Qwen3-VL-2B shape, bf16, `hf` rollout engine: rollout tokens/s and step split.

The project's RL worker (`paravt_core.rl.worker.train`, one rank, ZeRO `--zero-stage`) on a
random-weight 2B-shaped model (../shared/GPU.md) built from the tiny kit, with a prompt set
of --prompts questions on one generated 64 s 640x360 clip; --group episodes per prompt. Each
step's rollouts (main agents and sub-agents alike) run on the `hf` engine in bf16.

Reported per step: wall time split into rollout / reference pass / policy update (the worker's
`time_*_s` metrics), the main agents' generated tokens (episodes x mean generated length; a
sub-agent's summary is not counted) and rollout tokens/s. The random model rarely writes a valid tool call, so most episodes are one
generation of up to --max-new-tokens tokens: this measures the engine, not the agent.

--smoke runs the same code on the tiny model in fp32 (CPU allowed): it checks the script, not speed.

Run: python bench/rl_gpu.py [--steps 2] [--zero-stage 3] [--out result.json] [--set rl.shared_prefix=true]
Without a CUDA GPU (and no --smoke) it exits at once with status 2 saying so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

SYSTEM = "You answer questions about videos. Call crop_video to look closer."


def rl_rows(video: Path, n: int) -> list[dict]:
    rows = []
    for i in range(n):
        question = (f"<video>\nQuestion {i}: where is the block at the end?\nA. left\nB. right\n"
                    "Answer with the option letter only.")
        rows.append({"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                     "videos": [{"video": f"file://{video}"}],
                     "extra_info": json.dumps({"answer": "B", "question_type": "mcq", "question": question})})
    return rows


def overrides(tmp: Path, args) -> list[str]:
    dtype = "float32" if args.smoke else "bfloat16"
    return [f"run.output_dir={tmp / 'out'}", f"model.dtype={dtype}", f"rl.max_steps={args.steps}",
            f"rl.prompts_per_step={args.prompts}", f"rl.group_size={args.group}", f"rl.zero_stage={args.zero_stage}",
            "rl.checkpoint_every=1000", f"rl.rollout.max_new_tokens={args.max_new_tokens}",
            f"rl.rollout.subagent_max_new_tokens={args.max_new_tokens}", f"video.nframes={4 if args.smoke else 16}",
            f"video.max_pixels={6144 if args.smoke else 50176}",
            f"rl.gradient_checkpointing={str(args.checkpointing).lower()}", *args.set]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--zero-stage", type=int, default=3, choices=(0, 1, 2, 3))
    parser.add_argument("--checkpointing", action=argparse.BooleanOptionalAction, default=True,
                        help="rl.gradient_checkpointing (without it step 2 ran out of 80 GB at the 2B shape)")
    parser.add_argument("--smoke", action="store_true", help="the tiny model, CPU allowed: checks the script only")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override after the bench's own (repeatable), e.g. rl.shared_prefix=true")
    args = parser.parse_args()

    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu and not args.smoke:
        print("bench/rl_gpu.py: no CUDA GPU is visible; this benchmark measures GPU RL steps only",
              file=sys.stderr)
        return 2
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sft_gpu import write_video

    from paravt_core.config import load_config
    from paravt_core.dist.launch import free_port
    from paravt_core.model.shapes import build_shaped_model
    from paravt_core.model.tiny import TinyModelSpec, build_tiny_model
    from paravt_core.refs import ArtifactRef, content_hash
    from paravt_core.rl import stage
    from paravt_core.rl.worker import train

    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                       "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ[key] = value
    with tempfile.TemporaryDirectory(prefix="paravt-bench-rl-gpu-") as tmp_name:
        tmp = Path(tmp_name)
        started = time.perf_counter()
        tiny = build_tiny_model(TinyModelSpec(seed=0), tmp / "tiny")
        model_dir = tiny if args.smoke else build_shaped_model("2b", tiny, tmp / "model-2b")
        if on_gpu:
            torch.cuda.empty_cache()
        video = write_video(tmp / "clip.mp4", seconds=8 if args.smoke else 64)
        data = tmp / "rl"
        data.mkdir()
        pq.write_table(pa.Table.from_pylist(rl_rows(video, args.prompts * args.steps)), data / "rl.parquet")
        print(f"built the 2B-shaped model and data in {time.perf_counter() - started:.0f} s", flush=True)
        init = ArtifactRef(kind="sft_model", path=model_dir, sha256=content_hash(model_dir))
        rl_data = ArtifactRef(kind="rl_data", path=data, sha256=content_hash(data))
        cfg = load_config(REPO / "conf/pipeline/tiny.yaml", overrides(tmp, args))
        job = stage.make_job(cfg, init, rl_data, with_mlflow=False).model_copy(update={"steps_only": True})
        started = time.perf_counter()
        error = None
        try:
            train(job)
        except Exception as exc:  # e.g. out of memory in a later step: report the steps that finished
            error = f"{type(exc).__name__}: {str(exc)[-1500:]}"
            traceback.print_exc()  # where it failed, on stderr (the result keeps the message)
        wall = time.perf_counter() - started  # model loading and the steps; a timing run exports nothing
        metrics = job.out_dir / "metrics.jsonl"
        rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    steps = []
    for row in rows:
        generated = args.prompts * args.group * row["response_length"]  # main agents' generated tokens
        steps.append({"step": row.get("step"), "rollout_s": row["time_rollout_s"],
                      "reference_s": row["time_reference_s"], "train_s": row["time_train_s"],
                      "trajectories": row.get("trajectories"), "generated_tokens": generated,
                      "rollout_tokens_per_s": generated / row["time_rollout_s"] if row["time_rollout_s"] else None,
                      "kappa": row["kappa"], "loss": row["loss"]})
    result = {"device": torch.cuda.get_device_name(0) if on_gpu else "cpu", "smoke": args.smoke, "set": args.set,
              "zero_stage": args.zero_stage, "prompts": args.prompts, "group": args.group,
              "max_new_tokens": args.max_new_tokens, "wall_s_load_and_steps": wall,
              "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None, "steps": steps,
              "error": error}
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0 if error is None else 1


if __name__ == "__main__":
    raise SystemExit(main())
