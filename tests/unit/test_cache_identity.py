"""Cache identity in one module (`paravt_core/cache_identity.py`, issue #63 item 2): every config
field classified, and the keys of the shipped configs pinned to what main computed before the move."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from paravt_core import cache_identity
from paravt_core.config import PipelineConfig, RunConfig, load_config
from paravt_core.refs import ArtifactRef

REPO = Path(__file__).resolve().parents[2]


def _sub_section(annotation) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def classification_problems(config: type[BaseModel] = PipelineConfig) -> list[str]:
    """Config fields the cache-identity tables leave out or classify twice, and table entries that
    name no field. A section of its own may be classified whole (hashed when set, or never); its
    fields then need a class too unless it is never hashed, or a later engine's server section (hashed whole)."""
    hashed = cache_identity.HASHED
    when_set, never = set(cache_identity.hashed_only_when_set()), set(cache_identity.NEVER_HASHED)
    whole = {f"rl.rollout.{name}" for name in cache_identity.later_server_sections()}  # hashed whole by rule
    problems, seen = [], set()

    def walk(section: type[BaseModel], path: str) -> None:
        for name, field in section.model_fields.items():
            seen.add((path, name))
            classes = [table for table, holds in (("HASHED", name in hashed.get(path, ())),
                                                  ("HASHED_ONLY_WHEN_SET", (path, name) in when_set),
                                                  ("NEVER_HASHED", (path, name) in never)) if holds]
            sub = _sub_section(field.annotation)
            if sub is None and len(classes) != 1:
                problems.append(f"{path}.{name}: {' and '.join(classes) or 'not classified'}")
            elif sub is not None and (len(classes) > 1 or "HASHED" in classes):
                problems.append(f"{path}.{name}: a section, classified {' and '.join(classes)}")
            if sub is not None and "NEVER_HASHED" not in classes and f"{path}.{name}" not in whole:
                walk(sub, f"{path}.{name}")

    for name, field in config.model_fields.items():
        walk(field.annotation, name)
    listed = {(path, name) for path, names in hashed.items() for name in names} | when_set | never
    problems += [f"{path}.{name}: in a table, not in the config" for path, name in sorted(listed - seen)]
    return problems


def test_every_config_field_has_its_cache_identity_declared():
    assert classification_problems() == []
    model_fields, eval_fields = PipelineConfig().model.model_fields, PipelineConfig().eval.model_fields
    assert set(cache_identity.NOT_PER_RESULT) <= set(eval_fields)
    assert set(cache_identity.server_location()) == {"sglang", "vllm"} <= set(PipelineConfig().rl.rollout.model_fields)
    assert {name for names in cache_identity.APPLIED_SINCE_63.values() for name in names} <= set(model_fields)
    assert set(cache_identity.PRETRAIN_MODEL_FIELDS) <= set(model_fields)


def test_a_field_left_out_classified_twice_or_gone_is_named(monkeypatch):
    monkeypatch.setitem(cache_identity.HASHED, "run", ("name", "output_dir"))
    monkeypatch.setattr(cache_identity, "HASHED_ONLY_WHEN_SET",
                        (*cache_identity.HASHED_ONLY_WHEN_SET, ("sft", "max_steps"), ("sft", "old_knob")))
    assert classification_problems() == [
        "run.seed: not classified", "sft.max_steps: HASHED and HASHED_ONLY_WHEN_SET",
        "sft.old_knob: in a table, not in the config"]
    monkeypatch.undo()

    class RunWithKnob(RunConfig):  # a section gains a field nobody classified
        new_knob: int = 0

    class WithNewKnob(PipelineConfig):
        run: RunWithKnob = RunWithKnob()

    assert classification_problems(WithNewKnob) == ["run.new_knob: not classified"]


# --- the keys of the shipped configs --------------------------------------------------------

def _ref(name: str) -> ArtifactRef:
    return ArtifactRef(kind=name, path=Path("/x") / name, sha256=hashlib.sha256(name.encode()).hexdigest())


def _short(*parts) -> str:
    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()[:16]


