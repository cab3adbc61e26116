"""Does calling a tool pay? The precondition of the paper's collapse, measured per prompt (#46 item 2).

The paper explains GRPO's tool collapse (SPEC §6) so: with many overview frames a prompt can be
answered without tools, so the advantage of calling over skipping is near zero, and sampled
tool paths lose format. A world can only show the collapse where that holds. This probe
measures it on one model (the SFT model, before any RL) with the model's own samples:

- each question of an evaluation split is put to the model in the agentic evaluation's words
  (`eval.prompting.episode_prompt`, which the miniature's RL rows use too) at an overview budget
  K, and rolled out as the RL trainer rolls out: with the row's own rollout knobs (`rl.rollout`:
  think prefix, turns, token budgets; `probe_rollout`). The evaluation forces a think prefix that
  vanilla GRPO's rollouts do not have, and under `reward.scope: generated` a forced prefix earns
  no format credit (SPEC §4.5); until 2026-11-28 the probe rolled out as the evaluation does, so
  for vanilla GRPO it scored neither branch's `<think>` and none of a tool path's +0.3 for
  thinking before its call, which its training rollouts earn (docs/log/miniature-world-v3.md);
- its first turn is forced to open with the teacher's crop plan, or with its skip plan
  (`opening_probe.config_openings`: "crop: ..." and "no crop: enough", or "no crop: seen" for the
  overview-reading teacher, whose skip plan goes on to say what the frames show), and the rest of the
  episode is sampled at τ (the RL temperature, 0.7), `samples` episodes per branch. Only the
  main agent's first turn is forced; sub-agents and later turns run as they would;
- each episode is scored with the full SPEC §4 reward of the config's `rl.reward`
  (`rl.policy.paravt_reward`), and its format with the one fixed R_fmt of every row
  (`rl.policy.fixed_format_reward`, transcript scope). The reward and rollout knobs are the RL
  row's (`--rl-row paragrpo`, `--rl-row vanilla_grpo`: `config.rl_row_file`), so the check can be
  read under each row's own reward: under `reward.scope: generated` PARA-GRPO's think prefix sits
  in the prompt, so no episode shows `<think>`: anchoring never fires and R_fmt is 0.5 x [answer
  present] on both branches, while vanilla's rollouts write `<think>` themselves and a tool path
  earns +0.3 for thinking before its call (#62). Each record keeps the mean of every reward term
  per branch (`terms`), so the tables say which term makes a gap.

Per K it reports the share of questions on which skipping scores at least as well as cropping
(mean reward over the samples), the share on which it scores worse, and each branch's
format-failure rate (episodes whose fixed R_fmt is below 1). `precondition` holds these against
the thresholds written down before the first run (docs/miniature.md).

Which way GRPO pushes the decision is not the sign of the mean gap (`grpo_push`). The
trainer's advantage is group-normalized (SPEC §5 step 2): (R - group mean) / group std. In a
group where one rollout crops and the others skip with equal rewards, the crop's advantage is
±(G-1)/sqrt(G) whatever the size of the gap, so a right crop (+0.6 of R_tool over a right skip)
counts as much as a wrong one (-0.9). `grpo_push` draws groups of G rollouts, each cropping with
probability π and taking its reward from the question's own samples of that branch, normalizes
them with the trainer's functions (`rl.grpo.shaped_reward`, `group_advantages`), and averages
the decision logit's gradient Σ_i A_i (1[crop_i] - π): positive pushes towards cropping.
Step 4's batch normalization adds one constant to every advantage and scales them all, which
leaves that expectation's sign as it is (Σ_i (1[crop_i] - π) has mean 0); the per-token KL term
is left out.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paravt_core.agent.hf_build import build_hf_engine
from paravt_core.config import PipelineConfig
from paravt_core.eval.prepared import load_split_file
from paravt_core.eval.prompting import episode_prompt, is_agentic, prompt_mode_for
from paravt_core.miniature.opening_probe import config_openings, is_crop, skip_opening
from paravt_core.model.loading import build_model, load_processor

TEMPERATURE = 0.7
# Fixed before the first run (#46 item 2, docs/miniature.md "Does calling pay?").
SKIP_AS_GOOD_AT_LARGEST_K = 0.40  # skipping at least as good as cropping on >= 40 % of prompts
SKIP_WORSE_AT_SMALLEST_K = 0.80  # and worse on >= 80 % at the smallest K
FORMAT_GAP = 0.10  # crop-branch format failures at least this far above skip's


class ForcedFirstTurn:
    """An engine whose first `generate` call (the main agent's first turn of every episode in
    the batch: `run_episodes` asks the main engine once per turn) continues each request after
    `forced` token ids; the generation returned holds them first, with log-probability 0 (they
    were not sampled). Every later call goes to the wrapped engine unchanged."""

    def __init__(self, engine, forced: Sequence[int]):
        self.engine, self.forced, self.used, self.forced_requests = engine, list(forced), False, 0

    def generate(self, requests, params):
        import dataclasses

        # lazy: torch, after `paravt miniature`'s input checks
        from paravt_core.agent.engine import Generation, GenerationRequest

        if self.used:
            return self.engine.generate(requests, params)
        self.used = True
        self.forced_requests = len(requests)
        if params.max_new_tokens <= len(self.forced):
            raise ValueError(f"the forced opening ({len(self.forced)} tokens) leaves no room in the first turn's "
                             f"{params.max_new_tokens} new tokens")
        shifted = [GenerationRequest(list(r.prompt_ids) + self.forced, r.vision) for r in requests]
        budget = dataclasses.replace(params, max_new_tokens=params.max_new_tokens - len(self.forced))
        return [Generation(self.forced + g.token_ids, [0.0] * len(self.forced) + list(g.logprobs), g.finish_reason)
                for g in self.engine.generate(shifted, budget)]

    def update_weights(self, state_dict) -> None:
        self.engine.update_weights(state_dict)


@dataclass(frozen=True)
class BranchRecord:
    """One question at one K: per branch, the mean full reward, the mean fixed R_fmt, the
    share of episodes in format (fixed R_fmt 1) and the mean executed crop calls."""

    sample_id: str
    nframes: int
    reward: dict[str, float]  # "crop" / "skip" -> mean reward over the samples
    fmt: dict[str, float]
    in_format: dict[str, float]
    calls: dict[str, float]
    samples: dict[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)  # branch -> each episode's reward
    terms: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)  # branch -> term -> mean (unweighted)


@dataclass(frozen=True)
class BranchSummary:
    nframes: int
    questions: int
    skip_as_good: float  # share of questions: mean skip reward >= mean crop reward
    skip_worse: float  # share of questions: mean skip reward < mean crop reward
    reward: dict[str, float]  # branch -> mean over questions
    format_failures: dict[str, float]  # branch -> share of episodes not in format
    calls: dict[str, float]


def summarize(records: Sequence[BranchRecord]) -> list[BranchSummary]:
    """One summary per K (ascending)."""
    if not records:
        raise ValueError("no branch-probe records to summarize")
    out = []
    for k in sorted({r.nframes for r in records}):
        rows = [r for r in records if r.nframes == k]
        as_good = sum(r.reward["skip"] >= r.reward["crop"] for r in rows) / len(rows)
        out.append(BranchSummary(
            nframes=k, questions=len(rows), skip_as_good=as_good, skip_worse=1.0 - as_good,
            reward={b: statistics.fmean(r.reward[b] for r in rows) for b in ("crop", "skip")},
            format_failures={b: 1.0 - statistics.fmean(r.in_format[b] for r in rows) for b in ("crop", "skip")},
            calls={b: statistics.fmean(r.calls[b] for r in rows) for b in ("crop", "skip")}))
    return out


def precondition(summaries: Sequence[BranchSummary]) -> list[tuple[str, bool]]:
    """The three checks written down before the first run, each with whether it holds."""
    if not summaries:
        raise ValueError("no summaries")
    small, large = summaries[0], summaries[-1]
    gaps = [s.format_failures["crop"] - s.format_failures["skip"] for s in summaries]
    return [
        (f"K={large.nframes}: skipping at least as good as cropping on {100 * large.skip_as_good:.0f} % of questions "
         f"(needs >= {100 * SKIP_AS_GOOD_AT_LARGEST_K:.0f} %)", large.skip_as_good >= SKIP_AS_GOOD_AT_LARGEST_K),
        (f"K={small.nframes}: skipping worse than cropping on {100 * small.skip_worse:.0f} % of questions "
         f"(needs >= {100 * SKIP_WORSE_AT_SMALLEST_K:.0f} %)", small.skip_worse >= SKIP_WORSE_AT_SMALLEST_K),
        (f"crop-branch format failures above skip's by {', '.join(f'{g:+.2f}' for g in gaps)} at K = "
         f"{', '.join(str(s.nframes) for s in summaries)} (needs >= {FORMAT_GAP:.2f} at every K)",
         min(gaps) >= FORMAT_GAP),
    ]


def grpo_push(crop: Sequence[float], skip: Sequence[float], p_crop: float, group_size: int, *, shift: float = 0.2,
              scale: float = 10.0, clip: float | None = 20.0, eps: float = 1e-5, groups: int = 4000,
              seed: int = 0) -> float:
    """The expected gradient GRPO's group-normalized advantage puts on the crop decision's logit
    for one question (module docstring): mean over `groups` drawn groups of Σ_i A_i (1[crop_i] - π).

    Each of the `group_size` rollouts crops with probability `p_crop` and draws its reward
    uniformly from that branch's samples (`crop` or `skip`); `shift`, `scale`, `clip` and `eps`
    are the config's `rl.reward_shift`, `reward_scale`, `reward_clip` and `adv_eps`. Positive:
    the update makes cropping likelier; negative: skipping. Deterministic for a given `seed`.

    Raises:
        ValueError: an empty branch, π outside (0, 1), a group under 2 or no groups.
    """
    import torch

    # lazy: torch, after `paravt miniature`'s input checks
    from paravt_core.rl.grpo import group_advantages, shaped_reward

    if not crop or not skip:
        raise ValueError("grpo_push needs at least one sampled reward in each branch")
    if not 0.0 < p_crop < 1.0 or group_size < 2 or groups < 1:
        raise ValueError(f"need 0 < p_crop < 1, group_size >= 2 and groups >= 1 (got {p_crop}, {group_size}, {groups})")
    gen = torch.Generator().manual_seed(seed)
    crops = torch.rand(groups, group_size, generator=gen, dtype=torch.float64) < p_crop
    crop_t, skip_t = torch.tensor(list(crop), dtype=torch.float64), torch.tensor(list(skip), dtype=torch.float64)
    drawn_crop = crop_t[torch.randint(len(crop_t), (groups, group_size), generator=gen)]
    drawn_skip = skip_t[torch.randint(len(skip_t), (groups, group_size), generator=gen)]
    rewards = torch.where(crops, drawn_crop, drawn_skip)
    adv = group_advantages(shaped_reward(rewards.reshape(-1), shift, scale, clip), group_size, eps).view(groups, -1)
    return float((adv * (crops.to(torch.float64) - p_crop)).sum(dim=1).mean())


@dataclass(frozen=True)
class PushRow:
    nframes: int
    shown: bool | None  # None: every question at this K
    questions: int
    skip_by_mean: float  # share of questions whose mean reward favours skipping (skip >= crop)
    skip_by_push: dict[float, float]  # π -> share of questions whose GRPO push favours skipping (push <= 0)
    push: dict[float, float]  # π -> mean push over the questions


def push_rows(records: Sequence[BranchRecord], p_crops: Sequence[float], group_size: int,
              shown: Mapping[tuple[str, int], bool] | None = None, **knobs) -> list[PushRow]:
    """Per K (and, with `shown`, per whether the K frames show the event): how often the mean
    reward and GRPO's push (`grpo_push` at each π of `p_crops`, `knobs` passed on) favour skipping.

    Raises:
        ValueError: a record without its per-episode rewards (written before they were kept).
    """
    if any(not r.samples for r in records):
        raise ValueError("branch records without per-episode rewards: probe again to get them")
    out = []
    for k in sorted({r.nframes for r in records}):
        at_k = [r for r in records if r.nframes == k]
        parts = [(None, at_k)] if shown is None else [
            (flag, [r for r in at_k if shown[(r.sample_id, k)] == flag]) for flag in (True, False)]
        for flag, rows in parts:
            if not rows:
                continue
            pushes = {p: [grpo_push(r.samples["crop"], r.samples["skip"], p, group_size, **knobs) for r in rows]
                      for p in p_crops}
            out.append(PushRow(k, flag, len(rows), sum(r.reward["skip"] >= r.reward["crop"] for r in rows) / len(rows),
                               {p: sum(v <= 0 for v in vals) / len(rows) for p, vals in pushes.items()},
                               {p: statistics.fmean(vals) for p, vals in pushes.items()}))
    return out


def render_push(rows: Sequence[PushRow], group_size: int) -> str:
    ps = sorted({p for r in rows for p in r.push})
    lines = [f"| K | event on the K frames | questions | skip favoured by the mean reward (%) | "
             + " | ".join(f"skip favoured by GRPO's push at π={p:g} (%)" for p in ps) + " | "
             + " | ".join(f"mean push at π={p:g}" for p in ps) + " |",
             "|---:|---|" + "---:|" * (2 + 2 * len(ps))]
    for r in rows:
        where = "all" if r.shown is None else ("yes" if r.shown else "no")
        lines.append(f"| {r.nframes} | {where} | {r.questions} | {100 * r.skip_by_mean:.1f} | "
                     + " | ".join(f"{100 * r.skip_by_push[p]:.1f}" for p in ps) + " | "
                     + " | ".join(f"{r.push[p]:+.3f}" for p in ps) + " |")
    lines.append(f"\nGroups of {group_size}; push: E[Σ_i A_i (1[crop_i] - π)] under the trainer's group-normalized "
                 "advantage, positive towards cropping.")
    return "\n".join(lines)


def shown_on_overview(samples: Sequence, manifest: Mapping[str, Any], split: str,
                      frame_counts: Sequence[int]) -> dict[tuple[str, int], bool]:
    """(sample id, K) -> whether the question's video has its event on its K overview frames,
    from the generated world's ground truth (`manifest.json`, `miniature.visibility`).

    Raises:
        ValueError: the manifest has no such split, or a sample's video is not among its videos.
    """
    # lazy: PyAV, after `paravt miniature`'s input checks
    from paravt_core.miniature.visibility import event_visible, videos_of_samples

    video_of = videos_of_samples(manifest, split, samples)
    return {(s.id, k): event_visible(video_of[s.id], k) for s in samples for k in frame_counts}


def render_by_shown(records: Sequence[BranchRecord], shown: Mapping[tuple[str, int], bool]) -> str:
    """The per-K table again, split by whether the K overview frames show the question's event:
    where skipping can be right by sight, and where only a crop sees it."""
    lines = ["| K | event on the K frames | questions | skip as good as crop (%) | mean reward, crop | "
             "mean reward, skip | not in format, crop (%) | not in format, skip (%) |", "|---:|---|" + "---:|" * 6]
    for flag in (True, False):
        part = [r for r in records if shown[(r.sample_id, r.nframes)] == flag]
        for s in summarize(part) if part else ():
            lines.append(f"| {s.nframes} | {'yes' if flag else 'no'} | {s.questions} | {100 * s.skip_as_good:.1f} | "
                         f"{s.reward['crop']:.3f} | {s.reward['skip']:.3f} | {100 * s.format_failures['crop']:.1f} | "
                         f"{100 * s.format_failures['skip']:.1f} |")
    return "\n".join(lines[:2] + sorted(lines[2:], key=lambda line: int(line.split("|")[1])))


def render(summaries: Sequence[BranchSummary]) -> str:
    lines = ["| K | questions | skip as good as crop (%) | mean reward, crop | mean reward, skip | "
             "not in format, crop (%) | not in format, skip (%) | crop calls, crop branch | crop calls, skip branch |",
             "|---:|" + "---:|" * 8]
    for s in summaries:
        lines.append(f"| {s.nframes} | {s.questions} | {100 * s.skip_as_good:.1f} | {s.reward['crop']:.3f} | "
                     f"{s.reward['skip']:.3f} | {100 * s.format_failures['crop']:.1f} | "
                     f"{100 * s.format_failures['skip']:.1f} | {s.calls['crop']:.2f} | {s.calls['skip']:.2f} |")
    checks = precondition(summaries)
    lines += ["", *(f"- {text}: {'holds' if ok else 'does NOT hold'}" for text, ok in checks)]
    return "\n".join(lines)


def scored_under(cfg: PipelineConfig) -> str:
    """One line naming the RL row whose reward and rollout knobs the probe used."""
    reward, rollout = cfg.rl.reward, cfg.rl.rollout
    return (f"Scored under RL row {cfg.rl.row}: reward scope {reward.scope}, answer_suffix {reward.answer_suffix}, "
            f"anchor_weight {reward.anchor_weight:g}, tool reward {reward.use_tool_reward}; think prefix "
            f"{'in the prompt' if rollout.think_prefix else 'written by the model'}")


def probe_rollout(cfg: PipelineConfig):
    """The rollout knobs the probe's episodes run with: the RL row's, as `rl.worker` passes them
    to `run_episodes` (not the evaluation's, which force the think prefix)."""
    return cfg.rl.rollout


def branch_records(engine, processor, cfg: PipelineConfig, questions: Sequence, samples: int, k: int,
                   openings: dict[str, str], temperature: float = TEMPERATURE, seed: int = 0) -> list[BranchRecord]:
    """Both branches of every question in `questions` at K overview frames (module docstring);
    `openings` maps "crop" and "skip" to the forced opening texts."""
    from paravt_core.agent.context import ChatRenderer  # lazy: torch, after `paravt miniature`'s input checks
    from paravt_core.agent.rollout import run_episodes  # lazy: torch, after `paravt miniature`'s input checks
    from paravt_core.rl.data import RLPrompt  # lazy: torch, after `paravt miniature`'s input checks
    # lazy: torch, after `paravt miniature`'s input checks
    from paravt_core.rl.policy import fixed_format_reward, paravt_reward

    if not questions or samples < 1 or k < 1:
        raise ValueError(f"need questions, and samples and K of at least 1 (got {len(questions)}, {samples}, {k})")
    mode = prompt_mode_for(questions[0], cfg.eval)
    if not is_agentic(mode):
        raise ValueError(f"eval.prompt_mode {mode!r} is not agentic: the probe forces a tool decision")
    if any(q.kind != "mcq" for q in questions):
        raise ValueError("the branch probe scores multiple-choice questions only")
    prompts = [episode_prompt(s, mode, cfg.eval.dispatch, k) for s in questions]
    rl_prompts = [RLPrompt(p, str(s.answer), "mcq", s.question) for p, s in zip(prompts, questions)]
    rollout = probe_rollout(cfg)
    renderer = ChatRenderer(processor, rollout.think_prefix, (cfg.video.min_pixels, cfg.video.max_pixels))
    reward_fn = paravt_reward(cfg.rl)
    per_branch, terms = {}, {}
    # Without the think prefix (vanilla GRPO's rollouts) the model writes `<think>` itself: forced too.
    lead = "" if rollout.think_prefix else "<think>\n"
    for branch, text in openings.items():
        forced = ForcedFirstTurn(engine, renderer.encode(lead + text).token_ids)
        episodes = run_episodes(forced, processor, prompts, rollout, cfg.video, group_size=samples,
                                temperature=temperature, seed=seed, tool_mode="subagent", subagent_engine=engine)
        if forced.forced_requests != len(prompts) * samples:  # every episode's first turn, in one call
            raise RuntimeError(f"the {branch} opening was forced on {forced.forced_requests} first turns, not "
                               f"{len(prompts) * samples}")
        scored = [reward_fn(e, rl_prompts[e.prompt_index]) for e in episodes]
        per_branch[branch] = [(r.total, fixed_format_reward(e, "transcript"), e.tool_calls)
                              for r, e in zip(scored, episodes)]
        terms[branch] = [r.terms for r in scored]
    records = []
    for i, sample in enumerate(questions):
        block = slice(i * samples, (i + 1) * samples)
        rows = {b: per_branch[b][block] for b in per_branch}
        parts = {b: {name: statistics.fmean(t[name] for t in terms[b][block]) for name in terms[b][0]} for b in terms}
        records.append(BranchRecord(
            sample.id, k,
            reward={b: statistics.fmean(r for r, _, _ in v) for b, v in rows.items()},
            fmt={b: statistics.fmean(f for _, f, _ in v) for b, v in rows.items()},
            in_format={b: statistics.fmean(float(f >= 1.0) for _, f, _ in v) for b, v in rows.items()},
            calls={b: statistics.fmean(c for _, _, c in v) for b, v in rows.items()},
            samples={b: tuple(r for r, _, _ in v) for b, v in rows.items()}, terms=parts))
    return records


def branch_probe(model_dir: Path, cfg: PipelineConfig, split_json: Path, questions: int, samples: int,
                 frame_counts: Sequence[int], temperature: float = TEMPERATURE, seed: int = 0,
                 log_line=print) -> list[BranchRecord]:
    """Load the model in `model_dir` as the evaluation does and probe the first `questions`
    questions of the prepared split `split_json` at each K in `frame_counts`."""
    import time

    chosen = load_split_file(split_json)[:questions]
    if not chosen:
        raise ValueError(f"{split_json}: the split has no questions")
    teacher = config_openings(cfg)
    crop = next(text for name, text in teacher.items() if is_crop(name))
    skip = teacher[skip_opening(cfg)]
    processor = load_processor(model_dir)
    engine = build_hf_engine(cfg, build_model(cfg.model, model_dir, dtype="float32").eval(), processor, "evaluation")
    records = []
    for k in frame_counts:
        started = time.perf_counter()
        records += branch_records(engine, processor, cfg, chosen, samples, k, {"crop": crop, "skip": skip},
                                  temperature, seed)
        seconds = time.perf_counter() - started
        log_line(f"branch probe: K={k}, {len(chosen)} questions x 2 branches x {samples} samples in {seconds:.0f} s "
                 f"({2 * len(chosen) * samples / max(seconds, 1e-9):.2f} episodes/s)")
    return records
