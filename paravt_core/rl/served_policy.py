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

Under `rl.overlap: 1` (issue #65) the probe runs after every push, not only before step 1:
the server then generates the next batch while the trainer trains, and the probe's collective
holds every rank's next rollout until rank 0's push has landed. A vLLM server also says, in
each reply, which weights sampled its tokens (the label each push tags: `agent.engine.weight_label`);
`check_served_versions` holds a batch's labels to the version its schedule names.

The probe, its tolerance and the gap are `agent/policy_probe.py`'s (the evaluation runs
the same probe on its server, issue #61); this module draws it on a rollout engine.

While rank 0 waits for the probe's answer the other ranks wait in a collective (the probe's
broadcast). The probe's HTTP timeout is therefore kept below that collective's timeout
(`probe_timeout_s`): a server that does not answer fails rank 0 with an error naming the
server, before the other ranks fail with one naming only NCCL or gloo.
"""

from __future__ import annotations

from typing import Any

from paravt_core.agent.engine import GenerationRequest, RolloutEngine, SamplingParams, weight_label
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

__all__ = ["PROBE_NEW_TOKENS", "TOLERANCE", "PolicyProbe", "ServedPolicyMismatch", "check_gap", "check_served_versions",
           "collective_timeout_s", "draw_probe", "logprob_gap", "probe_timeout_s", "probe_tolerance",
           "trainer_logprobs"]

PROBE_SHARE_OF_COLLECTIVE = 0.9  # of the collective timeout the probe may wait: its error comes first


def collective_timeout_s() -> float:
    """The timeout of the ranks' collectives: `dist.rank.init_distributed` passes none, so DeepSpeed's
    `default_pg_timeout` applies (DEEPSPEED_TIMEOUT minutes; 10 by default in deepspeed 0.19.8)."""
    from deepspeed.constants import default_pg_timeout

    return default_pg_timeout.total_seconds()


def probe_timeout_s(request_timeout_s: float, collective_s: float) -> float:
    """The probe's HTTP timeout: the rollout requests' (`rl.rollout.<engine>.request_timeout_s`,
    3600 s by default), cut to below the collective timeout the other ranks wait in."""
    return min(request_timeout_s, PROBE_SHARE_OF_COLLECTIVE * collective_s)


def draw_probe(engine: RolloutEngine, tokenizer: Any, temperature: float, seed: int,
               collective_s: float | None = None) -> PolicyProbe:
    """The server's sample after `PROBE_TEXT`, with its log-probabilities at `temperature`; with
    `collective_s`, its HTTP requests time out within `probe_timeout_s` of it (module docstring)."""
    prompt = probe_prompt_ids(tokenizer)
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


def check_gap(gap: float, tolerance: float, server: str) -> None:
    """Raise `ServedPolicyMismatch` when the probe's gap exceeds `tolerance` (module docstring)."""
    if gap > tolerance:
        raise ServedPolicyMismatch(
            f"the rollout server at {server} does not serve the policy: after the policy's weights were pushed, its "
            f"log-probabilities of a fixed probe differ from the trainer's by {gap:.4g} nats per token (tolerance "
            f"{tolerance:g}). It did not load them, or serves another model's architecture; restart it on the RL "
            "stage's starting checkpoint (or leave rl.rollout.<engine>.url unset to have one launched). If the gap "
            "is numerical noise of this hardware, raise rl.served_logprob_tolerance")


def check_served_versions(served: dict[str, int], version: int, where: str, server: str) -> None:
    """Raise `ServedPolicyMismatch` unless the server says every token of a batch (`served`:
    {weight label: tokens}) was sampled by W(`version`), the weights the schedule names
    (`rl/overlap.behaviour_version`); `where` names the step and rank."""
    expected = weight_label(version)
    if not served:
        raise ServedPolicyMismatch(f"{where}: the rollout server at {server} named no weight version in its replies; "
                                   "the RL stage needs a vLLM that reports `weight_versions` (requirements-serve.txt)")
    wrong = {label: tokens for label, tokens in sorted(served.items()) if label != expected}
    if wrong:
        raise ServedPolicyMismatch(
            f"{where}: the rollout server at {server} sampled {sum(wrong.values())} of the batch's "
            f"{sum(served.values())} tokens with other weights than the schedule's {expected} (W({version})): "
            f"{wrong}. A push landed during the batch or was lost; the step's batch is not the schedule's")
