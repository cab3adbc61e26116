"""Every RL step's draws, logged so that the step can be replayed (SPEC §5).

Each rank writes `draws/step<N>-rank<r>.json` in the run folder after its rollout: the
prompts it rolled out (id, video key, overview budget K), the epoch, the sampler seed, the
weight version (optimizer steps applied to the weights that rolled out), the CPU threads,
and a digest of the rollouts' token ids. `replay_step` rebuilds that rollout from the log
alone: the same prompts and budgets, the same seed, the weights of that version (the SFT
model for version 0, else the DeepSpeed checkpoint written after that step), and compares
digests. On CPU in float32 a replay is bit-identical; on a GPU in bf16 kernels may not be.

A file per step and rank, written atomically, so a resumed run rewrites a step it repeats
instead of logging it twice. What is replayed is the rollout (the data of the step); the
advantages and the update follow from it, the weights and the config.

Before anything is rolled out, the log is checked (`check_draws`): it must parse to its
schema, name the step and rank it is filed under, and agree on every field replay reads
with what the run draws at that step (the prompts and their videos, each K, the epoch, the
sampler seed, the weight version). The checkpoint must be intact (`dist.checkpoints.checkpoint_damage`,
its manifest's sha256 included). Otherwise `ReplayError` says which file and field, so a
damaged or edited log is never replayed as if it were the step's.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from paravt_core.agent.hf_build import build_hf_engine
from paravt_core.agent.rollout import Episode, run_episodes
from paravt_core.atomic import atomic_write_text
from paravt_core.dist.checkpoints import CHECKPOINT_MANIFEST, checkpoint_damage
from paravt_core.dist.weights import checkpoint_state_dict
from paravt_core.model.integrity import ModelFolderError
from paravt_core.model.loading import build_model, load_processor
from paravt_core.rl.data import RLPrompt, RLRowError, read_rl_prompts
from paravt_core.rl.job import RLJob
from paravt_core.rl.overlap import behaviour_version
from paravt_core.rl.schedule import step_plan
from paravt_core.video.errors import VideoDecodeError


class PromptDraw(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_id: str
    video: str  # the video key the id was built from (`rl.data.video_key`)
    nframes: int | None  # gating's K; None: the video config's overview frames


class StepDraws(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int = Field(ge=1)  # 1-based, as metrics.jsonl and the checkpoints count
    rank: int = Field(ge=0)
    world: int = Field(ge=1)
    epoch: int = Field(ge=0)
    sampler_seed: int
    weight_version: int = Field(ge=0)  # optimizer steps applied to the weights that rolled out
    torch_threads: int = Field(ge=1)
    engine: str = "hf"  # rl.rollout.engine; only `hf` rollouts are replayed here
    prompts: list[PromptDraw] = Field(min_length=1)  # a step whose every video failed logs nothing
    rollout_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    # {weight label: tokens} the server reported sampling this batch with (`agent.engine.weight_label`;
    # checked against `weight_version`, `rl/served_policy.check_served_versions`); None: the engine does not say
    served_weight_versions: dict[str, int] | None = None


class ReplayError(RuntimeError):
    """A step that cannot be replayed; the message names the file and what is missing or wrong."""


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
    path = draws_path(run_dir, draws.step, draws.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, draws.model_dump_json(indent=1))


def read_draws(run_dir: Path, step: int, rank: int = 0) -> StepDraws:
    path = draws_path(run_dir, step, rank)
    if not path.is_file():
        logged = sorted(p.name for p in (Path(run_dir) / "draws").glob("*.json"))[:10]
        raise ReplayError(f"no draws log {path}; logged steps: {logged or 'none'}")
    try:
        return StepDraws.model_validate_json(path.read_bytes())
    except OSError as error:
        raise ReplayError(f"cannot read the draws log {path}: {error}") from None
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the file"
        raise ReplayError(f"{path} is not a draws log as the RL stage writes it ({where}: {first['msg']}; "
                          f"{error.error_count()} problem(s)): the file is damaged; replay another step, or run "
                          "the RL stage again to log this one") from None


def check_draws(draws: StepDraws, path: Path, step: int, rank: int, job: RLJob, prompts: Sequence[RLPrompt]) -> None:
    """Raise `ReplayError` unless the log at `path` is the one of `step` and `rank` and every
    field replay reads agrees with what the run draws at that step (`rl.schedule.step_plan`):
    the prompts (those of the plan, in its order; a prompt whose video did not decode is left
    out of the log), each prompt's video and K, the epoch, the sampler seed, the weights."""
    def wrong(what: str) -> ReplayError:
        return ReplayError(f"{path}: {what}; the log was edited or belongs to another run, so it does not say "
                           "what this step drew: replay another step, or run the RL stage again to log this one")

    if (draws.step, draws.rank) != (step, rank):
        raise wrong(f"it logs step {draws.step} rank {draws.rank}, but it is filed as step {step} rank {rank}")
    if draws.engine != job.config.rl.rollout.engine:
        raise wrong(f"engine is {draws.engine!r}, but the run rolled out on {job.config.rl.rollout.engine!r}")
    if rank >= draws.world:
        raise wrong(f"rank {rank} is outside the {draws.world} ranks it logs")
    seed = job.config.run.seed
    version = behaviour_version(step - 1, job.config.rl.overlap)  # rl.overlap: 1 generates a step behind
    for field_name, logged, drawn in (("weight_version", draws.weight_version, version),
                                      ("sampler_seed", draws.sampler_seed, sampler_seed(seed, step - 1, rank))):
        if logged != drawn:
            raise wrong(f"{field_name} is {logged}, but step {step} rank {rank} of this run has {drawn}")
    try:
        plan, epoch = step_plan(list(prompts), job.config, step - 1, rank, draws.world)
    except ValueError as error:  # the logged world does not divide rl.prompts_per_step
        raise wrong(str(error)) from None
    if draws.epoch != epoch:
        raise wrong(f"epoch is {draws.epoch}, but step {step} of this run is in epoch {epoch}")
    planned = iter(plan)
    for i, d in enumerate(draws.prompts):
        match = next((p for p in planned if p.prompt.prompt_id == d.prompt_id), None)
        if match is None:
            raise wrong(f"prompts[{i}] {d.prompt_id} is not among the prompts this step draws (after the ones "
                        f"before it): {[p.prompt.prompt_id for p in plan]}")
        if d.video != match.video_key:
            raise wrong(f"prompts[{i}] {d.prompt_id} logs video {d.video!r}, but the job's RL data has "
                        f"{match.video_key!r} for it")
        if d.nframes != match.prompt.nframes:
            raise wrong(f"prompts[{i}] {d.prompt_id} logs K={d.nframes}, but this step draws "
                        f"K={match.prompt.nframes} for it")


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

    tag = Path(run_dir) / "checkpoints" / f"step{version:07d}"
    if not tag.is_dir():
        kept = sorted(p.name for p in (Path(run_dir) / "checkpoints").glob("step*"))
        raise ReplayError(f"the step rolled out with the weights after step {version}, but there is no "
                          f"checkpoint {tag} (checkpoints kept: {kept or 'none'}); replay step 1 or a step whose "
                          f"weights are a kept checkpoint (rl.checkpoint_every, rl.keep_last)")
    problem = checkpoint_damage(tag) or _misfiled(tag, version)
    if problem:
        raise ReplayError(f"the checkpoint of the weights after step {version} is damaged: {problem}; replay step 1 "
                          "or a step whose weights are another checkpoint")
    return checkpoint_state_dict(tag.parent, tag.name, zero_stage)


