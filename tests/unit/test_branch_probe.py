"""The branch probe (paravt_core.miniature.branch_probe): does calling a tool pay, per question."""

from __future__ import annotations

from pathlib import Path

import pytest

from paravt_core.miniature.branch_probe import (
    BranchRecord,
    ForcedFirstTurn,
    precondition,
    render,
    summarize,
)

REPO = Path(__file__).resolve().parents[2]


class _Echo:
    """Continues every request with two tokens: its prompt length and the budget it was given."""

    def __init__(self):
        self.calls = []

    def generate(self, requests, params):
        from paravt_core.agent.engine import Generation

        self.calls.append(([list(r.prompt_ids) for r in requests], params.max_new_tokens))
        return [Generation([len(r.prompt_ids), params.max_new_tokens], [-0.5, -0.5], "stop") for r in requests]


def test_the_first_call_continues_after_the_forced_tokens_and_later_calls_pass_through():
    from paravt_core.agent.engine import GenerationRequest, SamplingParams

    inner = _Echo()
    engine = ForcedFirstTurn(inner, [7, 8, 9])
    first = engine.generate([GenerationRequest([1, 2]), GenerationRequest([3])], SamplingParams(max_new_tokens=10))
    assert inner.calls[0] == ([[1, 2, 7, 8, 9], [3, 7, 8, 9]], 7)  # forced tokens in the prompt, out of the budget
    assert [g.token_ids for g in first] == [[7, 8, 9, 5, 7], [7, 8, 9, 4, 7]]  # the turn holds them first
    assert first[0].logprobs == [0.0, 0.0, 0.0, -0.5, -0.5] and engine.forced_requests == 2
    later = engine.generate([GenerationRequest([1])], SamplingParams(max_new_tokens=10))
    assert inner.calls[1] == ([[1]], 10) and later[0].token_ids == [1, 10]
    with pytest.raises(ValueError, match="leaves no room"):
        ForcedFirstTurn(_Echo(), [1, 2, 3]).generate([GenerationRequest([1])], SamplingParams(max_new_tokens=3))


def _record(k: int, crop: float, skip: float, crop_fmt: float = 1.0, skip_fmt: float = 1.0) -> BranchRecord:
    return BranchRecord("q", k, {"crop": crop, "skip": skip}, {"crop": crop_fmt, "skip": skip_fmt},
                        {"crop": crop_fmt, "skip": skip_fmt}, {"crop": 2.0, "skip": 0.0})


def test_the_precondition_checks_each_threshold_at_its_k():
    # K=2: skip worse on 4 of 5; K=6: skip as good on 2 of 5; crop format failures 0.2 above skip's at both
    records = [_record(2, 1.0, 0.5, 0.8) for _ in range(4)] + [_record(2, 0.5, 0.5, 0.8)]
    records += [_record(6, 1.0, 1.0, 0.8) for _ in range(2)] + [_record(6, 1.0, 0.2, 0.8) for _ in range(3)]
    small, large = summarize(records)
    assert (small.nframes, small.skip_worse, large.nframes, large.skip_as_good) == (2, 0.8, 6, 0.4)
    assert small.format_failures == pytest.approx({"crop": 0.2, "skip": 0.0})
    assert [ok for _, ok in precondition([small, large])] == [True, True, True]
    # one question less where skipping is as good at K=6, and no format gap at K=2: two checks fail
    fewer = [r for r in records if not (r.nframes == 6 and r.reward["skip"] == 1.0)][:-1] + [_record(6, 1.0, 1.0, 0.8)]
    fewer = [(_record(2, r.reward["crop"], r.reward["skip"]) if r.nframes == 2 else r) for r in fewer]
    checks = precondition(summarize(fewer))
    assert [ok for _, ok in checks] == [False, True, False]
    assert "does NOT hold" in render(summarize(fewer)) and "| 6 | 3 |" in render(summarize(fewer))


