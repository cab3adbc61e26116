"""Every shipped YAML loads into its config type; bad input fails at load, naming the file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pydantic import BaseModel

from paravt_core.cache_identity import rollout_json
from paravt_core.config import ConfigError, PipelineConfig, load_config

CONF = Path(__file__).resolve().parents[2] / "conf"
PIPELINE_YAMLS = sorted((CONF / "pipeline").glob("*.yaml"))


def test_there_are_pipeline_configs():
    names = {p.name for p in PIPELINE_YAMLS}
    assert {"tiny.yaml", "paravt_8b.yaml"} <= names


@pytest.mark.parametrize("path", sorted(CONF.rglob("*.yaml")), ids=lambda p: str(p.relative_to(CONF)))
def test_every_yaml_loads(path: Path):
    first_line = path.read_text().splitlines()[0]
    assert first_line.startswith("#"), f"{path} must open with a comment saying what it is for"
    if path.parent.name == "pipeline":
        assert isinstance(load_config(path), PipelineConfig)
    elif path.parent.name == "rl":
        cfg = load_config(CONF / "pipeline" / "tiny.yaml", rl_row=path)
        assert cfg.rl.row == path.stem
    else:
        pytest.fail(f"{path}: no config type is known for conf/{path.parent.name}/")


def test_paper_settings_in_8b_config():
    cfg = load_config(CONF / "pipeline" / "paravt_8b.yaml")
    assert cfg.model.base == "Qwen/Qwen3-VL-8B-Instruct"
    assert (cfg.sft.learning_rate, cfg.sft.warmup_ratio, cfg.sft.max_steps) == (2e-5, 0.05, 1500)
    assert (cfg.rl.group_size, cfg.rl.temperature, cfg.rl.prompts_per_step) == (8, 0.7, 7)
    assert (cfg.rl.kl_coef, cfg.rl.learning_rate, cfg.rl.clip_eps) == (0.01, 2e-6, 0.2)
    assert cfg.rl.gating.choices == (4, 8, 16, 32, 64)
    assert (cfg.rl.rollout.max_turns, cfg.rl.rollout.max_parallel) == (3, 5)
    assert (cfg.video.nframes, cfg.video.min_pixels, cfg.video.max_pixels) == (64, 784, 50176)
    assert len(cfg.eval.splits) == 7


def test_unknown_key_names_file_and_key(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("# bad\nsft:\n  max_stepz: 3\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: sft\.max_stepz"):
        load_config(bad)


def test_bad_value_fails_at_load(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("# bad\nvideo:\n  min_pixels: 60000\n  max_pixels: 50176\n")
    with pytest.raises(ConfigError, match="min_pixels"):
        load_config(bad)
    with pytest.raises(ConfigError, match="eval.splits"):
        load_config(CONF / "pipeline" / "tiny.yaml", ["eval.splits=[videomme, imagenet]"])


def test_overrides_and_section_hash():
    base = load_config(CONF / "pipeline" / "tiny.yaml")
    changed = load_config(CONF / "pipeline" / "tiny.yaml", ["rl.max_steps=3"])
    assert changed.rl.max_steps == 3
    assert changed.section_hash("model", "sft") == base.section_hash("model", "sft")
    assert changed.section_hash("rl") != base.section_hash("rl")
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(CONF / "pipeline" / "tiny.yaml", ["rl.max_steps"])


def test_missing_file_is_clear(tmp_path: Path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_rl_rows_match_spec_table():
    def row(name):
        return load_config(CONF / "pipeline" / "tiny.yaml", rl_row=CONF / "rl" / f"{name}.yaml").rl

    full, vanilla = row("paragrpo"), row("vanilla_grpo")
    assert (full.rollout.think_prefix, full.reward.answer_suffix, full.reward.anchor_weight, full.gating.enabled) == (
        True, True, 0.5, True)
    assert (vanilla.rollout.think_prefix, vanilla.reward.answer_suffix, vanilla.reward.anchor_weight,
            vanilla.gating.enabled) == (False, False, 0.0, False)
    assert row("anchoring_only").gating.enabled is False and row("anchoring_only").reward.anchor_weight == 0.5
    assert row("gating_only").gating.enabled is True and row("gating_only").reward.anchor_weight == 0.0
    assert row("no_tool_reward").reward.use_tool_reward is False
    assert row("no_penalty").reward.unclosed_think_penalty is False
    # the row keeps the pipeline's budget
    assert full.max_steps == load_config(CONF / "pipeline" / "tiny.yaml").rl.max_steps


def test_bad_rl_row_names_file(tmp_path: Path):
    bad = tmp_path / "row.yaml"
    bad.write_text("# bad\nrow: x\ngating:\n  enabeld: true\n")
    with pytest.raises(ConfigError, match=r"row\.yaml: rl\.gating\.enabeld"):
        load_config(CONF / "pipeline" / "tiny.yaml", rl_row=bad)


def test_rl_prompts_must_split_over_ranks():
    with pytest.raises(ConfigError, match="multiple of rl.num_ranks"):
        load_config(CONF / "pipeline" / "tiny.yaml", ["rl.prompts_per_step=7", "rl.num_ranks=2"])


def test_benchmark_pins_name_known_repos_and_need_the_hub():
    from paravt_core.data.hub import benchmark_requests

    pinned = load_config(CONF / "pipeline" / "paravt_8b.yaml", ['data.benchmark_revisions={"lmms-lab/LVBench": "c0ffee"}'])
    revisions = {r.repo_id: r.revision for r in benchmark_requests("main", pins=pinned.data.benchmark_revisions)}
    assert revisions["lmms-lab/LVBench"] == "c0ffee" and revisions["lmms-lab/Video-MME"] == "main"
    with pytest.raises(ConfigError, match=r"\['lmms-lab/LVBenhc'\], which no split reads"):
        load_config(CONF / "pipeline" / "paravt_8b.yaml", ['data.benchmark_revisions={"lmms-lab/LVBenhc": "c0ffee"}'])
    with pytest.raises(ConfigError, match="applies to source: hub"):
        load_config(CONF / "pipeline" / "tiny.yaml", ['data.benchmark_revisions={"lmms-lab/LVBench": "c0ffee"}'])


def _float_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted paths of every float field in a config model tree."""
    found = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found += _float_fields(annotation, f"{prefix}{name}.")
        elif float in (getattr(annotation, "__args__", None) or (annotation,)):
            found.append(f"{prefix}{name}")
    return found


