"""`paravt rehearse` (paravt_core/rehearsal.py, #60): what it changes of a config, and what it checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from paravt_core.config import load_config
from paravt_core.device_ledger import Claim, LedgerError
from paravt_core.rehearsal import expected_roles, ledger_table, rehearsal_config, verify

REPO = Path(__file__).resolve().parents[2]
CONFIG_8B = REPO / "conf/pipeline/paravt_8b.yaml"
GB = 10**9


def test_the_8b_rehearsal_keeps_every_process_and_placement_and_shrinks_only_sizes():
    real, cfg, changes, sets = rehearsal_config(CONFIG_8B, [])
    changed = {c.key for c in changes}
    # Sizes, the model and the data source change; every count, placement and policy stays C's.
    assert {"model.base", "data.source", "sft.max_steps", "rl.max_steps", "video.nframes",
            "eval.max_samples_per_split"} <= changed
    assert cfg.model.base == "tiny" and cfg.data.source == "synth" and cfg.sft.max_steps == 4
    assert (cfg.sft.num_ranks, cfg.rl.num_ranks, cfg.rl.prompts_per_step) == (8, 7, 7)
    assert cfg.rl.rollout.engine == "vllm" and list(cfg.rl.rollout.vllm.gpus) == [7]
    assert cfg.rl.rollout.vllm.placement == "split" and cfg.rl.rollout.vllm.gpu_memory_utilization == 0.85
    assert (cfg.sft.keep_last, cfg.rl.keep_last, cfg.sft.zero_stage, cfg.rl.zero_stage) == (2, 2, 3, 3)
    assert cfg.sft.data_workers == 4 and cfg.sft.gradient_checkpointing and cfg.rl.gradient_checkpointing
    assert (cfg.data.on_bad_rows, cfg.data.max_quarantine_share) == ("quarantine", 0.01)
    assert cfg.eval.server == "auto" and cfg.eval.engine == "openai" and cfg.eval.endpoint is None
    assert cfg.model.dtype == "bfloat16" and cfg.model.vision_attention == "batched"
    assert cfg.sft.checkpoint_every == 1 < cfg.sft.max_steps - cfg.sft.keep_last + 1  # retention acts
    # The one count lowered (the evaluation's replicas), with why; the launch path stays.
    (lowered,) = [c for c in changes if c.key == "eval.gpus"]
    assert lowered.real == list(range(8)) and lowered.rehearsed == [0, 1] and "data-parallel" in lowered.why
    # The rest of the config is C's: everything but the changed keys dumps the same.
    def flat(model, prefix=""):
        out = {}
        for key, value in model.items():
            if isinstance(value, dict):
                out |= flat(value, f"{prefix}{key}.")
            else:
                out[f"{prefix}{key}"] = value
        return out
    before, after = flat(real.model_dump(mode="json")), flat(cfg.model_dump(mode="json"))
    differ = {k for k in before if before[k] != after[k]}
    assert differ <= changed | {"model.tiny"}, differ - changed


def test_a_users_override_applies_to_both_and_wins(tmp_path: Path):
    real, cfg, changes, sets = rehearsal_config(CONFIG_8B, ["rl.num_ranks=1", f"run.output_dir={tmp_path}"])
    assert real.rl.num_ranks == cfg.rl.num_ranks == 1 and cfg.run.output_dir == tmp_path
    assert "run.output_dir" not in {c.key for c in changes}  # not listed as changed: the user's value stands
    _, tiny, changes, _ = rehearsal_config(REPO / "conf/pipeline/tiny.yaml", [])
    assert "model.base" not in {c.key for c in changes} and tiny.model.base == "tiny"


def test_the_ledger_check_wants_a_claim_of_every_process_that_holds_a_card(tmp_path: Path):
    cfg = rehearsal_config(CONFIG_8B, [])[1]
    roles = expected_roles(cfg)
    assert roles.count("RL rollout server") == 1 and "SFT rank 7" in roles and "RL rank 6" in roles
    assert "RL rank 7" not in roles and "evaluation server" in roles
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text('{"event": "hold", "role": "SFT rank 0", "pid": 5, "gpu": 0, "planned_bytes": 1, "time": 1}\n')
    with pytest.raises(LedgerError, match="no claim of .*'SFT rank 1'"):
        verify(ledger, 80 * GB, flow_pid=1, expected_roles=roles)
    assert [c.role for c in verify(ledger, 80 * GB, flow_pid=1, expected_roles=("SFT rank",))] == ["SFT rank 0"]
    with pytest.raises(LedgerError, match="the flow process"):
        verify(ledger, 80 * GB, flow_pid=5)


def test_the_ledger_table_shows_the_most_held_at_once_per_card():
    claims = [Claim("SFT rank 0", 1, 0, 60 * GB, 0.0, 10.0), Claim("RL rank 0", 2, 0, 65 * GB, 20.0, 30.0),
              Claim("evaluation server (vllm)", 3, 0, 73 * GB, 40.0, 50.0), Claim("RL rollout server (vLLM)", 4, 7,
                                                                                    68 * GB, 20.0, 30.0)]
    table = ledger_table(claims, 80 * GB)
    assert "    0       73.0 GB  SFT rank 0 60.0, RL rank 0 65.0, evaluation server (vllm) 73.0" in table
    assert "    7       68.0 GB  RL rollout server (vLLM) 68.0" in table


def test_a_folder_that_is_not_a_rehearsals_is_not_emptied(tmp_path: Path):
    from flows.cli import _fresh_rehearsal_dir

    (tmp_path / "precious.txt").write_text("x")
    assert "is not a rehearsal's folder" in _fresh_rehearsal_dir(tmp_path)
    assert (tmp_path / "precious.txt").is_file()
    (tmp_path / "rehearsal.json").write_text("{}")
    world = tmp_path / "data" / "world-abc"
    world.mkdir(parents=True)
    (tmp_path / "data" / "downloads").mkdir()
    assert _fresh_rehearsal_dir(tmp_path) is None
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["data", "rehearsal.json", "world-abc"]
    # A link goes, never what it points to.
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    (elsewhere / "keep").mkdir(parents=True)
    (tmp_path / "data").rename(tmp_path / "data-moved")
    (tmp_path / "data").symlink_to(elsewhere, target_is_directory=True)
    assert _fresh_rehearsal_dir(tmp_path) is None
    assert (elsewhere / "keep").is_dir() and not (tmp_path / "data").exists()
    assert load_config(CONFIG_8B).run.output_dir.name == "paravt_8b"


def test_the_claims_are_planned_for_the_real_config_not_the_rehearsed_sizes(tmp_path: Path, monkeypatch):
    """4 frames and 32 new tokens would plan RL rank 0 at ~39 GB; the 8B run's sizes plan ~65 GB."""
    from paravt_core.plan import _planned_config, stage_bytes
    from paravt_core.rehearsal import ledger_environment

    real, cfg, _, _ = rehearsal_config(CONFIG_8B, [])
    env = ledger_environment(real, tmp_path / "device_ledger.jsonl", 80 * GB)
    assert load_config(CONFIG_8B).model_dump() == _planned_config(env["PARAVT_LEDGER_CONFIG"]).model_dump()
    base = env["PARAVT_LEDGER_MODEL"]
    rehearsed, planned = stage_bytes(cfg, "RL policy pass", base, 80 * GB), stage_bytes(real, "RL policy pass", base,
                                                                                        80 * GB)
    assert planned > rehearsed + 10 * GB
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert stage_bytes(cfg, "RL policy pass", base, 80 * GB) == planned
