"""The SFT model does not depend on how the reproduction schedules its first phases (#62).

`paravt reproduce` builds the world, then the base model (tiny model and perception
pretraining), then SFT (flows/reproduce.py). At 2922a80 the world and the base model ran side by
side on two threads of the flow process instead; the README's table came from that run. Here
both schedules run from nothing, each in an output folder of its own, and must give the same
weights: the base model's and the SFT model's (docs/log/miniature-builds.md, "Why a fresh
clone gave another SFT model"). What does change them, the host's cores and CPU, each model records
(`provenance.host_numerics` in its `paravt_meta.json`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _overrides(out: Path) -> list[str]:
    """conf/pipeline/reproduce.yaml shrunk to a few steps of each phase."""
    return [
        f"run.output_dir={out}", "data.synth.train_videos=4", "data.synth.eval_videos_per_split=1",
        "data.synth.eval_rows_per_split=2", "data.synth.sft_traces_per_video=2",
        "data.synth.subagent_traces_per_video=1", "data.synth.rl_prompts_per_video=2",
        "model.pretrain.videos=3", "model.pretrain.windows_per_video=2", "model.pretrain.max_steps=3",
        "model.pretrain.micro_batch_size=2", "model.pretrain.reading_rows=8", "model.pretrain.reading_steps=3",
        "model.pretrain.sft_replay_rows=4", "sft.max_steps=3", "sft.checkpoint_every=3",
    ]


def _weights(model) -> dict:
    """The model folder's weight files with their sha256 (`model.integrity`'s manifest): what the
    model computes, without the folder's paths and run ids (`paravt_meta.json`)."""
    from paravt_core.model.integrity import MANIFEST

    return json.loads((Path(model.path) / MANIFEST).read_text())["weights"]


def _meta(model) -> dict:
    return json.loads((Path(model.path) / "paravt_meta.json").read_text())


def test_the_world_and_the_base_model_side_by_side_give_the_default_s_sft_model(prefect_harness, tmp_path: Path):
    from prefect import flow

    from flows.data import data_stage
    from flows.fanout import fan_out
    from paravt_core.config import FanoutConfig, load_config
    from paravt_core.miniature.pretrain import sft_replay
    from tasks.miniature import pretrain
    from tasks.model import base_stage
    from tasks.sft import sft

    @flow(name="phase-schedule")
    def phases(out: Path, side_by_side: bool):
        cfg = load_config(REPO / "conf/pipeline/reproduce.yaml", _overrides(out))
        if side_by_side:  # as 2922a80's flow ran them
            (_, data), (_, base) = fan_out([("data", lambda: ("data", data_stage(cfg))),
                                            ("base model", lambda: ("base", base_stage(cfg, pretrain)))],
                                           FanoutConfig(max_concurrent=2))
        else:  # as flows/reproduce.py runs them
            data = data_stage(cfg)
            base = base_stage(cfg, pretrain)
        return data, base, sft(cfg, base, data.sft, extra=sft_replay(cfg))

    _, base_one, sft_one = phases(tmp_path / "one-after-the-other", side_by_side=False)
    _, base_two, sft_two = phases(tmp_path / "side-by-side", side_by_side=True)
    assert Path(sft_two.path).is_relative_to(tmp_path / "side-by-side")  # from nothing, not the first's cache
    # The data folders hold their own absolute video paths, so their hashes differ; the
    # world's manifest does not.
    world_one, world_two = (next((Path(out) / "data").glob("world-*")) for out in
                            (tmp_path / "one-after-the-other", tmp_path / "side-by-side"))
    assert world_one.name == world_two.name
    assert (world_one / "manifest.json").read_bytes() == (world_two / "manifest.json").read_bytes()
    assert _weights(base_one) == _weights(base_two)
    assert _weights(sft_one) == _weights(sft_two)
    # What else the weights depend on is recorded with them: the same here, since one host
    # trained both; each rank's threads are its share of the host's cores (dist.launch._launch).
    import torch

    from paravt_core.provenance import accelerator_model, cpu_model, training_device

    cfg = load_config(REPO / "conf/pipeline/reproduce.yaml", _overrides(tmp_path))
    for model, ranks in ((base_one, cfg.model.pretrain.num_ranks), (sft_one, cfg.sft.num_ranks)):
        numerics = _meta(model)["numerics"]
        threads = int(os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 1) // ranks))
        assert numerics == {"torch_threads": threads, "host_cpus": os.cpu_count(), "torch": torch.__version__,
                            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu": cpu_model(),
                            # and the card, where the ranks train on one
                            **({"accelerator": accelerator_model(device)} if (device := training_device()) != "cpu"
                               else {})}
    assert _meta(base_two)["numerics"] == _meta(base_one)["numerics"]
    assert _meta(sft_two)["numerics"] == _meta(sft_one)["numerics"]
