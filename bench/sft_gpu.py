"""SFT on one GPU at the Qwen3-VL-2B shape: tokens/s, MFU, GPU busy % and peak memory of switch sets vs the stock ceiling.

All sides train the same samples on the same random-weight 2B-shaped model (../shared/GPU.md:
2.13 B parameters, the tiny kit's tokenizer and processor): a 64 s 640x360 video sampled at
1 fps with at most 50,176 pixels per frame (64 frames of 160x288, each a timestamped image
item) and a multi-turn text: 5,150 tokens per sample with the tiny tokenizer (the same under
transformers 5.17 and 5.23, measured on CPU; GPU.md's sample, frames as one video item, had 3,363).
- variants (`--variants`, table VARIANTS): the project's SFT worker through the DeepSpeed
  launcher, one rank, the whole step (forward, backward, optimizer), each a set of switches:
  ZeRO stage, activation checkpointing, `sft.loss_impl`, `sft.liger_kernels`, `sft.packing`
  with micro-batch x accumulation at the same samples per step. A timing run (`steps_only`):
  no checkpoint, no export.
- ceiling: stock transformers forward+backward of one encoded sample (batch 1, no
  checkpointing, no KV cache, the model's own loss), no optimizer: GPU.md's "stock ceiling".
- issue #47's switches (`-pin`, `-bf16px`, `-compile`, `-all` after `z2-fast-vb-w4`): each row
  also gives its rate and largest step-loss difference against the first variant of the run,
  so list the variant without the switch first; a switch is kept only where it is faster and
  its losses equal.
- profiles: `--profile` one stock micro-step, `--profile-step` the first variant's second step
  in the project's worker (the whole step: data workers, copies, DeepSpeed's hooks, the
  optimizer), its rate then left out of the median.

MFU = 6 x trainable parameters x tokens per step / step time / 989e12 (H100 dense bf16 peak).
Tokens are the language model's sequence positions (text tokens plus the merged visual
tokens); the vision patches are not counted as tokens, while the vision tower's parameters
are in the parameter count: the convention of the GPU.md figures, not an exact FLOP count.
The first step of each side is warm-up and left out. GPU busy % is NVML's utilization,
sampled every 0.2 s while a variant runs (model loading included).

--smoke runs the same code on the tiny model (CPU allowed, fp32, the variants that need no
CUDA): it checks the script, not speed.

Run: make bench-gpu, or python bench/sft_gpu.py [--variants z2,z2-fast] [--steps 4] [--out result.json]
Without a CUDA GPU (and no --smoke) it exits at once with status 2 saying so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

H100_BF16_PEAK = 989e12
REPO = Path(__file__).resolve().parents[1]

# Lever lists the variants are made of.
Z2, Z3 = ["sft.zero_stage=2"], ["sft.zero_stage=3"]
CKPT, NO_CKPT = ["sft.gradient_checkpointing=true"], ["sft.gradient_checkpointing=false"]
LIGER = ["sft.loss_impl=liger", "sft.liger_kernels=true"]  # fused loss + RMSNorm/RoPE
CHUNKED_LIGER = ["sft.loss_impl=chunked", "sft.liger_kernels=true"]  # ZeRO-3 cannot run Liger's loss
PACK2 = ["sft.packing=true", "sft.micro_batch_size=2", "sft.grad_accum_steps=4"]
VB, W4 = ["model.vision_attention=batched"], ["sft.data_workers=4"]
NO_HP = ["sft.host_positions=false"]  # positions computed in the forward, as transformers does (on by default)
# Issue #47's switches, each measured alone against z2-fast-vb-w4 and all together.
PIN, BF16PX, COMPILE = ["sft.pin_memory=true"], ["sft.host_pixel_dtype=bfloat16"], ["sft.compile_text_layers=true"]
BASE = Z2 + NO_CKPT + LIGER + VB + W4

# name -> (description, config overrides). Every variant trains micro x accum = 8 samples per step.
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "z2": ("ZeRO-2, checkpointing, full-logits loss (the GPU.md baseline)", Z2 + CKPT + ["sft.loss_impl=logits"]),
    "z3": ("ZeRO-3, checkpointing, full-logits loss", Z3 + CKPT + ["sft.loss_impl=logits"]),
    "z2-fast": ("ZeRO-2, no checkpointing, Liger fused loss + RMSNorm/RoPE", Z2 + NO_CKPT + LIGER),
    "z2-fast-pack2": ("ZeRO-2, no checkpointing, Liger, 2 samples packed per micro-batch",
                      Z2 + NO_CKPT + LIGER + PACK2),
    "z2-fast-vb": ("z2-fast with the vision attention batched over equal-sized frames", Z2 + NO_CKPT + LIGER + VB),
    "z2-fast-vb-w4": ("z2-fast-vb with 4 data workers encoding the next micro-batches", Z2 + NO_CKPT + LIGER + VB + W4),
    "z2-fast-vb-w4-pin": ("z2-fast-vb-w4 with page-locked batches copied without blocking", BASE + PIN),
    "z2-fast-vb-w4-bf16px": ("z2-fast-vb-w4 with the pixel values cast to bf16 on the host", BASE + BF16PX),
    "z2-fast-vb-w4-compile": ("z2-fast-vb-w4 with torch.compile of the text decoder layers", BASE + COMPILE),
    "z2-fast-vb-w4-all": ("z2-fast-vb-w4 with pinned batches, bf16 host pixels and compiled text layers",
                          BASE + PIN + BF16PX + COMPILE),
    "z2-fast-vb-w4-nohp": ("z2-fast-vb-w4 with the positions computed in the forward (sft.host_positions off)",
                           Z2 + NO_CKPT + LIGER + VB + W4 + NO_HP),
    "z3-fast-vb-w4": ("ZeRO-3, no checkpointing, chunked loss, Liger RMSNorm/RoPE, batched vision, 4 data workers",
                      Z3 + NO_CKPT + CHUNKED_LIGER + VB + W4),
    "z2-vb-ckpt": ("ZeRO-2, checkpointing, Liger, batched vision attention (memory-safe for larger shapes)",
                   Z2 + CKPT + LIGER + VB),
    "z3-fast": ("ZeRO-3, no checkpointing, chunked loss + Liger RMSNorm/RoPE", Z3 + NO_CKPT + CHUNKED_LIGER),
    "z2-chunked": ("ZeRO-2, no checkpointing, chunked loss, no Liger", Z2 + NO_CKPT + ["sft.loss_impl=chunked"]),
    # One lever at a time against z2, for each switch's own effect:
    "z2-nockpt": ("ZeRO-2, no checkpointing, full-logits loss", Z2 + NO_CKPT + ["sft.loss_impl=logits"]),
    "z2-liger-loss": ("ZeRO-2, no checkpointing, Liger fused loss only", Z2 + NO_CKPT + ["sft.loss_impl=liger"]),
    "z2-pack2-ckpt": ("ZeRO-2, checkpointing, Liger, 2 samples packed per micro-batch", Z2 + CKPT + LIGER + PACK2),
    # --smoke (CPU): the switches that need no CUDA.
    "cpu-z0": ("ZeRO-0, full-logits loss", ["sft.zero_stage=0", "sft.loss_impl=logits"]),
    "cpu-z0-vb": ("ZeRO-0, full-logits loss, batched vision attention, 1 data worker",
                  ["sft.zero_stage=0", "sft.loss_impl=logits", *VB, "sft.data_workers=1"]),
    "cpu-z0-switches": ("ZeRO-0, full-logits loss, 1 data worker, pinned batches (nothing to pin on a CPU) and "
                        "compiled text layers",
                        ["sft.zero_stage=0", "sft.loss_impl=logits", "sft.data_workers=1", *PIN, *COMPILE]),
    "cpu-z0-pack2": ("ZeRO-0, chunked loss, 2 samples packed",
                     ["sft.zero_stage=0", "sft.loss_impl=chunked", "sft.packing=true", "sft.micro_batch_size=2",
                      "sft.grad_accum_steps=1"]),
}
DEFAULT_VARIANTS = "z2,z2-fast,z3-fast,z2-fast-pack2"


def write_video(path: Path, seconds: int = 64, fps: int = 2, size: tuple[int, int] = (360, 640),
                gop: int | None = None) -> Path:
    """A 640x360 clip of moving colour blocks (content is irrelevant to the timing, its geometry is not);
    `gop`: frames per keyframe (the encoder's default when None)."""
    import av
    import numpy as np

    height, width = size
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if gop is not None:
            stream.codec_context.gop_size = gop
        for i in range(seconds * fps):
            img = np.full((height, width, 3), 40, dtype=np.uint8)
            x = (i * 9) % (width - 80)
            img[100:180, x : x + 80] = (200, (i * 5) % 256, 60)
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def conversation(video: Path, tokenizer, text_tokens: int) -> list[dict]:
    """A ParaVT-style multi-turn trace whose texts add up to about `text_tokens` tokens."""
    reasoning = ("The overview shows a coloured block moving from left to right across a dark frame; "
                 "I compare its position at each timestamp to decide when it crosses the centre. ")
    rounds = []
    for r in range(64):
        rounds += [
            {"role": "assistant", "content": f"<think>{reasoning * 3}</think>"
             f'<tool_call>{{"name": "crop_video", "arguments": {{"video_path": "{video.name}", '
             f'"start_time": {r % 60}, "end_time": {r % 60 + 4}}}}}</tool_call>'},
            {"role": "tool", "content": f"From {r % 60} s to {r % 60 + 4} s the block moves right. " * 4},
        ]
        count = sum(len(tokenizer(m["content"])["input_ids"]) for m in rounds)
        if count >= text_tokens - 60:
            break
    return [
        {"role": "user", "content": [{"type": "video_url", "url": f"file://{video}"},
                                     {"type": "text", "text": "When does the block cross the centre? A. 10 s B. 30 s"}]},
        *rounds,
        {"role": "assistant", "content": "<think>It crosses near 30 s.</think><answer>B</answer>"},
    ]


def prepare(tmp: Path, rows: int, args) -> tuple:
    """(config builder, base model ref, SFT data ref) for the 2B shape, or the tiny model under --smoke."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from paravt_core.config import load_config
    from paravt_core.model.loading import load_processor
    from paravt_core.model.shapes import build_shaped_model
    from paravt_core.model.tiny import TinyModelSpec, build_tiny_model
    from paravt_core.refs import ArtifactRef, content_hash

    tiny = build_tiny_model(TinyModelSpec(seed=0), tmp / "tiny")
    if args.smoke:
        model_dir = tiny
    else:
        import torch

        model_dir = build_shaped_model("2b", tiny, tmp / "model-2b")
        torch.cuda.empty_cache()  # the launched worker needs the memory this process cached building it
    video = write_video(tmp / "clip.mp4", seconds=8 if args.smoke else 64)
    # The message texts; the template's role tags and per-frame timestamps bring the sample to 5,150 tokens.
    messages = conversation(video, load_processor(tiny).tokenizer, text_tokens=200 if args.smoke else 1435)
    data = tmp / "sft"
    data.mkdir()
    pq.write_table(pa.Table.from_pylist([{"messages": json.dumps(messages), "videos": [str(video)]}] * rows),
                   data / "bench.parquet")
    shape = (["model.dtype=float32", "video.sft_max_frames=4", "video.max_pixels=6144"] if args.smoke else
             ["model.dtype=bfloat16", "video.sft_max_frames=64", "video.max_pixels=50176"])

    def config(name: str, overrides: list[str]):
        return load_config(REPO / "conf/pipeline/tiny.yaml", [
            f"run.output_dir={tmp / 'out'}", f"run.name={name}", f"model.attn_implementation={args.attention}",
            "video.sft_fps=1", *shape, "sft.max_seq_len=16384", "sft.micro_batch_size=1",
            f"sft.grad_accum_steps={args.accum}", f"sft.max_steps={args.steps}",
            f"sft.checkpoint_every={10 * args.steps}", "sft.warmup_ratio=0.0", "sft.learning_rate=2e-5", *overrides,
        ])

    base = ArtifactRef(kind="base_model", path=model_dir, sha256=content_hash(model_dir))
    sft_data = ArtifactRef(kind="sft_data", path=data, sha256=content_hash(data))
    return config, base, sft_data


class BusySampler:
    """NVML GPU utilization every 0.2 s in a thread; `mean()` over the samples taken."""

    def __init__(self):
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._pynvml = pynvml
        except Exception:  # no NVML (CPU smoke run): nothing to sample
            self._handle = None

    def __enter__(self) -> BusySampler:
        if self._handle is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.samples.append(self._pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def mean(self) -> float | None:
        return statistics.mean(self.samples) if self.samples else None


def ours(cfg, base, sft_data, name: str, profile_to: Path | None = None) -> tuple[list[dict], dict]:
    """(losses.jsonl rows, last memory record) of a timing run of the project's SFT worker;
    `profile_to`: the worker writes torch.profiler's table of its second step there."""
    from paravt_core.atomic import atomic_write_text
    from paravt_core.dist.launch import launch_workers
    from paravt_core.sft import stage
    from paravt_core.sft.job import SFTJob

    out = (cfg.run.output_dir / "bench" / name).resolve()
    out.mkdir(parents=True)
    job = SFTJob(config=cfg, base_model=base.path, base_model_sha256=base.sha256,
                 data_files=stage.sft_shards(sft_data), data_sha256=sft_data.sha256, out_dir=out,
                 frame_cache_dir=(cfg.run.output_dir / "cache" / "frames").resolve(), tracking_uri=None,
                 mlflow_run_id=None, git_revision="bench", steps_only=True, profile_to=profile_to)
    job_file = atomic_write_text(out / "job.json", job.model_dump_json(indent=2))
    launch_workers(stage.WORKER, ["--job", str(job_file)], 1, None, lambda line: print(f"  [{name}] {line}"))
    rows = [json.loads(line) for line in (out / "losses.jsonl").read_text().splitlines()]
    memory = json.loads((out / "memory" / "rank0.json").read_text())
    return rows, max(memory, key=lambda row: row.get("peak_device_bytes") or 0)


def _timed(fn, reps: int, on_gpu: bool) -> float:
    """Median seconds of `fn()` over `reps` runs after one warm-up run."""
    import torch

    times = []
    for _ in range(reps + 1):
        if on_gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if on_gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def ceiling(cfg, base, sft_data, steps: int, device: str, profile_to: Path | None = None) -> dict:
    """Stock forward+backward per step (first left out): as transformers runs it, then with the batched
    vision attention, then also with the positions computed on the host (`sft.host_positions`); the
    vision tower's own forward+backward without and with batching; optionally a profile of one
    micro-step of the last. Trainable parameters, tokens per sample and peak GiB beside them."""
    import torch

    from paravt_core.model.loading import load_model, load_processor
    from paravt_core.model.positions import HostPositions
    from paravt_core.model.vision_attention import apply_vision_attention
    from paravt_core.sft import stage
    from paravt_core.sft.dataset import FrameCache, FrameSampling, OverlongPolicy, SFTDataset, read_sft_rows
    from paravt_core.sft.encode import collate

    processor = load_processor(base.path)
    model = load_model(base.path, dtype=cfg.model.dtype, device=device,
                       attn_implementation=cfg.model.attn_implementation)
    model.train()
    dataset = SFTDataset(read_sft_rows(stage.sft_shards(sft_data)), processor,
                         FrameCache(cfg.run.output_dir / "cache" / "frames", FrameSampling.from_config(cfg.video)),
                         OverlongPolicy(cfg.sft.max_seq_len, cfg.sft.overlong))
    host_batch = collate([dataset.encode(0)], processor.tokenizer.pad_token_id)
    batch = {k: v.to(device) for k, v in host_batch.items()}
    tokens = int(batch["attention_mask"].sum())
    on_gpu = device == "cuda"
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()

    def micro_step():
        model(**batch, use_cache=False).loss.backward()

    def vision_step():
        out = model.model.visual(batch["pixel_values"], grid_thw=batch["image_grid_thw"])
        hidden = out.pooler_output if hasattr(out, "pooler_output") else out[0]
        hidden.float().square().mean().backward()

    def rates() -> list[float]:
        measured = []
        for _ in range(steps):
            if on_gpu:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(cfg.sft.grad_accum_steps):
                micro_step()
            if on_gpu:
                torch.cuda.synchronize()
            measured.append(tokens * cfg.sft.grad_accum_steps / (time.perf_counter() - t0))
            model.zero_grad(set_to_none=True)
        return measured[1:]

    stock = rates()
    peak = torch.cuda.max_memory_allocated() / 2**30 if on_gpu else float("nan")
    vision_stock = _timed(vision_step, 2, on_gpu)
    model.zero_grad(set_to_none=True)
    apply_vision_attention(model, "batched")
    batched = rates()
    vision_batched = _timed(vision_step, 2, on_gpu)
    model.zero_grad(set_to_none=True)
    batch = {k: v.to(device) for k, v in HostPositions.of(model).add_to(host_batch).items()}
    hosted = rates()
    if profile_to is not None:
        from paravt_core.sft.step_profile import profiled

        try:
            micro_step()  # warm
            profile_to.write_text(profiled(micro_step, on_gpu))
        except Exception as exc:  # the profile is a help for reading the figures, not one of them
            profile_to.write_text(f"profiling failed: {exc!r}\n")
        model.zero_grad(set_to_none=True)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    del model
    if on_gpu:
        torch.cuda.empty_cache()
    return {"stock": stock, "batched_vision": batched, "host_positions": hosted, "vision_fwd_bwd_s": vision_stock,
            "vision_fwd_bwd_batched_s": vision_batched, "trainable": trainable, "tokens": tokens, "peak_gib": peak}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma-separated, of {sorted(VARIANTS)}")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--accum", type=int, default=8)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--attention", default="sdpa", choices=("sdpa", "flash_attention_2", "eager"))
    parser.add_argument("--profile", type=Path, default=None,
                        help="write torch.profiler's table of one stock micro-step (batched vision, host "
                             "positions) here")
    parser.add_argument("--profile-step", type=Path, default=None,
                        help="write torch.profiler's table of the first variant's second step (the project's own "
                             "step: worker, DeepSpeed engine, data workers) here")
    parser.add_argument("--smoke", action="store_true", help="the tiny model, CPU allowed: checks the script only")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args()
    names = [n for n in args.variants.split(",") if n]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; known: {sorted(VARIANTS)}")

    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu and not args.smoke:
        print("bench/sft_gpu.py: no CUDA GPU is visible; this benchmark measures GPU training only "
              "(run it on a CUDA machine: make install-gpu && make bench-gpu; --smoke checks the script on CPU)",
              file=sys.stderr)
        return 2
    result: dict = {"device": torch.cuda.get_device_name(0) if on_gpu else "cpu", "smoke": args.smoke,
                    "accum": args.accum, "steps": args.steps, "attention": args.attention, "variants": {}}
    with tempfile.TemporaryDirectory(prefix="paravt-bench-gpu-") as tmp_name:
        config, base, sft_data = prepare(Path(tmp_name), args.rows, args)
        measured = ceiling(config("ceiling", []), base, sft_data, args.steps, "cuda" if on_gpu else "cpu",
                           args.profile)
        trainable, tokens_per_sample, plain_peak = measured["trainable"], measured["tokens"], measured["peak_gib"]

        def mfu(tokens_per_s: float) -> float:
            return 6 * trainable * tokens_per_s / H100_BF16_PEAK

        plain_rate = statistics.median(measured["stock"])
        batched_rate = statistics.median(measured["batched_vision"])
        hosted_rate = statistics.median(measured["host_positions"])
        step_s = tokens_per_sample / plain_rate
        result.update(trainable_params=trainable, tokens_per_sample=tokens_per_sample,
                      stock_ceiling={"tokens_per_s": plain_rate, "mfu": mfu(plain_rate), "peak_gib": plain_peak,
                                     "micro_step_s": step_s, "vision_fwd_bwd_s": measured["vision_fwd_bwd_s"]},
                      stock_with_batched_vision={"tokens_per_s": batched_rate, "mfu": mfu(batched_rate),
                                                 "vs_stock_ceiling": batched_rate / plain_rate,
                                                 "vision_fwd_bwd_s": measured["vision_fwd_bwd_batched_s"]},
                      stock_with_batched_vision_host_positions={"tokens_per_s": hosted_rate, "mfu": mfu(hosted_rate),
                                                                "vs_stock_ceiling": hosted_rate / plain_rate})
        if args.out:
            args.out.write_text(json.dumps(result, indent=2))
        print(f"stock ceiling: {plain_rate:.0f} tokens/s, MFU {100 * mfu(plain_rate):.1f} %, "
              f"peak {plain_peak:.1f} GiB; one sample's forward+backward {step_s:.3f} s, of which the vision tower "
              f"alone {measured['vision_fwd_bwd_s']:.3f} s", flush=True)
        print(f"stock + batched vision attention: {batched_rate:.0f} tokens/s ({batched_rate / plain_rate:.2f}x), "
              f"vision tower alone {measured['vision_fwd_bwd_batched_s']:.3f} s", flush=True)
        print(f"stock + batched vision + host positions: {hosted_rate:.0f} tokens/s ({hosted_rate / plain_rate:.2f}x)",
              flush=True)
        for index, name in enumerate(names):
            description, overrides = VARIANTS[name]
            print(f"variant {name}: {description}", flush=True)
            started = time.perf_counter()
            with BusySampler() as busy:
                try:
                    cfg = config(name, overrides)
                    rows, memory = ours(cfg, base, sft_data, name, args.profile_step if index == 0 else None)
                except Exception as exc:  # an OOM or a kernel failure ends this variant, not the benchmark
                    result["variants"][name] = {"description": description, "error": str(exc)[-2000:]}
                    print(f"  {name} failed: {str(exc)[-400:]}", flush=True)
                    continue
            # Step 1 is warm-up; a profiled step carries the profiler's overhead.
            timed = [r for r in rows[1:] if not r.get("profiled")] or rows
            rate = statistics.median(r["tokens_per_s"] for r in timed)
            row = {"description": description, "overrides": overrides, "tokens_per_s": rate,
                   "s_per_step": tokens_per_sample * cfg.sft.micro_batch_size * cfg.sft.grad_accum_steps / rate,
                   "mfu": mfu(rate),
                   "vs_stock_ceiling": rate / plain_rate, "gpu_busy_pct": busy.mean(),
                   "peak_gib": (memory.get("peak_device_bytes") or 0) / 2**30,
                   "wall_s": time.perf_counter() - started, "losses": [r["loss"] for r in rows]}
            first = next(((n, v) for n, v in result["variants"].items() if "error" not in v), None)
            if first is not None:  # a switch is kept only if faster than the variant without it and loss-equal
                row["vs_first_variant"] = {"variant": first[0], "rate": rate / first[1]["tokens_per_s"],
                                           "max_loss_rel_diff": loss_difference(first[1]["losses"], row["losses"])}
            result["variants"][name] = row
            if args.out:  # after every variant: a run stopped at a time limit keeps what it measured
                args.out.write_text(json.dumps(result, indent=2))
            print(f"  {name}: {rate:.0f} tokens/s, MFU {100 * row['mfu']:.1f} %, {row['vs_stock_ceiling']:.2f}x the "
                  f"stock ceiling, GPU busy {row['gpu_busy_pct'] or float('nan'):.0f} %, peak {row['peak_gib']:.1f} "
                  f"GiB, {row['wall_s']:.0f} s", flush=True)
    print(table(result))
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


