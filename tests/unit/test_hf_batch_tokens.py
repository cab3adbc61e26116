"""eval.hf_batch_tokens reaches the `hf` engine of both its readers: the SFT grammar check and
the `hf` evaluation (issue #44 item 6; the split itself: tests/integration/test_rollout.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from paravt_core.agent.hf_engine import HFEngine
from paravt_core.agent.prompts import EpisodePrompt
from paravt_core.config import load_config
from paravt_core.refs import ArtifactRef, content_hash

TINY = Path(__file__).resolve().parents[2] / "conf/pipeline/tiny.yaml"


class _Generated(Exception):
    """Raised by the recording `generate`: the test needs the engine, not the episodes."""


def test_the_grammar_check_generates_under_the_token_budget(monkeypatch, tiny_model_dir, short_video):
    from paravt_core.sft.grammar import grammar_report

    budgets = []

    def recording(self, requests, params):
        budgets.append(self.max_batch_tokens)
        raise _Generated

    monkeypatch.setattr(HFEngine, "generate", recording)
    cfg = load_config(TINY, ["eval.hf_batch_tokens=4096"])
    prompt = EpisodePrompt("q1", short_video, ({"role": "user", "content": [{"type": "video"},
                                                                          {"type": "text", "text": "Why?"}]},), tools=())
    with pytest.raises(_Generated):
        grammar_report(tiny_model_dir, [prompt], cfg)
    assert budgets == [4096]


@pytest.mark.parametrize("budget", [None, 4096])
def test_the_hf_evaluation_generates_under_the_token_budget(tiny_model_dir, budget):
    from paravt_core.eval import stage as eval_stage

    cfg = load_config(TINY, ["eval.engine=hf", f"eval.hf_batch_tokens={'null' if budget is None else budget}"])
    model = ArtifactRef(kind="model", path=tiny_model_dir, sha256=content_hash(tiny_model_dir))
    runner = eval_stage.open_runner(cfg, model)
    assert isinstance(runner.engine, HFEngine) and runner.engine.max_batch_tokens == budget