def stage_keys(cfg: PipelineConfig, row: bool) -> dict[str, str]:
    """The config's part of every stage's cache key (`rl_run_dir`: RL's run folder; `eval_results`:
    `eval/stage.results_config` less its prompt-source digest, which follows the code)."""
    from paravt_core.miniature.pretrain import sft_replay, training_config
    from paravt_core.rl import stage as rl_stage
    from paravt_core.sft import stage as sft_stage

    keys = {"all": cfg.section_hash(), "rl,video,run": cfg.section_hash("rl", "video", "run"),
            "rl_run_dir": rl_stage.run_dir(cfg, _ref("init"), _ref("rl")).name}
    if row:
        return keys
    results = cache_identity.eval_results_settings(cfg)
    keys |= {"model": cfg.section_hash("model"), "video": cfg.section_hash("video"), "eval": cfg.section_hash("eval"),
             "sft,video,run": cfg.section_hash("sft", "video", "run"),
             "rollout_json": hashlib.sha256(cache_identity.rollout_json(cfg.rl.rollout).encode()).hexdigest()[:16],
             "sft_run_dir": sft_stage.run_dir(cfg, _ref("base"), _ref("sft"), extra=sft_replay(cfg)).name,
             "grammar": _short(*cache_identity.grammar_key_parts(cfg)),
             "eval_results": hashlib.sha256(json.dumps(results, sort_keys=True).encode()).hexdigest()[:16]}
    if cfg.model.pretrain.enabled:
        training = training_config(cfg)
        keys["pretrain"] = _short(training.section_hash("sft", "video"),
                                  cache_identity.pretrain_model_settings(training.model))
    return {name: keys[name] for name in PINNED_NAMES if name in keys}


PINNED_NAMES = ("all", "model", "video", "eval", "sft,video,run", "rl,video,run", "rollout_json", "sft_run_dir",
                "grammar", "eval_results", "pretrain", "rl_run_dir")

