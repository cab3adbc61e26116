"""The sampled held-out probe (paravt_core.miniature.heldout_probe): per-question κ and format."""

from __future__ import annotations

from pathlib import Path

import pytest

from paravt_core.miniature.heldout_probe import per_question

REPO = Path(__file__).resolve().parents[2]


def test_episodes_are_averaged_per_question_in_prompt_major_order():
    result = per_question(["a", "b"], [0, 2, 3, 3], [1.0, 0.5, 0.0, 0.0], samples=2)
    assert result.calls == {"a": 1.0, "b": 3.0}
    assert result.fmt == {"a": 0.75, "b": 0.0}
    with pytest.raises(ValueError, match="3 episodes for 2 questions x 2 samples"):
        per_question(["a", "b"], [0, 1, 2], [0.0, 0.0, 0.0], samples=2)


class _Scripted:
    """The main agent's first turn is scripted per question (by the question's text): no call
    and a well-formed answer, or two crop calls; everything else runs on the tiny model."""

    def __init__(self, engine, tokenizer, first_turns: dict[str, str]):
        self.engine, self.tokenizer, self.first_turns = engine, tokenizer, first_turns
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, requests, params):
        from paravt_core.agent.engine import Generation

        out = []
        for request in requests:
            text = self.tokenizer.decode(request.prompt_ids)
            turns = text.count("<|im_start|>assistant")
            scripted = [t for key, t in self.first_turns.items() if key in text]
            if turns == 1 and scripted and "concise, factual summary" not in text:
                ids = self.tokenizer(scripted[0], add_special_tokens=False)["input_ids"] + [self.end]
                out.append(Generation(ids, [-1.0] * len(ids), "stop"))
            else:
                out.append(self.engine.generate([request], params)[0])
        return out


@pytest.mark.integration
def test_the_probe_counts_each_questions_calls_and_scores_its_format_over_its_samples(tmp_path, tiny_model_dir):
    from tests.conftest import write_mcq_split

    from paravt_core.agent.hf_engine import HFEngine
    from paravt_core.config import load_config
    from paravt_core.data.synth.traces import tool_call_block
    from paravt_core.eval.prepared import load_split_file
    from paravt_core.miniature.heldout_probe import probe_episodes
    from paravt_core.model.loading import load_model, load_processor
    from paravt_core.rewards import format_reward

    split_json = write_mcq_split(tmp_path, ["Which colour is first?", "Which shape is last?"])
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", ["eval.max_new_tokens=12", "rl.rollout.subagent_max_new_tokens=6"])
    answered = "The overview answers this.\n</think>\n<answer>A</answer>"
    crops = "Two windows need a closer look.\n</think>\n" + "\n".join(tool_call_block("v1.mp4", w) for w in ((0.0, 4.0), (4.0, 8.0)))
    processor = load_processor(tiny_model_dir)
    engine = _Scripted(HFEngine(load_model(tiny_model_dir, "float32", "cpu").eval(), processor), processor.tokenizer,
                       {"Which colour is first?": answered, "Which shape is last?": crops})
    questions = load_split_file(split_json)

    result = probe_episodes(engine, processor, cfg, questions, samples=2, k=2, seed=0)
    first, second = (q.id for q in questions)
    assert result.calls == {first: 0.0, second: 2.0}  # both samples of each question, as scripted
    assert result.fmt[first] == format_reward("<think>\n" + answered, answer_suffix=True, anchor_weight=0.5) == 1.0
    assert 0.0 <= result.fmt[second] < 1.0  # the random model's final turn is no well-formed answer


def test_the_command_names_the_split_to_prepare_when_it_is_missing(tmp_path, tiny_model_dir, capsys):
    from paravt_core.cli import main

    code = main(["miniature", "sampled-probe", "--config", str(REPO / "conf/pipeline/tiny.yaml"),
                 "--set", f"run.output_dir={tmp_path}", "--model", str(tiny_model_dir)])
    assert code == 2
    err = capsys.readouterr().err
    assert "no prepared split 'videomme'" in err and "run the data stage" in err


def test_probe_file_is_read_back_under_its_fingerprint_and_sampled_again_otherwise(tmp_path, monkeypatch):
    """What `tasks.miniature.sampled_probe` keeps: a resumed reproduction whose task cache is
    gone reads a finished probe back, but never one of another model or other settings."""
    import json

    from paravt_core.config import load_config
    from paravt_core.miniature import heldout_probe
    from paravt_core.miniature.heldout_probe import ProbeResult, probe_frames, probe_to_file

    cfg = load_config(str(REPO / "conf/pipeline/reproduce.yaml"), ["reproduce.probe.questions=2",
                                                                   "reproduce.probe.samples=3"])
    calls = []

    def fake_sampled_probe(model_dir, cfg, split_json, questions, samples, k, temperature, seed):
        calls.append((questions, samples, k, temperature, seed))
        return ProbeResult({"q0": float(len(calls)), "q1": 0.0}, {"q0": 1.0, "q1": 0.5})

    monkeypatch.setattr(heldout_probe, "sampled_probe", fake_sampled_probe)
    out = tmp_path / "probe" / "sft-abc.json"
    first = probe_to_file(tmp_path / "model", cfg, tmp_path / "split.json", out, "fp-1")
    assert calls == [(2, 3, probe_frames(cfg), 0.7, 0)] and probe_frames(cfg) == max(cfg.rl.gating.choices)
    kept = json.loads(out.read_text())
    assert kept["kappa"] == 0.5 and kept["format"] == 0.75 and kept["fingerprint"] == "fp-1"
    assert probe_to_file(tmp_path / "model", cfg, tmp_path / "split.json", out, "fp-1") == first
    assert len(calls) == 1  # read back
    second = probe_to_file(tmp_path / "model", cfg, tmp_path / "split.json", out, "fp-2")
    assert len(calls) == 2 and second.calls["q0"] == 2.0  # another fingerprint: sampled again
    out.write_text("{not json")
    probe_to_file(tmp_path / "model", cfg, tmp_path / "split.json", out, "fp-2")
    assert len(calls) == 3  # a damaged file is sampled again, not trusted


def test_the_reproduction_refuses_a_probe_split_it_does_not_prepare(tmp_path):
    from pydantic import ValidationError

    from flows.reproduce import ReproduceParams

    with pytest.raises(ValidationError, match="reproduce.probe.split is 'videomme_val'"):
        ReproduceParams(config_path=str(REPO / "conf/pipeline/reproduce.yaml"),
                        overrides=[f"run.output_dir={tmp_path}", "eval.splits=[videomme]",
                                   "reproduce.probe.split=videomme_val"])
    ReproduceParams(config_path=str(REPO / "conf/pipeline/reproduce.yaml"),
                    overrides=[f"run.output_dir={tmp_path}", "eval.splits=[videomme]",
                               "reproduce.probe.split=videomme_val", "reproduce.probe.enabled=false"])