def test_records_split_by_whether_the_k_frames_show_the_event():
    from paravt_core.eval.samples import EvalSample
    from paravt_core.miniature.branch_probe import render_by_shown, shown_on_overview

    # two videos of 20 frames: one with its event on frames 8-11 (K=2 takes 0 and 19; K=6 takes 8),
    # one with its event on frames 1-2 (on no K=2 or K=6 frame)
    manifest = {"eval": {"val": {"videos": [
        {"file_name": "a.mp4", "video": {"n_frames": 20, "events": [{"start_frame": 8, "end_frame": 12}]}},
        {"file_name": "b.mp4", "video": {"n_frames": 20, "events": [{"start_frame": 1, "end_frame": 3}]}}]}}}
    samples = [EvalSample(id=i, split="val", video_path=Path(f"/media/{i}.mp4"), question="q", answer="A", kind="mcq", options=("x", "y"))
               for i in ("a", "b")]
    shown = shown_on_overview(samples, manifest, "val", [2, 6])
    assert shown == {("a", 2): False, ("a", 6): True, ("b", 2): False, ("b", 6): False}
    records = [BranchRecord(i, k, {"crop": 1.0, "skip": 1.2 if shown[(i, k)] else 0.2}, {"crop": 1.0, "skip": 1.0},
                            {"crop": 1.0, "skip": 1.0}, {"crop": 2.0, "skip": 0.0}) for i in ("a", "b") for k in (2, 6)]
    table = render_by_shown(records, shown)
    assert "| 2 | no | 2 | 0.0 |" in table and "| 6 | yes | 1 | 100.0 |" in table and "| 6 | no | 1 | 0.0 |" in table
    assert table.index("| 2 | no") < table.index("| 6 | yes")  # ordered by K
    with pytest.raises(ValueError, match="no evaluation split 'test'"):
        shown_on_overview(samples, manifest, "test", [2])
    with pytest.raises(ValueError, match="not in the world's manifest"):
        shown_on_overview([samples[0], EvalSample(id="c", split="val", video_path=Path("c.mp4"), question="q",
                                                  answer="A", kind="mcq", options=("x", "y"))], manifest, "val", [2])


def test_grpo_push_counts_the_sign_of_each_rollout_against_its_group_not_the_size_of_the_gap():
    from paravt_core.miniature.branch_probe import grpo_push

    # Skips always right (R 1.0); a crop right (1.6: R_tool's 0.1 + 0.5) 11 times in 20, else wrong (0.1).
    # The mean favours skipping (0.925 < 1.0), yet with few crops per group each one is
    # ±(G-1)/sqrt(G) against equal skips, so right crops (more than half) push towards cropping.
    crop = [1.6] * 11 + [0.1] * 9
    assert sum(crop) / len(crop) < 1.0
    assert grpo_push(crop, [1.0], 0.1, 8) > 0
    # right 8 times in 20: both views favour skipping
    assert grpo_push([1.6] * 8 + [0.1] * 12, [1.0], 0.1, 8) < 0
    # with about half the group cropping, two crop rewards meet in a group more often and the margin shrinks
    assert grpo_push(crop, [1.0], 0.5, 8) < grpo_push(crop, [1.0], 0.1, 8)
    # one branch better in every sample pushes its way at every π; equal branches do not push
    for p in (0.1, 0.5, 0.9):
        assert grpo_push([1.2, 1.1], [0.2, 0.3], p, 4) > 0 and grpo_push([0.2], [1.0, 0.9], p, 4) < 0
        assert grpo_push([1.0], [1.0], p, 4) == 0.0
    assert grpo_push(crop, [1.0], 0.3, 8, seed=3) == grpo_push(crop, [1.0], 0.3, 8, seed=3)
    for bad in (dict(crop=[], skip=[1.0], p_crop=0.5, group_size=4), dict(crop=[1.0], skip=[1.0], p_crop=1.0, group_size=4),
                dict(crop=[1.0], skip=[1.0], p_crop=0.5, group_size=1)):
        with pytest.raises(ValueError):
            grpo_push(**bad)


