"""The opening probe (paravt_core.miniature.opening_probe): its openings are the teacher's, its
summaries are pure, and its teacher-forced context is the one the evaluation decodes from."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from paravt_core.miniature.opening_probe import (
    CROP_OPENINGS,
    GREEDY_TOKENS,
    OPENINGS,
    OTHER,
    OpeningRecord,
    crop_share,
    followed_opening,
    is_crop,
    render_tables,
    summarize,
    teacher_openings,
)

REPO = Path(__file__).resolve().parents[2]


def _first_think(text: str) -> str:
    assert text.startswith("<think>\n"), text[:40]
    return text.removeprefix("<think>\n")


@pytest.mark.parametrize("style", ["shared", "own_token"])
def test_every_opening_is_how_a_teacher_trace_of_its_kind_begins(style):
    from paravt_core.config import load_config
    from paravt_core.data.synth.questions import background_question, event_question
    from paravt_core.data.synth.traces import direct_trace, no_tool_trace, tool_trace, unlooked_trace
    from paravt_core.data.synth.world import sample_video, youtube_like_id

    synth = load_config(REPO / "conf/pipeline/reproduce.yaml", [f"data.synth.crop_opening={style}"]).data.synth
    openings = teacher_openings(style)
    crop_names = [name for name in openings if is_crop(name)]
    seen = set()
    for seed in range(40):
        rng = random.Random(seed)
        spec = sample_video(rng, synth, youtube_like_id(rng))
        question = event_question(rng, spec, 0, "mcq")
        trace = tool_trace(rng, spec, question, "v.mp4", synth.max_calls_per_trace, synth.max_crop_s,
                           crop_opening=synth.crop_opening)
        crop = [name for name in crop_names if _first_think(trace.first_turn).startswith(openings[name])]
        assert len(crop) == 1, trace.first_turn[:120]
        seen.add(crop[0])
        unlooked = _first_think(unlooked_trace(spec, question).final_turn)
        assert unlooked.startswith(openings["no crop: enough"])
        background = background_question(rng, spec, "mcq")
        background_think = _first_think(no_tool_trace(spec, background).final_turn)
        assert background_think.startswith(openings["no crop: background"])
        direct = [_first_think(direct_trace(spec, question, hidden=h).final_turn) for h in (True, False)]
        if style == "own_token":  # the first word of a crop plan opens no think that does not crop
            first_word = {_first_think(trace.first_turn).split()[0]}
            assert first_word == {"Short"}
            assert all(text.split()[0] not in first_word for text in (unlooked, background_think, *direct))
    assert seen == set(crop_names)  # both crop openings are drawn by the teacher


def test_a_greedy_continuation_follows_the_opening_it_shares_the_most_tokens_with():
    openings = {"crop": [5, 6, 7, 8], "skip": [5, 9, 10], "short": [11, 12]}
    assert followed_opening([5, 6, 7, 1], openings) == "crop"
    assert followed_opening([5, 9, 10, 2], openings) == "skip"
    assert followed_opening([11, 12], openings) == "short"  # all of an opening shorter than MIN_FOLLOWED
    assert followed_opening([5, 6, 1], openings) == OTHER  # two tokens are not a decision
    assert followed_opening([], openings) == OTHER


def _record(group: str, k: int, logps: dict[str, tuple[float, ...]], greedy: str = OTHER) -> OpeningRecord:
    return OpeningRecord("q", group, k, (("The", 0.5),), logps, greedy, "")


def test_crop_share_is_the_crop_openings_share_of_the_openings_probability_even_when_each_is_tiny():
    logps = {"crop: depends": (-800.0,), "crop: easy to miss": (-800.0,), "no crop: enough": (-800.0 + math.log(2),),
             "no crop: background": (-1e9,)}
    share, mass = crop_share(_record("first wording", 2, logps))
    assert share == pytest.approx(0.5)  # exp(-800) underflows to 0: the share is taken relative to the largest
    assert mass == 0.0


def test_summaries_are_per_k_and_wording_with_an_all_row_and_the_tables_show_them():
    even = {name: (math.log(0.5), math.log(0.5)) for name in OPENINGS}
    crops = {name: ((0.0, 0.0) if name in CROP_OPENINGS else (math.log(1e-6), 0.0)) for name in OPENINGS}
    records = [_record("first wording", 2, crops, "crop: depends"), _record("second wording", 2, even),
               _record("second wording", 6, even, "no crop: enough")]
    summaries = summarize(records)
    assert list(summaries) == [(2, "all"), (2, "first wording"), (2, "second wording"), (6, "all"),
                               (6, "second wording")]
    assert summaries[(2, "first wording")].crop_share == pytest.approx(2 / (2 + 2e-6))
    assert summaries[(2, "second wording")].crop_share == pytest.approx(0.5)
    assert summaries[(2, "all")].questions == 2
    assert summaries[(2, "all")].greedy == {"crop: depends": 1, OTHER: 1}
    assert summaries[(6, "all")].along["no crop: enough"] == pytest.approx((0.5, 0.5))
    assert summaries[(2, "first wording")].first_token["no crop: enough"] == pytest.approx(1e-6)
    table = render_tables(summaries)
    assert "| 2 | 1 | first wording | 1.000 |" in table
    assert "| 6 | no crop: enough | 0.500 | 0.500 |" in table
    with pytest.raises(ValueError, match="no probe records"):
        summarize([])


@pytest.mark.integration
def test_the_probe_forces_the_openings_after_the_context_the_evaluation_decodes_from(tmp_path, tiny_model_dir):
    """The probe's greedy decoding and its teacher forcing read the same context: forcing the
    greedy tokens gives the engine's own log-probs, and the top first token is the greedy one."""
    from tests.conftest import write_mcq_split

    from paravt_core.config import load_config
    from paravt_core.miniature.opening_probe import probe_split

    split_json = write_mcq_split(tmp_path, ["What year is shown?", "What is the colour of the star in this video?"])
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml")

    first = probe_split(tiny_model_dir, cfg, split_json, [2], rows=2, log_line=lambda _: None)
    assert [(r.group, r.nframes) for r in first] == [("first wording", 2), ("second wording", 2)]
    assert all(len(r.along) == len(OPENINGS) and len(r.first_tokens) == 5 for r in first)
    for r in first:
        assert r.greedy_text.startswith(r.first_tokens[0][0])  # greedy takes the most likely first token

    # The evaluator's own path (run_episodes, greedy, the eval rollout knobs) on the same question
    # at the same K decodes the same first tokens: the probe's context is the evaluation's.
    from paravt_core.agent.hf_engine import HFEngine
    from paravt_core.agent.rollout import run_episodes
    from paravt_core.eval.prepared import load_split_file
    from paravt_core.eval.prompting import episode_prompt, prompt_mode_for, rollout_config
    from paravt_core.model.loading import load_model, load_processor

    processor = load_processor(tiny_model_dir)
    engine = HFEngine(load_model(tiny_model_dir, dtype="float32", device="cpu").eval(), processor)
    samples = load_split_file(split_json)
    mode = prompt_mode_for(samples[0], cfg.eval)
    prompts = [episode_prompt(s, mode, cfg.eval.dispatch, 2) for s in samples]
    # its first generation only: the random model never ends a turn, so the budget ends the episode
    knobs = rollout_config(cfg.eval, mode, cfg.rl.rollout).model_copy(update={"max_new_tokens": GREEDY_TOKENS})
    episodes = run_episodes(engine, processor, prompts, knobs, cfg.video, temperature=0.0,
                            tool_mode=cfg.eval.tool_mode)
    from contextlib import ExitStack

    import torch

    from paravt_core.miniature.opening_probe import evaluation_requests

    with ExitStack() as stack:
        requests, _ = evaluation_requests(processor, cfg, samples, 2, stack)
    for record, episode, request in zip(first, episodes, requests):
        generated_from = int(episode.loss_mask.nonzero()[0])  # ids before it: the prompt and the think prefix
        assert request.prompt_ids == episode.token_ids[:generated_from].tolist()
        assert torch.equal(request.vision.pixel_values, episode.vision.pixel_values)
        assert torch.equal(request.vision.image_grid_thw, episode.vision.image_grid_thw)
        generated = episode.token_ids[episode.loss_mask.bool()].tolist()
        assert generated[:len(record.greedy_token_ids)] == list(record.greedy_token_ids)

    # Force the greedy text itself: the probe must call it followed and give it the log-probs
    # decoding gave (same context, same model) within float noise.
    tokenizer = processor.tokenizer
    text = first[0].greedy_text
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text and len(ids) >= 3
    again = probe_split(tiny_model_dir, cfg, split_json, [2], rows=1, openings={"greedy": text},
                        log_line=lambda _: None)
    assert again[0].greedy == "greedy"
    # the openings are forced side by side in one left-padded forward: each gives what it gives alone
    alone = probe_split(tiny_model_dir, cfg, split_json, [2], rows=1, log_line=lambda _: None,
                        openings={"crop: depends": OPENINGS["crop: depends"]})
    assert alone[0].along["crop: depends"] == pytest.approx(first[0].along["crop: depends"], abs=1e-4)
    forced = again[0].along["greedy"]
    assert forced == pytest.approx(first[0].greedy_logprobs[:len(forced)], abs=1e-4)
    assert math.exp(forced[0]) == pytest.approx(again[0].first_tokens[0][1], rel=1e-5)


def test_the_command_names_the_split_to_prepare_when_it_is_missing(tmp_path, tiny_model_dir, capsys):
    from paravt_core.cli import main

    code = main(["miniature", "opening-probe", "--config", str(REPO / "conf/pipeline/tiny.yaml"),
                 "--set", f"run.output_dir={tmp_path}", "--model", str(tiny_model_dir)])
    assert code == 2
    err = capsys.readouterr().err
    assert "no prepared split 'videomme_val'" in err and "run the data stage" in err
