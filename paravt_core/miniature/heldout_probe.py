"""κ and format on a fixed held-out probe, sampled: what the κ and format verdicts compare.

The paper's effects are in κ (tool calls per episode) and format (fτ), not accuracy (SPEC §6,
Table 2). The reproduction read both from training steps: κ of each step's own rollouts (on
that step's prompts, at that step's frame budgets) and fτ under one fixed R_fmt. Neither is
measured on the same questions for every model, so neither can be compared row against row
question by question. This probe can: the first `questions` questions of a prepared evaluation
split, each put to the model as the agentic evaluation puts it (`eval.prompting.episode_prompt`,
subagent tool mode, the evaluation's turns and budgets) at ONE overview budget K, `samples`
episodes each at temperature τ (0.7 by default, RL's sampling), the sampler seeded. Per
question it returns the mean executed crop calls per episode (κ) and the mean fixed R_fmt over
the whole transcript (`rl.policy.fixed_format_reward`, scope `transcript`: every model is
probed with the same forced think prefix, so the scope is fair to all) — the per-question maps
`ModelRun.probe_calls` and `probe_format`, whose means per run `miniature.verdicts` compares.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from paravt_core.agent.hf_build import build_hf_engine
from paravt_core.atomic import atomic_write_text
from paravt_core.config import PipelineConfig
from paravt_core.eval.prepared import load_split_file
from paravt_core.eval.prompting import episode_prompt, is_agentic, prompt_mode_for, rollout_config
from paravt_core.model.loading import build_model, load_processor

# lazy: torch (2.3 s to import) only where a model runs: `paravt miniature` imports this module to
# check a command's config, model folder and split first (a config error took 0.9 s; 6.9 s with
# these imports at the top).

TEMPERATURE = 0.7


@dataclass(frozen=True)
class ProbeResult:
    calls: dict[str, float]  # question id -> mean executed crop calls per episode
    fmt: dict[str, float]  # question id -> mean fixed R_fmt over the transcript


def per_question(ids: Sequence[str], calls: Sequence[int], fmt: Sequence[float], samples: int) -> ProbeResult:
    """Means per question of episodes laid out prompt-major (`run_episodes`: question 0's
    `samples` episodes, then question 1's, ...)."""
    if len(calls) != len(ids) * samples or len(fmt) != len(calls):
        raise ValueError(f"{len(calls)} episodes for {len(ids)} questions x {samples} samples")
    out_calls, out_fmt = {}, {}
    for i, qid in enumerate(ids):
        block = slice(i * samples, (i + 1) * samples)
        out_calls[qid] = statistics.fmean(calls[block])
        out_fmt[qid] = statistics.fmean(fmt[block])
    return ProbeResult(out_calls, out_fmt)


def probe_episodes(engine, processor, cfg: PipelineConfig, questions: Sequence, samples: int, k: int,
                   temperature: float = TEMPERATURE, seed: int = 0) -> ProbeResult:
    """Roll `samples` episodes of each evaluation sample in `questions` out on `engine` at K
    overview frames and return their per-question κ and format (module docstring)."""
    from paravt_core.agent.rollout import run_episodes
    from paravt_core.rl.policy import fixed_format_reward

    if not questions or samples < 1 or k < 1:
        raise ValueError(f"need questions, and samples and K of at least 1 (got {len(questions)}, {samples}, {k})")
    mode = prompt_mode_for(questions[0], cfg.eval)
    if not is_agentic(mode):
        raise ValueError(f"eval.prompt_mode {mode!r} is not agentic: the probe counts tool calls")
    prompts = [episode_prompt(s, mode, cfg.eval.dispatch, k) for s in questions]
    episodes = run_episodes(engine, processor, prompts, rollout_config(cfg.eval, mode, cfg.rl.rollout), cfg.video,
                            group_size=samples, temperature=temperature, seed=seed, tool_mode="subagent")
    return per_question([s.id for s in questions], [e.tool_calls for e in episodes],
                        [fixed_format_reward(e, "transcript") for e in episodes], samples)


def sampled_probe(model_dir: Path, cfg: PipelineConfig, split_json: Path, questions: int, samples: int, k: int,
                  temperature: float = TEMPERATURE, seed: int = 0) -> ProbeResult:
    """Probe the model in `model_dir` on the first `questions` questions of the prepared split
    `split_json`, loaded as the evaluation loads it (`model.*` speed options)."""
    if questions < 1:
        raise ValueError(f"questions must be at least 1, got {questions}")
    chosen = load_split_file(split_json)[:questions]
    if not chosen:
        raise ValueError(f"{split_json}: the split has no questions")
    processor = load_processor(model_dir)
    engine = build_hf_engine(cfg, build_model(cfg.model, model_dir, dtype="float32").eval(), processor, "evaluation")
    return probe_episodes(engine, processor, cfg, chosen, samples, k, temperature, seed)


def probe_frames(cfg: PipelineConfig) -> int:
    """The probe's overview budget K: `reproduce.probe.frames`, else the largest K nFrames gating
    draws (where the paper's collapse shows: the overview answers most without a tool)."""
    return cfg.reproduce.probe.frames or max(cfg.rl.gating.choices)


def probe_to_file(model_dir: Path, cfg: PipelineConfig, split_json: Path, out: Path,
                  fingerprint: str) -> ProbeResult:
    """`sampled_probe` with `cfg.reproduce.probe`'s settings, kept in `out` (JSON, written
    atomically) under `fingerprint` (what the result depends on: the model's content, the
    split's, the settings): a file holding the same fingerprint is read back instead of
    sampling again, so a reproduction resumed without its task cache does not repeat probes."""
    import json

    if out.is_file():
        try:
            kept = json.loads(out.read_text())
        except (OSError, ValueError):
            kept = {}
        if kept.get("fingerprint") == fingerprint:
            return ProbeResult(dict(kept["probe_calls"]), dict(kept["probe_format"]))
    probe = cfg.reproduce.probe
    k = probe_frames(cfg)
    result = sampled_probe(model_dir, cfg, split_json, probe.questions, probe.samples, k, probe.temperature,
                           probe.seed)
    atomic_write_text(out, json.dumps({
        "fingerprint": fingerprint, "model": str(model_dir), "split": probe.split, "k": k,
        "samples": probe.samples, "temperature": probe.temperature, "seed": probe.seed,
        "kappa": statistics.fmean(result.calls.values()), "format": statistics.fmean(result.fmt.values()),
        "probe_calls": result.calls, "probe_format": result.fmt}, indent=1))
    return result