def test_every_float_field_refuses_inf_and_nan():
    fields = _float_fields(PipelineConfig)
    assert {"rl.learning_rate", "rl.kl_coef", "rl.reward.format_weight", "data.synth.fps"} <= set(fields)
    for field in fields:
        for value in (".inf", "-.inf", ".nan"):
            with pytest.raises(ConfigError, match=field.rsplit(".", 1)[-1]):
                load_config("conf/pipeline/tiny.yaml", [f"{field}={value}"])


@pytest.mark.parametrize("choices", ["[0, -4]", "[8, 0]", "[-4]"])
def test_gating_choices_must_be_positive(choices: str):
    with pytest.raises(ConfigError, match=r"rl\.gating\.choices\.\d"):
        load_config("conf/pipeline/tiny.yaml", [f"rl.gating.choices={choices}"])


def test_broken_yaml_file_names_the_file_and_line(tmp_path: Path):
    path = tmp_path / "broken.yaml"
    path.write_text("run:\n  name: x\n  seed: [1\nsft:\n  max_steps: 3\n")
    with pytest.raises(ConfigError, match=rf"{path}: not valid YAML \(line \d+, column \d+"):
        load_config(path)
    row = tmp_path / "row.yaml"
    row.write_text("kl_coef: {")
    with pytest.raises(ConfigError, match=rf"{row}: not valid YAML"):
        load_config("conf/pipeline/tiny.yaml", rl_row=row)


