"""One rank of the multi-rank RL tests (tests/integration/test_rl_multirank.py), started by
the DeepSpeed launcher. Generation is scripted per rank; everything else is the real thing.

Modes:
- `uneven`: the real RL trainer (`rl.worker.train`) on the tiny model, its rollout engine
  replaced by a scripted one: rank 0's episodes call three crops (four trajectories each
  with their sub-agents), rank 1's answer at once (one). Each rank writes what it held and
  a digest of every set of weights pushed to its rollout engine.
- `grad`: one micro-batch loss and backward through a DeepSpeed engine (ZeRO stage 0, so
  every rank holds the whole averaged gradient); rank r trains the trajectories of spec
  `episodes[r]`; rank 0 saves the gradients.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

SUMMARY_REQUEST = "concise, factual summary"
CALL = '<tool_call>{{"name": "crop_video", "arguments": {{"video_path": "v.mp4", "start_time": {s}, "end_time": {e}}}}}</tool_call>'
THREE_CALLS = "look closer</think>" + "".join(CALL.format(s=s, e=s + 3) for s in (0, 4, 8)) + "<|im_end|>"
ANSWER = "the square is red</think><answer>A</answer><|im_end|>"
SUMMARY = "A red square moves.<|im_end|>"


class ScriptedEngine:
    """Answers main-agent turns by the rank's script and sub-agent requests with a summary."""

    def __init__(self, tokenizer, calls_crops: bool):
        self.tok, self.calls_crops = tokenizer, calls_crops
        self.pushed: list[str] = []
        self.subagent_requests = 0

    def generate(self, requests, params):
        from paravt_core.agent.engine import Generation

        out = []
        for request in requests:
            context = self.tok.decode(request.prompt_ids[-120:])
            if SUMMARY_REQUEST in context:
                self.subagent_requests += 1
                text = SUMMARY
            elif self.calls_crops and "<tool_response>" not in self.tok.decode(request.prompt_ids):
                text = THREE_CALLS
            else:
                text = ANSWER
            ids = self.tok(text, add_special_tokens=False)["input_ids"]
            out.append(Generation(list(ids), [-0.5] * len(ids), "stop"))
        return out

    def update_weights(self, state_dict) -> None:
        h = hashlib.sha256()
        for name in sorted(state_dict):
            h.update(name.encode())
            h.update(state_dict[name].detach().float().contiguous().cpu().numpy().tobytes())
        self.pushed.append(h.hexdigest())


def rank_trajectories(spec: dict, rank: int | None):
    """(model, trajectories, RL config, ids, trained tokens of ALL ranks) of `rank`'s share of
    the scripted episodes of spec["episodes"] (one per rank: "crops" or "answer"); None: all."""
    from paravt_core.agent.prompts import question_prompt
    from paravt_core.agent.rollout import run_episodes
    from paravt_core.config import RLConfig, RolloutConfig, VideoConfig
    from paravt_core.model.loading import load_model, load_processor
    from paravt_core.rl.policy import StepAdvantages, assign_token_advantages, trajectories

    torch.manual_seed(0)
    processor = load_processor(Path(spec["model"]))
    model = load_model(Path(spec["model"]))
    video_cfg = VideoConfig(nframes=2, min_pixels=784, max_pixels=3072, crop_max_frames=2)
    prompt = question_prompt("p0", spec["video"], "What colour is the square?\nA. red\nB. blue")
    shares = []
    for i, kind in enumerate(spec["episodes"]):
        engine = ScriptedEngine(processor.tokenizer, calls_crops=kind == "crops")
        (episode,) = run_episodes(engine, processor, [prompt], RolloutConfig(max_turns=1), video_cfg)
        trajs = trajectories([episode], train_subagents=True)
        assign_token_advantages(trajs, StepAdvantages(torch.tensor([spec["advantages"][i]]), None, [], torch.zeros(1)),
                                RLConfig(kl_mode="none"))
        shares.append(trajs)
    total = float(sum(t.loss_mask.sum() for share in shares for t in share))
    cfg = RLConfig(kl_mode="none", decoupled_ppo=False, temperature=1.0)
    ids = {"pad": processor.tokenizer.pad_token_id, "image": model.config.image_token_id,
           "video": model.config.video_token_id}
    mine = [t for share in shares for t in share] if rank is None else shares[rank]
    return model, mine, cfg, ids, total


def run_uneven(job_file: Path, out: Path) -> None:
    import torch.distributed as dist

    from paravt_core.rl import rollout_engine, worker
    from paravt_core.rl.job import RLJob
    from paravt_core.rl.worker import train

    engines: list[ScriptedEngine] = []

    def scripted_backend(cfg, init_model, processor, device, rank, world, staging_dir, init_sha256):
        engine = ScriptedEngine(processor.tokenizer, calls_crops=rank == 0)
        engines.append(engine)
        return rollout_engine.RolloutBackend(engine, pushes_weights=True, world=world)

    worker.build_rollout_engine = scripted_backend  # where the trainer looks the name up
    rank = int(__import__("os").environ["RANK"])
    original_barrier = dist.barrier

    def report_then_barrier(*args, **kwargs):
        # train() ends with a barrier before the process group goes: write this rank's record first.
        if engines:
            (out / f"rank{rank}.json").write_text(json.dumps(
                {"pushed": engines[0].pushed, "subagent_requests": engines[0].subagent_requests}))
        return original_barrier(*args, **kwargs)

    dist.barrier = report_then_barrier
    train(RLJob.model_validate_json(job_file.read_text()))


def run_grad(spec_file: Path, out: Path) -> None:
    import deepspeed

    from paravt_core.dist.ds_config import deepspeed_config
    from paravt_core.dist.rank import init_distributed, shutdown_distributed

    spec = json.loads(spec_file.read_text())
    rank, world, device = init_distributed()
    model, trajs, cfg, ids, total = rank_trajectories(spec, rank)
    config = deepspeed_config(micro_batch=1, grad_accum=1, zero_stage=0, grad_clip=1e9, bf16=False)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
                                           config=config)
    from paravt_core.rl.policy import micro_batch_loss

    engine.set_gradient_accumulation_boundary(True)
    loss, _ = micro_batch_loss(engine, trajs, cfg, ids, total, device, world=world)
    engine.backward(loss)
    if rank == 0:
        torch.save({n: p.grad.detach().clone() for n, p in engine.module.named_parameters() if p.grad is not None},
                   out / "grads.pt")
    shutdown_distributed()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("uneven", "grad"), required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()
    (run_uneven if args.mode == "uneven" else run_grad)(Path(args.input), Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
