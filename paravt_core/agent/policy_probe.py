"""The log-probability probe: a server's log-probabilities of a fixed prompt's continuation
against the local model's, so a server is held to its weights, not its name (issues #48, #61).

A server answers status 200 whatever weights it holds. The probe asks it for a few tokens
after `PROBE_TEXT` with each one's log-probability, then recomputes them from the local
model by teacher forcing (`teacher_forced_logprobs`, the trainer's own policy pass); the
mean absolute difference, in nats per token, is the gap. Another model's weights give a gap
orders of magnitude above `TOLERANCE` (issue #48: the base model served for the SFT one).

Two users:
- RL rollouts, on the rollout engine's token-id endpoint after each weight push
  (`rl/served_policy.py`, which adds the RL stage's message);
- the evaluation, on the OpenAI API (`/v1/completions`, prompt as token ids) before its
  first sample (`served_completion_probe`, `check_served_logprobs`; `eval/stage.py`): the
  served-model check takes a server whose root is not a folder here on its name, and the
  probe fails a wrong model however it is named.

Tolerance, per token in nats (`rl.served_logprob_tolerance` overrides):
- float32: 1e-3. Measured on vLLM's CPU build with the tiny model: the served values equal
  the teacher-forced ones within 2e-4 (tests/server/test_vllm_rollouts.py); another model's
  weights differ by orders of magnitude more.
- bfloat16: 0.1. Set, not measured: an assumption that bf16 kernels (the server's on the GPU
  against the trainer's, or the evaluation's local pass on the CPU) differ by hundredths of a
  nat per token, far below a wrong model's gap; raise it with `rl.served_logprob_tolerance`
  if a GPU run stops here with a gap well below a wrong model's. The evaluation's server is
  started in `model.dtype` (`server_launch.server_command`), the dtype compared against.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from paravt_core.agent.served_model import request_json
from paravt_core.model.loading import build_model
from paravt_core.model.logprobs import teacher_forced_logprobs

if TYPE_CHECKING:
    from paravt_core.config import ModelConfig

PROBE_TEXT = "PARAVT-POLICY-PROBE. Describe what happens in the video, in temporal order."
PROBE_NEW_TOKENS = 8
# At temperature 1 the served log-probabilities are log_softmax(logits) whichever logprobs
# mode the server runs (vLLM's default raw mode or the rollouts' processed mode).
PROBE_TEMPERATURE = 1.0
PROBE_SEED = 0
TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1}


class ServedPolicyMismatch(RuntimeError):
    """The server's log-probabilities are not the local model's."""


@dataclass(frozen=True)
class PolicyProbe:
    """The probe's prompt, the tokens the server sampled and their served log-probabilities."""

    prompt_ids: list[int]
    token_ids: list[int]
    served_logprobs: list[float]


def probe_prompt_ids(tokenizer: Any) -> list[int]:
    return list(tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"])


def trainer_logprobs(model: Any, probe: PolicyProbe, temperature: float, device: str) -> torch.Tensor:
    """[N] log-probabilities of the probe's sampled tokens under `model`, by teacher forcing."""
    ids = torch.tensor([probe.prompt_ids + probe.token_ids], device=device)  # [1, P + N]
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        logp = teacher_forced_logprobs(model, inputs, temperature)  # [1, P + N]
    return logp[0, len(probe.prompt_ids):].float().cpu()


def logprob_gap(probe: PolicyProbe, trainer: torch.Tensor) -> float:
    """Mean absolute difference (nats per token) of the served and the local log-probabilities."""
    served = torch.tensor(probe.served_logprobs, dtype=torch.float32)
    if served.shape != trainer.shape:
        raise ServedPolicyMismatch(f"the server returned {served.numel()} log-probabilities for "
                                   f"{len(probe.token_ids)} sampled tokens; the local model scored {trainer.numel()}")
    return float((served - trainer).abs().mean())


def probe_tolerance(dtype: str, configured: float | None) -> float:
    return configured if configured is not None else TOLERANCE.get(dtype, TOLERANCE["bfloat16"])


def _token_ids(choice: dict[str, Any]) -> list[int]:
    """The sampled token ids of a completion choice: vLLM's `token_ids` (`return_token_ids`),
    else its logprobs tokens spelled "token_id:N" (`return_tokens_as_token_ids`)."""
    if isinstance(choice.get("token_ids"), list):
        return [int(i) for i in choice["token_ids"]]
    return [int(str(token).removeprefix("token_id:")) for token in choice["logprobs"]["tokens"]]


def served_completion_probe(api_root: str, model_name: str, tokenizer: Any, *, api_key: str | None = None,
                            deadline_s: float = 600.0) -> PolicyProbe:
    """The server's sample after `PROBE_TEXT` on the OpenAI completions API, with each sampled
    token's log-probability at `PROBE_TEMPERATURE`; the request ends by `deadline_s`.

    Raises:
        ServerUnanswered: no answer in time, or not JSON.
        ServedPolicyMismatch: an answer without sampled token ids and their log-probabilities.
    """
    prompt = probe_prompt_ids(tokenizer)
    url = api_root.rstrip("/") + "/completions"
    data = request_json(url, api_key=api_key, deadline_s=deadline_s, payload={
        "model": model_name, "prompt": prompt, "max_tokens": PROBE_NEW_TOKENS, "temperature": PROBE_TEMPERATURE,
        "top_p": 1.0, "seed": PROBE_SEED, "logprobs": 1, "return_token_ids": True,
        "return_tokens_as_token_ids": True, "skip_special_tokens": False})
    try:
        choice = data["choices"][0]
        tokens = _token_ids(choice)
        logprobs = [float(value) for value in choice["logprobs"]["token_logprobs"]]
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
        raise ServedPolicyMismatch(f"POST {url} gave no sampled token ids with their log-probabilities "
                                   f"({type(error).__name__}: {str(error)[:200]}), so the served weights cannot be "
                                   "held to the checkpoint's; serve it with vLLM (`paravt eval serve`)") from None
    return PolicyProbe(prompt, tokens, logprobs)


def check_served_logprobs(api_root: str, model_name: str, checkpoint: str | Path, tokenizer: Any,
                          model_cfg: ModelConfig, tolerance: float, *, api_key: str | None = None,
                          deadline_s: float = 600.0) -> float:
    """The probe's gap between the server at `api_root` and `checkpoint` loaded here on the CPU
    (as `model_cfg` says, `model.loading.build_model`; released after); returns it.

    Raises:
        ServedPolicyMismatch: the gap exceeds `tolerance`, or the server gives no log-probabilities.
        ServerUnanswered: the server gives no answer in time.
    """
    import gc

    probe = served_completion_probe(api_root, model_name, tokenizer, api_key=api_key, deadline_s=deadline_s)
    # The evaluation's model reference is content-hashed when it is resolved: no second sha256 of
    # every weight file (16 GB at 8B) before the probe.
    model = build_model(model_cfg, checkpoint, device="cpu", checksums=False).eval()
    try:
        gap = logprob_gap(probe, trainer_logprobs(model, probe, PROBE_TEMPERATURE, "cpu"))
    finally:
        del model
        gc.collect()
    if gap > tolerance:
        raise ServedPolicyMismatch(
            f"the server at {api_root} does not serve the weights of {checkpoint}: its log-probabilities of a fixed "
            f"probe differ from that checkpoint's by {gap:.4g} nats per token (tolerance {tolerance:g}), whatever "
            f"its name says. Serve the checkpoint with `paravt eval serve --model {checkpoint}`; if the gap is "
            "numerical noise of this hardware, raise rl.served_logprob_tolerance")
    return gap
