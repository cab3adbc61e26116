"""SFT on one GPU at the Qwen3-VL-2B shape: tokens/s and MFU of the project's job vs a plain forward+backward.

Both sides train the same samples on the same random-weight 2B-shaped model (../shared/GPU.md:
2.13 B parameters, the tiny kit's tokenizer and processor): a 64 s 640x360 video sampled at
1 fps with at most 50,176 pixels per frame (64 frames of 160x288: 5,760 patches, 1,440
merged video tokens) and a multi-turn text: 3,487 tokens per sample in all with the tiny
tokenizer (measured on CPU; GPU.md's sample had 3,363).
- ours: `paravt_core.sft` through the DeepSpeed launcher, one rank, ZeRO `--zero-stage`,
  micro-batch 1 x `--accum`, the whole step (forward, backward, optimizer);
- ceiling: a plain PyTorch forward+backward of the same encoded samples, no optimizer.

MFU = 6 x trainable parameters x tokens per step / step time / 989e12 (H100 dense bf16 peak).
Tokens are the language model's sequence positions (text tokens plus the merged video
tokens); the vision patches are not counted as tokens, while the vision tower's parameters
are in the parameter count: the convention of the GPU.md figures, not an exact FLOP count.
The first step of each side is warm-up and left out.

Run: make bench-gpu, or .venv-gpu/bin/python bench/sft_gpu.py [--zero-stage 2] [--steps 6]
Without a CUDA GPU it exits at once with status 2 saying so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

H100_BF16_PEAK = 989e12
REPO = Path(__file__).resolve().parents[1]


def write_video(path: Path, seconds: int = 64, fps: int = 2, size: tuple[int, int] = (360, 640)) -> Path:
    """A 640x360 clip of moving colour blocks (content is irrelevant to the timing, its geometry is not)."""
    import av
    import numpy as np

    height, width = size
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
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
    import pyarrow as pa
    import pyarrow.parquet as pq

    from paravt_core.config import load_config
    from paravt_core.model.loading import load_processor
    from paravt_core.model.shapes import build_shaped_model
    from paravt_core.model.tiny import TinyModelSpec, build_tiny_model
    from paravt_core.refs import ArtifactRef, content_hash

    tiny = build_tiny_model(TinyModelSpec(seed=0), tmp / "tiny")
    model_dir = build_shaped_model("2b", tiny, tmp / "model-2b")
    video = write_video(tmp / "clip.mp4")
    # The message texts; the template's role tags and per-frame timestamps bring the sample to 3,487 tokens.
    messages = conversation(video, load_processor(tiny).tokenizer, text_tokens=1435)
    data = tmp / "sft"
    data.mkdir()
    pq.write_table(pa.Table.from_pylist([{"messages": json.dumps(messages), "videos": [str(video)]}] * rows),
                   data / "bench.parquet")
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", [
        f"run.output_dir={tmp / 'out'}", "model.dtype=bfloat16", f"model.attn_implementation={args.attention}",
        "video.sft_fps=1", "video.sft_max_frames=64", "video.max_pixels=50176", "sft.max_seq_len=8192",
        f"sft.zero_stage={args.zero_stage}", "sft.micro_batch_size=1", f"sft.grad_accum_steps={args.accum}",
        f"sft.max_steps={args.steps}", f"sft.checkpoint_every={10 * args.steps}", "sft.warmup_ratio=0.0",
        "sft.learning_rate=2e-5", f"sft.gradient_checkpointing={str(args.checkpointing).lower()}",
    ])
    base = ArtifactRef(kind="base_model", path=model_dir, sha256=content_hash(model_dir))
    sft_data = ArtifactRef(kind="sft_data", path=data, sha256=content_hash(data))
    return cfg, base, sft_data


def ours(cfg, base, sft_data) -> list[dict]:
    from paravt_core.sft import stage

    stage.run(cfg, base, sft_data, log_line=print)
    run_dir = stage.run_dir(cfg, base, sft_data)
    return [json.loads(line) for line in (run_dir / "losses.jsonl").read_text().splitlines()]


def ceiling(cfg, base, sft_data, steps: int) -> tuple[list[float], int, int]:
    """Tokens/s of forward+backward per step (first left out), trainable parameters, tokens per sample."""
    import torch

    from paravt_core.model.loading import load_model, load_processor
    from paravt_core.sft import stage
    from paravt_core.sft.dataset import FrameCache, FrameSampling, OverlongPolicy, SFTDataset, read_sft_rows
    from paravt_core.sft.encode import collate

    processor = load_processor(base.path)
    model = load_model(base.path, dtype="bfloat16", device="cuda", attn_implementation=cfg.model.attn_implementation)
    if cfg.sft.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    sampling = FrameSampling(fps=cfg.video.sft_fps, max_frames=cfg.video.sft_max_frames,
                             crop_fps=cfg.video.crop_fps, crop_min_frames=cfg.video.crop_min_frames,
                             crop_max_frames=cfg.video.crop_max_frames,
                             min_pixels=cfg.video.min_pixels, max_pixels=cfg.video.max_pixels)
    dataset = SFTDataset(read_sft_rows(stage.sft_shards(sft_data)), processor,
                         FrameCache(cfg.run.output_dir / "cache" / "frames", sampling),
                         OverlongPolicy(cfg.sft.max_seq_len, cfg.sft.overlong))
    batch = {k: v.to("cuda") for k, v in collate([dataset.encode(0)], processor.tokenizer.pad_token_id).items()}
    tokens = int(batch["attention_mask"].sum())
    rates = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(cfg.sft.grad_accum_steps):
            model(**batch).loss.backward()
        torch.cuda.synchronize()
        rates.append(tokens * cfg.sft.grad_accum_steps / (time.perf_counter() - t0))
        model.zero_grad(set_to_none=True)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return rates[1:], trainable, tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zero-stage", type=int, default=2, choices=(0, 1, 2, 3))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--accum", type=int, default=8)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--attention", default="sdpa", choices=("sdpa", "flash_attention_2", "eager"))
    parser.add_argument("--checkpointing", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("bench/sft_gpu.py: no CUDA GPU is visible; this benchmark measures GPU training only "
              "(run it on a CUDA machine: make install-gpu && make bench-gpu)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="paravt-bench-gpu-") as tmp_name:
        cfg, base, sft_data = prepare(Path(tmp_name), args.rows, args)
        rows = ours(cfg, base, sft_data)[1:]
        plain, trainable, tokens_per_sample = ceiling(cfg, base, sft_data, args.steps)

    def mfu(tokens_per_s: float) -> float:
        return 6 * trainable * tokens_per_s / H100_BF16_PEAK

    ours_rate = statistics.median(r["tokens_per_s"] for r in rows)
    plain_rate = statistics.median(plain)
    result = {
        "device": torch.cuda.get_device_name(0), "zero_stage": args.zero_stage, "accum": args.accum,
        "attention": args.attention, "gradient_checkpointing": args.checkpointing,
        "trainable_params": trainable, "tokens_per_sample": tokens_per_sample,
        "ours": {"tokens_per_s": ours_rate, "s_per_step": tokens_per_sample * args.accum / ours_rate,
                 "mfu": mfu(ours_rate)},
        "plain_forward_backward": {"tokens_per_s": plain_rate, "mfu": mfu(plain_rate)},
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