# Computed on main at 6a5a576 before the tables moved; the three that differ say main's value and
# test_the_keys_that_changed says why.
PINNED = {
    "paravt_8b": {
        "all": "078697fc43478a24",
        "model": "ad4ef464024eca2d",
        "video": "1b8bdaf88e4e0adb",
        "eval": "c6e450aceb048c98",
        "sft,video,run": "20136a86e987f8fa",
        "rl,video,run": "36c35c15e9603cee",
        "rollout_json": "e352a839e816bd8b",
        "sft_run_dir": "5d6c05a93fc0b86f",
        "grammar": "feff1b9dd165afeb",  # main: f504fcb1b851b6b7
        "eval_results": "10caea78d7fa9c86",
        "rl_run_dir": "paragrpo-d7a6018ad8acdeb8",
    },
    "paravt_8b+anchoring_only": {
        "all": "e68e1c280131992c",
        "rl,video,run": "b89fa527bcfd09ac",
        "rl_run_dir": "anchoring_only-06192332b2fee060",
    },
    "paravt_8b+gating_only": {
        "all": "8d6ab368cecc7eb9",
        "rl,video,run": "4018e86317599f9c",
        "rl_run_dir": "gating_only-28f0e339c0c68133",
    },
    "paravt_8b+no_penalty": {
        "all": "ade59babed416c94",
        "rl,video,run": "9ac5d3ba5217157b",
        "rl_run_dir": "no_penalty-9a608e89fead150d",
    },
    "paravt_8b+no_tool_reward": {
        "all": "9b48e01a22e80968",
        "rl,video,run": "1a460223d3f05ccd",
        "rl_run_dir": "no_tool_reward-5ab4ac2779d7fa34",
    },
    "paravt_8b+paragrpo": {
        "all": "078697fc43478a24",
        "rl,video,run": "36c35c15e9603cee",
        "rl_run_dir": "paragrpo-d7a6018ad8acdeb8",
    },
    "paravt_8b+paragrpo_ref_at_rollout_tau": {
        "all": "e17c6d57c2cb3d39",
        "rl,video,run": "69317f2c662f9ff5",
        "rl_run_dir": "paragrpo_ref_at_rollout_tau-a6787730a548adc2",
    },
    "paravt_8b+paragrpo_simple_advantage": {
        "all": "3b11e74bff6cb348",
        "rl,video,run": "f7c2bdc9b45c1e5d",
        "rl_run_dir": "paragrpo_simple_advantage-ed6df725db1a7228",
    },
    "paravt_8b+paragrpo_transcript": {
        "all": "e8c894377e1e7270",
        "rl,video,run": "0e297e1277e8e6c4",
        "rl_run_dir": "paragrpo_transcript-d79b128de26e91ac",
    },
    "paravt_8b+vanilla_grpo": {
        "all": "93006d2d995427ac",
        "rl,video,run": "9837f2150bfc4cfe",
        "rl_run_dir": "vanilla_grpo-fb18953118ebef25",
    },
    "reproduce": {
        "all": "9db7ab2bafa20691",
        "model": "239b766d13a3a63b",
        "video": "d6b24b7e6bc2b451",
        "eval": "7f00399c7538a1ed",
        "sft,video,run": "47ddff26abe297be",
        "rl,video,run": "552374f71b5eaf24",
        "rollout_json": "08a0203221414716",
        "sft_run_dir": "9eb34b73090df9cb",
        "grammar": "57fd4940e7a08b22",
        "eval_results": "2c6ea62a2811a89c",  # main: 9e1540a4ee01d00c
        "pretrain": "9e118fb990314fe1",
        "rl_run_dir": "paragrpo-cf79e3754bfffb9c",
    },
    "reproduce+anchoring_only": {
        "all": "ccdf91935d792d33",
        "rl,video,run": "f5723d349ebf4cb9",
        "rl_run_dir": "anchoring_only-11e436e471bd33d5",
    },
    "reproduce+gating_only": {
        "all": "6f02728e03c45daf",
        "rl,video,run": "11611c1472d7d805",
        "rl_run_dir": "gating_only-225cb74c3ce29e3e",
    },
    "reproduce+no_penalty": {
        "all": "05e052ca7ff63b12",
        "rl,video,run": "e1536304c05faef7",
        "rl_run_dir": "no_penalty-230a77a780cde3ad",
    },
    "reproduce+no_tool_reward": {
        "all": "ddba54b51e5a7dd7",
        "rl,video,run": "2de347d5dbea0e7d",
        "rl_run_dir": "no_tool_reward-e74217c10b4ab7d0",
    },
    "reproduce+paragrpo": {
        "all": "9db7ab2bafa20691",
        "rl,video,run": "552374f71b5eaf24",
        "rl_run_dir": "paragrpo-cf79e3754bfffb9c",
    },
    "reproduce+paragrpo_ref_at_rollout_tau": {
        "all": "dcba933ac5435477",
        "rl,video,run": "cac353928c3dbfd2",
        "rl_run_dir": "paragrpo_ref_at_rollout_tau-500cf791ad32d3f4",
    },
    "reproduce+paragrpo_simple_advantage": {
        "all": "3d5725cbdc36c39f",
        "rl,video,run": "ac447eb4fa8e877e",
        "rl_run_dir": "paragrpo_simple_advantage-39525c8d24b2a0e8",
    },
    "reproduce+paragrpo_transcript": {
        "all": "c77979141bffd839",
        "rl,video,run": "352146444a9b69e8",
        "rl_run_dir": "paragrpo_transcript-4e7308b0a5ba7ee3",
    },
    "reproduce+vanilla_grpo": {
        "all": "3dd1ed8fddaa28cb",
        "rl,video,run": "a964c8c1a41e41d9",
        "rl_run_dir": "vanilla_grpo-3897c34b5589443b",
    },
    "tiny": {
        "all": "3717119bac173713",
        "model": "94032bdbdf52ee48",
        "video": "a36bb58b997aeb87",
        "eval": "e20beac23fd3a77a",
        "sft,video,run": "0e61748dd4416797",
        "rl,video,run": "6160dc75aa3afbef",
        "rollout_json": "08a0203221414716",
        "sft_run_dir": "99a7b8b385ca9eb1",
        "grammar": "a537e35b6990148e",
        "eval_results": "85bc583caa5ee3bf",  # main: f7ade02e4924bddc
        "rl_run_dir": "paragrpo-fa01a7ba67887450",
    },
    "tiny+anchoring_only": {
        "all": "dfd340adb92118e7",
        "rl,video,run": "b9ca2b9397f5424a",
        "rl_run_dir": "anchoring_only-653ffeff6940baa5",
    },
    "tiny+gating_only": {
        "all": "5bb403238bf29002",
        "rl,video,run": "5b38d18b382a7fa8",
        "rl_run_dir": "gating_only-244fe9fd06186253",
    },
    "tiny+no_penalty": {
        "all": "f19e686a81a7dcc5",
        "rl,video,run": "63b3649bd3a55f09",
        "rl_run_dir": "no_penalty-a678b6380b45c6ef",
    },
    "tiny+no_tool_reward": {
        "all": "da05f72cc5f21560",
        "rl,video,run": "48f34f997cf61df6",
        "rl_run_dir": "no_tool_reward-d2a305b7e317249f",
    },
    "tiny+paragrpo": {
        "all": "3717119bac173713",
        "rl,video,run": "6160dc75aa3afbef",
        "rl_run_dir": "paragrpo-fa01a7ba67887450",
    },
    "tiny+paragrpo_ref_at_rollout_tau": {
        "all": "6a77ccdecd4bb290",
        "rl,video,run": "1a0539f3f59540e6",
        "rl_run_dir": "paragrpo_ref_at_rollout_tau-2497d8172cc7a066",
    },
    "tiny+paragrpo_simple_advantage": {
        "all": "b4957b7a2befae56",
        "rl,video,run": "de1c4d9d283481e3",
        "rl_run_dir": "paragrpo_simple_advantage-33a575dbd0381d7f",
    },
    "tiny+paragrpo_transcript": {
        "all": "6d272119dfd2a3c3",
        "rl,video,run": "c8d0dc4b942688f2",
        "rl_run_dir": "paragrpo_transcript-7a7b237bd02d6583",
    },
    "tiny+vanilla_grpo": {
        "all": "b2051d403d19851f",
        "rl,video,run": "486cb8197b2ea196",
        "rl_run_dir": "vanilla_grpo-2382331579e842a5",
    },
}