def test_unparsable_set_value_names_the_item():
    with pytest.raises(ConfigError, match=r"override 'k=\[1': the value is not valid YAML"):
        load_config("conf/pipeline/tiny.yaml", ["run.seed=1", "k=[1"])


@pytest.mark.parametrize("override, message", [
    ("reproduce.rows=[paragrpo, paragrpo]", "distinct RL rows"),
    ("reproduce.rows=[]", "distinct RL rows"),
    ("reproduce.seeds=[0, 0]", "seeds must be distinct"),
    ("reproduce.sft_seeds=[1, 1]", "sft_seeds must be distinct"),
    ("reproduce.rows=['../etc']", "reproduce.rows"),
    ("model.pretrain.max_steps=0", "model.pretrain.max_steps"),
    ("model.pretrain.reading_rows=-1", "model.pretrain.reading_rows"),
    ("model.pretrain.reading_steps=0", "model.pretrain.reading_steps"),
    ("model.pretrain.event_windows=1.5", "model.pretrain.event_windows"),
    ("data.synth.colours=[red, green, blue]", "at least 4"),
])
def test_reproduce_and_pretrain_settings_are_checked_at_load(override: str, message: str):
    with pytest.raises(ConfigError, match=message):
        load_config("conf/pipeline/reproduce.yaml", [override])


def test_reproduce_config_pretrains_the_tiny_base_and_runs_the_contrast_over_four_runs_a_row():
    cfg = load_config("conf/pipeline/reproduce.yaml")
    assert cfg.model.pretrain.enabled and cfg.model.is_tiny and cfg.model.pretrain.event_windows > 0
    assert cfg.data.synth.option_order == "canonical" and len(cfg.data.synth.colours) == 4
    # #46 item 5: vanilla GRPO against PARA-GRPO, the fewest runs a row the verdicts resolve (4)
    assert cfg.reproduce.rows == ("vanilla_grpo", "paragrpo") and len(cfg.reproduce.seeds) == 4
    # pretraining's step is 8 rows however many ranks share it
    assert cfg.model.pretrain.num_ranks * cfg.model.pretrain.micro_batch_size == 8
    from paravt_core.miniature.pretrain import training_config

    assert (training_config(cfg).sft.num_ranks, training_config(cfg, 5).sft.num_ranks) == (2, 2)  # both phases
    assert max(cfg.rl.gating.choices) <= cfg.eval.nframes  # gating never shows more than the evaluation
    # SFT has shown the tiny policy every overview budget gating draws, and RL trains on the
    # evaluation's question type
    assert set(cfg.rl.gating.choices) <= set(cfg.video.sft_frame_choices)
    assert cfg.rl.question_types == ("mcq",) and cfg.eval.splits == ("videomme", "videomme_val")
    assert cfg.data.synth.validation  # knobs are chosen on videomme_val, the test split reports


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path: Path):
    """Issue #33 item 3: a second `sft:` section silently replaced the first (rc 0, SFT defaults back)."""
    shipped = (Path(__file__).resolve().parents[2] / "conf/pipeline/tiny.yaml").read_text()
    path = tmp_path / "tiny.yaml"
    path.write_text(shipped + "sft:\n  learning_rate: 5.0\n")
    first = 1 + next(i for i, line in enumerate(shipped.splitlines()) if line.startswith("sft:"))
    with pytest.raises(ConfigError, match=rf"tiny.yaml.*line {len(shipped.splitlines()) + 1}.*duplicate key 'sft' "
                                          rf"\(first given on line {first}\)"):
        load_config(path)
    nested = tmp_path / "nested.yaml"
    nested.write_text("sft:\n  max_steps: 3\n  max_steps: 4\n")
    with pytest.raises(ConfigError, match="line 3.*duplicate key 'max_steps'"):
        load_config(nested)


