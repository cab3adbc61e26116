"""The SFT token loss of one micro-batch, three ways with one value (`sft.loss_impl`).

The loss is the mean, over the micro-batch's trained tokens (labels != -100, shifted by one:
the hidden state at t predicts token t + 1), of -log softmax(logits)[token], as the model's
own `ForCausalLMLoss` computes it. What differs is memory and speed:
- `logits`: the model's loss. It builds [B, L, 151,936] logits and a float32 copy: at
  3.5k tokens per sample 3,500 x 151,936 x (2 + 4) bytes = 3.2 GB per sample (computed).
- `chunked`: the model runs with `logits_to_keep=1`, the final norm's output is read, and
  only the trained positions are projected, 1024 rows at a time under activation
  checkpointing (`paravt_core.model.logprobs`, shared with the RL pass). Any device, any ZeRO
  stage (the head is called as a module, so ZeRO-3 gathers it).
- `liger`: the same trained rows through Liger's fused linear cross-entropy (Triton): the
  projection and the loss in one kernel, chunked inside, gradient computed in the forward.
  CUDA only, and not under ZeRO-3 (it reads the head's weight tensor directly).
"""

from __future__ import annotations

from typing import Any

import torch

from paravt_core.model.logprobs import final_hidden_states, output_layers, selected_token_logprobs
from paravt_core.sft.encode import IGNORE_INDEX

LOSS_IMPLS = ("logits", "chunked", "liger")


def trained_rows(hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden rows [N, H], target ids [N]) of the trained positions: row t predicts labels[t + 1]."""
    targets = labels[:, 1:]  # [B, L-1]
    keep = targets != IGNORE_INDEX
    return hidden[:, :-1][keep], targets[keep]


def _liger_loss(head: torch.nn.Module, rows: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if not rows.is_cuda:
        raise RuntimeError("sft.loss_impl=liger runs Liger's Triton kernels, which need a CUDA GPU; "
                           "use sft.loss_impl=chunked (same loss, any device)")
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError as err:
        raise RuntimeError("sft.loss_impl=liger needs the liger-kernel package (the gpu extra: "
                           "pip install 'paravt-pipeline[gpu]' or make install-gpu)") from err
    bias = getattr(head, "bias", None)
    return LigerFusedLinearCrossEntropyLoss(reduction="mean")(head.weight, rows, targets, bias)


def micro_batch_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor], impl: str = "logits",
                     chunk_size: int = 1024) -> torch.Tensor:
    """Mean token loss of `batch` (model inputs with `labels`) under `model`, a scalar with autograd.

    `model` is the HF model or a wrapper calling it (the DeepSpeed engine).
    """
    if impl not in LOSS_IMPLS:
        raise ValueError(f"loss_impl {impl!r} is not one of {LOSS_IMPLS}")
    # No KV cache: training needs none, and transformers reads a packed row (`encode.pack`)
    # only when no cache is passed; with one, packed samples would attend to each other.
    if impl == "logits":
        return model(**batch, use_cache=False).loss
    inputs: dict[str, Any] = {k: v for k, v in batch.items() if k != "labels"}
    inputs["use_cache"] = False
    norm, head = output_layers(model)
    hidden = final_hidden_states(model, inputs, norm)  # [B, L, H]
    rows, targets = trained_rows(hidden, batch["labels"])
    if impl == "liger":
        if targets.numel():
            return _liger_loss(head, rows, targets)
        # Never under ZeRO-3 (config refuses it), so no gather waits on the head; but ZeRO-1/2 reduce
        # every parameter's gradient on every rank: the head gets a zero one here as it does elsewhere.
        return hidden.sum() * 0.0 + head.weight.sum() * 0.0
    # Even with no trained token the head is called: under multi-rank ZeRO-3 every rank must run
    # as many head gathers as the others (`selected_token_logprobs` agrees on the count).
    picked = selected_token_logprobs(head, rows, targets, temperature=1.0, chunk_size=chunk_size)
    return -picked.sum() / max(1, targets.numel())
