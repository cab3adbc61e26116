"""A training stage's DeepSpeed settings: its JSON config, optimizer and training dtype
(on CPU ranks fp32, on GPUs the config's, bf16 when it asks for it)."""

from __future__ import annotations

from typing import Any

from paravt_core.config import DeepSpeedConfig, PipelineConfig


def local_grad_norm(engine) -> float:
    """Pre-clipping L2 norm of the full gradients (ZeRO-0 keeps them whole on every rank;
    DeepSpeed records a global norm only for its ZeRO optimizers)."""
    import torch

    grads = [p.grad.detach().float() for p in engine.module.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) if grads else 0.0


def training_dtype(model_dtype: str, on_gpu: bool) -> str:
    """The dtype ranks hold and train the weights in: the config's on GPUs, fp32 on CPU ranks."""
    return model_dtype if on_gpu else "float32"


def deepspeed_config(*, micro_batch: int, grad_accum: int, zero_stage: int, grad_clip: float,
                     bf16: bool, zero: DeepSpeedConfig | None = None) -> dict[str, Any]:
    """The DeepSpeed JSON of one training stage; `zero` holds the offload and bucket settings."""
    zero = zero or DeepSpeedConfig()
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": grad_clip,
        "zero_optimization": _zero_section(zero_stage, zero),
        "bf16": {"enabled": bf16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if zero.offload_optimizer != "none":
        # DeepSpeed refuses a client optimizer with offload unless this is off; with its own
        # CPU Adam (`zero_optimizer`) the check passes as is (see DeepSpeedConfig).
        config["zero_force_ds_cpu_optimizer"] = zero.cpu_optimizer == "deepspeed_cpu_adam"
    return config


def _zero_section(stage: int, zero: DeepSpeedConfig) -> dict[str, Any]:
    section: dict[str, Any] = {"stage": stage}
    if stage == 0:
        return section
    section["reduce_bucket_size"] = zero.reduce_bucket_size
    if stage == 3:
        section["stage3_prefetch_bucket_size"] = zero.stage3_prefetch_bucket_size
        section["stage3_param_persistence_threshold"] = zero.stage3_param_persistence_threshold
    else:
        section["allgather_bucket_size"] = zero.allgather_bucket_size
    if zero.overlap_comm is not None:
        section["overlap_comm"] = zero.overlap_comm
    for key, device in (("offload_optimizer", zero.offload_optimizer), ("offload_param", zero.offload_param)):
        if device != "none":
            section[key] = {"device": device, "pin_memory": zero.pin_memory}
            if device == "nvme":
                section[key]["nvme_path"] = str(zero.nvme_path)
    return section


def zero_optimizer(params, *, lr: float, weight_decay: float, zero: DeepSpeedConfig):
    """AdamW for DeepSpeed: its CPU Adam when the optimizer is offloaded and asked for, else PyTorch's."""
    import torch

    if zero.offload_optimizer != "none" and zero.cpu_optimizer == "deepspeed_cpu_adam":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, lr=lr, weight_decay=weight_decay, adamw_mode=True)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def sft_deepspeed_config(cfg: PipelineConfig, on_gpu: bool) -> dict[str, Any]:
    sft = cfg.sft
    return deepspeed_config(micro_batch=sft.micro_batch_size, grad_accum=sft.grad_accum_steps,
                            zero_stage=sft.zero_stage, grad_clip=sft.grad_clip,
                            bf16=training_dtype(cfg.model.dtype, on_gpu) == "bfloat16", zero=sft.deepspeed)


def rl_deepspeed_config(cfg: PipelineConfig, on_gpu: bool) -> dict[str, Any]:
    """One optimizer step per RL step; its micro-batches are accumulated by hand (rl/worker.py)."""
    rl = cfg.rl
    return deepspeed_config(micro_batch=1, grad_accum=1, zero_stage=rl.zero_stage, grad_clip=rl.grad_clip,
                            bf16=training_dtype(cfg.model.dtype, on_gpu) == "bfloat16", zero=rl.deepspeed)