def test_a_config_that_is_not_utf8_names_the_byte(tmp_path: Path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("run:\n  name: café\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.yaml: not UTF-8 text \(byte 16 is 0xe9\)"):
        load_config(path)


def test_paravt_run_refuses_a_bad_config_in_one_line(tmp_path: Path, capsys):
    """No traceback: the command names the file and the problem, exit 2, before any stage."""
    from paravt_core.cli import main

    path = tmp_path / "dup.yaml"
    path.write_text("run:\n  name: a\nrun:\n  name: b\n")
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"paravt run: {path}: not valid YAML (line 3") and "Traceback" not in err
    assert main(["reproduce", "--config", str(path)]) == 2
    assert capsys.readouterr().err.startswith("paravt reproduce: ")


# --- load-time checks for what could only fail late (issue #48 items 3 and 9) ----------


def test_an_empty_split_list_is_refused_at_load_naming_the_key():
    # it used to pass, train SFT, then fail in the grammar check as if every video were undecodable
    with pytest.raises(ConfigError, match=r"eval.splits is empty; list at least one of \['videomme'"):
        load_config(CONF / "pipeline" / "tiny.yaml", ["eval.splits=[]"])


def test_a_file_too_large_for_a_config_is_refused_before_parsing(tmp_path: Path):
    import time

    from paravt_core.config import MAX_CONFIG_BYTES

    huge = tmp_path / "huge.yaml"
    # valid YAML throughout, so only the size can refuse it (a parse took ~1 s per MB)
    huge.write_text("run:\n  name: x\n" + "# padding\n" * (3 * MAX_CONFIG_BYTES // 10))
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=rf"huge.yaml: 3,145,7\d\d bytes, too large for a config file \(at most "
                                          rf"{MAX_CONFIG_BYTES:,} bytes"):
        load_config(huge)
    assert time.perf_counter() - started < 1.0
    with pytest.raises(ConfigError, match="huge.yaml: .* too large for a RL row file"):
        load_config(CONF / "pipeline" / "tiny.yaml", rl_row=huge)


def test_a_config_at_the_size_limit_still_loads(tmp_path: Path):
    from paravt_core.config import MAX_CONFIG_BYTES

    body = (CONF / "pipeline" / "tiny.yaml").read_bytes()
    padded = tmp_path / "padded.yaml"
    padded.write_bytes(body + b"\n" + b"#" * (MAX_CONFIG_BYTES - len(body) - 2) + b"\n")
    assert padded.stat().st_size == MAX_CONFIG_BYTES
    assert load_config(padded).run.name == load_config(CONF / "pipeline" / "tiny.yaml").run.name


@pytest.mark.parametrize(
    ("key", "under", "problem"),
    [
        ("run.output_dir", "a_file/out", r"/a_file is a file, not a folder"),
        ("run.output_dir", "a_file", r"is a file, not a folder"),
        ("run.output_dir", "a_file/../out", r"/a_file is a file, not a folder"),
        ("data.hub_cache_dir", "a_file/deeper/cache", r"/a_file is a file, not a folder"),
        ("run.output_dir", "dangling/out", r"/dangling is a link to nothing, not a folder"),
    ],
)
def test_an_output_folder_that_cannot_be_created_is_refused_at_load(tmp_path: Path, key: str, under: str,
                                                                   problem: str):
    (tmp_path / "a_file").write_text("not a folder")
    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    folder = tmp_path / under
    with pytest.raises(ConfigError, match=rf"tiny.yaml: {key} {re.escape(str(folder))}: .*{problem}; choose a "
                                          "folder that can be created"):
        load_config(CONF / "pipeline" / "tiny.yaml", [f"{key}={folder}"])


def test_an_output_folder_yet_to_be_made_loads_and_nothing_is_created(tmp_path: Path):
    folder = tmp_path / "new" / "deeper"
    cfg = load_config(CONF / "pipeline" / "tiny.yaml", [f"run.output_dir={folder}",
                                                        f"data.hub_cache_dir={tmp_path / 'cache'}"])
    assert cfg.run.output_dir == folder and not (tmp_path / "new").exists() and not (tmp_path / "cache").exists()


def test_any_command_refuses_a_config_that_does_not_load_in_one_line(tmp_path: Path, capsys):
    """`paravt report` reads the config without catching ConfigError itself: exit 2, no traceback."""
    from paravt_core.cli import main

    (tmp_path / "a_file").write_text("")
    config = tmp_path / "c.yaml"
    config.write_text(f"run:\n  output_dir: {tmp_path / 'a_file' / 'out'}\n")
    assert main(["report", "--experiment", "x", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"paravt report: {config}: run.output_dir ") and "is a file, not a folder" in err
    assert "Traceback" not in err and len(err.splitlines()) == 1


def test_an_empty_event_kind_list_is_refused_at_load():
    # it passed, then the data stage failed drawing an event kind from nothing (random.choice of ())
    with pytest.raises(ConfigError, match="data.synth.event_kinds: Tuple should have at least 1 item"):
        load_config(CONF / "pipeline" / "tiny.yaml", ["data.synth.event_kinds=[]"])
    assert load_config(CONF / "pipeline" / "tiny.yaml", ["data.synth.event_kinds=[digit]"]).data.synth.event_kinds


def test_retention_and_probe_workers_are_checked_at_load_and_never_change_a_cache_key():
    """Issue #44 item 9: keeping fewer checkpoints or probing with more processes changes no
    result, so a run folder (keyed by `section_hash`) is resumed, not started over, when
    sft/rl.keep_last or data.probe_workers is set or changed."""
    base = load_config(CONF / "pipeline" / "tiny.yaml")
    kept = load_config(CONF / "pipeline" / "tiny.yaml", ["sft.keep_last=2", "rl.keep_last=1", "data.probe_workers=3"])
    assert (kept.sft.keep_last, kept.rl.keep_last, base.sft.keep_last) == (2, 1, None)
    assert kept.section_hash() == base.section_hash()
    assert kept.section_hash("sft", "video", "run") == base.section_hash("sft", "video", "run")
    for knob in ("sft.keep_last", "rl.keep_last", "data.probe_workers"):
        with pytest.raises(ConfigError, match=knob):
            load_config(CONF / "pipeline" / "tiny.yaml", [f"{knob}=0"])


def test_the_8b_config_rolls_out_on_vllm_on_a_gpu_of_its_own():
    # Issue #44 item 2: vLLM's whole server path has run here (server tier); SGLang's has not.
    rollout = load_config(CONF / "pipeline" / "paravt_8b.yaml").rl.rollout
    assert rollout.engine == "vllm" and rollout.vllm.url is None
    assert (rollout.vllm.placement, rollout.vllm.gpus, rollout.vllm.tp_size) == ("split", (7,), 1)
    assert rollout.vllm.gpu_memory_utilization == 0.85
    sglang = load_config(CONF / "pipeline" / "paravt_8b.yaml", ["rl.rollout.engine=sglang"]).rl.rollout.sglang
    assert (sglang.placement, sglang.gpus) == ("split", (7,))  # the other engine stays a switch away


@pytest.mark.parametrize("overrides, message", [
    (["rl.rollout.vllm.placement=split"], "neither vllm.url (a running server) nor vllm.gpus"),
    (["rl.rollout.vllm.gpus=[3]"], "rl.rollout.vllm.gpus is for placement: split"),
    (["rl.rollout.vllm.placement=split", "rl.rollout.vllm.gpus=[2,3]"], "must be tp_size (1) GPUs"),
    (["rl.rollout.vllm.placement=split", "rl.rollout.vllm.gpus=[3,3]", "rl.rollout.vllm.tp_size=2"], "twice"),
    (["rl.rollout.vllm.placement=split", "rl.rollout.vllm.gpus=[-1]"], "rl.rollout.vllm.gpus.0"),
    (["rl.rollout.vllm.gpu_memory_utilization=1.0"], "rl.rollout.vllm.gpu_memory_utilization"),
])
def test_a_vllm_placement_that_cannot_work_is_refused_at_load(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(CONF / "pipeline" / "tiny.yaml", ["rl.rollout.engine=vllm", *overrides])


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_launched_server_may_not_share_a_trainers_gpu(engine):
    paper = CONF / "pipeline" / "paravt_8b.yaml"
    with pytest.raises(ConfigError, match=re.escape(f"rl.rollout.{engine}.gpus [6] include GPU(s) [6], which the "
                                                    "trainers take (rl.num_ranks 7: ranks on GPUs 0-6)")):
        load_config(paper, [f"rl.rollout.engine={engine}", f"rl.rollout.{engine}.gpus=[6]"])
    # a running server, a hostfile's placement, or the engine not in use: nothing launched here
    load_config(paper, [f"rl.rollout.engine={engine}", f"rl.rollout.{engine}.gpus=[6]",
                        f"rl.rollout.{engine}.url=http://10.0.0.2:30000"])
    load_config(paper, [f"rl.rollout.engine={engine}", f"rl.rollout.{engine}.gpus=[6]", "rl.hostfile=hosts"])
    load_config(paper, ["rl.rollout.engine=hf", f"rl.rollout.{engine}.gpus=[6]"])


def test_the_vllm_placement_and_hf_batch_knobs_enter_the_cache_keys_only_when_set():
    import hashlib

    served = PipelineConfig(rl={"rollout": {"engine": "vllm", "vllm": {"url": "http://127.0.0.1:8000"}}})
    # The keys of this config at 2872d50, before the knobs existed (section_hash; the grammar check's
    # key hashes the rollout section's JSON). The whole config's key without its `model` section:
    # the tiny kit's spec changed since (Qwen3-VL's shipped pixel bounds, issue #44 item 4).
    sections = [name for name in PipelineConfig.model_fields if name != "model"]
    assert (served.section_hash("rl"), served.section_hash("eval"), served.section_hash(*sections)) == (
        "ae23182e9ce64598", "f3e899e57fde1f25", "e53166ec8093afd9")
    assert hashlib.sha256(rollout_json(served.rl.rollout).encode()).hexdigest()[:16] == "0c9b33431ce383b4"
    placed = PipelineConfig(rl={"num_ranks": 7, "rollout": {"engine": "vllm", "vllm": {"placement": "split",
                                                                                       "gpus": [7]}}})
    assert placed.section_hash("rl") != PipelineConfig(rl={"num_ranks": 7, "rollout": {"engine": "vllm"}}
                                                       ).section_hash("rl")
    assert '"gpus":[7]' in rollout_json(placed.rl.rollout)
    assert PipelineConfig(eval={"hf_batch_tokens": 4096}).section_hash("eval") != PipelineConfig().section_hash("eval")


# #61 items 5 and 6: seeds and thread / process counts out of what numpy, torch and the OS take.
SEED_KEYS = ["run.seed", "sft.seed", "model.pretrain.seed", "reproduce.probe.seed", "data.synth.seed",
             "model.tiny.seed"]


@pytest.mark.parametrize("key", SEED_KEYS)
@pytest.mark.parametrize("value", ["-1", str(2**26), str(2**64)])
def test_a_seed_no_stage_can_take_is_refused_at_load_naming_the_file_and_key(key: str, value: str):
    """Before: a negative seed (or one past 2^64) loaded, and the SFT rank crashed in numpy after
    the data stage (retried twice, then a traceback)."""
    with pytest.raises(ConfigError, match=rf"tiny.yaml: {re.escape(key)}: Input should be"):
        load_config(CONF / "pipeline" / "tiny.yaml", [f"{key}={value}"])


def test_the_largest_seed_loads_and_every_stage_can_seed_with_it():
    """MAX_SEED works end to end: SFT's data order (numpy), torch, and the RL rollout's sampler
    seed as `agent.rollout` derives it for the last turn of a million-step, 1000-rank run."""
    from types import SimpleNamespace

    import numpy as np
    import torch

    from paravt_core.agent.rollout import _Rollout
    from paravt_core.rl.replay import sampler_seed
    from paravt_core.seeds import MAX_SEED
    from paravt_core.sft.loader import sample_order

    cfg = load_config(CONF / "pipeline" / "tiny.yaml", [f"{key}={MAX_SEED}" for key in SEED_KEYS]
                      + [f"reproduce.seeds=[0,{MAX_SEED}]"])
    assert cfg.run.seed == cfg.sft.seed == cfg.reproduce.seeds[1] == MAX_SEED
    assert len(sample_order(10, MAX_SEED, 10**6)) == 10
    rollout = _Rollout.__new__(_Rollout)
    rollout.seed, rollout.temperature, rollout.top_p = sampler_seed(MAX_SEED, 10**6, 999), 1.0, 1.0
    rollout.cfg = SimpleNamespace(max_new_tokens=8, subagent_max_new_tokens=8)
    rollout.renderer = SimpleNamespace(turn_end_id=0)
    seed = rollout.params(turn=9, subagent=True).seed
    torch.manual_seed(seed)
    torch.Generator().manual_seed(seed)
    assert seed < 2**63 and np.random.default_rng(seed).integers(2) in (0, 1)
    with pytest.raises(ConfigError, match=r"reproduce.seeds.1: Input should be greater than or equal to 0"):
        load_config(CONF / "pipeline" / "tiny.yaml", ["reproduce.seeds=[0,-5]"])


@pytest.mark.parametrize("knob, value", [("run.fanout.threads_per_run", 1_000_000), ("run.fanout.threads_per_run", 65536),
                                         ("data.probe_workers", 100_000), ("sft.data_workers", 5000)])
def test_a_thread_or_process_count_past_any_machine_is_refused_at_load(knob: str, value: int):
    """Before: run.fanout.threads_per_run=1000000 (or 65536) loaded, and the flow process died in
    torch.set_num_threads with SIGSEGV, no message."""
    from paravt_core.config import MAX_WORKERS

    with pytest.raises(ConfigError, match=rf"tiny.yaml: {re.escape(knob)}: Input should be less than or equal to "
                                          f"{MAX_WORKERS}"):
        load_config(CONF / "pipeline" / "tiny.yaml", [f"{knob}={value}"])
    assert load_config(CONF / "pipeline" / "tiny.yaml", [f"{knob}={MAX_WORKERS}"])


@pytest.mark.parametrize("knob", ["sft.num_ranks", "rl.num_ranks", "model.pretrain.num_ranks", "eval.concurrency"])
def test_a_rank_or_request_count_past_any_machine_is_refused_at_load(knob: str):
    """Before: sft.num_ranks=100000 loaded, and the stage started processes until the machine refused."""
    from paravt_core.config import MAX_WORKERS

    with pytest.raises(ConfigError, match=rf"{re.escape(knob)}: Input should be less than or equal to {MAX_WORKERS}"):
        load_config(CONF / "pipeline" / "tiny.yaml", [f"{knob}=100000"])


@pytest.mark.parametrize("command", [["tiny-model", "--out", "{tmp}/m"], ["synth", "--out", "{tmp}/s"]])
@pytest.mark.parametrize("seed", ["-1", str(2**64), "x"])
def test_a_seed_flag_out_of_range_is_a_usage_error(command, seed: str, tmp_path: Path, capsys):
    from paravt_core.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([a.format(tmp=tmp_path) for a in command] + ["--seed", seed])
    assert exit_.value.code == 2
    assert "is not a seed: give a whole number from 0 to 67,108,863" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
