"""What can GRPO learn from a checkpoint? The rollout probe on its RL prompts (#15).

Group normalization (SPEC §5, advantage step 2) gives every rollout of a group the same
zero advantage when the group's rewards are equal, so the accuracy term teaches only through
groups whose rollouts disagree on R_acc. A greedy policy's error can be trained away only if
sampling sometimes gets that prompt right. This probe samples `group_size` rollouts of N RL
prompts as the trainer's first step samples them (the row's rollout knobs and reward, nFrames
gating's frame budget of epoch 0, the given temperatures) and reports, overall and per
ground-truth answer: accuracy, the share of groups with mixed R_acc (what the accuracy term
learns from), tool calls per rollout, and which answers were given. Rows are prompts of the
run's materialized RL shards, filtered by `rl.question_types`, drawn by a seeded shuffle (not
the trainer's step order). The model runs on the CPU in float32, as the other probes of the
miniature do: on an 8B checkpoint this is slow, and there is no GPU path yet.

Summaries are pure functions of the scored outcomes (`summarize`, `render_table`).
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from paravt_core.agent.hf_build import build_hf_engine
from paravt_core.config import PipelineConfig
from paravt_core.data.stage import materialized_dir, media_dir
from paravt_core.model.loading import build_model, load_processor

# lazy: torch (2.3 s to import) only where a model runs: `paravt miniature` imports this module to
# check a command's config, model folder and split first (a config error took 0.9 s; 6.9 s with
# these imports at the top).

ALL = "all"


@dataclass(frozen=True)
class Outcome:
    """One scored rollout: its prompt's index in the probe, the ground truth, the answer the
    reward extracted (SPEC §4.1), R_acc, the total reward and the executed tool calls."""

    prompt_index: int
    truth: str
    answer: str
    acc: float
    total: float
    tool_calls: int


@dataclass(frozen=True)
class GroupStats:
    """Rollout statistics of the prompts that share one ground truth (or of all prompts)."""

    prompts: int
    rollouts: int
    accuracy: float
    mixed_groups: float  # share of prompts whose rollouts disagree on R_acc
    informative_groups: float  # share of prompts whose rollouts disagree on the total reward
    kappa: float
    answers: dict[str, int]


def summarize(outcomes: Sequence[Outcome]) -> dict[str, GroupStats]:
    """`{ALL: ..., truth: ...}` over the outcomes, grouped by prompt (any group size)."""
    if not outcomes:
        raise ValueError("no rollouts to summarize")
    by_prompt: dict[int, list[Outcome]] = {}
    for o in outcomes:
        by_prompt.setdefault(o.prompt_index, []).append(o)
    for index, group in by_prompt.items():
        if len({o.truth for o in group}) != 1:
            raise ValueError(f"prompt {index}: its rollouts disagree on the ground truth")
    truths = sorted({group[0].truth for group in by_prompt.values()})
    stats = {ALL: _stats(list(by_prompt.values()))}
    for truth in truths:
        stats[truth] = _stats([g for g in by_prompt.values() if g[0].truth == truth])
    return stats


def _stats(groups: list[list[Outcome]]) -> GroupStats:
    rollouts = [o for g in groups for o in g]
    return GroupStats(
        prompts=len(groups),
        rollouts=len(rollouts),
        accuracy=sum(o.acc for o in rollouts) / len(rollouts),
        mixed_groups=sum(_spread({o.acc for o in g}) for g in groups) / len(groups),
        informative_groups=sum(_spread({o.total for o in g}) for g in groups) / len(groups),
        kappa=sum(o.tool_calls for o in rollouts) / len(rollouts),
        answers=dict(Counter(_short(o.answer) for o in rollouts).most_common()),
    )


def _spread(values: set[float]) -> bool:
    return max(values) - min(values) > 1e-9


def _short(answer: str, width: int = 12) -> str:
    """An answer as a table cell: one line, at most `width` characters, "(none)" if empty."""
    text = " ".join(answer.split())
    if not text:
        return "(none)"
    return text if len(text) <= width else text[: width - 1] + "…"


def render_table(results: dict[float, dict[str, GroupStats]]) -> str:
    """A markdown table: one line per (temperature, ground truth), `all` first."""
    lines = ["| temperature | truth | prompts | rollouts | accuracy | mixed R_acc groups | mixed R groups | "
             "tool calls | answers given |", "|---|---|---|---|---|---|---|---|---|"]
    for tau, stats in results.items():
        for truth, s in stats.items():
            answers = ", ".join(f"{a} {n}" for a, n in s.answers.items())
            lines.append(f"| {tau:g} | {truth} | {s.prompts} | {s.rollouts} | {s.accuracy:.2f} | "
                         f"{s.mixed_groups:.2f} | {s.informative_groups:.2f} | {s.kappa:.2f} | {answers} |")
    return "\n".join(lines)


def probe_prompts(cfg: PipelineConfig, count: int, seed: int) -> list:
    """`count` RL prompts of the run's materialized shards (`rl.question_types`), drawn with
    `seed`, each with the frame budget nFrames gating gives it at epoch 0 (none if off)."""
    from paravt_core.rl.data import read_rl_prompts
    from paravt_core.rl.grpo import frame_budget

    shard_dir = materialized_dir(cfg) / "rl"
    files = sorted(shard_dir.glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no RL parquet shards in {shard_dir}; run the data stage of this config first")
    prompts = read_rl_prompts(files, cfg.rl.question_types, media_dir(cfg))
    random.Random(seed).shuffle(prompts)
    picked = prompts[:count]
    gating = cfg.rl.gating
    out = []
    for p in picked:
        k = frame_budget(cfg.run.seed, p.prompt.prompt_id, 0, gating.choices, gating.draw_key) if gating.enabled else None
        out.append(dataclasses.replace(p, prompt=dataclasses.replace(p.prompt, nframes=k)))
    return out


def run_probe(model_dir: Path, cfg: PipelineConfig, prompts: Sequence, temperatures: Sequence[float],
              group_size: int, log_line=print) -> dict[float, dict[str, GroupStats]]:
    """Roll out `group_size` episodes of every prompt at each temperature; score them with the
    row's reward (`rl.policy.paravt_reward`); summarize per temperature."""
    import time

    from paravt_core.agent.rollout import run_episodes
    from paravt_core.rl.policy import paravt_reward

    processor = load_processor(model_dir)
    engine = build_hf_engine(cfg, build_model(cfg.model, model_dir, dtype="float32").eval(), processor, "rollout")
    reward = paravt_reward(cfg.rl)
    results: dict[float, dict[str, GroupStats]] = {}
    for tau in temperatures:
        start = time.perf_counter()
        episodes = run_episodes(engine, processor, [p.prompt for p in prompts], cfg.rl.rollout, cfg.video,
                                group_size=group_size, temperature=tau, seed=cfg.run.seed)
        outcomes = []
        for e in episodes:
            prompt = prompts[e.prompt_index]
            r = reward(e, prompt)
            outcomes.append(Outcome(e.prompt_index, prompt.answer, r.answer, r.terms["acc"], r.total, e.tool_calls))
        results[tau] = summarize(outcomes)
        seconds = time.perf_counter() - start
        log_line(f"rollout probe: temperature {tau:g}, {len(episodes)} rollouts in {seconds:.0f} s "
                 f"({len(episodes) / max(seconds, 1e-9):.2f} rollouts/s), accuracy {results[tau][ALL].accuracy:.2f}")
    return results
