"""Which way did an RL run push the crop decision, where the overview shows the answer and where it does not?

A run's episode log (`rl/episode_log.py`) holds, per episode, its tool calls, reward and the
advantages its main agent's first trained tokens carried into the loss (after every step of
SPEC §5's advantage pipeline). In a generated world the ground truth says, per episode, whether
its K overview frames show the asked event (`miniature.visibility.event_visible`), or whether
the question is about the background, which every frame shows. This splits the log by that.

Per class it reports the crop share, the mean reward of cropping and of skipping episodes, and
the push on the crop decision: in each group that holds both (only those say anything about the
decision), Σ_crop a_i (1 - π̂) - Σ_skip a_i π̂, with a_i the mean advantage on the episode's
first trained tokens (where the decision is written) and π̂ the group's crop share. That is the
gradient the update puts on a crop-or-skip logit, up to the common 1 / step_tokens: positive
pushes towards cropping. A group whose episodes all crop or all skip adds nothing to the push;
each row counts those groups (`all_crop_groups`, `all_skip_groups`) and the groups whose
rollouts all got the same reward as group normalization saw it (`equal_reward_groups`: shaped
and clipped, the log's `shaped`, in logs that have it; R in older ones), so a block of steps where the decision
or the reward saturated shows as such rather than as a small push.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

# lazy: visibility loads paravt_core.video and so PyAV (0.3 s), which `paravt --help` and
# `paravt miniature`'s input errors do without.

BACKGROUND = "background"
SHOWN = "shown"
NOT_SHOWN = "not shown"
KINDS = (SHOWN, NOT_SHOWN, BACKGROUND)


def train_videos_by_name(manifest: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """File name -> the manifest's training video (its sentinel path's last part)."""
    return {PurePosixPath(entry["sentinel"]).name: entry["video"] for entry in manifest.get("train", ())}


def episode_kind(record: Mapping[str, Any], videos: Mapping[str, Mapping[str, Any]]) -> str:
    """`BACKGROUND` for a question about the background; else `SHOWN` or `NOT_SHOWN` by whether
    the episode's K overview frames show its video's event.

    Raises:
        ValueError: the episode's video is not among the world's training videos.
    """
    from paravt_core.miniature.visibility import event_visible

    if "background" in str(record.get("question", "")).lower():
        return BACKGROUND
    name = PurePosixPath(str(record["video"])).name
    if name not in videos:
        raise ValueError(f"step {record.get('step')}: video {record['video']!r} is not a training video of the world's "
                         "manifest (was the run trained on this world?)")
    return SHOWN if event_visible(videos[name], int(record["nframes"])) else NOT_SHOWN


def decision_advantage(record: Mapping[str, Any]) -> float:
    values = record["first_token_advantages"]
    return statistics.fmean(values) if values else 0.0


def group_push(group: Sequence[Mapping[str, Any]]) -> float | None:
    """The push of one prompt group on the crop decision (module docstring); None when every
    episode crops or every one skips."""
    crops = [r["tool_calls"] > 0 for r in group]
    share = sum(crops) / len(group)
    if share in (0.0, 1.0):
        return None
    return sum(decision_advantage(r) * ((1.0 - share) if crop else -share) for r, crop in zip(group, crops))


@dataclass(frozen=True)
class SplitRow:
    steps: tuple[int, int]  # first and last step pooled
    nframes: int
    kind: str
    episodes: int
    crop_share: float
    calls_when_cropping: float
    reward_crop: float | None
    reward_skip: float | None
    mixed_groups: int
    push: float  # summed over the mixed groups of the steps
    push_per_step: float
    all_crop_groups: int  # groups left out of the push: every episode crops
    all_skip_groups: int  # ... every episode skips
    equal_reward_groups: int  # groups whose episodes' rewards are all equal (no task signal)


def _scalar(record: Mapping[str, Any]) -> float:
    """The reward group normalization got: shaped and clipped where the log has it (`shaped`), else R."""
    return float(record.get("shaped", record["total"]))


def split_rows(records: Sequence[Mapping[str, Any]], videos: Mapping[str, Mapping[str, Any]],
               step_blocks: int = 1) -> list[SplitRow]:
    """Rows per block of steps (the run's steps cut into `step_blocks` consecutive blocks), K and kind."""
    if not records:
        raise ValueError("the episode log is empty")
    steps = sorted({int(r["step"]) for r in records})
    blocks = [steps[i * len(steps) // step_blocks:(i + 1) * len(steps) // step_blocks] for i in range(step_blocks)]
    groups: dict[tuple[int, int, str, int], list] = defaultdict(list)
    for r in records:
        groups[(int(r["step"]), int(r["rank"]), str(r["prompt_id"]), int(r["nframes"]))].append(r)
    kinds = {key: episode_kind(g[0], videos) for key, g in groups.items()}  # a group shares its prompt
    out = []
    for block in (b for b in blocks if b):
        chosen = set(block)
        for k in sorted({int(r["nframes"]) for r in records}):
            for kind in KINDS:
                mine = [g for key, g in groups.items() if key[0] in chosen and key[3] == k and kinds[key] == kind]
                episodes = [r for g in mine for r in g]
                if not episodes:
                    continue
                crop = [r for r in episodes if r["tool_calls"] > 0]
                skip = [r for r in episodes if r["tool_calls"] == 0]
                pushes = [p for p in (group_push(g) for g in mine) if p is not None]
                crop_counts = [sum(r["tool_calls"] > 0 for r in g) for g in mine]
                out.append(SplitRow(
                    (block[0], block[-1]), k, kind, len(episodes), len(crop) / len(episodes),
                    statistics.fmean(r["tool_calls"] for r in crop) if crop else 0.0,
                    statistics.fmean(r["total"] for r in crop) if crop else None,
                    statistics.fmean(r["total"] for r in skip) if skip else None,
                    len(pushes), sum(pushes), sum(pushes) / len(block),
                    all_crop_groups=sum(n == len(g) for n, g in zip(crop_counts, mine)),
                    all_skip_groups=crop_counts.count(0),
                    equal_reward_groups=sum(len({_scalar(r) for r in g}) == 1 for g in mine)))
    return out


def render(rows: Sequence[SplitRow]) -> str:
    def fmt(x: float | None) -> str:
        return "–" if x is None else f"{x:.3f}"

    lines = ["| steps | K | question | episodes | crop share (%) | calls when cropping | mean reward, crop | "
             "mean reward, skip | mixed groups | push on crop, per step | all-crop groups | all-skip groups | "
             "equal-reward groups |", "|---|---:|---|" + "---:|" * 10]
    for r in rows:
        lines.append(f"| {r.steps[0]}-{r.steps[1]} | {r.nframes} | {r.kind} | {r.episodes} | {100 * r.crop_share:.1f} | "
                     f"{r.calls_when_cropping:.2f} | {fmt(r.reward_crop)} | {fmt(r.reward_skip)} | {r.mixed_groups} | "
                     f"{r.push_per_step:+.2f} | {r.all_crop_groups} | {r.all_skip_groups} | {r.equal_reward_groups} |")
    lines.append("\nPush: Σ over groups holding both of Σ_crop a (1 - π̂) - Σ_skip a π̂, a the advantage on the "
                 "episode's first trained tokens; positive towards cropping. All-crop and all-skip groups add no "
                 "push; equal-reward groups carry no task signal (only KL and batch normalization's shift).")
    return "\n".join(lines)