def _misfiled(tag: Path, version: int) -> str | None:
    """Why `tag` does not hold the state after step `version`, for what its manifest cannot say
    (#61: one deleted, another step's file copied in): each model-states file records the step
    it was saved after (the trainers' client state, `{"step": N}`), and a tag whose manifest is
    gone while the run's other tags have theirs is named."""
    for states in sorted(tag.glob("*model_states.pt")):
        saved = torch.load(states, map_location="cpu", weights_only=False, mmap=True)
        step = saved.get("step") if isinstance(saved, dict) else None
        if isinstance(step, int) and step != version:
            return (f"{states} holds the state after step {step}, not step {version} (its recorded step): a file of "
                    "another step was copied there; restore this step's file")
    others = [p for p in tag.parent.glob("step*") if p != tag and (p / CHECKPOINT_MANIFEST).is_file()]
    if others and not (tag / CHECKPOINT_MANIFEST).is_file():
        return (f"{tag / CHECKPOINT_MANIFEST} is missing (the run's other checkpoints have theirs), so {tag}'s files "
                "cannot be checked against what was saved")
    return None


def read_job(run_dir: Path) -> RLJob:
    """The run's `job.json` (its config, model and data), or `ReplayError` naming the file."""
    path = Path(run_dir) / "job.json"
    try:
        return RLJob.model_validate_json(path.read_bytes())
    except (OSError, ValidationError) as error:
        raise ReplayError(f"{path} is not a readable RL job ({str(error).splitlines()[0]}); it is written when the "
                          "RL stage starts: run the stage again, or give its run folder") from None


