"""One rank of the PARA-GRPO trainer (SPEC §5); started by the DeepSpeed launcher.

Each step: pick this rank's prompts, draw each prompt's frame budget K (nFrames gating),
roll out G episodes per prompt with the agentic protocol (SPEC §3) on the rollout engine,
score them (SPEC §4), score the reference and (decoupled PPO) the policy before the update,
turn rewards into token advantages by the release's five steps (SPEC §5; batch statistics
summed over all ranks), and take one PPO-clip step over the episodes and (with
`train_subagents`) their sub-agent runs. The rollout engine is then given the new weights;
with `rl.overlap: 1` the next step's rollout runs in a background thread while the step trains,
and the weights reach the engine when `rl/overlap.py`'s schedule says (one step off-policy).
A rollout server is also given them before step 1, on every run, and must then serve the
policy's log-probs on a fixed probe (`rl/served_policy.py`, issue #48): it holds whatever
weights it was last given, which need not be the ones it names.

On several ranks (SPEC §5): the ranks agree on the number of micro-batches of every pass
that runs collectives (the ZeRO-3 reference, the policy) and a rank with fewer runs
fillers, so no rank is left blocked in a gather; the loss is ONE token mean over every
trained token of the step on every rank (the count is all-reduced). Before the loss every
trajectory passes `rl/contracts.py`, and each rank logs its step's draws (`rl/replay.py`) and what
its episodes were trained with (`rl/episode_log.py`).

Departures from the release (SPEC §5): sub-agent trajectories are trained (each with its
episode's advantage); K really sets the overview frame count; token-level anchoring is
available; `reward.scope: transcript` is a row of its own (SPEC §4.5).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from paravt_core.agent.context import THINK_PREFIX
from paravt_core.agent.rollout import run_episodes
from paravt_core.agent.tags import TagLocator
from paravt_core.collectives import CheckedCollectives
from paravt_core.dist.checkpoints import resume, save, trim_step_log
from paravt_core.dist.ds_config import rl_deepspeed_config, training_dtype, zero_optimizer
from paravt_core.dist.rank import StepLog, init_distributed, maybe_kill_for_test, shutdown_distributed
from paravt_core.dist.weights import export_hf_model, full_state_dict, gathered_state_dict
from paravt_core.memory import record_memory
from paravt_core.model.loading import build_model, load_processor
from paravt_core.plan import declare_stage
from paravt_core.provenance import host_numerics
from paravt_core.rl import policy as P, served_policy as S
from paravt_core.rl.contracts import TokenLayout, TrajectoryContractError, check_trajectories
from paravt_core.rl.data import read_rl_prompts, rollout_dropping_undecodable
from paravt_core.rl.decision import combine_rank_rows, decision_metrics, decision_parts
from paravt_core.rl.episode_log import episode_records, write_episode_log
from paravt_core.rl.grpo import Moments
from paravt_core.rl.job import RLJob
from paravt_core.rl.kl import kl_mode
from paravt_core.rl.overlap import (Batch, behaviour_version, load_inflight, prune_inflight, run_overlapped,
                                    save_inflight)
from paravt_core.rl.policy import fixed_format_reward, paravt_reward, reward_means
from paravt_core.rl.replay import PromptDraw, StepDraws, rollout_digest, sampler_seed, write_draws
from paravt_core.rl.rollout_engine import build_rollout_engine
from paravt_core.rl.schedule import step_plan
from paravt_core.rl.shared_prefix import PACKED, enable_checkpointing
from paravt_core.rl.weight_push import GatheredWeights
from paravt_core.tracking import MetricLogger


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", required=True)
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args(argv)
    train(RLJob.model_validate_json(Path(args.job).read_text()))
    return 0


class Trainer:
    """Models, engines and the DeepSpeed policy of one rank."""

    def __init__(self, job: RLJob, reward_fn=None):
        import deepspeed

        self.job, self.cfg, self.rl = job, job.config, job.config.rl
        self.rank, self.world, self.device = init_distributed()
        # The device ledger (rehearsals): this rank holds the plan's RL policy pass row on its card.
        declare_stage(f"RL rank {self.rank}", "RL policy pass", self.cfg, job.init_model)
        torch.manual_seed(self.cfg.run.seed)
        on_gpu = self.device.startswith("cuda")
        ds_config = rl_deepspeed_config(self.cfg, on_gpu=on_gpu)
        zero3 = ds_config if self.rl.zero_stage == 3 else None
        self.processor = load_processor(job.init_model)
        # ZeRO 0-2: straight onto the rank's device, as SFT (DeepSpeed would move it there anyway).
        policy = build_model(self.cfg.model, job.init_model, dtype=training_dtype(self.cfg.model.dtype, on_gpu),
                             device=self.device, zero3_config=zero3)
        if self.rl.gradient_checkpointing:  # a shared-prefix pass stays piecewise through the recompute
            enable_checkpointing(policy)
        policy.train()
        # rl.rollout.engine decides; a config asking for sglang never gets hf (rl/rollout_engine.py).
        self.rollout_backend = build_rollout_engine(self.cfg, job.init_model, self.processor, self.device, self.rank,
                                                    self.world, job.out_dir / "rollout_weights", job.init_model_sha256)
        self.engine = self.rollout_backend.engine
        # rl.overlap on hf: the engine process has its share of the rank's threads, the trainer the rest.
        self.rollout_threads = torch.get_num_threads()  # what a rollout generates at (the draws log's)
        if self.rollout_backend.thread_share is not None:
            trainer_threads, self.rollout_threads = self.rollout_backend.thread_share
            torch.set_num_threads(trainer_threads)
        self.ref_model = None
        if kl_mode(self.rl).needs_reference:
            self.ref_model = self._reference(job, zero3)
        self.prompts = read_rl_prompts(job.data_files, self.rl.question_types, job.media_root)
        self.undecodable: set[str] = set()  # videos whose prompts are dropped (`rollout_dropping_undecodable`)
        self.reward_fn = reward_fn or paravt_reward(self.rl)
        tok = self.processor.tokenizer
        self.ids = {"pad": tok.pad_token_id, "image": policy.config.image_token_id, "video": policy.config.video_token_id}
        # Tags are matched as token sequences (SPEC §2): in Qwen3-VL's tokenizer `<answer>` is several tokens.
        self.locator = TagLocator(tok) if self.rl.anchoring_mode == "token" else None
        # Rollouts without the think prefix write it themselves: the decision token follows it (rl/decision.py).
        self.think_lead = () if self.rl.rollout.think_prefix else tuple(tok.encode(THINK_PREFIX,
                                                                                   add_special_tokens=False))
        self.layout = TokenLayout.of(policy.config, tok, self.processor.image_processor.merge_size)
        # Only a ZeRO-3 reference runs collectives in its forward; a whole local copy does not.
        self.ref_collectives = zero3 is not None
        optimizer = zero_optimizer(policy.parameters(), lr=self.rl.learning_rate,
                                   weight_decay=self.rl.weight_decay, zero=self.rl.deepspeed)
        self.policy, _, _, _ = deepspeed.initialize(model=policy, optimizer=optimizer, config=ds_config)
        record_memory(job.out_dir, "rl", "engine", self.rank, self.world, self.device, self.policy.module)
        self.ckpt_dir = job.out_dir / "checkpoints"
        self.start = int(resume(self.policy, self.ckpt_dir, stage="rl").get("step", 0))
        if self.rank == 0:
            trim_step_log(job.out_dir / "metrics.jsonl", self.start)  # re-run steps are logged once
        # A server holds whatever it was last given (another run's weights, issue #48): it gets
        # the policy's before step 1 on every run, then must serve its log-probs.
        if self.start or self.rollout_backend.served:
            self.push_weights(self.start)
        if self.rollout_backend.served:
            self.check_served_policy()

    def _reference(self, job: RLJob, zero3: dict | None):
        """The frozen reference: whole on the device, or under ZeRO-3 its own partitioned inference
        engine (same offload settings as the policy, no optimizer), so no rank holds it whole."""
        import deepspeed

        if zero3 is None:
            return build_model(self.cfg.model, job.init_model, device=self.device).eval()
        dtype = "bfloat16" if zero3["bf16"]["enabled"] else "float32"
        reference = build_model(self.cfg.model, job.init_model, dtype=dtype, zero3_config=zero3)
        engine, _, _, _ = deepspeed.initialize(model=reference, config=zero3)
        engine.eval()  # DeepSpeedEngine.eval returns None, not the engine
        return engine

    def push_weights(self, version: int) -> None:
        """The policy's weights, W(`version`), to the rollout engine: every rank's own `hf` copy
        gets the whole state dict; a server gets rank 0's snapshot, streamed as each ZeRO-3
        parameter is gathered, and the other ranks only join the gathers (issue #44 item 8)."""
        if self.rollout_backend.served:
            weights = GatheredWeights(self.policy, self.rl.zero_stage, keep=self.rollout_backend.pushes_weights)
        else:
            weights = gathered_state_dict(self.policy, self.rl.zero_stage)
        self.rollout_backend.update_weights(weights, version)
        self.policy.module.train()

    def push_overlapped(self, version: int) -> None:
        """`rl.overlap: 1`'s push (`rl/overlap.py`): on a server, the probe follows each one
        (`rl/served_policy.py`); its collective keeps every rank's next rollout from starting
        before rank 0's push has landed."""
        self.push_weights(version)
        if self.rollout_backend.served:
            self.check_served_policy()

    def check_served_policy(self) -> None:
        """Stop unless the rollout server's log-probs of a fixed probe are the policy's
        (`rl/served_policy.py`): rank 0 draws it, every rank scores it (a ZeRO-3 forward
        gathers on all ranks) and all stop together on the largest gap."""
        import torch.distributed as dist

        probe = None
        if self.rank == 0:
            probe = S.draw_probe(self.engine, self.processor.tokenizer, self.rl.temperature, self.cfg.run.seed,
                                 collective_s=S.collective_timeout_s() if self.world > 1 else None)
        if self.world > 1 and dist.is_initialized():
            box = [probe]
            dist.broadcast_object_list(box, src=0)
            probe = box[0]
        trainer = S.trainer_logprobs(self.policy, probe, self.rl.temperature, self.device)
        gap = self._all_ranks(S.logprob_gap(probe, trainer), op="max")[0]
        if self.rank == 0:
            print(f"rl: the rollout server serves the policy (probe log-prob gap {gap:.2e} nats per token)",
                  file=sys.stderr, flush=True)
        S.check_gap(gap, S.probe_tolerance(self.cfg.model.dtype, self.rl.served_logprob_tolerance),
                    self.rollout_backend.url or "the configured url")

    def rollout(self, step: int):
        """(prompts kept, their episodes) of this rank's step; its draws are logged (`rl/replay.py`)."""
        prompts, epoch = step_plan(self.prompts, self.cfg, step, self.rank, self.world)
        seed = sampler_seed(self.cfg.run.seed, step, self.rank)

        def run(batch: list) -> list:
            return run_episodes(self.engine, self.processor, [p.prompt for p in batch], self.rl.rollout,
                                self.cfg.video, group_size=self.rl.group_size, temperature=self.rl.temperature,
                                seed=seed)

        version = behaviour_version(step, self.rl.overlap)
        self.rollout_backend.served_versions()  # from here on: this batch's (the probe's draw is not)
        kept, episodes = rollout_dropping_undecodable(prompts, run, self.undecodable)
        served = self.rollout_backend.served_versions()
        write_draws(self.job.out_dir, StepDraws(
            step=step + 1, rank=self.rank, world=self.world, epoch=epoch, sampler_seed=seed,
            weight_version=version, torch_threads=self.rollout_threads, engine=self.rl.rollout.engine,
            rollout_sha256=rollout_digest(episodes), served_weight_versions=served,
            prompts=[PromptDraw(prompt_id=p.prompt.prompt_id, video=p.video_key, nframes=p.prompt.nframes)
                     for p in kept]))
        if served is not None:  # the server's word on which weights made the batch (issue #65)
            S.check_served_versions(served, version, f"RL step {step + 1}, rank {self.rank}",
                                    self.rollout_backend.url or "the configured url")
        return kept, episodes

    def rollout_batch(self, step: int) -> tuple[list, list]:
        """The step's rollout (`rollout`), then the engine's memory given back where it is co-located."""
        prompts, episodes = self.rollout(step)
        self.rollout_backend.after_rollout()
        return prompts, episodes

    def train_step(self, step: int) -> dict[str, float]:
        """The synchronous step (`rl.overlap: 0`): roll out, train, push the new weights."""
        t0 = time.perf_counter()
        prompts, episodes = self.rollout_batch(step)
        t1 = time.perf_counter()
        row = self.learn(step, prompts, episodes, t1 - t0, push=True)
        row.update(behaviour_version=float(step), time_trainer_idle_s=t1 - t0,
                   time_rollout_idle_s=time.perf_counter() - t1)
        return row

    def learn(self, step: int, prompts: list, episodes: list, rollout_s: float, push: bool) -> dict[str, float]:
        """One optimizer step on a rolled-out batch (its wall time `rollout_s`) and, with `push`,
        the new weights to the engine; the step's metrics row of this rank."""
        t1 = time.perf_counter()
        trajs = P.trajectories(episodes, self.rl.train_subagents, self.locator)
        self._check_on_every_rank(lambda: check_trajectories(
            trajs, episodes, prompts, self.layout, self.rl.gating.choices if self.rl.gating.enabled else None,
            f"RL step {step + 1}, rank {self.rank}"))
        micro = max(1, self.rl.micro_batch_size)
        own = -(-len(trajs) // micro)
        # Every rank runs as many micro-batches as the rank with the most (SPEC §5).
        count = int(self._all_ranks(float(own), op="max")[0])
        PACKED.clear()  # a step that failed before its policy pass leaves no packing behind
        if self.ref_model is not None:
            P.reference_pass(self.ref_model, trajs, micro, self.ids, self.rl.ref_temperature or self.rl.temperature,
                             self.device, count if self.ref_collectives else None, self.rl.logprob_chunk,
                             self.rl.shared_prefix)
        kl = (P.episode_kl(episodes, trajs, kl_mode(self.rl)) if self.ref_model is not None
              else torch.zeros(len(episodes)))
        t2 = time.perf_counter()
        adv = P.step_advantages(episodes, prompts, self.rl, self.reward_fn, kl)
        P.assign_token_advantages(trajs, adv, self.rl)
        raw_stats = _advantage_stats(trajs, "adv_raw")
        moments = None
        if self.rl.batch_norm_advantages:
            local = P.local_advantage_moments(trajs, self.rl.moments_main_agent_only)
            moments = Moments(*self._all_ranks(local.total, local.total_sq, local.count))
            P.normalize_token_advantages(trajs, moments, self.rl.adv_eps)
        total = self._all_ranks(float(sum(t.loss_mask.sum() for t in trajs)))[0]  # ONE token mean (SPEC §5)
        decisions = decision_parts(trajs, adv.per_episode, adv.format_per_episode, self.rl, moments, self.think_lead)
        write_episode_log(self.job.out_dir, step + 1, self.rank, episode_records(
            step + 1, self.rank, episodes, prompts, adv.rewards, adv.per_episode, trajs, total, decisions,
            adv.shaped.tolist(), behaviour_version(step, self.rl.overlap)))
        loss_sum, clip_sum, dropped = 0.0, 0.0, 0.0
        try:
            for i, batch in enumerate(P.micro_batches(trajs, micro, count, by_group=self.rl.shared_prefix)):
                self.policy.set_gradient_accumulation_boundary(i == count - 1)
                loss, stats = P.micro_batch_loss(self.policy, batch.trajs, self.rl, self.ids, total, self.device,
                                                 world=self.world, weight=0.0 if batch.filler else 1.0)
                self.policy.backward(loss)
                loss_sum += loss.item()
                clip_sum += stats["clip_frac"]
                dropped += stats["dropped_tokens"]
        finally:  # the reference pass's packed micro-batches served this pass; the next step packs its own
            PACKED.clear()
        self.policy.step()
        t3 = time.perf_counter()
        if push:
            self.push_weights(step + 1)
        pushed = time.perf_counter() - t3
        clipped, dropped = self._all_ranks(clip_sum, dropped)  # shares of the step's trained tokens
        row = self.metrics(episodes, adv, loss_sum, clipped / max(total, 1.0), (rollout_s, t2 - t1, t3 - t2))
        row.update(raw_stats, **_advantage_stats(trajs, "adv"), dropped_frac=dropped / max(total, 1.0),
                   time_push_s=pushed, saturated_groups=saturated_groups(adv, self.rl.group_size), trajectories=float(len(trajs)),
                   micro_batches=float(count), filler_micro_batches=float(count - own),
                   **decision_metrics(decisions, moments, self.rl.adv_eps))
        return row

    def _check_on_every_rank(self, check) -> None:
        """Run `check` (it raises on a bad trajectory); every rank raises when any rank's check
        failed, so no rank is left waiting in the step's next collective for one that stopped."""
        problem = None
        try:
            check()
        except TrajectoryContractError as error:
            problem = error
        if self._all_ranks(float(problem is not None), op="max")[0] and problem is None:
            raise TrajectoryContractError(f"a trajectory of another rank broke the contract in this step (rank "
                                          f"{self.rank} stops with it); that rank's log names it")
        if problem is not None:
            raise problem

    def _all_ranks(self, *values: float, op: str = "sum") -> list[float]:
        """`values` summed (or their max) over every rank; as they are on one rank."""
        import torch.distributed as dist

        if not dist.is_initialized() or self.world == 1:
            return list(values)
        reduce_op = dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        CheckedCollectives(self.device).all_reduce(t, op=reduce_op)
        return [float(x) for x in t.cpu()]

    def metrics(self, episodes, adv, loss: float, clip_frac: float, times) -> dict[str, float]:
        """SPEC §5 per-step metrics of this rank (averaged over ranks by the caller)."""
        gen_len = [float(e.loss_mask.sum()) for e in episodes]
        row = {
            "f_tau": float(np.mean([x.terms["format"] for x in adv.rewards])),
            "f_tau_fixed": float(np.mean([fixed_format_reward(e) for e in episodes])),
            "f_tau_fixed_transcript": float(np.mean([fixed_format_reward(e, "transcript") for e in episodes])),
            "kappa": float(np.mean([e.tool_calls for e in episodes])),
            **reward_means(adv.rewards),
            "parse_failures": float(np.mean([e.parse_failures for e in episodes])),
            "unanswered_calls": float(np.mean([e.unanswered_calls for e in episodes])),
            "response_length": float(np.mean(gen_len)),
            "kl": float(adv.kl.mean()),
            "clip_frac": clip_frac,
            "loss": loss,
            "time_rollout_s": times[0],
            "time_reference_s": times[1],
            "time_train_s": times[2],
        }
        for k, n in Counter(e.nframes for e in episodes).items():
            row[f"nframes_{k}"] = n / len(episodes)
        return row


def _advantage_stats(trajs, prefix: str) -> dict[str, float]:
    """Mean, std and largest magnitude of the trained tokens' advantages."""
    values = torch.cat([t.advantages[t.loss_mask.bool()] for t in trajs]) if trajs else torch.zeros(0)
    if values.numel() == 0:
        return {f"{prefix}_mean": 0.0, f"{prefix}_std": 0.0, f"{prefix}_absmax": 0.0}
    return {f"{prefix}_mean": float(values.mean()), f"{prefix}_std": float(values.std()) if values.numel() > 1 else 0.0,
            f"{prefix}_absmax": float(values.abs().max())}


def saturated_groups(adv, group_size: int) -> float:
    """Share of prompt groups with no task signal: all their scalars equal as group normalization
    gets them (`StepAdvantages.shaped`: shaped and clipped, SPEC §5 step 1), so rewards that
    differ only beyond the clip count as equal. Such a group's tokens carry only the KL reward
    and step 4's shift."""
    if adv.shaped is None:
        raise ValueError("the step's advantages carry no shaped scalars (build them with rl.policy.step_advantages)")
    totals = adv.shaped.tolist()
    groups = [totals[i : i + group_size] for i in range(0, len(totals), group_size)]
    return float(np.mean([max(g) - min(g) < 1e-9 for g in groups])) if groups else 0.0


def _all_reduce_mean(row: dict[str, float], world: int) -> dict[str, float]:
    import torch.distributed as dist

    gathered: list[dict[str, float]] = [{} for _ in range(world)]
    dist.all_gather_object(gathered, row)
    return combine_rank_rows(gathered)


def train(job: RLJob, reward_fn=None) -> None:
    import torch.distributed as dist

    threads = torch.get_num_threads()  # the rank's (the trainer takes a share of them under rl.overlap)
    try:
        trainer = Trainer(job, reward_fn)
        try:
            _train_loop(trainer, job)
        finally:
            trainer.rollout_backend.close()  # a server this rank launched
        dist.barrier()
    finally:
        torch.set_num_threads(threads)  # a caller running the rank in its own process gets them back
        shutdown_distributed()


def _train_loop(trainer: Trainer, job: RLJob) -> None:
    from tqdm import tqdm

    rl = job.config.rl
    metrics = MetricLogger(job.tracking_uri, job.mlflow_run_id, enabled=trainer.rank == 0)
    bar = tqdm(initial=trainer.start, total=rl.max_steps, desc="rl",
               disable=trainer.rank != 0 or not sys.stdout.isatty())
    progress = StepLog("rl", rl.max_steps, trainer.start, enabled=trainer.rank == 0 and not sys.stdout.isatty(),
                       every=1)

    def finish(step: int, local: dict[str, float], following: Batch | None) -> None:
        row = _all_reduce_mean(local, trainer.world)
        if trainer.rank == 0:
            with open(job.out_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": step + 1, **row}) + "\n")
            metrics.log(step + 1, row)
            bar.update(1)
            bar.set_postfix(R=f"{row['reward']:.3f}", f=f"{row['f_tau']:.2f}", k=f"{row['kappa']:.2f}")
            progress.step(step + 1, reward=row["reward"], f_tau=row["f_tau"], kappa=row["kappa"],
                          rollout_s=row["time_rollout_s"])
        done = step + 1
        if not job.steps_only and (done % rl.checkpoint_every == 0 or done == rl.max_steps):
            if following is not None:  # the next step's batch, which a resumed run trains on (rl/overlap.py)
                save_inflight(trainer.ckpt_dir, following, trainer.rank)
            save(trainer.policy, trainer.ckpt_dir, done, {"step": done}, keep_last=rl.keep_last,
                 stage="rl")
            if rl.overlap:
                prune_inflight(trainer.ckpt_dir, trainer.rank)
        maybe_kill_for_test(done)

    if rl.overlap:
        def train(step: int, batch: Batch) -> dict[str, float]:
            prompts, episodes = batch.data
            return trainer.learn(step, prompts, episodes, batch.seconds, push=False)

        resumed = 0 < trainer.start < rl.max_steps  # (at max_steps only the export is left)
        first = load_inflight(trainer.ckpt_dir, trainer.start, trainer.rank) if resumed else None
        # The engine holds W(start): the init model, or on a resumed run the weights pushed at its start.
        run_overlapped(trainer.start, rl.max_steps, trainer.start, first,
                       trainer.rollout_batch, train, trainer.push_overlapped, finish)
    else:
        for step in range(trainer.start, rl.max_steps):
            finish(step, trainer.train_step(step), None)
    bar.close()
    if job.steps_only:
        metrics.finish()
        return
    state = full_state_dict(trainer.policy, trainer.ckpt_dir, rl.zero_stage)
    if trainer.rank == 0:
        meta = {"stage": "rl", "row": rl.row, "resolved_config": job.config.model_dump(mode="json"),
                "init_model": str(job.init_model), "init_model_sha256": job.init_model_sha256,
                "data_sha256": job.data_sha256, "git_revision": job.git_revision, "steps": rl.max_steps,
                "mlflow_run_id": job.mlflow_run_id,
                "numerics": host_numerics(trainer.device)}  # rank 0's; the weights depend on these too
        export_hf_model(state, job.init_model, job.out_dir / "model", job.config.model.dtype, meta,
                        job.config.video)
    metrics.finish()


if __name__ == "__main__":
    raise SystemExit(main())