def loss_difference(reference: list[float], losses: list[float]) -> float | None:
    """Largest relative difference of two runs' step losses (same samples, same order), None when
    their step counts differ."""
    if len(reference) != len(losses) or not losses:
        return None
    return max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(reference, losses))


def table(result: dict) -> str:
    lines = [f"SFT at the {'tiny (smoke)' if result['smoke'] else '2B'} shape on {result['device']}, "
             f"{result['tokens_per_sample']} tokens per sample, {result['accum']} samples per step",
             f"{'variant':<15} | {'tokens/s':>9} | {'MFU %':>6} | {'x ceiling':>9} | {'busy %':>6} | {'peak GiB':>8}",
             f"{'stock ceiling':<15} | {result['stock_ceiling']['tokens_per_s']:>9.0f} | "
             f"{100 * result['stock_ceiling']['mfu']:>6.1f} | {1.0:>9.2f} | {'':>6} | "
             f"{result['stock_ceiling']['peak_gib']:>8.1f}",
             f"{'stock + vb':<15} | {result['stock_with_batched_vision']['tokens_per_s']:>9.0f} | "
             f"{100 * result['stock_with_batched_vision']['mfu']:>6.1f} | "
             f"{result['stock_with_batched_vision']['vs_stock_ceiling']:>9.2f} | {'':>6} | {'':>8}",
             f"{'stock + vb + hp':<15} | {result['stock_with_batched_vision_host_positions']['tokens_per_s']:>9.0f} | "
             f"{100 * result['stock_with_batched_vision_host_positions']['mfu']:>6.1f} | "
             f"{result['stock_with_batched_vision_host_positions']['vs_stock_ceiling']:>9.2f} | {'':>6} | {'':>8}"]
    for name, row in result["variants"].items():
        if "error" in row:
            lines.append(f"{name:<15} | failed: {row['error'].splitlines()[-1][:80] if row['error'] else ''}")
            continue
        busy = f"{row['gpu_busy_pct']:.0f}" if row["gpu_busy_pct"] is not None else "-"
        versus = row.get("vs_first_variant")
        beside = "" if versus is None else (
            f" | {versus['rate']:.2f}x {versus['variant']}, losses within "
            + (f"{versus['max_loss_rel_diff']:.1e}" if versus["max_loss_rel_diff"] is not None else "? (steps differ)"))
        lines.append(f"{name:<15} | {row['tokens_per_s']:>9.0f} | {100 * row['mfu']:>6.1f} | "
                     f"{row['vs_stock_ceiling']:>9.2f} | {busy:>6} | {row['peak_gib']:>8.1f}{beside}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
