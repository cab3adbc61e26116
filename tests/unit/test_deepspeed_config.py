"""The DeepSpeed JSON generated from `sft.deepspeed` / `rl.deepspeed`, and `paravt config show`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist
import yaml

from paravt_core.config import ConfigError, DeepSpeedConfig, load_config
from paravt_core.dist.ds_config import deepspeed_config, rl_deepspeed_config, sft_deepspeed_config
from paravt_core.dist.rank import shutdown_distributed

CONF = Path(__file__).resolve().parents[2] / "conf"
TINY = CONF / "pipeline" / "tiny.yaml"
PAPER = CONF / "pipeline" / "paravt_8b.yaml"


@pytest.fixture()
def deepspeed_parser(tmp_path: Path):
    """DeepSpeed's own config parser (it refuses unknown keys); it reads the world size from a process group."""
    from deepspeed.runtime.config import DeepSpeedConfig as Parsed

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "rendezvous"), 1), rank=0, world_size=1)
    yield Parsed
    shutdown_distributed()


def test_defaults_keep_the_plain_stage():
    assert deepspeed_config(micro_batch=1, grad_accum=1, zero_stage=0, grad_clip=1.0, bf16=False)[
        "zero_optimization"] == {"stage": 0}
    cfg = load_config(PAPER)
    generated = sft_deepspeed_config(cfg, on_gpu=True)
    assert generated["zero_optimization"]["stage"] == 3 and "offload_optimizer" not in generated["zero_optimization"]
    assert generated["bf16"] == {"enabled": True} and generated["gradient_accumulation_steps"] == 8
    assert "zero_force_ds_cpu_optimizer" not in generated
    # CPU ranks train in fp32 whatever the model dtype.
    assert sft_deepspeed_config(cfg, on_gpu=False)["bf16"] == {"enabled": False}


def test_offload_with_the_torch_optimizer_lifts_the_cpu_adam_rule(deepspeed_parser):
    cfg = load_config(PAPER, ["sft.deepspeed.offload_optimizer=cpu", "sft.deepspeed.cpu_optimizer=torch_adamw",
                              "sft.deepspeed.overlap_comm=false", "sft.deepspeed.reduce_bucket_size=20000000"])
    generated = sft_deepspeed_config(cfg, on_gpu=True)
    assert generated["zero_force_ds_cpu_optimizer"] is False
    parsed = deepspeed_parser(generated)
    assert parsed.zero_config.offload_optimizer.device == "cpu" and parsed.zero_config.offload_param is None
    assert parsed.zero_config.overlap_comm is False and parsed.zero_config.reduce_bucket_size == 20_000_000
    assert parsed.zero_force_ds_cpu_optimizer is False


def test_nvme_and_parameter_offload_reach_deepspeed(deepspeed_parser, tmp_path: Path):
    cfg = load_config(PAPER, ["rl.deepspeed.offload_optimizer=nvme", "rl.deepspeed.offload_param=cpu",
                              f"rl.deepspeed.nvme_path={tmp_path}"])
    generated = rl_deepspeed_config(cfg, on_gpu=True)
    assert generated["zero_force_ds_cpu_optimizer"] is True  # DeepSpeed's CPU Adam is the optimizer
    parsed = deepspeed_parser(generated)
    assert parsed.zero_config.offload_optimizer.device == "nvme"
    assert Path(parsed.zero_config.offload_optimizer.nvme_path) == tmp_path
    assert parsed.zero_config.offload_param.device == "cpu"
    assert sft_deepspeed_config(cfg, on_gpu=True)["zero_optimization"].get("offload_param") is None


def test_stage_two_config_parses(deepspeed_parser):
    cfg = load_config(PAPER, ["sft.zero_stage=2", "sft.deepspeed.offload_optimizer=cpu"])
    parsed = deepspeed_parser(sft_deepspeed_config(cfg, on_gpu=True))
    assert parsed.zero_optimization_stage == 2 and parsed.zero_config.offload_optimizer.device == "cpu"


@pytest.mark.parametrize("overrides, message", [
    (["sft.zero_stage=2", "sft.deepspeed.offload_param=cpu"], r"sft.deepspeed.offload_param=cpu needs sft.zero_stage: 3"),
    (["rl.zero_stage=0", "rl.deepspeed.offload_optimizer=cpu"], r"rl.deepspeed.offload_optimizer=cpu needs rl.zero_stage >= 1"),
    (["sft.deepspeed.offload_optimizer=nvme"], r"nvme offload needs sft.deepspeed.nvme_path"),
    (["sft.deepspeed.nvme_path=/nvme"], r"nothing offloads to nvme"),
    (["sft.deepspeed.offload_optimizer=gpu"], r"sft.deepspeed.offload_optimizer"),
    (["sft.deepspeed.bucket=1"], r"sft.deepspeed.bucket: Extra inputs are not permitted"),
])
def test_bad_offload_settings_fail_at_load(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(PAPER, overrides)


def test_the_section_is_shared_and_frozen():
    cfg = load_config(TINY)
    assert type(cfg.sft.deepspeed) is type(cfg.rl.deepspeed) is DeepSpeedConfig
    with pytest.raises(Exception):
        cfg.sft.deepspeed.offload_optimizer = "cpu"


def test_config_show_prints_the_resolved_config_and_deepspeed_json(capsys):
    from paravt_core.cli import main

    assert main(["config", "show", "--config", str(PAPER), "--accelerator", "cuda",
                 "--set", "sft.zero_stage=2", "--set", "sft.deepspeed.offload_optimizer=cpu"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["sft"]["zero_stage"] == 2 and shown["sft"]["deepspeed"]["offload_optimizer"] == "cpu"
    assert shown["rl"]["learning_rate"] == 2e-6  # defaults and file values alike are shown
    sft_ds = shown["generated"]["sft_deepspeed"]
    assert sft_ds["zero_optimization"]["stage"] == 2 and sft_ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert shown["generated"]["rl_deepspeed"]["zero_optimization"]["stage"] == 3


def test_config_show_names_a_bad_override(capsys):
    from paravt_core.cli import main

    assert main(["config", "show", "--config", str(TINY), "--set", "sft.deepspeed.offload_param=cpu"]) == 2
    assert "needs sft.zero_stage: 3" in capsys.readouterr().err
