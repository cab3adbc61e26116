"""RL rows fanned out (issue #45 item 5): two rows at once on one thread each against the same
two rows one after the other on two threads each, on this machine.

Both modes run the first two RL rows of the miniature reproduction (`reproduce.rows` of
conf/pipeline/reproduce.yaml: vanilla_grpo and paragrpo) through `flows.fanout.fan_out`,
the code the reproduce and ablations flows use, on the tiny model from the same base model
and the same generated RL prompts, each row trained from scratch in each mode (nothing cached). A row
is `paravt_core.rl.stage.run`: the DeepSpeed launch, its start-up, the steps and the export.
Wall times exclude the shared preparation (the generated world, the base model). The
modes run back to back, concurrent first, so a machine loaded by others loads both.
Also printed: each row's weights hash per mode (equal only where the thread count leaves
the float reductions alone).

Run: .venv/bin/python bench/fanout.py [--steps 3] [--out /tmp/fanout-bench]
(a Prefect API is used as for any flow: PREFECT_API_URL, else a temporary local server)
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def row_configs(out: Path, steps: int):
    from paravt_core.config import load_config

    overrides = [
        f"run.output_dir={out}", "data.synth.train_videos=4", "data.synth.eval_videos_per_split=1",
        "data.synth.eval_rows_per_split=1", "data.synth.rl_prompts_per_video=2",
        f"rl.max_steps={steps}", f"rl.checkpoint_every={steps}", "rl.prompts_per_step=1", "rl.group_size=2",
        "rl.rollout.max_new_tokens=16", "rl.rollout.subagent_max_new_tokens=8",
    ]
    config = REPO / "conf/pipeline/reproduce.yaml"
    rows = load_config(config, overrides).reproduce.rows[:2]
    return {row: load_config(config, overrides, REPO / "conf/rl" / f"{row}.yaml") for row in rows}


def weights_hash(model_dir: Path) -> str:
    """sha256[:16] over the exported weight files (paravt_meta.json also holds the run's config,
    fan-out settings included, and its MLflow run id)."""
    import hashlib

    from paravt_core.refs import file_hash

    files = sorted(Path(model_dir).glob("*.safetensors"))
    return hashlib.sha256("".join(file_hash(f) for f in files).encode()).hexdigest()[:16]


def run_mode(configs: dict, base, rl_data, max_concurrent: int, threads: int) -> tuple[float, dict[str, str]]:
    """(wall seconds, {row: weights sha256}) of the rows under one fan-out setting, each
    trained from scratch (its run folder is removed first: a finished one returns at once)."""
    import shutil

    from prefect import flow

    from flows.fanout import fan_out
    from paravt_core.config import FanoutConfig
    from paravt_core.rl import stage as rl_stage

    fanout = FanoutConfig(max_concurrent=max_concurrent, threads_per_run=threads)
    rows = {row: cfg.model_copy(update={"run": cfg.run.model_copy(update={"fanout": fanout})})
            for row, cfg in configs.items()}
    for cfg in rows.values():
        shutil.rmtree(rl_stage.run_dir(cfg, base, rl_data), ignore_errors=True)

    @flow(name="bench-fanout")
    def rows_flow() -> tuple[float, dict[str, str]]:
        started = time.perf_counter()
        models = fan_out([(row, functools.partial(rl_stage.run, cfg, base, rl_data, log_line=lambda line: None))
                          for row, cfg in rows.items()], fanout)
        return time.perf_counter() - started, {row: weights_hash(m.path) for row, m in zip(rows, models, strict=True)}

    return rows_flow()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="RL steps per row")
    parser.add_argument("--out", type=Path, default=None, help="working folder (default: a temporary one)")
    args = parser.parse_args()

    from paravt_core.data import stage as data_stage
    from paravt_core.model import stage as model_stage

    out = args.out or Path(tempfile.mkdtemp(prefix="paravt-fanout-bench-"))
    configs = row_configs(out, args.steps)
    first = next(iter(configs.values()))
    base = model_stage.run(first)
    data = data_stage.run(first, progress=False)

    together, together_models = run_mode(configs, base, data.rl, max_concurrent=2, threads=1)
    alone, alone_models = run_mode(configs, base, data.rl, max_concurrent=1, threads=2)
    print(f"rows {list(configs)}, {args.steps} RL steps each, on {first.rl.num_ranks} rank(s) per row")
    print(f"two rows at once, 1 thread each:        {together:7.1f} s  weights {together_models}")
    print(f"one row after the other, 2 threads each: {alone:7.1f} s  weights {alone_models}")
    print(f"wall time ratio (at once / one after the other): {together / alone:.2f}")


if __name__ == "__main__":
    main()
