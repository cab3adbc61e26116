"""From episodes to a PARA-GRPO loss: trajectories, rewards, advantages, log-probs (SPEC §4, §5)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from paravt_core.agent.engine import GenerationRequest, VisionInputs
from paravt_core.agent.hf_engine import pad_requests
from paravt_core.agent.rollout import Episode
from paravt_core.config import RLConfig
from paravt_core.rl.data import RLPrompt
from paravt_core.rl.grpo import (
    group_advantages,
    kl_per_token,
    policy_loss,
    sequence_kl,
    shaped_reward,
    token_advantages,
)
from paravt_core.rl.rewards import RewardBreakdown, compute_reward

STRUCTURAL_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<answer>", "</answer>", "<|im_end|>")

RewardFn = Callable[[Episode, RLPrompt], RewardBreakdown]


@dataclass
class Trajectory:
    """One trained sequence: a main-agent episode or a sub-agent run (with its episode's advantage)."""

    token_ids: torch.Tensor  # [L]
    loss_mask: torch.Tensor  # [L]
    old_logprobs: torch.Tensor  # [L]
    vision: VisionInputs
    episode: int  # index of the episode it belongs to
    is_subagent: bool
    ref_logprobs: torch.Tensor | None = None  # [L], filled by the reference pass


def paravt_reward(cfg: RLConfig) -> RewardFn:
    """The SPEC §4 reward on the configured scope (§4.5)."""
    r = cfg.reward

    def score(episode: Episode, prompt: RLPrompt) -> RewardBreakdown:
        out = compute_reward(episode.text(r.scope), prompt.answer, prompt.question_type,
                             answer_suffix=r.answer_suffix, anchor_weight=r.anchor_weight,
                             format_weight=r.format_weight, oe_mode=r.oe_mode, question=prompt.question,
                             unclosed_think_penalty=r.unclosed_think_penalty)
        if not r.use_tool_reward:
            out = RewardBreakdown(out.answer, out.acc, out.format, 0.0, out.acc + r.format_weight * out.format)
        return out

    return score


def trajectories(episodes: Sequence[Episode], train_subagents: bool) -> list[Trajectory]:
    out = [Trajectory(e.token_ids, e.loss_mask, e.old_logprobs, e.vision, i, False) for i, e in enumerate(episodes)]
    if train_subagents:
        for i, e in enumerate(episodes):
            out += [Trajectory(s.token_ids, s.loss_mask, s.old_logprobs, s.vision, i, True) for s in e.subagents]
    return out


def sequence_logprobs(model, batch_trajs: Sequence[Trajectory], pad_id: int, image_id: int, video_id: int,
                      temperature: float, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each trajectory's own tokens under `model` (logits / temperature).

    Returns:
        (logp [B, L], left-padded; valid [B, L] 1 where a real token has a prediction)
    """
    requests = [GenerationRequest(t.token_ids.tolist(), t.vision) for t in batch_trajs]
    padded = pad_requests(requests, pad_id, image_id, video_id)
    inputs = padded.model_inputs(torch.device(device))
    logits = model(**inputs).logits.float() / temperature  # [B, L, V]
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, inputs["input_ids"][:, 1:, None]).squeeze(-1)
    logp = torch.nn.functional.pad(logp, (1, 0))  # align: logp[:, t] predicts token t
    return logp, padded.attention_mask.to(device)


def left_pad(rows: Sequence[torch.Tensor], length: int, dtype=torch.float32) -> torch.Tensor:
    out = torch.zeros(len(rows), length, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, length - r.numel():] = r.to(dtype)
    return out


@dataclass
class StepAdvantages:
    per_episode: torch.Tensor  # [E] sequence advantage (R_acc + R_tool (+ R_fmt in sequence mode))
    format_per_episode: torch.Tensor | None  # [E] token anchoring only
    rewards: list[RewardBreakdown]
    kl: torch.Tensor  # [E] summed KL of each episode (0 when not computed)


def step_advantages(episodes: Sequence[Episode], prompts: Sequence[RLPrompt], cfg: RLConfig, reward_fn: RewardFn,
                    seq_kl: torch.Tensor) -> StepAdvantages:
    """Group-normalized advantages of the episodes (prompt-major, G per prompt)."""
    rewards = [reward_fn(e, prompts[e.prompt_index]) for e in episodes]
    fmt_w = cfg.reward.format_weight
    if cfg.anchoring_mode == "token":
        main = torch.tensor([r.total - fmt_w * r.format for r in rewards])
        fmt = group_advantages(shaped_reward(torch.tensor([r.format for r in rewards]) * fmt_w,
                                             cfg.reward_shift, cfg.reward_scale), cfg.group_size)
    else:
        main, fmt = torch.tensor([r.total for r in rewards]), None
    if cfg.kl_mode == "reward":
        main = main - cfg.kl_coef * seq_kl
    adv = group_advantages(shaped_reward(main, cfg.reward_shift, cfg.reward_scale), cfg.group_size)
    return StepAdvantages(adv, fmt, rewards, seq_kl)


def structural_mask(token_ids: torch.Tensor, structural_ids: torch.Tensor) -> torch.Tensor:
    return torch.isin(token_ids, structural_ids)


def reference_pass(ref_model, trajs: Sequence[Trajectory], micro: int, ids: dict[str, int], temperature: float,
                   device: str) -> None:
    """Fill each trajectory's `ref_logprobs` from the frozen reference (SPEC §5 KL)."""
    with torch.no_grad():
        for i in range(0, len(trajs), micro):
            chunk = trajs[i : i + micro]
            logp, _ = sequence_logprobs(ref_model, chunk, ids["pad"], ids["image"], ids["video"], temperature, device)
            for row, t in zip(logp.cpu(), chunk):
                t.ref_logprobs = row[row.numel() - t.token_ids.numel():]


def episode_kl(episodes: Sequence[Episode], trajs: Sequence[Trajectory]) -> torch.Tensor:
    """Summed KL(rollout policy || reference) over each episode's generated tokens [E]."""
    kl = torch.zeros(len(episodes))
    for t in trajs:
        if not t.is_subagent and t.ref_logprobs is not None:
            kl[t.episode] = sequence_kl(t.old_logprobs[None], t.ref_logprobs[None], t.loss_mask[None].float())[0]
    return kl


def micro_batch_loss(model, batch_trajs: Sequence[Trajectory], adv: StepAdvantages, cfg: RLConfig, ids: dict[str, int], structural_ids: torch.Tensor, total_tokens: int,
                     device: str) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the step's token-mean loss (sums to the token mean over the step)."""
    logp, _ = sequence_logprobs(model, batch_trajs, ids["pad"], ids["image"], ids["video"], cfg.temperature, device)
    length = logp.shape[1]
    mask = left_pad([t.loss_mask for t in batch_trajs], length).to(device)  # [B, L]
    old = left_pad([t.old_logprobs for t in batch_trajs], length).to(device)
    tokens = torch.stack([torch.nn.functional.pad(t.token_ids, (length - t.token_ids.numel(), 0)) for t in batch_trajs])
    episode_idx = torch.tensor([t.episode for t in batch_trajs])
    fmt = adv.format_per_episode[episode_idx] if adv.format_per_episode is not None else None
    structural = structural_mask(tokens, structural_ids).to(device) if fmt is not None else None
    token_adv = token_advantages(adv.per_episode[episode_idx].to(device), mask,
                                 fmt.to(device) if fmt is not None else None, structural)
    loss, clip_frac = policy_loss(logp, old, token_adv, mask, cfg.clip_eps)
    n = mask.sum()
    loss = loss * n / total_tokens
    if cfg.kl_mode == "loss":
        ref = left_pad([t.ref_logprobs for t in batch_trajs], length).to(device)
        loss = loss + cfg.kl_coef * (kl_per_token(logp, ref) * mask).sum() / total_tokens
    return loss, {"clip_frac": float(clip_frac) * float(n), "tokens": float(n)}
