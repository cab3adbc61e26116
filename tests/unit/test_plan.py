"""The memory plan (`paravt_core/plan.py`, `paravt plan`): calibrated on the 2B shape's measured
peaks, refusing the 8B config's former RL values and passing the shipped ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paravt_core.cli import main
from paravt_core.config import load_config
from paravt_core.plan import (
    GB,
    GIB,
    QWEN3_VL_2B,
    QWEN3_VL_8B,
    PlanError,
    _activations,
    _model_states,
    gpus_needed,
    memory_plan,
    model_shape,
)

REPO = Path(__file__).resolve().parents[2]
CONFIG_8B = str(REPO / "conf/pipeline/paravt_8b.yaml")
H100 = 79 * GIB  # an H100 80 GB as torch reports it, rounded down
FORMER_RL = ["rl.gradient_checkpointing=false", "rl.micro_batch_size=4"]  # paravt_8b.yaml before #44


def _plan(overrides: list[str] = (), gpus: int = 8, gpu_bytes: int = H100, config: str = CONFIG_8B, shape=QWEN3_VL_8B):
    return memory_plan(load_config(config, list(overrides)), shape, gpus, gpu_bytes)


def _stage(plan, name: str):
    (stage,) = [s for s in plan.stages if s.stage == name]
    return stage


def test_parameter_counts_are_those_of_the_models_built_on_the_gpu():
    # ../shared/GPU.md: 2.13 B at the 2B shape, about 8.8 B (Qwen3-VL-8B: 8.77 B) at 8B.
    assert round(QWEN3_VL_2B.params / 1e9, 2) == 2.13
    assert round(QWEN3_VL_8B.params / 1e9, 2) == 8.77


# (what ran on one H100 at the 2B shape, measured peak GiB from docs/gpu_check.md, the plan's figure)
def _stock_forward_backward() -> int:
    # transformers' forward+backward of the 5,150-token, 64-frame sample (180 patches a frame),
    # no checkpointing, no optimizer: bf16 weights, activations, the model's own logits loss.
    shape = QWEN3_VL_2B
    return 2 * shape.params + _activations(shape, 1, 5150, 64 * 180, False, "sdpa") + 12 * 5150 * shape.vocab


def _sft_zero2_one_gpu() -> int:
    overrides = ["sft.num_ranks=1", "sft.zero_stage=2", "sft.max_seq_len=5150", "video.max_pixels=46080",
                 "sft.micro_batch_size=1", "sft.gradient_checkpointing=true", "sft.loss_impl=logits"]
    return _stage(_plan(overrides, gpus=1, shape=QWEN3_VL_2B), "SFT").total


def _rl_zero3_one_gpu() -> int:
    # bench/rl_gpu.py: 2 prompts x 4, 128 new tokens, 16 frames, hf engine, ZeRO-3 policy and
    # reference, checkpointing; the random model never called a tool (max_turns 0 bounds it).
    overrides = ["model.dtype=bfloat16", "rl.prompts_per_step=2", "rl.group_size=4", "rl.zero_stage=3",
                 "rl.num_ranks=1", "rl.micro_batch_size=4", "rl.rollout.max_new_tokens=128",
                 "rl.rollout.subagent_max_new_tokens=128", "video.nframes=16", "video.max_pixels=50176",
                 "rl.gradient_checkpointing=true", "rl.rollout.max_turns=0", "rl.gating.choices=[16]",
                 "rl.rollout.engine=hf", "rl.rollout.sglang.placement=colocated", "rl.rollout.sglang.gpus=[]"]
    return _stage(_plan(overrides, gpus=1, shape=QWEN3_VL_2B), "RL policy pass").total


@pytest.mark.parametrize("planned, measured_gib", [(_stock_forward_backward, 42.5), (_sft_zero2_one_gpu, 43.7),
                                                   (_rl_zero3_one_gpu, 48.1)],
                         ids=["stock-fwd-bwd", "sft-zero2", "rl-zero3"])
def test_the_plan_reads_at_most_10_percent_above_the_measured_peaks_and_never_below(planned, measured_gib):
    planned_gib = planned() / GIB
    assert measured_gib <= planned_gib <= 1.10 * measured_gib, (planned_gib, measured_gib)


def test_the_8b_config_as_shipped_fits_one_node_of_eight_h100s():
    plan = _plan()
    assert plan.fits, plan.refusals
    assert {s.stage for s in plan.stages} == {"flow process", "SFT", "RL policy pass", "RL rollout server (vLLM)",
                                              "SFT grammar check (hf)", "evaluation server"}


def test_the_flow_process_has_a_row_and_holds_no_gpu_memory():
    """#60 finding 1: the plan had no row for the flow process; every stage that loads a model
    (the `hf` evaluation too) does so in a process of its own."""
    for overrides in ([], ["eval.engine=hf"]):
        assert _stage(_plan(overrides), "flow process").total == 0


def test_the_evaluation_server_is_planned_at_vllms_default_fraction_unless_sglang_is_asked():
    """#60 finding 7: vLLM's default gpu_memory_utilization is 0.92 (vllm/config/cache.py of
    vllm 0.32.0, the pinned GPU version), not 0.90."""
    from paravt_core.plan import SERVER_FRACTION, VLLM_FRACTION

    assert VLLM_FRACTION == 0.92
    for server, fraction in (("auto", VLLM_FRACTION), ("vllm", VLLM_FRACTION), ("sglang", SERVER_FRACTION)):
        assert _stage(_plan([f"eval.server={server}"]), "evaluation server").budget == int(fraction * H100)


def test_the_8b_configs_former_rl_values_are_refused_naming_the_knobs():
    plan = _plan(FORMER_RL)
    assert not plan.fits
    (refusal,) = plan.refusals
    assert refusal.startswith("RL policy pass")
    assert "set rl.gradient_checkpointing: true and rl.micro_batch_size: 3" in refusal
    assert _stage(plan, "RL policy pass").total > 900 * GB  # activations of 4 x 20.8 k tokens over 36 layers


def test_checkpointing_alone_is_not_enough_for_four_longest_trajectories():
    (refusal,) = _plan(["rl.micro_batch_size=4"]).refusals
    assert "set rl.micro_batch_size: 3" in refusal and "gradient_checkpointing: true" not in refusal


def test_the_grammar_checks_generates_without_a_token_budget_do_not_fit_one_card():
    # 16 episodes' answer turn re-prefills 16 contexts of 18.7 k tokens (the first turn's 4.7 k
    # tokens each planned 42.6 GB and passed before issue #44 item 6); all 56 are worse still.
    for overrides in (["eval.hf_batch_tokens=null"], ["eval.hf_batch_tokens=null", "sft.grammar_batch=null"]):
        (refusal,) = _plan(overrides).refusals
        assert refusal.startswith("SFT grammar check") and "eval.hf_batch_tokens" in refusal
    stage = _stage(_plan(["eval.hf_batch_tokens=null"]), "SFT grammar check (hf)")
    assert stage.total > 100 * GB and "16 of 16 turn-4 contexts" in stage.note


def test_a_token_budget_bounds_every_generate_of_the_grammar_check_however_many_episodes():
    shipped = _stage(_plan(), "SFT grammar check (hf)")
    all_at_once = _stage(_plan(["sft.grammar_batch=null"]), "SFT grammar check (hf)")
    assert not shipped.over and shipped.total == all_at_once.total < 55 * GB
    # the largest call under a budget: the shortest prompts (one-frame sub-agents) packed into it
    assert "60 of 280 1-frame sub-agent prompts" in all_at_once.note
    assert _stage(_plan(["eval.hf_batch_tokens=32768"]), "SFT grammar check (hf)").total < shipped.total


def test_an_hf_evaluation_is_planned_per_generate_under_the_token_budget():
    hf = ["eval.engine=hf", "eval.endpoint=null", "eval.concurrency=16"]  # 16 samples: over a card without the budget
    whole = _stage(_plan(hf + ["eval.hf_batch_tokens=null"]), "evaluation (hf)")
    split = _stage(_plan(hf), "evaluation (hf)")
    assert whole.over and not split.over and "eval.hf_batch_tokens" in whole.knobs


def test_the_plan_counts_the_grammar_checks_prompts():
    from paravt_core.config import EVAL_SPLITS
    from paravt_core.plan import GRAMMAR_PROMPTS
    from paravt_core.sft.grammar import PER_SPLIT

    assert GRAMMAR_PROMPTS == PER_SPLIT * len(EVAL_SPLITS) == 56


def test_too_few_gpus_for_the_ranks_and_the_server_are_refused():
    (refusal,) = _plan(gpus=4).refusals
    assert "8 GPUs" in refusal and "4 are given" in refusal


@pytest.mark.parametrize("engine, knob", [("sglang", "mem_fraction_static"), ("vllm", "gpu_memory_utilization")])
def test_a_split_rollout_server_whose_pool_cannot_hold_its_weights_is_refused(engine, knob):
    plan = _plan([f"rl.rollout.engine={engine}", f"rl.rollout.{engine}.{knob}=0.2"])
    (refusal,) = plan.refusals
    name = {"sglang": "SGLang", "vllm": "vLLM"}[engine]
    assert refusal.startswith(f"RL rollout server ({name})") and knob in refusal


def test_the_shipped_vllm_rollout_server_is_planned_on_its_own_gpu():
    stage = _stage(_plan(), "RL rollout server (vLLM)")
    assert stage.where == "server GPU(s) [7]" and stage.budget == int(0.85 * H100)
    assert dict(stage.parts)["weights"] == 2 * QWEN3_VL_8B.params and "17 episodes" in stage.note  # at 79 GiB
    # vLLM's own 0.92 when the config leaves it unset
    assert _stage(_plan(["rl.rollout.vllm.gpu_memory_utilization=null"]), "RL rollout server (vLLM)").budget == \
        int(0.92 * H100)


def test_a_colocated_vllm_server_keeps_its_pool_beside_rank_0s_trainer():
    overrides = ["rl.rollout.vllm.placement=colocated", "rl.rollout.vllm.gpus=[]"]
    stage = _stage(_plan(overrides), "RL rollout server (vLLM, colocated)")
    assert stage.over and dict(stage.parts)["server pool"] == int(0.85 * H100) and "placement split" in stage.knobs
    assert gpus_needed(load_config(CONFIG_8B, overrides)) == 8  # sft.num_ranks; the server takes none of its own


def test_a_vllm_context_shorter_than_the_longest_trajectory_is_refused():
    (refusal,) = _plan(["rl.rollout.vllm.max_model_len=16384"]).refusals
    assert "rl.rollout.vllm.max_model_len 16384" in refusal and "20784 tokens" in refusal


def test_a_colocated_server_counts_beside_the_trainers_states():
    overrides = ["rl.rollout.engine=sglang", "rl.rollout.sglang.placement=colocated", "rl.rollout.sglang.gpus=[]",
                 "rl.num_ranks=8", "rl.prompts_per_step=8", "rl.rollout.sglang.mem_fraction_static=0.85"]
    stage = _stage(_plan(overrides), "RL rollout server (SGLang, colocated)")
    assert stage.over and dict(stage.parts)["server pool"] == int(0.85 * H100)


# The ZeRO paper's accounting, as docs/scale.md tabulated it by hand before the plan: 16Ψ/N under ZeRO-3,
# 2Ψ + 14Ψ/N under ZeRO-2, 4Ψ/N with the optimizer offloaded (Ψ = 8.77 B).
@pytest.mark.parametrize("ranks, stage, offload, gpu_gb", [(8, 3, "none", 17.5), (8, 2, "none", 32.9),
                                                          (4, 3, "none", 35.1), (2, 3, "cpu", 17.5),
                                                          (1, 3, "cpu", 35.1)])
def test_model_states_follow_the_zero_accounting(ranks, stage, offload, gpu_gb):
    ds = load_config(CONFIG_8B, [f"rl.deepspeed.offload_optimizer={offload}"]).rl.deepspeed
    parts = dict(_model_states(QWEN3_VL_8B.params, ranks, stage, ds, QWEN3_VL_8B).gpu)
    assert round((parts["weights"] + parts["gradients"] + parts["optimizer"]) / GB, 1) == gpu_gb


def test_eager_attention_adds_the_score_matrices():
    sdpa = _activations(QWEN3_VL_8B, 1, 8192, 0, True, "sdpa")
    eager = _activations(QWEN3_VL_8B, 1, 8192, 0, True, "eager")
    assert eager - sdpa == QWEN3_VL_8B.heads * 8192 * 8192 * 6


def _write_8b_config(folder: Path, section: str = "text_config", key: str = "", value=None) -> Path:
    """Qwen3-VL-8B's config.json in `folder`, with `section`'s `key` set to `value` when a key is given."""
    text = {"hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936}
    vision = {"hidden_size": 1152, "depth": 27, "intermediate_size": 4304, "out_hidden_size": 4096,
              "deepstack_visual_indexes": [8, 16, 24], "num_position_embeddings": 2304}
    raw = {"text_config": text, "vision_config": vision, "tie_word_embeddings": False}
    if key:
        (raw if section == "" else raw[section])[key] = value
    (folder / "config.json").write_text(json.dumps(raw))
    return folder


def test_a_local_model_folder_gives_its_shape(tmp_path):
    assert model_shape(str(_write_8b_config(tmp_path))).params == QWEN3_VL_8B.params


# #61 item 2: each field the plan reads, set to a value no model has (negative, zero, fractional, a string,
# null, past any float's reach); before, the plan said "fits" or raised a traceback.
@pytest.mark.parametrize("section, key, value", [
    ("text_config", "hidden_size", -4096), ("text_config", "num_hidden_layers", -36),
    ("text_config", "hidden_size", 4096.5), ("text_config", "num_attention_heads", 0),
    ("text_config", "hidden_size", "4096"), ("text_config", "vocab_size", None),
    pytest.param("text_config", "intermediate_size", 10**400, id="intermediate_size-10^400"),
    ("text_config", "num_key_value_heads", True),
    ("text_config", "head_dim", 0), ("vision_config", "depth", -1), ("vision_config", "hidden_size", 1e308),
    ("vision_config", "num_position_embeddings", -2304), ("vision_config", "out_hidden_size", "big"),
])
def test_a_model_dimension_no_model_has_is_refused_naming_the_file_and_key(tmp_path, section, key, value):
    _write_8b_config(tmp_path, section, key, value)
    with pytest.raises(PlanError, match=rf"config.json: {section}.{key} is .*not a whole number from 1 to"):
        model_shape(str(tmp_path))


@pytest.mark.parametrize("section, key, value, message", [
    ("text_config", "num_key_value_heads", 7, "num_attention_heads 32 is not a multiple of num_key_value_heads 7"),
    ("vision_config", "deepstack_visual_indexes", "8,16", "deepstack_visual_indexes is \"8,16\", not a list"),
    ("", "tie_word_embeddings", "false", "tie_word_embeddings is \"false\", not true or false"),
    ("text_config", "vocab_size", "__missing__", "text_config.vocab_size is missing"),
    ("", "vision_config", [], "no text_config and vision_config objects"),
])
def test_a_model_config_whose_parts_disagree_is_refused(tmp_path, section, key, value, message):
    _write_8b_config(tmp_path, section, key, value)
    if value == "__missing__":
        raw = json.loads((tmp_path / "config.json").read_text())
        del raw[section][key]
        (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(PlanError, match=message):
        model_shape(str(tmp_path))


def test_paravt_plan_and_preflight_refuse_a_model_that_cannot_exist_in_one_line(tmp_path, capsys, monkeypatch):
    import paravt_core.preflight as pf

    base = _write_8b_config(tmp_path, "text_config", "num_attention_heads", 0)
    args = ["--config", CONFIG_8B, "--set", f"model.base={base}"]
    assert main(["plan", *args, "--gpus", "8", "--gpu-memory-gib", "79"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "text_config.num_attention_heads is 0" in err and "Traceback" not in err
    monkeypatch.setattr(pf, "system_probes", lambda: pf.Probes(
        python_version=lambda: (3, 11, 0), cuda=lambda: pf.CudaFacts("2.5.1", "12.4", (H100,) * 8),
        driver_version=lambda: "560.1", free_disk=lambda path: 10**15, has_module=lambda python, name: True,
        free_shm=lambda: 64 * 10**9))
    assert main(["preflight", *args]) == 1
    assert "FAIL  model shape" in capsys.readouterr().out


@pytest.mark.parametrize("memory", ["inf", "nan", "-1", "0", "1e300"])
def test_paravt_plan_refuses_card_memory_no_card_has_with_exit_2(memory, capsys):
    assert main(["plan", "--config", CONFIG_8B, "--gpus", "8", "--gpu-memory-gib", memory]) == 2
    err = capsys.readouterr().err
    assert "--gpu-memory-gib a number of GiB above 0" in err and err.count("\n") == 1


def test_an_unknown_model_or_a_config_without_its_sections_is_a_plan_error(tmp_path):
    with pytest.raises(PlanError, match="no shape known"):
        model_shape("someone/else")
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(PlanError, match="config.json: not a Qwen3-VL config"):
        model_shape(str(tmp_path))


def test_paravt_plan_prints_the_table_and_exits_1_when_over_budget(capsys):
    assert main(["plan", "--config", CONFIG_8B, "--gpus", "8", "--gpu-memory-gib", "79"]) == 0
    out = capsys.readouterr().out
    assert "RL policy pass" in out and "evaluation server" in out and "Over budget" not in out
    assert main(["plan", "--config", CONFIG_8B, "--gpus", "8", "--gpu-memory-gib", "79",
                 *[a for item in FORMER_RL for a in ("--set", item)]]) == 1
    assert "rl.gradient_checkpointing: true" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--config", "conf/pipeline/tiny.yaml"], "tiny model"),
    (["--config", "nowhere.yaml"], "does not exist"),
    (["--config", CONFIG_8B, "--set", "model.base=someone/else"], "no shape known"),
])
def test_paravt_plan_refuses_what_it_cannot_plan_with_exit_2(args, message, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["plan", *args, "--gpus", "8", "--gpu-memory-gib", "79"]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_rollout_server_at_a_url_is_listed_as_not_planned(engine):
    plan = _plan([f"rl.rollout.engine={engine}", f"rl.rollout.{engine}.url=http://10.0.0.2:30000"])
    assert not [s for s in plan.stages if s.stage.startswith("RL rollout")]
    assert "http://10.0.0.2:30000" in plan.format().split("Not planned:")[1]
