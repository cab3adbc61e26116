"""Log-probs of chosen tokens without the full-vocabulary logits tensor (SPEC §5).

PARA-GRPO (SPEC §5) needs log π(token_t | prefix) only at the positions it scores: the
policy's for the PPO ratio, the reference's for the KL term. Projecting every position to
the vocabulary builds [B, L, V] float32 logits (V = 151,936: about 24 GB for four
10k-token sequences at 8B), and log_softmax and its backward add copies of that size.

Here the model runs with `logits_to_keep=1`, its final hidden states are read from the text
model's last norm, and only the wanted positions are projected, a chunk of rows at a time,
each chunk reduced at once to logit[target] - logsumexp(logits) in float32. With autograd
on, each chunk runs under a non-reentrant activation checkpoint: backward keeps the chunk's
hidden rows only and recomputes its logits, so the peak is one [chunk, V] block, forward or
backward, instead of [N, V]. The values are the full computation's (the same float32
log-softmax of logits / temperature), not an approximation.

The head is called as a module, `head(h)`, never as `F.linear(h, head.weight)`: under
DeepSpeed ZeRO-3 the module call is what gathers its partitioned weight (in the backward
recompute too) and routes the weight's gradient back to its partition. That gather is a
collective of the ranks, so under multi-rank ZeRO-3 every rank must call the head as often
as the others: the ranks agree on the most chunks any of them has, and a rank with fewer
wanted positions runs empty chunks (with uneven counts, two CPU ranks abort on gloo's
"collective mismatch"; NCCL ranks would wait in the gather).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

LOGPROB_CHUNK = 1024  # rows per [chunk, V] block: 1024 x 151,936 float32 logits is 0.62 GB


def _chunk_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                    temperature: float) -> torch.Tensor:
    logits = head(hidden).float() / temperature  # [n, V]
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # [n]


def _chunks_every_rank_runs(head: torch.nn.Module, chunks: int, device: torch.device) -> int:
    """`chunks`, or under multi-rank ZeRO-3 the most chunks any rank of the head's group has."""
    weight = next(head.parameters(), None)
    if getattr(weight, "ds_zero_partition_world_size", 1) == 1:
        return chunks
    most = torch.tensor([chunks], device=device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX, group=weight.ds_process_group)
    return int(most)


def selected_token_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                            chunk_size: int = LOGPROB_CHUNK) -> torch.Tensor:
    """log_softmax(head(hidden) / temperature)[i, targets[i]] for every row i, `chunk_size` rows at a time.

    Args:
        head: the output projection (the causal LM's `lm_head`), [n, H] -> [n, V] logits.
        hidden: [N, H] final hidden states; row i is the prediction of token `targets[i]`.
        targets: [N] token ids.
    Returns:
        [N] float32 log-probs, differentiable w.r.t. `hidden` and the head's parameters.
    """
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"hidden must be [N, H] with targets [N]; got {tuple(hidden.shape)} and "
                         f"{tuple(targets.shape)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    recompute = torch.is_grad_enabled()
    chunks = list(zip(hidden.split(chunk_size), targets.split(chunk_size)))
    chunks += [(hidden[:0], targets[:0])] * (_chunks_every_rank_runs(head, len(chunks), hidden.device) - len(chunks))
    pieces = []
    for rows, ids in chunks:
        if recompute:
            pieces.append(checkpoint(_chunk_logprobs, head, rows, ids, temperature, use_reentrant=False))
        else:
            pieces.append(_chunk_logprobs(head, rows, ids, temperature))
    return torch.cat(pieces)


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The HF model inside `model`: itself, or what a wrapper (DeepSpeedEngine, DDP) holds as `.module`."""
    inner = model
    while isinstance(getattr(inner, "module", None), torch.nn.Module):
        inner = inner.module
    return inner


def output_layers(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(final norm of the text model, lm_head) of a Qwen3-VL causal LM, itself or wrapped.

    `model` may be the HF model or a wrapper holding it as `.module` (DeepSpeedEngine, DDP).
    """
    inner = unwrapped(model)
    text_model = getattr(getattr(inner, "model", None), "language_model", None)
    norm = getattr(text_model, "norm", None)
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if not isinstance(norm, torch.nn.Module) or not isinstance(head, torch.nn.Module):
        raise TypeError(f"token log-probs need a Qwen3-VL-style causal LM (`.model.language_model.norm` and "
                        f"`get_output_embeddings()`), optionally wrapped as `.module`; got {type(model).__name__} "
                        f"holding {type(inner).__name__}")
    return norm, head


def final_hidden_states(model: torch.nn.Module, inputs: dict[str, torch.Tensor],
                        norm: torch.nn.Module) -> torch.Tensor:
    """[B, L, H] output of `norm` (the text model's last layer) in one forward of `model` on `inputs`.

    `logits_to_keep=1` has the model project only the last position to the vocabulary.
    """
    captured: list[torch.Tensor] = []
    handle = norm.register_forward_hook(lambda module, args, output: captured.append(output))
    try:
        model(**inputs, logits_to_keep=1)
    finally:
        handle.remove()
    if len(captured) != 1:
        raise RuntimeError(f"expected the text model's final norm to run once per forward, it ran {len(captured)} "
                           "times; the model's layout is not the Qwen3-VL one this code reads")
    return captured[0]


def teacher_forced_logprobs(model: torch.nn.Module, inputs: dict[str, torch.Tensor], temperature: float,
                            needed: torch.Tensor | None = None, chunk_size: int = LOGPROB_CHUNK) -> torch.Tensor:
    """Log-prob of each input token given its prefix, under `model` at `temperature`.

    Args:
        inputs: the model's keyword inputs, `input_ids` [B, L] among them.
        needed: [B, L] bool or 0/1: the positions t whose log-prob is wanted; None = all.
    Returns:
        [B, L] float32; position t holds log p(input_ids[:, t] | input_ids[:, :t]), 0 at position 0
        (no prediction) and wherever `needed` is off.
    """
    ids = inputs["input_ids"]  # [B, L]
    if needed is not None and needed.shape != ids.shape:
        raise ValueError(f"needed must be shaped like input_ids {tuple(ids.shape)}, got {tuple(needed.shape)}")
    want = torch.ones_like(ids, dtype=torch.bool) if needed is None else needed.to(ids.device, torch.bool).clone()
    want[:, 0] = False
    norm, head = output_layers(model)
    hidden = final_hidden_states(model, inputs, norm)  # [B, L, H]
    rows, cols = want.nonzero(as_tuple=True)  # [N] each; hidden at t - 1 predicts token t
    picked = selected_token_logprobs(head, hidden[rows, cols - 1], ids[rows, cols], temperature, chunk_size)
    return torch.zeros(ids.shape, dtype=torch.float32, device=ids.device).index_put((rows, cols), picked)
