"""The `hf` engine from the config: the one place an `HFEngine` is built (issue #63).

Two uses, one rule each:
- `evaluation`: engines that play episodes the way the `hf` evaluation does (the evaluation,
  the SFT grammar check, the miniature's probes). A turn's requests go to `generate` in
  sub-batches of at most `eval.hf_batch_tokens` left-padded prompt tokens, so its prefill and
  KV cache fit one card; greedy outputs are the same tokens either way (`HFEngine`).
- `rollout`: RL's rollout engine and its replay (`rl/replay.py`). One batch per turn: a sampled
  draw depends on how the requests are cut, and a replay must redraw the run's own. With
  `rl.shared_prefix` a prompt the turn's requests repeat (a group's G rollouts) is prefilled
  once (`HFEngine`'s `share_prompts`), as the passes that train on them run it once.

`paravt plan` sizes the same `generate` calls from `prefill_budget`, so the plan and the engine
read the budget from one place. This module does not import torch (the plan runs without it);
`build_hf_engine` imports the engine when it builds one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

# lazy: hf_engine loads torch and transformers (2.3 s + 0.9 s to import); plan.py imports this
# module, and `paravt plan` / `paravt preflight` run without them.

if TYPE_CHECKING:
    from paravt_core.agent.hf_engine import HFEngine
    from paravt_core.config import PipelineConfig

Use = Literal["evaluation", "rollout"]
USES: tuple[Use, ...] = ("evaluation", "rollout")


def prefill_budget(cfg: PipelineConfig, use: Use) -> int | None:
    """Left-padded prompt tokens per `generate` of an `hf` engine built for `use`; None: one batch."""
    if use not in USES:
        raise ValueError(f"an hf engine is built for one of {USES}, not {use!r}")
    return cfg.eval.hf_batch_tokens if use == "evaluation" else None


def build_hf_engine(cfg: PipelineConfig, model: Any, processor: Any, use: Use) -> HFEngine:
    """An `HFEngine` on `model` (built by `model.loading.build_model`) and its processor, for `use`."""
    from paravt_core.agent.hf_engine import HFEngine

    return HFEngine(model, processor, prefill_budget(cfg, use), share_prompts=use == "rollout" and cfg.rl.shared_prefix)
