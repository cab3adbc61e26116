"""One rank of the PARA-GRPO trainer (SPEC §5); started by the DeepSpeed launcher.

Each step: pick this rank's prompts, draw each prompt's frame budget K (nFrames gating),
roll out G episodes per prompt with the agentic protocol (SPEC §3) on the rollout engine,
score them (SPEC §4), score the reference, turn rewards into group advantages, and take
one PPO-clip step over the episodes and (with `train_subagents`) their sub-agent runs.
The rollout engine is then given the new weights.

Departures from the release (SPEC §5): sub-agent trajectories are trained (each with its
episode's advantage); K really sets the overview frame count; token-level anchoring is
available; rewards score the whole transcript by default (SPEC §4.5).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from paravt_core.dist import StepLog
from paravt_core.rl.job import RLJob


def step_prompts(prompts: list, step: int, per_step: int, rank: int, world: int, seed: int) -> tuple[list, int]:
    """This rank's prompts for `step` (a pure function of step: resumable) and the epoch."""
    from paravt_core.sft.worker import sample_index

    orders: dict[int, np.ndarray] = {}
    if per_step % world:
        raise ValueError(f"rl.prompts_per_step ({per_step}) is not a multiple of the {world} ranks")
    per_rank = per_step // world
    first = step * per_rank * world + rank * per_rank
    picked = [prompts[sample_index(first + k, len(prompts), seed, orders)] for k in range(per_rank)]
    return picked, first // len(prompts)


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

        from paravt_core import dist as pdist
        from paravt_core.agent.hf_engine import HFEngine
        from paravt_core.model.loading import load_model, load_processor
        from paravt_core.rl.data import read_rl_prompts
        from paravt_core.rl.policy import STRUCTURAL_TOKENS, paravt_reward

        self.job, self.cfg, self.rl = job, job.config, job.config.rl
        self.rank, self.world, self.device = pdist.init_distributed()
        torch.manual_seed(self.cfg.run.seed)
        self.processor = load_processor(job.init_model)
        policy = load_model(job.init_model, dtype="float32")
        policy.train()
        self.rollout_model = load_model(job.init_model, dtype=self.cfg.model.dtype, device=self.device).eval()
        self.engine = HFEngine(self.rollout_model, self.processor)
        self.ref_model = None
        if self.rl.kl_mode != "none":
            self.ref_model = load_model(job.init_model, dtype=self.cfg.model.dtype, device=self.device).eval()
        self.prompts = read_rl_prompts(job.data_files)
        self.undecodable: set[str] = set()  # videos whose prompts are dropped (`rollout_dropping_undecodable`)
        self.reward_fn = reward_fn or paravt_reward(self.rl)
        tok = self.processor.tokenizer
        self.ids = {"pad": tok.pad_token_id, "image": policy.config.image_token_id, "video": policy.config.video_token_id}
        self.structural_ids = torch.tensor([tok.convert_tokens_to_ids(t) for t in STRUCTURAL_TOKENS])
        optimizer = torch.optim.AdamW(policy.parameters(), lr=self.rl.learning_rate, weight_decay=self.rl.weight_decay)
        bf16 = self.device.startswith("cuda") and self.cfg.model.dtype == "bfloat16"
        ds_config = pdist.deepspeed_config(micro_batch=1, grad_accum=1, zero_stage=self.rl.zero_stage,
                                           grad_clip=self.rl.grad_clip, bf16=bf16)
        self.policy, _, _, _ = deepspeed.initialize(model=policy, optimizer=optimizer, config=ds_config)
        self.ckpt_dir = job.out_dir / "checkpoints"
        self.start = int(pdist.resume(self.policy, self.ckpt_dir).get("step", 0))
        if self.start:
            self.push_weights()

    def push_weights(self) -> None:
        from paravt_core import dist as pdist

        state = pdist.gathered_state_dict(self.policy, self.rl.zero_stage)
        self.engine.update_weights(state)
        self.policy.module.train()

    def rollout(self, step: int):
        from paravt_core.agent.rollout import run_episodes
        from paravt_core.rl.data import rollout_dropping_undecodable
        from paravt_core.rl.grpo import frame_budget

        picked, epoch = step_prompts(self.prompts, step, self.rl.prompts_per_step, self.rank, self.world,
                                     self.cfg.run.seed)
        gating = self.rl.gating
        prompts = []
        for p in picked:
            k = frame_budget(self.cfg.run.seed, p.prompt.prompt_id, epoch, gating.choices) if gating.enabled else None
            prompts.append(dataclasses.replace(p, prompt=dataclasses.replace(p.prompt, nframes=k)))
        def run(batch: list) -> list:
            return run_episodes(self.engine, self.processor, [p.prompt for p in batch], self.rl.rollout,
                                self.cfg.video, group_size=self.rl.group_size, temperature=self.rl.temperature,
                                seed=self.cfg.run.seed * 100_003 + step * 997 + self.rank)

        return rollout_dropping_undecodable(prompts, run, self.undecodable)

    def train_step(self, step: int) -> dict[str, float]:
        from paravt_core.rl.policy import episode_kl, micro_batch_loss, reference_pass, step_advantages, trajectories

        t0 = time.perf_counter()
        prompts, episodes = self.rollout(step)
        t1 = time.perf_counter()
        trajs = trajectories(episodes, self.rl.train_subagents)
        micro = max(1, self.rl.micro_batch_size)
        if self.ref_model is not None:
            reference_pass(self.ref_model, trajs, micro, self.ids, self.rl.temperature, self.device)
        kl = episode_kl(episodes, trajs) if self.ref_model is not None else torch.zeros(len(episodes))
        t2 = time.perf_counter()
        adv = step_advantages(episodes, prompts, self.rl, self.reward_fn, kl)
        total = float(sum(t.loss_mask.sum() for t in trajs)) or 1.0
        loss_sum, clip_sum = 0.0, 0.0
        chunks = [trajs[i : i + micro] for i in range(0, len(trajs), micro)]
        for i, chunk in enumerate(chunks):
            self.policy.set_gradient_accumulation_boundary(i == len(chunks) - 1)
            loss, stats = micro_batch_loss(self.policy, chunk, adv, self.rl, self.ids, self.structural_ids, total,
                                           self.device)
            self.policy.backward(loss)
            loss_sum += loss.item()
            clip_sum += stats["clip_frac"]
        self.policy.step()
        self.push_weights()
        t3 = time.perf_counter()
        return self.metrics(episodes, adv, loss_sum, clip_sum / total, (t1 - t0, t2 - t1, t3 - t2))

    def metrics(self, episodes, adv, loss: float, clip_frac: float, times) -> dict[str, float]:
        """SPEC §5 per-step metrics of this rank (averaged over ranks by the caller)."""
        r = adv.rewards
        gen_len = [float(e.loss_mask.sum()) for e in episodes]
        row = {
            "f_tau": float(np.mean([x.format for x in r])),
            "kappa": float(np.mean([e.tool_calls for e in episodes])),
            "reward_acc": float(np.mean([x.acc for x in r])),
            "reward_tool": float(np.mean([x.tool for x in r])),
            "reward_format": float(np.mean([x.format for x in r])),
            "reward": float(np.mean([x.total for x in r])),
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


def _all_reduce_mean(row: dict[str, float], world: int) -> dict[str, float]:
    import torch.distributed as dist

    gathered: list[dict[str, float]] = [{} for _ in range(world)]
    dist.all_gather_object(gathered, row)
    keys = sorted({k for g in gathered for k in g})
    return {k: float(np.mean([g.get(k, 0.0) for g in gathered])) for k in keys}


def train(job: RLJob, reward_fn=None) -> None:
    import torch.distributed as dist
    from tqdm import tqdm

    from paravt_core import dist as pdist
    from paravt_core.tracking import MetricLogger

    trainer = Trainer(job, reward_fn)
    rl = job.config.rl
    metrics = MetricLogger(job.tracking_uri, job.mlflow_run_id, enabled=trainer.rank == 0)
    bar = tqdm(range(trainer.start, rl.max_steps), initial=trainer.start, total=rl.max_steps, desc="rl",
               disable=trainer.rank != 0 or not sys.stdout.isatty())
    progress = StepLog("rl", rl.max_steps, trainer.start, enabled=trainer.rank == 0 and not sys.stdout.isatty(),
                       every=1)
    for step in bar:
        row = _all_reduce_mean(trainer.train_step(step), trainer.world)
        if trainer.rank == 0:
            with open(job.out_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": step + 1, **row}) + "\n")
            metrics.log(step + 1, row)
            bar.set_postfix(R=f"{row['reward']:.3f}", f=f"{row['f_tau']:.2f}", k=f"{row['kappa']:.2f}")
            progress.step(step + 1, reward=row["reward"], f_tau=row["f_tau"], kappa=row["kappa"],
                          rollout_s=row["time_rollout_s"])
        done = step + 1
        if done % rl.checkpoint_every == 0 or done == rl.max_steps:
            pdist.save(trainer.policy, trainer.ckpt_dir, done, {"step": done})
        pdist.maybe_kill_for_test(done)
    state = pdist.full_state_dict(trainer.policy, trainer.ckpt_dir, rl.zero_stage)
    if trainer.rank == 0:
        meta = {"stage": "rl", "row": rl.row, "resolved_config": job.config.model_dump(mode="json"),
                "init_model": str(job.init_model), "init_model_sha256": job.init_model_sha256,
                "data_sha256": job.data_sha256, "git_revision": job.git_revision, "steps": rl.max_steps,
                "mlflow_run_id": job.mlflow_run_id}
        pdist.export_hf_model(state, job.init_model, job.out_dir / "model", job.config.model.dtype, meta)
    metrics.finish()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    raise SystemExit(main())
