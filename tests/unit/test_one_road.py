"""One road from the config to the runtime objects (issue #63 item 2): every stage builds its model
with `model.loading.build_model` and its `hf` engine with `agent.hf_build.build_hf_engine`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from paravt_core.agent.hf_build import build_hf_engine, prefill_budget
from paravt_core.agent.hf_engine import HFEngine
from paravt_core.agent.prompts import EpisodePrompt
from paravt_core.config import PipelineConfig, load_config
from paravt_core.model.loading import build_model, runnable_attention

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "conf/pipeline/tiny.yaml"
# The one place each is called from (the builders); tests may call them directly.
BUILDERS = {"load_model": {"paravt_core/model/loading.py"}, "HFEngine": {"paravt_core/agent/hf_build.py"}}
# Every run setting away from its default (causal_rows applies to sdpa, the default attention).
FAST = ["model.vision_attention=batched", "model.vision_dedupe=always", "model.patch_embed=linear",
        "model.prefill_attention=causal_rows"]


def direct_calls(root: Path, folders: tuple[str, ...] = ("paravt_core", "tasks", "flows")) -> list[str]:
    """`file:line name` of every call of a builder's primitive outside its builder."""
    found = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), relative)):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
                if name in BUILDERS and relative not in BUILDERS[name]:
                    found.append(f"{relative}:{node.lineno} {name}")
    return found


def run_settings(model) -> dict[str, str]:
    """How a loaded tiny Qwen3-VL runs, read off its modules (`model/vision_attention.py`, `fast_paths.py`)."""
    from paravt_core.model.fast_paths import _causal_rows_text_forward, _linear_patch_embed
    from paravt_core.model.vision_attention import _batched_forward

    def bound(module, forward) -> bool:
        return getattr(module.forward, "__func__", None) is forward

    inner = model.model
    return {"attn_implementation": model.config._attn_implementation,
            "vision_attention": "batched" if bound(inner.visual.blocks[0].attn, _batched_forward) else "per_item",
            "vision_dedupe": getattr(inner, "_paravt_vision_dedupe", "never"),
            "patch_embed": "linear" if bound(inner.visual.patch_embed.proj, _linear_patch_embed) else "conv",
            "prefill_attention": ("causal_rows" if bound(inner.language_model.layers[0].self_attn,
                                                         _causal_rows_text_forward) else "masked")}


def test_no_stage_loads_a_model_or_builds_an_hf_engine_but_through_the_builders():
    assert direct_calls(REPO) == []


def test_the_scan_finds_a_direct_call(tmp_path: Path):
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "probe.py").write_text(
        "from paravt_core.model import loading\n\n\ndef f(d):\n    return loading.load_model(d)\n")
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "engine.py").write_text("def g(m, p):\n    return HFEngine(m, p)\n")
    assert direct_calls(tmp_path, ("tasks", "flows")) == ["tasks/probe.py:5 load_model", "flows/engine.py:2 HFEngine"]


def test_build_model_applies_every_run_setting_of_the_config(tiny_model_dir: Path):
    fast = load_config(TINY, FAST).model
    assert run_settings(build_model(fast, tiny_model_dir)) == {
        "attn_implementation": "sdpa", "vision_attention": "batched", "vision_dedupe": "always",
        "patch_embed": "linear", "prefill_attention": "causal_rows"}
    # the defaults are the stock paths (vision_dedupe no_grad: deduplicates outside autograd only)
    assert run_settings(build_model(PipelineConfig().model, tiny_model_dir)) == {
        "attn_implementation": "sdpa", "vision_attention": "per_item", "vision_dedupe": "no_grad",
        "patch_embed": "conv", "prefill_attention": "masked"}
    eager = load_config(TINY, ["model.attn_implementation=eager"]).model
    assert run_settings(build_model(eager, tiny_model_dir))["attn_implementation"] == "eager"


def test_flash_attention_runs_where_cuda_runs_it():
    assert runnable_attention("flash_attention_2", "cuda:0", None) == "flash_attention_2"
    assert runnable_attention("flash_attention_2", "cpu", {"zero_optimization": {"stage": 3}}) == "flash_attention_2"
    assert runnable_attention("flash_attention_2", "cpu", None) == "sdpa"
    assert runnable_attention("eager", "cpu", None) == "eager"


class _Generated(Exception):
    """Raised by the recording `generate`: the test needs the engine, not the episodes."""


def test_the_grammar_check_runs_the_model_as_the_config_says(monkeypatch, tiny_model_dir, short_video):
    """The grammar check loaded its model without `model.*`'s run settings until #63 (model/loading.py
    promises every stage runs the vision tower the same way)."""
    from paravt_core.sft.grammar import grammar_report

    seen = []

    def recording(self, requests, params):
        seen.append((run_settings(self.model), self.max_batch_tokens))
        raise _Generated

    monkeypatch.setattr(HFEngine, "generate", recording)
    cfg = load_config(TINY, [*FAST, "eval.hf_batch_tokens=4096"])
    prompt = EpisodePrompt("q1", short_video, ({"role": "user", "content": [{"type": "video"},
                                                                          {"type": "text", "text": "Why?"}]},), tools=())
    with pytest.raises(_Generated):
        grammar_report(tiny_model_dir, [prompt], cfg)
    assert seen == [(run_settings(build_model(cfg.model, tiny_model_dir)), 4096)]
    assert seen[0][0]["vision_attention"] == "batched"


def test_the_prefill_budget_is_the_evaluations_and_never_a_rollouts(tiny_model):
    cfg = load_config(TINY, ["eval.hf_batch_tokens=4096"])
    assert prefill_budget(cfg, "evaluation") == 4096 and prefill_budget(cfg, "rollout") is None
    assert prefill_budget(PipelineConfig(), "evaluation") is None

    class Processor:  # what HFEngine reads of a processor
        class tokenizer:  # noqa: N801
            pad_token_id, eos_token_id = 0, 1

    assert build_hf_engine(cfg, tiny_model, Processor, "evaluation").max_batch_tokens == 4096
    assert build_hf_engine(cfg, tiny_model, Processor, "rollout").max_batch_tokens is None
    # rl.shared_prefix prefills a group's repeated prompt once in the rollouts (and their
    # replay), never in an evaluation-like engine; off by default
    shared = load_config(TINY, ["rl.shared_prefix=true"])
    assert [build_hf_engine(c, tiny_model, Processor, use).share_prompts
            for c in (cfg, shared) for use in ("evaluation", "rollout")] == [False, False, False, True]
    with pytest.raises(ValueError, match="not 'grammar'"):
        prefill_budget(cfg, "grammar")


def test_the_plan_sizes_the_hf_generate_calls_with_the_engines_budget(monkeypatch):
    from paravt_core import plan

    asked = []
    monkeypatch.setattr(plan, "prefill_budget", lambda cfg, use: asked.append(use) or 1234)
    cfg = load_config(REPO / "conf/pipeline/paravt_8b.yaml", ["eval.engine=hf", "eval.endpoint=null"])
    stages = [s for s in plan.memory_plan(cfg, plan.QWEN3_VL_8B, 8, 79 * plan.GIB).stages if "(hf)" in s.stage]
    assert [s.stage for s in stages] == ["SFT grammar check (hf)", "evaluation (hf)"] and asked == ["evaluation"]
    assert all("eval.hf_batch_tokens 1234" in s.note for s in stages)
