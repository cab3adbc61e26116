"""Holding a rollout server's weights to the trainer's policy before RL step 1 (issue #48).

A rollout server (`rl.rollout.engine: vllm` or `sglang`) serves whatever weights it holds:
the ones it was started on, or a previous run's that were loaded into it after each of
that run's steps, though `/v1/models` still names the folder it started from. So the
trainer pushes the policy's weights to it before step 1 on every run (`rl/worker.py`), and
then plays one fixed probe on it: the server samples a few tokens after a fixed text
prompt and returns each one's log-probability at the rollout temperature; the trainer
recomputes them by teacher forcing (the same `teacher_forced_logprobs` as its own policy
pass). If the mean absolute difference exceeds the tolerance, the server does not serve
the policy (the push did not take, or it serves another architecture's weights) and the
run stops before any rollout.

Tolerance, per token in nats (`rl.served_logprob_tolerance` overrides):
- float32: 1e-3. Measured on vLLM's CPU build with the tiny model: the served values equal
  the teacher-forced ones within 2e-4 (tests/server/test_vllm_rollouts.py); another model's
  weights differ by orders of magnitude more (issue #48: the base model served instead of
  the SFT one gave a step-1 KL of 13.99).
- bfloat16: 0.1. Set, not measured: bf16 kernels of server and trainer differ by a few
  hundredths per token; raise it with `rl.served_logprob_tolerance` if a GPU run stops
  here with a gap well below a wrong model's.

While rank 0 waits for the probe's answer the other ranks wait in a collective (the probe's
broadcast). The probe's HTTP timeout is therefore kept below that collective's timeout
(`probe_timeout_s`): a server that does not answer fails rank 0 with an error naming the
server, before the other ranks fail with one naming only NCCL or gloo.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from paravt_core.agent.engine import GenerationRequest, RolloutEngine, SamplingParams

PROBE_TEXT = "PARAVT-POLICY-PROBE. Describe what happens in the video, in temporal order."
PROBE_NEW_TOKENS = 8
TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1}
PROBE_SHARE_OF_COLLECTIVE = 0.9  # of the collective timeout the probe may wait: its error comes first


def collective_timeout_s() -> float:
    """The timeout of the ranks' collectives: `dist.init_distributed` passes none, so DeepSpeed's
    `default_pg_timeout` applies (DEEPSPEED_TIMEOUT minutes; 10 by default in deepspeed 0.19.8)."""
    from deepspeed.constants import default_pg_timeout

    return default_pg_timeout.total_seconds()


def probe_timeout_s(request_timeout_s: float, collective_s: float) -> float:
    """The probe's HTTP timeout: the rollout requests' (`rl.rollout.<engine>.request_timeout_s`,
    3600 s by default), cut to below the collective timeout the other ranks wait in."""
    return min(request_timeout_s, PROBE_SHARE_OF_COLLECTIVE * collective_s)


class ServedPolicyMismatch(RuntimeError):
    """The rollout server's log-probabilities are not the trainer's policy's."""


@dataclass(frozen=True)
class PolicyProbe:
    """The probe's prompt, the tokens the server sampled and their served log-probabilities."""

    prompt_ids: list[int]
    token_ids: list[int]
    served_logprobs: list[float]


def draw_probe(engine: RolloutEngine, tokenizer: Any, temperature: float, seed: int,
               collective_s: float | None = None) -> PolicyProbe:
    """The server's sample after `PROBE_TEXT`, with its log-probabilities at `temperature`; with
    `collective_s`, its HTTP requests time out within `probe_timeout_s` of it (module docstring)."""
    prompt = tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    params = SamplingParams(max_new_tokens=PROBE_NEW_TOKENS, temperature=temperature, seed=seed)
    served_timeout = getattr(engine, "timeout_s", None)  # the HTTP engines' per-request timeout
    if collective_s is not None and served_timeout is not None:
        engine.timeout_s = probe_timeout_s(served_timeout, collective_s)
    try:
        (generation,) = engine.generate([GenerationRequest(list(prompt))], params)
    finally:
        if served_timeout is not None:
            engine.timeout_s = served_timeout
    return PolicyProbe(list(prompt), list(generation.token_ids), list(generation.logprobs))


def trainer_logprobs(model: Any, probe: PolicyProbe, temperature: float, device: str) -> torch.Tensor:
    """[N] log-probabilities of the probe's sampled tokens under `model`, by teacher forcing."""
    from paravt_core.model.logprobs import teacher_forced_logprobs

    ids = torch.tensor([probe.prompt_ids + probe.token_ids], device=device)  # [1, P + N]
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        logp = teacher_forced_logprobs(model, inputs, temperature)  # [1, P + N]
    return logp[0, len(probe.prompt_ids):].float().cpu()


def logprob_gap(probe: PolicyProbe, trainer: torch.Tensor) -> float:
    """Mean absolute difference (nats per token) of the served and the trainer's log-probabilities."""
    served = torch.tensor(probe.served_logprobs, dtype=torch.float32)
    if served.shape != trainer.shape:
        raise ServedPolicyMismatch(f"the server returned {served.numel()} log-probabilities for "
                                   f"{len(probe.token_ids)} sampled tokens; the trainer scored {trainer.numel()}")
    return float((served - trainer).abs().mean())


def probe_tolerance(dtype: str, configured: float | None) -> float:
    return configured if configured is not None else TOLERANCE.get(dtype, TOLERANCE["bfloat16"])


def check_gap(gap: float, tolerance: float, server: str) -> None:
    """Raise `ServedPolicyMismatch` when the probe's gap exceeds `tolerance` (module docstring)."""
    if gap > tolerance:
        raise ServedPolicyMismatch(
            f"the rollout server at {server} does not serve the policy: after the policy's weights were pushed, its "
            f"log-probabilities of a fixed probe differ from the trainer's by {gap:.4g} nats per token (tolerance "
            f"{tolerance:g}). It did not load them, or serves another model's architecture; restart it on the RL "
            "stage's starting checkpoint (or leave rl.rollout.<engine>.url unset to have one launched). If the gap "
            "is numerical noise of this hardware, raise rl.served_logprob_tolerance")
