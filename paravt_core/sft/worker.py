"""One rank of the SFT trainer; started by the DeepSpeed launcher (see `paravt_core.sft.stage`).

Departures from the release's SFT (SPEC §1), point by point:
- one trainer from 1 CPU rank to N GPUs (DeepSpeed ZeRO 0-3 from config, fp32 on CPU);
- data order is a pure function of (seed, step), so a run resumed from a checkpoint sees
  the same samples, and so the same losses, as an uninterrupted one;
- sequence packing is a switch (`sft.packing`, `encode.pack`): a micro-batch's samples in
  one row with per-sample positions and attention; off, micro-batches are right-padded;
- the token loss may skip the full-vocabulary logits (`sft.loss_impl`, `sft/loss.py`);
- samples may be encoded ahead of the step in worker processes (`sft.data_workers`,
  `sft/loader.py`), the same samples in the same order;
- speed switches that train the same losses (issue #47): page-locked batches copied without
  blocking (`sft.pin_memory`), bf16 pixel values from the host (`sft.host_pixel_dtype`), compiled
  text decoder layers (`sft.compile_text_layers`).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from pathlib import Path

import torch

from paravt_core.dist.rank import StepLog
from paravt_core.sft.job import SFTJob
from paravt_core.sft.loader import (EncodingStats, MicroBatchPlan, micro_batch, micro_batches,  # noqa: F401
                                    sample_index, sample_order)


def lr_lambda(total_steps: int, warmup_steps: int, schedule: str):
    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def reduce_step_statistics(collectives, step_loss: float, tokens: int, samples: int) -> tuple[float, float, float]:
    """(loss summed over ranks, tokens, samples) of one step over all ranks.

    The tensor is built on the rank's device: NCCL cannot reduce a CPU tensor.
    """
    stats = torch.tensor([step_loss, tokens, samples], dtype=torch.float64, device=collectives.device)
    collectives.all_reduce(stats)
    loss_sum, tokens_all, samples_all = stats.tolist()
    return loss_sum, tokens_all, samples_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", required=True)
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args(argv)
    job = SFTJob.model_validate_json(Path(args.job).read_text())
    train(job)
    return 0


def train(job: SFTJob) -> None:
    import deepspeed
    import torch.distributed as dist
    from tqdm import tqdm

    from paravt_core.atomic import atomic_write_text
    from paravt_core.collectives import CheckedCollectives
    from paravt_core.dist.checkpoints import resume, save, trim_step_log
    from paravt_core.dist.ds_config import local_grad_norm, sft_deepspeed_config, training_dtype, zero_optimizer
    from paravt_core.dist.rank import init_distributed, maybe_kill_for_test, shutdown_distributed
    from paravt_core.plan import declare_stage
    from paravt_core.memory import record_memory
    from paravt_core.model.loading import build_model, load_processor
    from paravt_core.model.positions import HostPositions
    from paravt_core.sft.dataset import FrameCache, FrameSampling, OverlongPolicy, SFTDataset, read_sft_rows
    from paravt_core.sft.encode import model_batch
    from paravt_core.sft.loss import micro_batch_loss
    from paravt_core.sft.step_profile import profiled
    from paravt_core.tracking import MetricLogger

    cfg = job.config
    sft = cfg.sft
    rank, world, device = init_distributed()
    # The device ledger (rehearsals): this rank holds the plan's SFT row on its card.
    declare_stage(f"SFT rank {rank}", "SFT", cfg, job.base_model)
    collectives = CheckedCollectives(device)
    torch.manual_seed(cfg.run.seed)
    on_gpu = device.startswith("cuda")
    ds_config = sft_deepspeed_config(cfg, on_gpu=on_gpu)
    pixel_dtype = host_pixel_dtype(sft.host_pixel_dtype, training_dtype(cfg.model.dtype, on_gpu))
    pin = sft.pin_memory and on_gpu  # page-locking is for copies to a GPU; a CPU run has none

    processor = load_processor(job.base_model)
    # ZeRO 0-2: loaded straight onto the rank's device (DeepSpeed would move it there anyway), so
    # the "constructed" memory record already shows the weights on the GPU; ZeRO-3 places its slices.
    model = build_model(cfg.model, job.base_model, dtype=training_dtype(cfg.model.dtype, on_gpu), device=device,
                        zero3_config=ds_config if sft.zero_stage == 3 else None)
    record_memory(job.out_dir, job.stage, "constructed", rank, world, device, model)
    if sft.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if sft.liger_kernels:
        apply_liger_kernels(model, on_gpu)
    if sft.compile_text_layers:  # after Liger, so the compiled graphs hold its kernels
        compile_text_layers(model)
    model.train()
    rope_index = model.model.get_rope_index
    sampling = FrameSampling.from_config(cfg.video)
    dataset = SFTDataset(read_sft_rows(job.data_files), processor, FrameCache(job.frame_cache_dir, sampling),
                         OverlongPolicy(sft.max_seq_len, sft.overlong), frame_choices=cfg.video.sft_frame_choices)

    optimizer = zero_optimizer(model.parameters(), lr=sft.learning_rate, weight_decay=sft.weight_decay,
                               zero=sft.deepspeed)
    warmup = int(round(sft.warmup_ratio * sft.max_steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(sft.max_steps, warmup, sft.lr_schedule))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=ds_config)
    record_memory(job.out_dir, job.stage, "engine", rank, world, device, engine.module)
    ckpt_dir = job.out_dir / "checkpoints"
    start = int(resume(engine, ckpt_dir, stage=job.stage).get("step", 0))
    metrics = MetricLogger(job.tracking_uri, job.mlflow_run_id, enabled=rank == 0)
    losses_path = job.out_dir / "losses.jsonl"
    if rank == 0:
        trim_step_log(losses_path, start)  # steps after the checkpoint run again: log them once
    # Padding or packing, and the positions, happen where the samples are encoded (a data worker, if any).
    to_batch = functools.partial(model_batch, pad_id=processor.tokenizer.pad_token_id, rope_index=rope_index,
                                 packing=sft.packing, positions=HostPositions.of(model) if sft.host_positions else None,
                                 pixel_dtype=pixel_dtype)
    plan = MicroBatchPlan(dataset, start=start, max_steps=sft.max_steps, micro=sft.micro_batch_size,
                          accum=sft.grad_accum_steps, rank=rank, world=world, seed=cfg.run.seed, collate=to_batch)
    batches = micro_batches(plan, sft.data_workers, pin_memory=pin)
    encoded_by: dict[int, EncodingStats] = {}

    bar = tqdm(range(start, sft.max_steps), initial=start, total=sft.max_steps, desc=job.stage,
               disable=rank != 0 or not sys.stdout.isatty(), mininterval=2.0)
    progress = StepLog(job.stage, sft.max_steps, start, enabled=rank == 0 and not sys.stdout.isatty())

    def one_step() -> tuple[torch.Tensor, int, int, float | None]:
        step_loss, tokens, samples = torch.zeros((), dtype=torch.float64, device=device), 0, 0
        stage0_norm = None
        for a in range(sft.grad_accum_steps):
            item = next(batches)
            encoded_by[item.process] = item.stats
            # From pinned memory the copy returns at once and overlaps the previous kernels.
            batch = {k: v.to(device, non_blocking=pin) for k, v in item.batch.items()}
            loss = micro_batch_loss(engine, batch, sft.loss_impl)
            engine.backward(loss)
            if a == sft.grad_accum_steps - 1 and sft.zero_stage == 0:
                stage0_norm = local_grad_norm(engine)
            engine.step()
            # Summed on the device: no wait for the GPU until the step's end, so the next micro-batch
            # is queued while this one runs.
            step_loss += loss.detach().double() / sft.grad_accum_steps
            tokens += item.tokens
            samples += item.count
        return step_loss, tokens, samples, stage0_norm

    for step in bar:
        t0 = time.perf_counter()
        profiling = job.profile_to is not None and rank == 0 and step == start + 1
        if profiling:  # the second step: the first pays for warm-up (allocator, compilation)
            done_step: list = []
            table = profiled(lambda: done_step.append(one_step()), on_gpu)
            atomic_write_text(job.profile_to, table)
            step_loss, tokens, samples, stage0_norm = done_step[0]
        else:
            step_loss, tokens, samples, stage0_norm = one_step()
        loss_sum, tokens_all, samples_all = reduce_step_statistics(collectives, step_loss.item(), tokens, samples)
        loss_mean = loss_sum / world
        elapsed = time.perf_counter() - t0
        grad_norm = stage0_norm if sft.zero_stage == 0 else engine.get_global_grad_norm()
        row = {"step": step + 1, "loss": loss_mean, "lr": scheduler.get_last_lr()[0],
               "grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
               "tokens_per_s": tokens_all / elapsed, "samples_per_s": samples_all / elapsed}
        if profiling:
            row["profiled"] = True  # its time includes the profiler's overhead: not a rate to compare
        if rank == 0:
            with open(losses_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            metrics.log(step + 1, {k: v for k, v in row.items() if k != "step"})
            bar.set_postfix(loss=f"{loss_mean:.4f}", tok_s=f"{row['tokens_per_s']:.0f}")
            progress.step(step + 1, loss=loss_mean, lr=row["lr"], tok_s=row["tokens_per_s"])
        done = step + 1
        if not job.steps_only and (done % sft.checkpoint_every == 0 or done == sft.max_steps):
            save(engine, ckpt_dir, done, {"step": done}, keep_last=sft.keep_last, stage=job.stage)
        maybe_kill_for_test(done)

    record_memory(job.out_dir, job.stage, "trained", rank, world, device, engine.module)
    if not job.steps_only:
        _export(job, engine, rank, _export_stats(encoded_by, dataset, job.out_dir / "model"), ckpt_dir)
    metrics.finish()
    dist.barrier()
    shutdown_distributed()


def apply_liger_kernels(model, on_gpu: bool) -> None:
    """Liger's Triton RMSNorm and RoPE in the text model (`sft.liger_kernels`); the loss is `sft.loss_impl`'s."""
    if not on_gpu:
        raise RuntimeError("sft.liger_kernels runs Triton kernels, which need a CUDA GPU; turn it off on CPU")
    try:
        from liger_kernel.transformers.monkey_patch import _patch_rms_norm_module
        from liger_kernel.transformers.rope import liger_rotary_pos_emb, liger_rotary_pos_emb_vision
    except ImportError as err:
        raise RuntimeError("sft.liger_kernels needs the liger-kernel package (the gpu extra: make install-gpu)") from err
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    # What Liger's `apply_liger_kernel_to_qwen3_vl(rope, rms_norm)` does, without that function: it
    # imports its fused-loss forward first, whose module needs `Qwen3VLCausalLMOutputWithPast`, a
    # class transformers 5.23 no longer has (liger-kernel 0.8.5, the newest on the registry: every
    # `sft.liger_kernels` run failed at that import on the GPU, docs/gpu_check.md, 2026-11-30).
    # RoPE: the module's functions (process-wide, as Liger's patch is); RMSNorm: the text model's
    # norms patched in place by Liger's own helper (private in liger-kernel 0.8.5, the version
    # requirements-gpu.txt pins), their parameters the same objects as ZeRO-3 needs; Llama's casting, offset 0.
    modeling_qwen3_vl.apply_rotary_pos_emb = liger_rotary_pos_emb
    modeling_qwen3_vl.apply_rotary_pos_emb_vision = liger_rotary_pos_emb_vision
    text = model.model.language_model
    norms = [text.norm]
    for layer in text.layers:
        norms += [layer.input_layernorm, layer.post_attention_layernorm]
        norms += [norm for norm in (getattr(layer.self_attn, "q_norm", None), getattr(layer.self_attn, "k_norm", None))
                  if norm is not None]
    for norm in norms:
        _patch_rms_norm_module(norm, offset=0.0, casting_mode="llama")


def host_pixel_dtype(setting: str, training_dtype: str) -> torch.dtype | None:
    """The dtype the pixel values are cast to on the host (`sft.host_pixel_dtype`), None to leave them.

    Raises:
        ValueError: bfloat16 asked for a model trained in another dtype, where the cast would round
            the inputs the model sees (a CPU rank trains in fp32 whatever model.dtype says).
    """
    if setting == "float32":
        return None
    if training_dtype != "bfloat16":
        raise ValueError(f"sft.host_pixel_dtype={setting} gives a {training_dtype} model rounded pixel values; it is "
                         "exact for a bfloat16 model only (GPU ranks with model.dtype=bfloat16): set "
                         "sft.host_pixel_dtype=float32")
    return torch.bfloat16


def compile_text_layers(model) -> int:
    """torch.compile each decoder layer of the text model in place (`sft.compile_text_layers`);
    returns how many. The layers are alike, so the first compiled graph serves the rest;
    transformers' checkpointing wrapper calls the compiled module, so both combine."""
    layers = model.model.language_model.layers
    for layer in layers:
        layer.compile()
    return len(layers)


