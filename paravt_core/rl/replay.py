"""Every RL step's draws, logged so that the step can be replayed (SPEC §5).

Each rank writes `draws/step<N>-rank<r>.json` in the run folder after its rollout: the
prompts it rolled out (id, video key, overview budget K), the epoch, the sampler seed, the
weight version (optimizer steps applied to the weights that rolled out), the CPU threads,
and a digest of the rollouts' token ids. `replay_step` rebuilds that rollout from the log
alone: the same prompts and budgets, the same seed, the weights of that version (the SFT
model for step 1, else the DeepSpeed checkpoint written after step N-1), and compares
digests. On CPU in float32 a replay is bit-identical; on a GPU in bf16 kernels may not be.

A file per step and rank, written atomically, so a resumed run rewrites a step it repeats
instead of logging it twice. What is replayed is the rollout (the data of the step); the
advantages and the update follow from it, the weights and the config.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict

from paravt_core.agent.rollout import Episode


class PromptDraw(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_id: str
    video: str  # the video key the id was built from (`rl.data.video_key`)
    nframes: int | None  # gating's K; None: the video config's overview frames


class StepDraws(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int  # 1-based, as metrics.jsonl and the checkpoints count
    rank: int
    world: int
    epoch: int
    sampler_seed: int
    weight_version: int  # optimizer steps applied to the weights that rolled out
    torch_threads: int
    engine: str = "hf"  # rl.rollout.engine; only `hf` rollouts are replayed here
    prompts: list[PromptDraw]
    rollout_sha256: str


class ReplayError(RuntimeError):
    """A step that cannot be replayed; the message says what is missing."""


def sampler_seed(run_seed: int, step_index: int, rank: int) -> int:
    """The rollout sampler's seed of one rank's step (0-based step index)."""
    return run_seed * 100_003 + step_index * 997 + rank


def rollout_digest(episodes: Sequence[Episode]) -> str:
    """sha256 over every episode's ids, loss mask and the engine's log-probs (the loss reads
    them), and its sub-agents' ids and log-probs, in order."""
    h = hashlib.sha256()
    for e in episodes:
        h.update(f"{e.prompt_id}|{e.sample_index}|{e.nframes}|".encode())
        for tensor in (e.token_ids.to(torch.int64), e.loss_mask.to(torch.int64), e.old_logprobs.to(torch.float32)):
            h.update(tensor.numpy().tobytes())
        for s in e.subagents:
            h.update(s.token_ids.to(torch.int64).numpy().tobytes())
            h.update(s.logprobs.to(torch.float32).numpy().tobytes())
    return h.hexdigest()


def draws_path(run_dir: Path, step: int, rank: int) -> Path:
    return Path(run_dir) / "draws" / f"step{step:07d}-rank{rank}.json"


def write_draws(run_dir: Path, draws: StepDraws) -> Path:
    from paravt_core.atomic import atomic_write_text

    path = draws_path(run_dir, draws.step, draws.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, draws.model_dump_json(indent=1))


def read_draws(run_dir: Path, step: int, rank: int = 0) -> StepDraws:
    path = draws_path(run_dir, step, rank)
    if not path.is_file():
        logged = sorted(p.name for p in (Path(run_dir) / "draws").glob("*.json"))[:10]
        raise ReplayError(f"no draws log {path}; logged steps: {logged or 'none'}")
    return StepDraws.model_validate_json(path.read_text())


@dataclasses.dataclass
class Replay:
    draws: StepDraws
    digest: str
    episodes: list[Episode]

    @property
    def identical(self) -> bool:
        return self.digest == self.draws.rollout_sha256


def replay_weights(run_dir: Path, version: int, zero_stage: int) -> dict[str, torch.Tensor] | None:
    """The policy after `version` optimizer steps: None for 0 (the init model's own weights),
    else the checkpoint written after that step."""
    if version == 0:
        return None
    from paravt_core.dist import checkpoint_state_dict

    tag = Path(run_dir) / "checkpoints" / f"step{version:07d}"
    if not tag.is_dir():
        kept = sorted(p.name for p in (Path(run_dir) / "checkpoints").glob("step*"))
        raise ReplayError(f"step {version + 1} rolled out with the weights after step {version}, but there is no "
                          f"checkpoint {tag} (checkpoints kept: {kept or 'none'}); replay step 1 or a step right "
                          f"after a kept checkpoint (rl.checkpoint_every, rl.keep_last)")
    return checkpoint_state_dict(tag.parent, tag.name, zero_stage)


def replay_step(run_dir: Path, step: int, rank: int = 0) -> Replay:
    """Roll out one logged step again from its draws log (module docstring).

    Raises:
        ReplayError: no log of that step, no checkpoint of its weights, or a prompt of the
            log missing from the job's RL data.
    """
    from paravt_core.agent.hf_engine import HFEngine
    from paravt_core.agent.rollout import run_episodes
    from paravt_core.model.loading import load_model, load_processor
    from paravt_core.rl.data import read_rl_prompts
    from paravt_core.rl.job import RLJob

    run_dir = Path(run_dir)
    job = RLJob.model_validate_json((run_dir / "job.json").read_text())
    cfg, draws = job.config, read_draws(run_dir, step, rank)
    if draws.engine != "hf":
        raise ReplayError(f"step {step} rolled out on the {draws.engine} engine; replay rebuilds rollouts with the "
                          f"embedded hf engine only, whose numerics differ from a server's")
    state = replay_weights(run_dir, draws.weight_version, cfg.rl.zero_stage)
    torch.set_num_threads(draws.torch_threads)
    processor = load_processor(job.init_model)
    model = load_model(job.init_model, dtype=cfg.model.dtype, attn_implementation=cfg.model.attn_implementation)
    engine = HFEngine(model.eval(), processor)
    if state is not None:
        engine.update_weights(state)
    by_id = {p.prompt.prompt_id: p for p in read_rl_prompts(job.data_files, cfg.rl.question_types, job.media_root)}
    missing = [d.prompt_id for d in draws.prompts if d.prompt_id not in by_id]
    if missing:
        raise ReplayError(f"prompts {missing[:5]} of {draws_path(run_dir, step, rank)} are not in the job's RL data "
                          f"{[str(f) for f in job.data_files]}")
    prompts = [dataclasses.replace(by_id[d.prompt_id].prompt, nframes=d.nframes) for d in draws.prompts]
    episodes = run_episodes(engine, processor, prompts, cfg.rl.rollout, cfg.video, group_size=cfg.rl.group_size,
                            temperature=cfg.rl.temperature, seed=draws.sampler_seed)
    return Replay(draws, rollout_digest(episodes), episodes)