@pytest.mark.parametrize("name", sorted(PINNED))
def test_the_shipped_configs_keep_their_cache_keys(name: str):
    config, _, row = name.partition("+")
    rl_row = REPO / "conf/rl" / f"{row}.yaml" if row else None
    cfg = load_config(REPO / "conf/pipeline" / f"{config}.yaml", rl_row=rl_row)
    assert stage_keys(cfg, bool(row)) == PINNED[name]


def test_the_keys_that_changed():
    """eval.hf_batch_tokens was hashed only when set by `section_hash` and always by the results'
    key: one rule now, only when set, so the results of configs without it (tiny, reproduce) move
    once and the 8B config's stay. The grammar check runs the model with `model.*`'s run settings
    since #63: a config that sets one (the 8B config's vision_attention: batched) is a new key."""
    plain, budget = PipelineConfig(), PipelineConfig(eval={"hf_batch_tokens": 4096})
    assert "hf_batch_tokens" not in cache_identity.eval_results_settings(plain)["eval"]
    assert cache_identity.eval_results_settings(budget)["eval"]["hf_batch_tokens"] == 4096
    assert plain.section_hash("eval") != budget.section_hash("eval")
    batched = PipelineConfig(model={"vision_attention": "batched"})
    assert cache_identity.grammar_key_parts(batched) != cache_identity.grammar_key_parts(plain)
    assert len(cache_identity.grammar_key_parts(plain)) == 2  # as main's key: rollout JSON, video section
    # the evaluation applies model.attn_implementation since #63, hashed when not sdpa
    eager = PipelineConfig(model={"attn_implementation": "eager"})
    assert cache_identity.eval_results_settings(eager)["model_runtime"] == {"attn_implementation": "eager"}
    assert "model_runtime" not in cache_identity.eval_results_settings(batched)  # applied before #63 already
    # SFT applies the fast paths since #63: a config that sets one trains into a new run folder
    linear = PipelineConfig(model={"patch_embed": "linear"})
    assert cache_identity.sft_run_settings(linear) != cache_identity.sft_run_settings(plain)
    assert cache_identity.sft_run_settings(plain) == plain.section_hash("sft", "video", "run")