def replay_step(run_dir: Path, step: int, rank: int = 0) -> Replay:
    """Roll out one logged step again from its draws log (module docstring).

    Raises:
        ReplayError: an unreadable job or log, a log that disagrees with the run
            (`check_draws`), no intact checkpoint of its weights, a prompt of the log missing
            from the job's RL data, or an init model that is not whole.
    """
    run_dir = Path(run_dir)
    job = read_job(run_dir)
    cfg, draws, path = job.config, read_draws(run_dir, step, rank), draws_path(run_dir, step, rank)
    try:
        data = read_rl_prompts(job.data_files, cfg.rl.question_types, job.media_root)
    except (OSError, RLRowError) as error:
        raise ReplayError(f"cannot read the job's RL data {[str(f) for f in job.data_files]}: {error}") from None
    by_id = {p.prompt.prompt_id: p for p in data}
    missing = [d.prompt_id for d in draws.prompts if d.prompt_id not in by_id]
    if missing:
        raise ReplayError(f"prompts {missing[:5]} of {path} are not in the job's RL data "
                          f"{[str(f) for f in job.data_files]}")
    check_draws(draws, path, step, rank, job, data)
    if draws.engine != "hf":
        raise ReplayError(f"step {step} rolled out on the {draws.engine} engine; replay rebuilds rollouts with the "
                          f"embedded hf engine only, whose numerics differ from a server's")
    state = replay_weights(run_dir, draws.weight_version, cfg.rl.zero_stage)
    torch.set_num_threads(draws.torch_threads)
    try:
        # The rollout engine's own options: prefill_attention and patch_embed change its numbers.
        model = build_model(cfg.model, job.init_model)
        processor = load_processor(job.init_model)
    except ModelFolderError as error:
        raise ReplayError(f"the run's init model is not whole: {error}") from None
    engine = build_hf_engine(cfg, model.eval(), processor, "rollout")
    if state is not None:
        engine.update_weights(state)
    prompts = [dataclasses.replace(by_id[d.prompt_id].prompt, nframes=d.nframes) for d in draws.prompts]
    try:
        episodes = run_episodes(engine, processor, prompts, cfg.rl.rollout, cfg.video, group_size=cfg.rl.group_size,
                                temperature=cfg.rl.temperature, seed=draws.sampler_seed)
    except VideoDecodeError as error:  # it decoded when the step ran: the file changed since
        raise ReplayError(f"a video of the step no longer decodes: {error}") from None
    return Replay(draws, rollout_digest(episodes), episodes)
