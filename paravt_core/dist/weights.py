"""A trained model's full weights, out of a running engine (ZeRO-3 shards consolidated or
gathered) or a saved checkpoint tag, and their export as a Hugging Face model folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paravt_core.atomic import atomic_dir
from paravt_core.model.integrity import write_manifest
from paravt_core.model.loading import load_export_model, load_processor, pixel_bounded

if TYPE_CHECKING:
    from paravt_core.config import VideoConfig

# The exported folder's own record (`export_hf_model`'s `metadata`: the resolved config, the
# inputs' hashes, the git revision, the host numerics); its presence marks an export finished.
# sft/worker.py spells the name out: its bytes key the pretraining cache (miniature/pretrain_cache.CODE).
MODEL_META = "paravt_meta.json"


def full_state_dict(engine, checkpoint_dir: Path, zero_stage: int) -> dict[str, Any] | None:
    """The whole model's weights on rank 0 (None elsewhere), consolidated from ZeRO-3 shards."""
    import torch.distributed as dist

    if zero_stage == 3:
        dist.barrier()
        if dist.get_rank() != 0:
            return None
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return get_fp32_state_dict_from_zero_checkpoint(str(checkpoint_dir))
    if dist.get_rank() != 0:
        return None
    return {k: v.detach().cpu() for k, v in engine.module.state_dict().items()}


def checkpoint_state_dict(checkpoint_dir: Path, tag: str, zero_stage: int) -> dict[str, Any]:
    """The fp32 model weights of one saved tag, read offline (no engine, no process group)."""
    import torch

    if zero_stage == 0:
        states = torch.load(Path(checkpoint_dir) / tag / "mp_rank_00_model_states.pt", map_location="cpu",
                            weights_only=False)
        return {k: v.float() if v.is_floating_point() else v for k, v in states["module"].items()}
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(checkpoint_dir), tag=tag)


def persistent_buffers(module) -> list[tuple[str, Any]]:
    """(name, buffer) of `module`'s buffers that its state dict holds: a non-persistent one (a
    rotary embedding's `inv_freq`) is computed at load, is in no checkpoint, and a server refuses
    a snapshot naming it (vLLM: "no module or parameter named 'rotary_emb'", found by
    `paravt rehearse`)."""
    transient = {f"{prefix}.{name}" if prefix else name for prefix, sub in module.named_modules()
                 for name in sub._non_persistent_buffers_set}
    return [(name, buf) for name, buf in module.named_buffers() if name not in transient]


def gathered_state_dict(engine, zero_stage: int) -> dict[str, Any]:
    """The full weights on every rank (ZeRO-3 shards gathered), for the `hf` rollout engine's
    copy on each rank; a rollout server gets `rl.weight_push.GatheredWeights` instead."""
    import torch

    module = engine.module
    if zero_stage != 3:
        return {k: v.detach() for k, v in module.state_dict().items()}
    import deepspeed

    state = {}
    with torch.no_grad():
        for name, param in module.named_parameters():
            with deepspeed.zero.GatheredParameters([param]):
                state[name] = param.detach().clone().cpu()
        for name, buf in persistent_buffers(module):  # the state dict's names, as at ZeRO 0-2
            state[name] = buf.detach().clone().cpu()
    return state


def export_hf_model(state_dict: dict[str, Any], base_model_dir: Path, out_dir: Path, dtype: str,
                    metadata: dict[str, Any], video: VideoConfig) -> Path:
    """Write a Hugging Face model directory (weights, processor, provenance) atomically.

    The processor is the base's with `video`'s pixel bounds, the ones the trainer rendered
    frames with (`model.loading.pixel_bounded`): a server renders with the folder's own.
    """
    # Built in the export dtype: load_state_dict casts the fp32 weights in, so rank 0 never holds
    # a second full fp32 copy beside the consolidated state.
    model = load_export_model(base_model_dir, dtype)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"exported weights do not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        pixel_bounded(load_processor(base_model_dir), video).save_pretrained(tmp)
        write_manifest(tmp)  # sizes and sha256 of the weights, checked at registration and load
        (tmp / MODEL_META).write_text(json.dumps(metadata, indent=2, default=str))
    return out_dir
