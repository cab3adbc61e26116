"""Bytes per second of the rollout server's weight push, before and after issue #44 item 8.

A tiny Qwen3-VL widened to a few hundred MB (`--hidden`, `--layers`; float32) is partitioned
under ZeRO-3 on one CPU rank (gloo, every parameter partitioned as at 8B), and rank 0's side
of the push is timed from the gathers to a complete snapshot folder a server could load:
  before  `dist.weights.gathered_state_dict` (each parameter gathered and cloned to host memory), then
          the snapshot writer of before: every tensor cast and cloned again, then safetensors'
          `save_file`, into the run folder;
  after   `rl.weight_push.GatheredWeights` into `weight_snapshots.write_weight_snapshot`: each tensor is
          written to the file while it is gathered, to /dev/shm (where a launched server's
          snapshot now goes when it fits) and, for comparison, to the run folder.
Peak = how far this process's peak resident set (VmHWM, reset before each run) rose above the
resident set at the start of the run: what the push holds on the host at once.

Each variant runs --repeats times, alternating, on the same machine in one invocation; the
table gives the median. The disk runs write to the page cache (no fsync, as the server reads
the file at once on the same machine); on a loaded machine the rates are lower bounds.

At 8B (Qwen3-VL-8B, 17.5 GB in bf16) the seconds per step are estimated as 17.5 GB over the
measured rate. That is rank 0's host side only: on GPUs each parameter's NCCL all-gather and
its device-to-host copy come before it, and the server's reload after it (neither measured here).

Run: `.venv/bin/python bench/weight_push.py [--hidden 1024 --layers 8 --repeats 3]` (~1 minute).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

QWEN3_VL_8B_BYTES = 17.5e9  # bf16 weights of Qwen3-VL-8B (issue #44)


def _status_bytes(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def _timed(run) -> tuple[float, int]:
    """(seconds, peak host bytes above the start) of `run()`."""
    start = _status_bytes("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM restarts from the resident set now
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0, _status_bytes("VmHWM") - start


def old_push(engine, folder: Path, model_dir: Path) -> None:
    """The push as it was: the whole state gathered to host, then copied and serialized."""
    from safetensors.torch import save_file

    from paravt_core.agent.weight_snapshots import CONFIG_FILES
    from paravt_core.dist.weights import gathered_state_dict

    state = gathered_state_dict(engine, 3)
    partial = folder.with_name(folder.name + ".partial")
    partial.mkdir(parents=True)
    for name in CONFIG_FILES:
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, partial / name)
    tensors = {name: value.detach().to("cpu", value.dtype).clone().contiguous() for name, value in state.items()}
    save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt"})
    partial.rename(folder)


def new_push(engine, root: Path, model_dir: Path) -> None:
    from paravt_core.agent.weight_snapshots import write_weight_snapshot
    from paravt_core.rl.weight_push import GatheredWeights

    write_weight_snapshot(root, 1, model_dir, GatheredWeights(engine, 3, keep=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="paravt-weight-push-"))
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "GLOO_SOCKET_IFNAME": "lo"})
    from paravt_core.agent.weight_snapshots import SHM_DIR
    from paravt_core.dist.ds_config import deepspeed_config
    from paravt_core.dist.launch import RENDEZVOUS_FILE_ENV, free_port
    from paravt_core.dist.rank import init_distributed, shutdown_distributed
    from paravt_core.rl.weight_push import GatheredWeights, shm_free_bytes, shm_margin, shm_staging_dir

    os.environ.update({"MASTER_PORT": str(free_port()), RENDEZVOUS_FILE_ENV: str(work / "store")})
    shm_root = shm_staging_dir(work / "rollout_weights")
    try:
        import deepspeed

        from paravt_core.model.loading import load_model
        from paravt_core.model.tiny import TinyModelSpec, build_tiny_model

        spec = TinyModelSpec(hidden_size=args.hidden, intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
                             head_dim=32)
        model_dir = build_tiny_model(spec, work / "model")
        init_distributed()
        config = deepspeed_config(micro_batch=1, grad_accum=1, zero_stage=3, grad_clip=1.0, bf16=False)
        config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
        model = load_model(model_dir, zero3_config=config)
        engine, _, _, _ = deepspeed.initialize(model=model, config=config)
        nbytes = sum(s.nbytes() for s in GatheredWeights(engine, 3, keep=False).specs)
        shm_ok = shm_free_bytes(SHM_DIR) >= nbytes + shm_margin(nbytes)
        variants = {
            "before: gather all, copy, save_file -> run folder": lambda: old_push(engine, work / "old" / "v1", model_dir),
            "after: streamed -> run folder": lambda: new_push(engine, work / "new", model_dir)}
        if shm_ok:
            variants["after: streamed -> /dev/shm"] = lambda: new_push(engine, shm_root, model_dir)
        runs: dict[str, list[tuple[float, int]]] = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, run in variants.items():
                runs[name].append(_timed(run))
                for folder in (work / "old", work / "new", shm_root):
                    shutil.rmtree(folder, ignore_errors=True)
        print(f"weight push, rank 0's host side, {nbytes / 1e6:.0f} MB of float32 weights "
              f"({len(GatheredWeights(engine, 3, keep=False).specs)} tensors), one CPU rank under ZeRO-3, "
              f"median of {args.repeats}, {os.cpu_count()} CPUs" + ("" if shm_ok else "; /dev/shm too small, skipped"))
        print(f"{'path':<52} {'MB':>6} {'s':>7} {'GB/s':>6} {'peak MB':>8} {'x before':>8} {'8B s/step':>9}")
        base = statistics.median(s for s, _ in runs[next(iter(variants))])
        for name, results in runs.items():
            seconds = statistics.median(s for s, _ in results)
            peak = statistics.median(p for _, p in results)
            rate = nbytes / seconds
            print(f"{name:<52} {nbytes / 1e6:>6.0f} {seconds:>7.3f} {rate / 1e9:>6.2f} {peak / 1e6:>8.0f} "
                  f"{base / seconds:>8.2f} {QWEN3_VL_8B_BYTES / rate:>9.1f}")
        print("8B s/step: 17.5 GB (Qwen3-VL-8B, bf16) at the measured rate; GPU gathers, device-to-host copies "
              "and the server's reload come on top")
    finally:
        shutil.rmtree(shm_root, ignore_errors=True)
        shutdown_distributed()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