def _export_stats(encoded_by: dict[int, EncodingStats], dataset, model_dir: Path) -> EncodingStats:
    """The counters the export records: this run's; when no step ran (a damaged export written
    again from the final checkpoint), the ones the folder's previous export recorded."""
    if encoded_by:
        return EncodingStats.total(encoded_by)
    try:
        meta = json.loads((model_dir / "paravt_meta.json").read_text())
        cache = meta.get("frame_cache") or {}
        return EncodingStats(int(meta.get("overlong_skipped", 0)), int(meta.get("overlong_truncated", 0)),
                             dict(meta.get("media_skipped") or {}), int(cache.get("hits", 0)),
                             int(cache.get("misses", 0)))
    except (OSError, ValueError, TypeError, AttributeError):
        return EncodingStats.of(dataset)


def _export(job: SFTJob, engine, rank: int, encoded: EncodingStats, ckpt_dir: Path) -> None:
    from paravt_core.dist.weights import export_hf_model, full_state_dict
    from paravt_core.provenance import host_numerics

    state = full_state_dict(engine, ckpt_dir, job.config.sft.zero_stage)
    if rank != 0:
        return
    meta = {
        "stage": job.stage,
        "resolved_config": job.config.model_dump(mode="json"),
        "base_model": str(job.base_model),
        "base_model_sha256": job.base_model_sha256,
        "data_sha256": job.data_sha256,
        "git_revision": job.git_revision,
        "steps": job.config.sft.max_steps,
        "mlflow_run_id": job.mlflow_run_id,
        "overlong_skipped": encoded.overlong_skipped,
        "overlong_truncated": encoded.overlong_truncated,
        "media_skipped": encoded.media_errors,  # rank 0's: row source -> why its video did not decode
        "frame_cache": {"hits": encoded.cache_hits, "misses": encoded.cache_misses},
        "numerics": host_numerics(),  # rank 0's; the weights depend on these too (provenance.host_numerics)
    }
    export_hf_model(state, job.base_model, job.out_dir / "model", job.config.model.dtype, meta, job.config.video)


if __name__ == "__main__":
    raise SystemExit(main())
