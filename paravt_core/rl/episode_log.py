"""What each RL step trained on, one line per episode (`episodes/step<N>-rank<r>.jsonl`).

The step's metrics (`metrics.jsonl`) are means over the batch; they cannot say which rollouts
the update pushed up or down. This log can: for every episode of a rank's step, its prompt
(id, video key, question, overview budget K), its tool calls, its reward terms (SPEC §4: one
key per term of `rewards.REWARD_TERMS`, then `total`), its
group-normalized scalar advantage (SPEC §5 step 2), and what the main agent's trained tokens
carried after steps 3-4 (per-token KL reward, batch normalization): the mean over its
trained tokens and the value on each of its first `FIRST_TOKENS` trained tokens with their
ids, where an episode's first decision lies (crop or answer); and its decision token (the first
trained token after the think prefix, `rl/decision.py`) with that token's advantage split into
the task scalar, the KL reward to go, the format term and batch normalization's shift
(`decision_*` keys; None where the episode wrote no token after the prefix); and `shaped`, the
scalar group normalization got (shaped and clipped, step 1), so a group whose rewards differ
only beyond the clip reads as saturated; and `behaviour_version`, the weights that generated it
(one step behind the trainer's under `rl.overlap: 1`). Its sub-agents' trained tokens are counted beside it.
`step_tokens` is the step's one token-mean denominator over every rank (SPEC §5), so
`advantage * 1 / step_tokens` is a token's weight in the loss.

One file per step and rank, written atomically after the advantages and before the update, so
a resumed run that repeats a step rewrites its file. Records are plain JSON built from the
trainer's own tensors (`episode_records`, a pure function); reading them back is
`read_episode_log`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from paravt_core.atomic import atomic_write_text
from paravt_core.rewards import reward_term_names
from paravt_core.rl.decision import DecisionParts

FIRST_TOKENS = 8
DECISION_KEYS = tuple(f"decision_{f.name}" for f in fields(DecisionParts))


def episode_log_path(run_dir: Path, step: int, rank: int) -> Path:
    return Path(run_dir) / "episodes" / f"step{step:07d}-rank{rank}.jsonl"


def episode_records(step: int, rank: int, episodes: Sequence, prompts: Sequence, rewards: Sequence,
                    scalar_advantages, trajectories: Sequence, step_tokens: float,
                    decisions: Mapping[int, DecisionParts] | None = None,
                    shaped: Sequence[float] | None = None,
                    behaviour_version: int | None = None) -> list[dict[str, Any]]:
    """One record per episode, in the step's order (prompt-major, `group_size` per prompt).

    Args:
        episodes: the rank's `Episode`s; `prompts` the kept `RLPrompt`s they index.
        rewards: each episode's `RewardBreakdown`; `scalar_advantages` [E] after step 2.
        trajectories: the step's `Trajectory`s with their final `advantages` (steps 3-4).
        step_tokens: trained tokens of the step over every rank.
        decisions: episode index -> its decision token's parts (`rl.decision.decision_parts`);
            None: no `decision_*` keys.
        shaped: [E] the scalars group normalization got (shaped and clipped, SPEC §5 step 1;
            `StepAdvantages.shaped`), logged as `shaped`; None: not logged.
        behaviour_version: the weight version that generated the episodes (`rl/overlap.py`),
            logged as `behaviour_version`; None: not logged.

    Raises:
        ValueError: the lengths disagree, or an episode has no main-agent trajectory.
    """
    if not len(episodes) == len(rewards) == len(scalar_advantages):
        raise ValueError(f"{len(episodes)} episodes, {len(rewards)} rewards and {len(scalar_advantages)} advantages")
    if shaped is not None and len(shaped) != len(episodes):
        raise ValueError(f"{len(episodes)} episodes and {len(shaped)} shaped rewards")
    main: dict[int, Any] = {}
    sub_tokens = [0] * len(episodes)
    sub_sum = [0.0] * len(episodes)
    for t in trajectories:
        if t.advantages is None:
            raise ValueError("a trajectory has no advantages yet: log after assign_token_advantages")
        trained = t.loss_mask.bool()
        if t.is_subagent:
            sub_tokens[t.episode] += int(trained.sum())
            sub_sum[t.episode] += float(t.advantages[trained].sum())
        else:
            main[t.episode] = t
    missing = sorted(set(range(len(episodes))) - set(main))
    if missing:
        raise ValueError(f"episodes {missing[:3]} have no main-agent trajectory")
    records = []
    for i, (episode, reward) in enumerate(zip(episodes, rewards)):
        t = main[i]
        trained = t.loss_mask.bool()
        values = t.advantages[trained]
        prompt = prompts[episode.prompt_index]
        records.append({
            "step": step, "rank": rank, "prompt_id": episode.prompt_id, "video": prompt.video_key,
            "question": prompt.question,
            "sample_index": episode.sample_index, "nframes": episode.nframes, "tool_calls": episode.tool_calls,
            "end_reason": episode.end_reason, **{name: reward.terms[name] for name in reward_term_names()},
            "total": reward.total, "advantage": float(scalar_advantages[i]),
            "main_tokens": int(trained.sum()), "main_advantage_mean": float(values.mean()) if values.numel() else 0.0,
            "first_token_ids": [int(x) for x in t.token_ids[trained][:FIRST_TOKENS]],
            "first_token_advantages": [round(float(x), 6) for x in values[:FIRST_TOKENS]],
            "subagent_tokens": sub_tokens[i], "subagent_advantage_sum": sub_sum[i], "step_tokens": float(step_tokens)})
        if shaped is not None:
            records[-1]["shaped"] = float(shaped[i])
        if behaviour_version is not None:
            records[-1]["behaviour_version"] = behaviour_version
        if decisions is not None:
            parts = decisions.get(i)
            records[-1].update(parts.record() if parts is not None else dict.fromkeys(DECISION_KEYS))
    return records


def write_episode_log(run_dir: Path, step: int, rank: int, records: Sequence[dict[str, Any]]) -> Path:
    path = episode_log_path(run_dir, step, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))


def read_episode_log(run_dir: Path) -> list[dict[str, Any]]:
    """Every record of a run's episode log, by step then rank.

    Raises:
        FileNotFoundError: the run folder has no episode log (a run from before it was written).
        ValueError: a line that is not a JSON object, named by file and line.
    """
    folder = Path(run_dir) / "episodes"
    files = sorted(folder.glob("step*-rank*.jsonl"))
    if not files:
        raise FileNotFoundError(f"{folder}: no episode log (runs log it since 2026-11-28; train again to get one)")
    records = []
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            try:
                row = json.loads(line)
            except ValueError as error:
                raise ValueError(f"{path}, line {number}: not JSON ({error})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}, line {number}: not a JSON object")
            records.append(row)
    return records
