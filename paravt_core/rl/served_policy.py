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

The probe, its tolerance and the gap are `agent/policy_probe.py`'s (the evaluation runs
the same probe on its server, issue #61); this module draws it on a rollout engine.
"""

from __future__ import annotations

from typing import Any

from paravt_core.agent.engine import GenerationRequest, RolloutEngine, SamplingParams
from paravt_core.agent.policy_probe import (
    PROBE_NEW_TOKENS,
    TOLERANCE,
    PolicyProbe,
    ServedPolicyMismatch,
    logprob_gap,
    probe_prompt_ids,
    probe_tolerance,
    trainer_logprobs,
)

__all__ = ["PROBE_NEW_TOKENS", "TOLERANCE", "PolicyProbe", "ServedPolicyMismatch", "check_gap", "draw_probe",
           "logprob_gap", "probe_tolerance", "trainer_logprobs"]


def draw_probe(engine: RolloutEngine, tokenizer: Any, temperature: float, seed: int) -> PolicyProbe:
    """The server's sample after `PROBE_TEXT`, with its log-probabilities at `temperature`."""
    prompt = probe_prompt_ids(tokenizer)
    params = SamplingParams(max_new_tokens=PROBE_NEW_TOKENS, temperature=temperature, seed=seed)
    (generation,) = engine.generate([GenerationRequest(list(prompt))], params)
    return PolicyProbe(list(prompt), list(generation.token_ids), list(generation.logprobs))


def check_gap(gap: float, tolerance: float, server: str) -> None:
    """Raise `ServedPolicyMismatch` when the probe's gap exceeds `tolerance` (module docstring)."""
    if gap > tolerance:
        raise ServedPolicyMismatch(
            f"the rollout server at {server} does not serve the policy: after the policy's weights were pushed, its "
            f"log-probabilities of a fixed probe differ from the trainer's by {gap:.4g} nats per token (tolerance "
            f"{tolerance:g}). It did not load them, or serves another model's architecture; restart it on the RL "
            "stage's starting checkpoint (or leave rl.rollout.<engine>.url unset to have one launched). If the gap "
            "is numerical noise of this hardware, raise rl.served_logprob_tolerance")