def test_push_rows_compare_the_mean_with_the_push_per_k_and_shown(tmp_path, capsys):
    import argparse
    import json
    from dataclasses import asdict

    from paravt_core.miniature import cli
    from paravt_core.miniature.branch_probe import push_rows, render_push

    def record(i: str, k: int, crop: list[float], skip: list[float]) -> BranchRecord:
        mean = {"crop": sum(crop) / len(crop), "skip": sum(skip) / len(skip)}
        return BranchRecord(i, k, mean, {"crop": 1.0, "skip": 1.0}, {"crop": 1.0, "skip": 1.0}, {"crop": 2.0, "skip": 0.0},
                            samples={"crop": tuple(crop), "skip": tuple(skip)})

    split = [1.6] * 11 + [0.1] * 9  # the mean favours skipping, the push at a small π cropping
    records = [record("a", 6, split, [1.0]), record("b", 6, [0.1], [1.0]), record("c", 2, [1.6], [0.1])]
    shown = {("a", 6): True, ("b", 6): True, ("c", 2): False}
    rows = push_rows(records, [0.1], 8, shown)
    assert [(r.nframes, r.shown, r.questions) for r in rows] == [(2, False, 1), (6, True, 2)]
    assert rows[1].skip_by_mean == 1.0 and rows[1].skip_by_push == {0.1: 0.5} and rows[0].skip_by_push == {0.1: 0.0}
    assert "| 6 | yes | 2 | 100.0 | 50.0 |" in render_push(rows, 8)
    assert [r.shown for r in push_rows(records, [0.1], 8)] == [None, None]
    with pytest.raises(ValueError, match="probe again"):
        push_rows([_record(6, 1.0, 1.0)], [0.1], 8)

    saved = tmp_path / "branch.json"
    saved.write_text(json.dumps({"records": [asdict(r) for r in records],
                                 "shown": [{"sample_id": i, "nframes": k, "shown": v} for (i, k), v in shown.items()]}))
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["miniature", "branch-push", "--config", str(REPO / "conf/pipeline/tiny.yaml"),
                              "--from", str(saved), "--push-p", "0.1", "--group-size", "8"])
    assert args.func(args) == 0 and "| 6 | yes | 2 | 100.0 | 50.0 |" in capsys.readouterr().out
    saved.write_text(json.dumps({"records": [{"sample_id": "q"}]}))
    assert args.func(args) == 2 and "not a branch probe's --out file" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.parametrize("think_prefix", [True, False])  # False: vanilla GRPO's rollouts, `<think>` forced too
def test_both_branches_are_rolled_out_on_the_tiny_model_and_scored(tmp_path, tiny_model_dir, think_prefix):
    from tests.conftest import write_mcq_split

    from paravt_core.agent.hf_engine import HFEngine
    from paravt_core.config import load_config
    from paravt_core.eval.prepared import load_split_file
    from paravt_core.miniature.branch_probe import branch_records
    from paravt_core.model.loading import load_model, load_processor

    split_json = write_mcq_split(tmp_path, ["Which colour is first?"])
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", ["eval.max_new_tokens=48", "rl.rollout.subagent_max_new_tokens=4",
                                                          f"rl.rollout.think_prefix={str(think_prefix).lower()}"])
    processor = load_processor(tiny_model_dir)
    engine = HFEngine(load_model(tiny_model_dir, "float32", "cpu").eval(), processor)
    openings = {"crop": "Short events are easy to miss.", "skip": "The overview frames should be enough."}
    (record,) = branch_records(engine, processor, cfg, load_split_file(split_json), samples=2, k=2, openings=openings)
    assert set(record.reward) == set(record.fmt) == set(record.calls) == {"crop", "skip"} and record.nframes == 2
    assert {b: len(v) for b, v in record.samples.items()} == {"crop": 2, "skip": 2}  # each episode's reward, for grpo_push
    assert record.reward["crop"] == pytest.approx(sum(record.samples["crop"]) / 2)
    # a random model writes no well-formed answer after either opening
    assert all(0.0 <= v <= 1.0 for v in record.fmt.values()) and all(v == 0.0 for v in record.in_format.values())


def test_the_probe_rolls_out_with_the_rl_rows_knobs_not_the_evaluations():
    from paravt_core.config import load_config
    from paravt_core.eval.prompting import rollout_config
    from paravt_core.miniature.branch_probe import probe_rollout

    cfg = load_config(REPO / "conf/pipeline/reproduce.yaml", [], REPO / "conf/rl/vanilla_grpo.yaml")
    # vanilla GRPO's rollouts have no think prefix; the evaluation's force one, which the generated
    # scope does not score (SPEC §4.5), so probing with them under-scored vanilla's format
    assert probe_rollout(cfg) == cfg.rl.rollout and probe_rollout(cfg).think_prefix is False
    assert rollout_config(cfg.eval, "agentic_general", cfg.rl.rollout).think_prefix is True


