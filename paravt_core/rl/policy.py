"""From episodes to a PARA-GRPO loss: trajectories, rewards, advantages, log-probs (SPEC §4, §5).

The step's data flow (each stage a function here, driven by `rl/worker.py`):
1. `trajectories`: the main-agent episodes, then (with `train_subagents`) their sub-agent
   runs, each with the structural-token mask of its ids (`agent/tags.py`: tags matched as
   token sequences, never as single ids).
2. `reference_pass`: log-probs of every trajectory under the frozen reference (KL).
3. `step_advantages`: rewards (SPEC §4), shaped, clipped, group-normalized (SPEC §5 steps
   1-2); `assign_token_advantages`: per-token advantages with the KL reward to go (step 3);
   the worker then batch-normalizes them over all ranks (step 4).
4. `micro_batch_loss`: decoupled PPO-clip over a micro-batch (step 5). The trainer takes ONE
   optimizer step per rollout batch, after every micro-batch's backward, so the policy that
   computes a micro-batch's log-probs IS the policy before the update: its detached
   log-probs are the proximal ones, with no second forward pass. A trainer that updated
   within a batch (PPO mini-batches) would need them recomputed before its first update.
Sub-agent trajectories get their episode's normalized scalar at their last generated token
and their own KL rewards (SPEC §5: sub-agents trained with their episode's advantage).
With `rl.shared_prefix` the reference and policy passes run each group's shared prompt once
per micro-batch (`rl/shared_prefix.py`), the micro-batches built by group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from paravt_core.agent.engine import GenerationRequest, VisionInputs
from paravt_core.agent.hf_engine import pad_requests
from paravt_core.agent.rollout import Episode
from paravt_core.agent.tags import TagLocator
from paravt_core.config import RLConfig
from paravt_core.rl.data import RLPrompt
from paravt_core.rl.grpo import (
    Moments,
    batch_normalize,
    behaviour_weight,
    group_advantages,
    masked_moments,
    policy_loss,
    shaped_reward,
    token_advantages,
)
from paravt_core.rl.kl import KLMode, kl_mode
from paravt_core.model.logprobs import LOGPROB_CHUNK, teacher_forced_logprobs
from paravt_core.rl.shared_prefix import group_order, shared_prefix_logprobs
from paravt_core.rewards import (
    RewardBreakdown,
    RewardScope,
    Scored,
    extract_answer,
    format_reward,
    reward_term_names,
    score_terms,
)

RewardFn = Callable[[Episode, RLPrompt], RewardBreakdown]


@dataclass
class Trajectory:
    """One trained sequence: a main-agent episode or a sub-agent run (with its episode's advantage)."""

    token_ids: torch.Tensor  # [L]
    loss_mask: torch.Tensor  # [L]
    old_logprobs: torch.Tensor  # [L] under the rollout engine
    vision: VisionInputs
    episode: int  # index of the episode it belongs to
    is_subagent: bool
    structural: torch.Tensor | None = None  # [L] bool, token anchoring only
    ref_logprobs: torch.Tensor | None = None  # [L], filled by the reference pass
    advantages: torch.Tensor | None = None  # [L], filled by assign_token_advantages
    prompt_length: int = 0  # tokens before the agent's first turn (its prompt, frames expanded)


def paravt_reward(cfg: RLConfig) -> RewardFn:
    """The SPEC §4 reward (`rewards.REWARD_TERMS` under the `reward` knobs) on the configured
    scope (§4.5)."""
    knobs = cfg.reward

    def score(episode: Episode, prompt: RLPrompt) -> RewardBreakdown:
        text = episode.text(knobs.scope)
        return score_terms(Scored(text, extract_answer(text), prompt.answer, prompt.question_type, prompt.question),
                           knobs)

    return score


def reward_means(rewards: Sequence[RewardBreakdown]) -> dict[str, float]:
    """The step metrics of the reward: `reward_<name>`, the mean of each term of
    `rewards.REWARD_TERMS` (unweighted), then `reward`, the mean of the summed reward."""
    means = {f"reward_{name}": float(np.mean([r.terms[name] for r in rewards])) for name in reward_term_names()}
    return means | {"reward": float(np.mean([r.total for r in rewards]))}


def fixed_format_reward(episode: Episode, scope: RewardScope = "generated") -> float:
    """R_fmt under ONE definition for every row (SPEC §5, Table 2 fτ): answer_suffix on,
    λ = 0.5, scope generated, so rows with different reward knobs stay comparable.

    `scope="transcript"` scores the forced think prefixes too. Under the SPEC's generated
    scope a row with `rollout.think_prefix` never shows an opening `<think>` (the prompt
    forced it), so the same written transcript scores 0.5 there and 1.0 without the prefix:
    the miniature Table 2 measured PARA-GRPO 0.49 against vanilla 0.99 at step 1, from one
    SFT policy (docs/log/miniature-world-v1.md). Both are logged (`f_tau_fixed`,
    `f_tau_fixed_transcript`)."""
    return format_reward(episode.text(scope), answer_suffix=True, anchor_weight=0.5)


def trajectories(episodes: Sequence[Episode], train_subagents: bool,
                 locator: TagLocator | None = None) -> list[Trajectory]:
    """The step's trained sequences; `locator` (token anchoring) marks their structural tokens."""
    out = [Trajectory(e.token_ids, e.loss_mask, e.old_logprobs, e.vision, i, False, prompt_length=e.prompt_length)
           for i, e in enumerate(episodes)]
    if train_subagents:
        for i, e in enumerate(episodes):
            out += [Trajectory(s.token_ids, s.loss_mask, s.old_logprobs, s.vision, i, True,
                               prompt_length=s.prompt_ids.numel()) for s in e.subagents]
    if locator is not None:
        for t in out:
            t.structural = locator.mask(t.token_ids)
    return out


def sequence_logprobs(model, batch_trajs: Sequence[Trajectory], pad_id: int, image_id: int, video_id: int,
                      temperature: float, device: str, needed: torch.Tensor | None = None,
                      chunk: int = LOGPROB_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each trajectory's own tokens under `model` (logits / temperature).

    Only the `needed` positions are projected to the vocabulary, in chunks (`model/logprobs.py`):
    no [B, L, V] logits tensor is built.

    Args:
        needed: [B, L] bool or 0/1, left-padded like the batch: the positions t whose
            logp[:, t] is wanted; None = every position.
        chunk: positions per [chunk, V] block of logits.
    Returns:
        (logp [B, L], left-padded, 0 at position 0 and off `needed`; valid [B, L] 1 where a
        real token has a prediction)
    """
    requests = [GenerationRequest(t.token_ids.tolist(), t.vision) for t in batch_trajs]
    padded = pad_requests(requests, pad_id, image_id, video_id)
    inputs = padded.model_inputs(torch.device(device))
    logp = teacher_forced_logprobs(model, inputs, temperature, needed, chunk)  # [B, L]; logp[:, t] predicts token t
    return logp, padded.attention_mask.to(device)


def left_pad(rows: Sequence[torch.Tensor], length: int, dtype=torch.float32) -> torch.Tensor:
    out = torch.zeros(len(rows), length, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, length - r.numel():] = r.to(dtype)
    return out


@dataclass(frozen=True)
class MicroBatch:
    """One forward (and backward) of a pass; a filler only keeps the ranks' collectives in step."""

    trajs: list[Trajectory]
    filler: bool = False


def micro_batches(trajs: Sequence[Trajectory], micro: int, count: int | None = None,
                  by_group: bool = False) -> list[MicroBatch]:
    """This rank's micro-batches of `micro` trajectories, then fillers up to `count`.

    `by_group` (`rl.shared_prefix`) orders the trajectories by the prompt they share first
    (`shared_prefix.group_order`): the count, ceil(trajectories / micro), is the same either way.

    Under ZeRO-3 every forward and backward gathers and scatters parameters with the other
    ranks, and the ranks hold different numbers of trajectories (sub-agent calls differ per
    episode): a rank that ran out of micro-batches would leave the others blocked. The ranks
    agree on `count` (the largest rank's) and a rank with fewer runs fillers: its first
    trajectory again, whose output is discarded and whose loss is weighed 0 (SPEC §5).

    Raises:
        ValueError: `count` below this rank's own count, or fillers asked for with no trajectory.
    """
    if by_group:  # a group's members side by side, so they share one prefix per micro-batch (rl.shared_prefix)
        trajs = [trajs[i] for i in group_order(trajs)]
    batches = [MicroBatch(list(trajs[i : i + micro])) for i in range(0, len(trajs), micro)]
    count = len(batches) if count is None else count
    if count < len(batches):
        raise ValueError(f"the ranks agreed on {count} micro-batches, but this rank has {len(batches)}")
    if count > len(batches) and not trajs:
        raise ValueError("this rank has no trajectory to run the agreed filler micro-batches with")
    return batches + [MicroBatch(list(trajs[:1]), filler=True)] * (count - len(batches))


def _needed(batch: Sequence[Trajectory]) -> torch.Tensor:
    """[B, L] bool, left-padded as the batch is: the positions whose log-prob a pass uses (the
    trained tokens); no other position is projected to the vocabulary."""
    return left_pad([t.loss_mask for t in batch], max(t.token_ids.numel() for t in batch), torch.bool)


def batch_logprobs(model, batch_trajs: Sequence[Trajectory], ids: dict[str, int], temperature: float, device: str,
                   chunk: int = LOGPROB_CHUNK, shared_prefix: bool = False) -> torch.Tensor:
    """[B, L] left-padded log-probs of a micro-batch's trained tokens (0 elsewhere): the per-row
    path, or with `shared_prefix` each group's prefix once (`rl/shared_prefix.py`)."""
    needed = _needed(batch_trajs)
    if shared_prefix:
        return shared_prefix_logprobs(model, batch_trajs, ids, temperature, device, needed, chunk)
    return sequence_logprobs(model, batch_trajs, ids["pad"], ids["image"], ids["video"], temperature, device,
                             needed=needed, chunk=chunk)[0]


def _logprob_pass(model, trajs: Sequence[Trajectory], micro: int, ids: dict[str, int], temperature: float,
                  device: str, count: int | None = None, chunk: int = LOGPROB_CHUNK,
                  shared_prefix: bool = False) -> list[tuple[Trajectory, torch.Tensor]]:
    rows: list[tuple[Trajectory, torch.Tensor]] = []
    with torch.no_grad():
        for batch in micro_batches(trajs, micro, count, by_group=shared_prefix):
            logp = batch_logprobs(model, batch.trajs, ids, temperature, device, chunk, shared_prefix)
            if not batch.filler:
                rows += [(t, row[row.numel() - t.token_ids.numel():]) for row, t in zip(logp.cpu(), batch.trajs)]
    return rows


def reference_pass(ref_model, trajs: Sequence[Trajectory], micro: int, ids: dict[str, int], temperature: float,
                   device: str, count: int | None = None, chunk: int = LOGPROB_CHUNK,
                   shared_prefix: bool = False) -> None:
    """Fill each trajectory's `ref_logprobs` (on its trained tokens; 0 elsewhere) from the frozen
    reference (SPEC §5 KL). `count`: the micro-batches the ranks agreed on (`micro_batches`);
    `shared_prefix`: `rl.shared_prefix`."""
    for t, row in _logprob_pass(ref_model, trajs, micro, ids, temperature, device, count, chunk, shared_prefix):
        t.ref_logprobs = row


@dataclass
class StepAdvantages:
    """The step's per-episode terms (SPEC §5 steps 1-2); token advantages come from them."""

    per_episode: torch.Tensor  # [E] normalized scalar (R_acc + R_tool (+ R_fmt in sequence mode))
    format_per_episode: torch.Tensor | None  # [E] token anchoring only
    rewards: list[RewardBreakdown]
    kl: torch.Tensor  # [E] summed KL estimate of each episode's generated tokens (0 when not computed)
    # [E] the scalars group-normalized into `per_episode`: shaped and clipped (step 1), so a group
    # whose rewards differ only beyond the clip is as saturated as one with equal rewards
    shaped: torch.Tensor | None = None


def step_advantages(episodes: Sequence[Episode], prompts: Sequence[RLPrompt], cfg: RLConfig, reward_fn: RewardFn,
                    seq_kl: torch.Tensor) -> StepAdvantages:
    """Shaped, clipped, group-normalized scalars of the episodes (prompt-major, G per prompt).

    KL enters the group statistics only with `kl_mode: sequence_reward` (the older variant);
    the release's `token_reward` adds it per token afterwards (`assign_token_advantages`).
    """
    rewards = [reward_fn(e, prompts[e.prompt_index]) for e in episodes]
    fmt_w = cfg.reward.format_weight

    def shaped(values: torch.Tensor) -> torch.Tensor:
        return shaped_reward(values, cfg.reward_shift, cfg.reward_scale, cfg.reward_clip)

    def normalized(values: torch.Tensor) -> torch.Tensor:
        return group_advantages(values, cfg.group_size, cfg.adv_eps)

    if cfg.anchoring_mode == "token":
        main = torch.tensor([r.total - fmt_w * r.terms["format"] for r in rewards])
        fmt = normalized(shaped(torch.tensor([r.terms["format"] for r in rewards]) * fmt_w))
    else:
        main, fmt = torch.tensor([r.total for r in rewards]), None
    scalars = shaped(kl_mode(cfg).shaped_scalars(main, seq_kl))
    return StepAdvantages(normalized(scalars), fmt, rewards, seq_kl, scalars)


def assign_token_advantages(trajs: Sequence[Trajectory], adv: StepAdvantages, cfg: RLConfig) -> None:
    """Each trajectory's per-token advantages before batch normalization (SPEC §5 step 3).

    Token anchoring's format advantage goes to main-agent trajectories only: a sub-agent's
    end-of-turn token is structural too, but the format term scores the main agent's text.
    """
    kl = kl_mode(cfg)
    for t in trajs:
        kl_reward = kl.token_reward(t.old_logprobs, t.ref_logprobs)
        fmt = None
        if adv.format_per_episode is not None and not t.is_subagent:
            fmt = adv.format_per_episode[t.episode]
        t.advantages = token_advantages(adv.per_episode[t.episode], t.loss_mask, kl_reward, fmt, t.structural)


def local_advantage_moments(trajs: Sequence[Trajectory], main_agent_only: bool = False) -> Moments:
    """This rank's share of the batch statistics of step 4 (`rl.moments_main_agent_only`:
    over the main agent's trained tokens only)."""
    counted = [t for t in trajs if not (main_agent_only and t.is_subagent)]
    return masked_moments([t.advantages for t in counted], [t.loss_mask for t in counted])


def normalize_token_advantages(trajs: Sequence[Trajectory], moments: Moments, eps: float) -> None:
    """Step 4: batch-normalize every trajectory's token advantages with the (all-rank) moments."""
    normalized = batch_normalize([t.advantages for t in trajs], [t.loss_mask for t in trajs], moments, eps)
    for t, values in zip(trajs, normalized):
        t.advantages = values


def episode_kl(episodes: Sequence[Episode], trajs: Sequence[Trajectory], mode: KLMode) -> torch.Tensor:
    """Summed KL estimate over each episode's generated tokens [E] (`KLMode.episode_estimate`:
    k1 clamped as the token reward is for the release's per-token reward, k3 for the other
    modes, both under the rollout's log-probs)."""
    kl = torch.zeros(len(episodes))
    for t in trajs:
        if t.is_subagent or t.ref_logprobs is None:
            continue
        kl[t.episode] = mode.episode_estimate(t.old_logprobs, t.ref_logprobs, t.loss_mask.float())
    return kl


def micro_batch_loss(model, batch_trajs: Sequence[Trajectory], cfg: RLConfig, ids: dict[str, int],
                     total_tokens: float, device: str, world: int = 1,
                     weight: float = 1.0) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the step's token-mean loss (SPEC §5: ONE mean over every
    trained token of the step on every rank).

    Args:
        total_tokens: trained tokens of the whole step, summed over the ranks.
        world: data-parallel ranks. DeepSpeed averages the ranks' gradients, so each rank's
            share is scaled by `world`: the sum over ranks of the returned losses, divided by
            `world`, is the token mean over the step's batch.
        weight: 0 for a filler micro-batch (`micro_batches`): it runs forward and backward so
            the ranks' collectives stay in step, and adds nothing to the gradient.
    Needs `advantages` on every trajectory. With `decoupled_ppo` the proximal log-probs are
    this forward's, detached (module docstring: one optimizer step per rollout batch).
    """
    logp = batch_logprobs(model, batch_trajs, ids, cfg.temperature, device, cfg.logprob_chunk, cfg.shared_prefix)
    length = logp.shape[1]
    mask = left_pad([t.loss_mask for t in batch_trajs], length).to(device)  # [B, L]
    rollout = left_pad([t.old_logprobs for t in batch_trajs], length).to(device)  # [B, L]
    token_adv = left_pad([t.advantages for t in batch_trajs], length).to(device)  # [B, L]
    behaviour = None
    if cfg.decoupled_ppo:
        prox = logp.detach()  # [B, L] the policy before this step's update
        behaviour = behaviour_weight(prox, rollout, cfg.behaviour_weight_cap)
        loss, clip_frac = policy_loss(logp, prox, token_adv, mask, cfg.clip_eps, behaviour)
    else:
        loss, clip_frac = policy_loss(logp, rollout, token_adv, mask, cfg.clip_eps)
    n = mask.sum()
    scale = weight * world / max(float(total_tokens), 1.0)
    loss = loss * n * scale
    kl = kl_mode(cfg)
    if kl.in_loss:
        ref = left_pad([t.ref_logprobs for t in batch_trajs], length).to(device)
        loss = loss + kl.loss_term(logp, ref, mask) * scale
    dropped = float(((behaviour == 0).float() * mask).sum()) if behaviour is not None else 0.0
    counted = float(weight > 0)
    return loss, {"clip_frac": float(clip_frac) * float(n) * counted, "tokens": float(n) * counted,
                  "dropped_tokens": dropped * counted}
