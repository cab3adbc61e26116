"""SFT throughput: epoch 1 vs epoch 2 (the frame cache), and our trainer vs transformers.Trainer.

Both trainers run side by side in one invocation on the same tiny Qwen3-VL, the same
materialized SFT rows of a generated world, micro-batch 1, two epochs each:
- ours: `paravt_core.sft` through the DeepSpeed launcher (1 CPU rank, ZeRO-0), with its
  on-disk frame cache (cold in epoch 1, warm in epoch 2);
- reference: `transformers.Trainer` over a dataset that decodes frames on every read with
  the same sampler and the same encoding (what a plain HF recipe does).
Tokens/s counts the tokens of the trained sequences (prompt + answer, video tokens
included) per wall-clock second of training steps.

Run: .venv/bin/python bench/sft.py [--rows 24]   (needs `pip install -e .[bench]` for accelerate)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch


def prepare(tmp: Path, rows: int):
    from paravt_core.config import load_config
    from paravt_core.data import stage as data_stage
    from paravt_core.model import stage as model_stage

    per_video = 3
    cfg = load_config(Path(__file__).resolve().parents[1] / "conf/pipeline/tiny.yaml", [
        f"run.output_dir={tmp / 'out'}", f"data.synth.train_videos={max(4, rows // per_video)}",
        f"data.synth.sft_traces_per_video={per_video}",
        "data.synth.eval_videos_per_split=1", "data.synth.eval_rows_per_split=1", "data.on_bad_rows=quarantine",
    ])
    return cfg, model_stage.run(cfg), data_stage.run(cfg, progress=False)


def ours(cfg, base, data, steps: int) -> list[dict]:
    from paravt_core.sft import stage

    run_cfg = cfg.model_copy(update={"sft": cfg.sft.model_copy(update={
        "max_steps": 2 * steps, "checkpoint_every": 10 * steps, "warmup_ratio": 0.0})})
    stage.run(run_cfg, base, data.sft, log_line=lambda line: None)
    return [json.loads(line) for line in (stage.run_dir(run_cfg, base, data.sft) / "losses.jsonl").read_text().splitlines()]


class UncachedDataset(torch.utils.data.Dataset):
    """The same rows, sampler and encoding as ours, frames decoded on every read (no cache)."""

    def __init__(self, cfg, base_dir: Path, files: list[Path]):
        from paravt_core.model.loading import load_processor
        from paravt_core.sft.dataset import FrameSampling, read_sft_rows

        self.sampling = FrameSampling(fps=cfg.video.sft_fps, max_frames=cfg.video.sft_max_frames,
                                      crop_fps=cfg.video.crop_fps, crop_min_frames=cfg.video.crop_min_frames,
                                      crop_max_frames=cfg.video.crop_max_frames,
                                      min_pixels=cfg.video.min_pixels, max_pixels=cfg.video.max_pixels)
        self.rows = read_sft_rows(files)
        self.processor = load_processor(base_dir)
        self.tokens = 0

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        from paravt_core.sft.dataset import load_image
        from paravt_core.sft.encode import encode_conversation

        sample = encode_conversation(self.rows[index]["messages"], self.processor, self._decode, load_image)
        self.tokens += sample.num_tokens
        return {"sample": sample}

    def _decode(self, path: Path, window: tuple[float, float] | None = None):
        from transformers.video_utils import VideoMetadata

        from paravt_core.sft.dataset import decode_video

        frames, meta = decode_video(path, self.sampling, window)
        return frames, VideoMetadata(**meta)


def reference(cfg, base, data, steps: int, scratch: Path) -> list[float]:
    """Tokens/s of each epoch of transformers.Trainer."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from paravt_core.model.loading import load_model
    from paravt_core.sft.encode import collate

    dataset = UncachedDataset(cfg, base.path, sorted(Path(data.sft.path).glob("*.parquet")))
    pad = dataset.processor.tokenizer.pad_token_id
    epochs: list[tuple[float, int]] = []

    class EpochTimer(TrainerCallback):
        def on_epoch_begin(self, args, state, control, **kw):
            self.t0, self.tok0 = time.perf_counter(), dataset.tokens

        def on_epoch_end(self, args, state, control, **kw):
            epochs.append((time.perf_counter() - self.t0, dataset.tokens - self.tok0))

    args = TrainingArguments(output_dir=str(scratch / "hf"), per_device_train_batch_size=1, num_train_epochs=2,
                             max_steps=2 * steps, learning_rate=cfg.sft.learning_rate, lr_scheduler_type="cosine",
                             logging_strategy="no", save_strategy="no", report_to=[], use_cpu=True,
                             dataloader_num_workers=0, remove_unused_columns=False, disable_tqdm=True)
    trainer = Trainer(model=load_model(base.path), args=args, train_dataset=dataset,
                      data_collator=lambda items: collate([i["sample"] for i in items], pad), callbacks=[EpochTimer()])
    trainer.train()
    return [tok / sec for sec, tok in epochs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=24, help="approximate SFT rows (one epoch = this many steps)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        cfg, base, data = prepare(tmp, args.rows)
        from paravt_core.sft.dataset import read_sft_rows

        n = len(read_sft_rows(sorted(Path(data.sft.path).glob("*.parquet"))))
        rows = ours(cfg, base, data, n)
        ours_e1 = statistics.fmean(r["tokens_per_s"] for r in rows[:n])
        ours_e2 = statistics.fmean(r["tokens_per_s"] for r in rows[n:])
        ref_e1, ref_e2 = reference(cfg, base, data, n, tmp / "ref")
    print(f"\nSFT throughput, tiny Qwen3-VL, {n} rows/epoch, micro-batch 1, CPU ({torch.get_num_threads()} threads)")
    print(f"{'trainer':<34}{'epoch 1 tok/s':>15}{'epoch 2 tok/s':>15}{'e2/e1':>8}")
    print(f"{'ours (DeepSpeed, frame cache)':<34}{ours_e1:>15.0f}{ours_e2:>15.0f}{ours_e2 / ours_e1:>8.2f}")
    print(f"{'transformers.Trainer (no cache)':<34}{ref_e1:>15.0f}{ref_e2:>15.0f}{ref_e2 / ref_e1:>8.2f}")
    print(f"ours / Trainer: epoch 1 {ours_e1 / ref_e1:.2f}x, epoch 2 {ours_e2 / ref_e2:.2f}x")


if __name__ == "__main__":
    main()
