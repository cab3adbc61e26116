"""What every RL step checks of its trajectories before the loss (SPEC §3, §5).

A wrong loss mask, a frame count that does not match its image tokens or a token id past
the vocabulary does not crash a PPO step: it trains on the wrong tokens, or fails deep in
the model with a shape error that names no episode. `check_trajectories` fails fast
instead, naming the step, rank, prompt, video and agent of the first bad trajectory:

- the loss mask is 0/1, as long as the ids, and covers exactly the tokens the
  trajectory's own agent generated: the main agent's mask is rebuilt from its transcript
  (prompt and forced segments 0, generated segments 1), a sub-agent's is 0 on its prompt
  and 1 on its summary; no trained token is a vision placeholder;
- the image (video) placeholder tokens equal the processed frames' grid
  (t * h * w / merge_size^2 per frame), and every trajectory carries frames: a text-only
  micro-batch would skip the vision tower's collectives on one rank under ZeRO-3;
- with nFrames gating on, each episode's overview budget K is one of `rl.gating.choices`;
- every token id lies in [0, vocab size); the engine's log-probs of trained tokens are
  finite and not above 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from paravt_core.agent.rollout import Episode
from paravt_core.rl.data import RLPrompt


class TrajectoryContractError(ValueError):
    """A trajectory the step must not train on; the message names it and what is wrong."""


@dataclass(frozen=True)
class TokenLayout:
    """The model's ids the contract checks against."""

    vocab_size: int
    image_id: int
    video_id: int
    vision_ids: frozenset[int]  # placeholders and vision start/end: never trained
    merge_size: int

    @classmethod
    def of(cls, model_config, tokenizer, merge_size: int) -> TokenLayout:
        """From a Qwen3-VL model config and its tokenizer."""
        text = getattr(model_config, "text_config", model_config)
        marks = [tokenizer.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|vision_end|>")]
        ids = {model_config.image_token_id, model_config.video_token_id, *[m for m in marks if m is not None]}
        return cls(int(text.vocab_size), int(model_config.image_token_id), int(model_config.video_token_id),
                   frozenset(ids), int(merge_size))


def expected_main_mask(episode: Episode) -> torch.Tensor | None:
    """The loss mask the main agent's transcript implies [L], or None when a segment does
    not record its token count."""
    parts = [torch.zeros(episode.prompt_length, dtype=torch.long)]
    for segment in episode.transcript:
        if segment.tokens is None:
            return None
        parts.append(torch.full((segment.tokens,), int(segment.generated), dtype=torch.long))
    return torch.cat(parts)


def _placeholders(grid: torch.Tensor | None, merge_size: int) -> int:
    return 0 if grid is None else int(grid.prod(dim=-1).sum()) // (merge_size * merge_size)


def trajectory_problem(traj, episode: Episode, layout: TokenLayout) -> str | None:
    """What is wrong with one trajectory (`rl.policy.Trajectory`), or None."""
    ids, mask, logp = traj.token_ids, traj.loss_mask, traj.old_logprobs
    if not (ids.numel() == mask.numel() == logp.numel()):
        return f"{ids.numel()} ids, {mask.numel()} loss-mask values and {logp.numel()} log-probs"
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= layout.vocab_size):
        bad = ids[(ids < 0) | (ids >= layout.vocab_size)]
        return f"token id {int(bad[0])} outside the vocabulary [0, {layout.vocab_size})"
    if not bool(((mask == 0) | (mask == 1)).all()):
        return f"loss mask holds values other than 0 and 1: {sorted(set(mask.tolist()))[:5]}"
    if traj.is_subagent:
        expected = torch.cat([torch.zeros(traj.prompt_length, dtype=torch.long),
                              torch.ones(ids.numel() - traj.prompt_length, dtype=torch.long)])
    else:
        expected = expected_main_mask(episode)
    if expected is not None and (expected.numel() != mask.numel() or not torch.equal(expected, mask.long())):
        if expected.numel() != mask.numel():
            return f"loss mask of {mask.numel()} tokens, but the transcript holds {expected.numel()}"
        where = int(torch.nonzero(expected != mask.long())[0])
        return (f"loss mask is {int(mask[where])} at token {where} where the agent's own generated tokens give "
                f"{int(expected[where])} (the mask must cover exactly its generated tokens)")
    trained_vision = [i for i in ids[mask.bool()].tolist() if i in layout.vision_ids]
    if trained_vision:
        return f"{len(trained_vision)} vision placeholder token(s) carry loss"
    vision = traj.vision
    for name, token, grid in (("image", layout.image_id, vision.image_grid_thw),
                              ("video", layout.video_id, vision.video_grid_thw)):
        count, want = int((ids == token).sum()), _placeholders(grid, layout.merge_size)
        if count != want:
            return f"{count} {name} placeholder tokens, but its frames' grid needs {want}"
    if vision.image_grid_thw is None and vision.video_grid_thw is None:
        return "no frames (every trajectory carries its video's frames)"
    trained_logp = logp[mask.bool()]
    if trained_logp.numel() and not bool((torch.isfinite(trained_logp) & (trained_logp <= 1e-4)).all()):
        return "the rollout engine's log-probs of its generated tokens are not all finite and <= 0"
    return None


def check_trajectories(trajs: Sequence, episodes: Sequence[Episode], prompts: Sequence[RLPrompt],
                       layout: TokenLayout, gating_choices: Sequence[int] | None, where: str) -> None:
    """Raise `TrajectoryContractError` naming the first trajectory that breaks the contract
    (module docstring). `where`: the step and rank, for the message."""
    for e in episodes:
        if gating_choices is not None and e.nframes not in gating_choices:
            prompt = prompts[e.prompt_index].prompt
            raise TrajectoryContractError(
                f"{where}: episode {e.sample_index} of prompt {e.prompt_id} (video {prompt.video_path}) has an "
                f"overview budget K={e.nframes} outside rl.gating.choices {list(gating_choices)}")
    for i, t in enumerate(trajs):
        episode = episodes[t.episode]
        problem = trajectory_problem(t, episode, layout)
        if problem is not None:
            prompt = prompts[episode.prompt_index].prompt
            agent = "a sub-agent" if t.is_subagent else "the main agent"
            raise TrajectoryContractError(
                f"{where}: trajectory {i} ({agent} of episode {episode.sample_index} of prompt {episode.prompt_id}, "
                f"video {prompt.video_path}) breaks the trajectory contract: {problem}. Not training on it; this is a "
                f"bug in the rollout or the trajectory assembly (rl/contracts.py)")