def test_an_rl_row_is_named_or_given_as_a_file():
    from paravt_core.config import ConfigError, load_config, rl_row_file
    from paravt_core.miniature.branch_probe import scored_under

    config = REPO / "conf/pipeline/reproduce.yaml"
    assert rl_row_file(config, "paragrpo") == REPO / "conf/rl/paragrpo.yaml"
    assert rl_row_file(config, REPO / "conf/rl/vanilla_grpo.yaml") == REPO / "conf/rl/vanilla_grpo.yaml"
    para, vanilla = load_config(config, [], "paragrpo"), load_config(config, [], "vanilla_grpo")
    assert para == load_config(config, [], REPO / "conf/rl/paragrpo.yaml") and para.rl.row == "paragrpo"
    assert (vanilla.rl.row, vanilla.rl.reward.anchor_weight, vanilla.rl.rollout.think_prefix) == (
        "vanilla_grpo", 0.0, False)
    assert "RL row paragrpo: reward scope generated" in scored_under(para) and "in the prompt" in scored_under(para)
    assert "written by the model" in scored_under(vanilla)
    with pytest.raises(ConfigError, match="no_such_row.yaml does not exist"):
        load_config(config, [], "no_such_row")


@pytest.mark.integration
def test_each_rl_row_scores_the_probes_episodes_with_its_own_reward(tmp_path, tiny_model_dir, monkeypatch):
    """#62: the branch probe under PARA-GRPO's reward (generated scope, think prefix in the prompt)
    against vanilla's, on the same tiny model, questions and seed."""
    from tests.conftest import write_mcq_split

    import paravt_core.agent.rollout as rollout
    from paravt_core.agent.hf_engine import HFEngine
    from paravt_core.config import load_config
    from paravt_core.eval.prepared import load_split_file
    from paravt_core.miniature.branch_probe import branch_records
    from paravt_core.model.loading import load_model, load_processor
    from paravt_core.rewards import accuracy_reward, extract_answer, format_reward, has_answer, tool_reward

    split_json = write_mcq_split(tmp_path, ["Which colour is first?"])
    processor = load_processor(tiny_model_dir)
    engine = HFEngine(load_model(tiny_model_dir, "float32", "cpu").eval(), processor)
    # the skip plan answers at once, so a skip episode holds an answer whatever the random model adds
    openings = {"crop": "Short events are easy to miss.", "skip": "The frames show it.</think>\n<answer>A</answer>"}
    played = []
    real = rollout.run_episodes

    def run_and_keep(*args, **kwargs):
        episodes = real(*args, **kwargs)
        played.append(episodes)
        return episodes

    monkeypatch.setattr(rollout, "run_episodes", run_and_keep)
    records = {}
    for row in ("paragrpo", "vanilla_grpo"):
        cfg = load_config(REPO / "conf/pipeline/tiny.yaml", ["eval.max_new_tokens=48", "rl.rollout.max_new_tokens=24",
                                                              "rl.rollout.subagent_max_new_tokens=4"], row)
        played.clear()
        (records[row],) = branch_records(engine, processor, cfg, load_split_file(split_json), samples=3, k=2,
                                         openings=openings)
        knobs = cfg.rl.reward
        for branch, episodes in zip(openings, played):
            texts = [e.text("generated") for e in episodes]
            # the row's reward by its definition (SPEC §4): R_acc + R_fmt (the row's knobs) + R_tool
            fmt = [format_reward(t, answer_suffix=knobs.answer_suffix, anchor_weight=knobs.anchor_weight,
                                 unclosed_think_penalty=knobs.unclosed_think_penalty) for t in texts]
            assert records[row].terms[branch]["format"] == pytest.approx(sum(fmt) / len(fmt))
            acc = [accuracy_reward(extract_answer(t), "A", "mcq") for t in texts]
            expected = [a + f + tool_reward(t, a) for a, f, t in zip(acc, fmt, texts)]
            assert records[row].samples[branch] == pytest.approx(tuple(expected))
            if row == "paragrpo":  # the prefix is in the prompt: no <think> is scored, anchoring never fires
                assert all(not t.startswith("<think>") for t in texts)
                assert [f for f, t in zip(fmt, texts) if "<think>" not in t] == [
                    0.5 * has_answer(t) for t in texts if "<think>" not in t]
            else:  # vanilla writes the prefix itself (forced here), and it is scored
                assert all(t.startswith("<think>\n") for t in texts)
    # the same right skip: PARA-GRPO's R_fmt is 0.5 (the answer's tags), vanilla's more (its <think> counts)
    assert records["paragrpo"].terms["skip"]["acc"] == records["vanilla_grpo"].terms["skip"]["acc"] == 1.0
    assert records["paragrpo"].terms["skip"]["format"] < records["vanilla_grpo"].terms["skip"]["format"]
