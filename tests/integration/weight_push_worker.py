"""One rank of tests/integration/test_weight_push.py, started by the DeepSpeed launcher: the
trainer's weight push (`Trainer.push_weights`) to a rollout server from a ZeRO-3 policy on two
CPU ranks, with rank 0 pushing as it does for a server. The engine writes the snapshot a server
would load; each rank reports how much its peak host memory grew during the push."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from types import SimpleNamespace

import torch


def _status_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))


class SnapshotEngine:
    """A rollout server's side of the push: the snapshot it would load, written as the real
    engines write it."""

    def __init__(self, staging: Path, model_dir: Path):
        self.staging, self.model_dir, self.snapshots = staging, model_dir, []

    def update_weights(self, weights, version: int) -> None:
        from paravt_core.agent.weight_snapshots import write_weight_snapshot

        self.snapshots.append(write_weight_snapshot(self.staging, len(self.snapshots) + 1, self.model_dir, weights))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()
    import deepspeed

    from paravt_core.dist.ds_config import deepspeed_config
    from paravt_core.dist.rank import init_distributed, shutdown_distributed
    from paravt_core.dist.weights import gathered_state_dict
    from paravt_core.model.loading import load_model
    from paravt_core.rl.rollout_engine import RolloutBackend
    from paravt_core.rl.worker import Trainer

    out, model_dir = Path(args.out), Path(args.model)
    rank, world, _ = init_distributed()
    config = deepspeed_config(micro_batch=1, grad_accum=1, zero_stage=3, grad_clip=1.0, bf16=False)
    config["zero_optimization"]["stage3_param_persistence_threshold"] = 0  # every parameter partitioned, as at 8B
    model = load_model(model_dir, zero3_config=config)
    policy, _, _, _ = deepspeed.initialize(model=model, config=config)  # no optimizer: the push only gathers
    engine = SnapshotEngine(out / "snapshots", model_dir)
    backend = RolloutBackend(engine, pushes_weights=rank == 0, served=True, world=world)
    trainer = SimpleNamespace(policy=policy, rl=SimpleNamespace(zero_stage=3), rollout_backend=backend)
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM restarts from the current RSS
    Trainer.push_weights(trainer, 1)
    growth = (_status_kib("VmHWM") - before) * 1024
    full = gathered_state_dict(policy, 3)  # the weights as the trainer holds them, for the check
    sizes = [t.numel() * t.element_size() for t in full.values()]
    report = {"rank": rank, "growth_bytes": growth, "model_bytes": sum(sizes), "largest_bytes": max(sizes),
              "snapshots": [str(p) for p in engine.snapshots]}
    if rank == 0:
        from safetensors.torch import load_file

        pushed = load_file(str(engine.snapshots[0] / "model.safetensors"))
        # The state dict's names, what a checkpoint and a server load (no non-persistent buffer),
        # and the same as the hf engine's gathered copy.
        report["same_names"] = sorted(pushed) == sorted(policy.module.state_dict()) == sorted(full)
        report["different"] = sorted(n for n in full if n in pushed and not (
            pushed[n].dtype == full[n].dtype and torch.equal(pushed[n], full[n])))
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    shutdown_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
