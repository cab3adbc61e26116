"""The second wording of event questions and the cold-start teacher that seldom looks when
asked so (`SynthConfig.second_wording`, `second_wording_look`; #15)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from paravt_core.data.synth import SynthConfig
from paravt_core.data.synth.benchmarks import build_eval_split
from paravt_core.data.synth.generate import train_videos
from paravt_core.data.synth.paravt import rl_rows, teacher_traces
from paravt_core.data.synth.questions import QUESTION_TEMPLATES, second_wording_text
from paravt_core.data.synth.traces import no_tool_trace, unlooked_trace

BASE = dict(
    seed=5, train_videos=40, eval_videos_per_split=40, eval_rows_per_split=40, min_duration_s=36, max_duration_s=46,
    sft_traces_per_video=4, rl_prompts_per_video=3, no_tool_share=0.1, direct_share=0.15, prompts="eval",
    max_calls_per_trace=3, teacher_windows="cover", question_topics=("colour",), event_kinds=("shape",),
    max_events=1, colours=("blue", "green", "red", "yellow"), option_order="canonical", rl_overview_share=0.2,
)


def _config(**knobs) -> SynthConfig:
    return SynthConfig(**{**BASE, **knobs})


def _event_traces(cfg: SynthConfig):
    return [t for _, t in teacher_traces(cfg, train_videos(cfg)) if t.question.event_index is not None]


def _first_wording(text: str) -> bool:
    """BASE asks only the colour of shape events."""
    first = QUESTION_TEMPLATES["shape"]["colour"]
    head, tail = first.split("{obj}")
    return text.startswith(head) and text.endswith(tail)


def test_off_by_default_every_question_keeps_its_first_wording():
    cfg = _config()
    assert cfg.second_wording == 0 and cfg.second_wording_look == 1
    questions = [t.question for t in _event_traces(cfg)] + build_eval_split(cfg, "videomme").questions
    assert questions and all(q.wording == 0 and _first_wording(q.text) for q in questions)


def test_the_share_is_drawn_in_sft_rl_and_evaluation_questions():
    cfg = _config(second_wording=0.5)
    for questions in ([t.question for t in _event_traces(cfg)],
                      [q for q in build_eval_split(cfg, "videomme").questions if q.event_index is not None]):
        second = [q for q in questions if q.wording]
        assert 0.3 < len(second) / len(questions) < 0.7
        assert all(q.text.endswith("in this video?") and not _first_wording(q.text) for q in second)
        assert all(_first_wording(q.text) for q in questions if not q.wording)
    asked = [json.loads(r["extra_info"])["question"] for r in rl_rows(cfg, train_videos(cfg))]
    assert any(q.startswith("What is the colour of the ") for q in asked)
    assert any(q.startswith("What colour was ") for q in asked)


def test_second_wording_never_names_the_asked_value():
    cfg = _config(second_wording=1.0)
    traces = _event_traces(cfg)
    assert traces
    for trace in traces:
        question = trace.question
        assert question.wording == 1 and question.answer_text not in question.text
    for video in train_videos(cfg):
        event = video.spec.events[0]
        assert event.colour not in second_wording_text(event, "colour")


@pytest.mark.parametrize("look", [0.0, 1.0])
def test_the_teacher_looks_in_the_second_wording_only_as_often_as_asked(look: float):
    cfg = _config(second_wording=0.5, second_wording_look=look)
    agentic = [t for t in _event_traces(cfg) if not t.direct]
    first = [t for t in agentic if not t.question.wording]
    second = [t for t in agentic if t.question.wording]
    assert first and second
    assert all(t.calls and t.first_turn for t in first)  # the first wording is always looked into
    assert all(bool(t.calls) is bool(look) for t in second)
    for trace in second:
        assert trace.final_turn.endswith(f"<answer>{trace.question.answer}</answer>")  # right by luck, and kept


def test_a_third_of_second_wording_rows_look_and_the_draw_is_stable():
    cfg = _config(train_videos=120, second_wording=0.5, second_wording_look=1 / 3)
    second = [t for t in _event_traces(cfg) if not t.direct and t.question.wording]
    looked = sum(bool(t.calls) for t in second) / len(second)
    assert 0.2 < looked < 0.47
    again = [t for t in _event_traces(cfg) if not t.direct and t.question.wording]
    assert [bool(t.calls) for t in again] == [bool(t.calls) for t in second]


def test_unlooked_trace_answers_without_a_call_and_with_the_tool_traces_conclusion():
    cfg = _config(second_wording=1.0, second_wording_look=0.0)
    video = train_videos(cfg)[0]
    traces = [t for v, t in teacher_traces(cfg, [video]) if t.question.event_index is not None and not t.direct]
    trace = traces[0]
    assert trace.first_turn is None and trace.calls == () and trace.tool_responses == ()
    assert "No crop is needed." in trace.final_turn and "So the answer is" in trace.final_turn
    background = [t for v, t in teacher_traces(_config(no_tool_share=1.0, direct_share=0.0), [video])][0]
    with pytest.raises(ValueError, match="background questions take no_tool_trace"):
        unlooked_trace(video.spec, background.question)
    assert no_tool_trace(video.spec, background.question).first_turn is None


def test_a_look_share_without_second_wording_is_a_clear_error():
    with pytest.raises(ValidationError, match="set second_wording > 0"):
        _config(second_wording_look=0.5)


def test_wording_of_tells_every_template_of_either_wording():
    from paravt_core.data.synth.questions import EVENT_TOPICS
    from paravt_core.miniature.measurements import wording_of
    from paravt_core.data.synth.world import Event

    for kind, templates in QUESTION_TEMPLATES.items():
        assert all(wording_of(t.format(obj="the star")) == 0 for t in templates.values())
        event = Event(kind=kind, start_frame=10, end_frame=30, fps=10.0, colour="red", shape="star",
                      position="centre", digit=3 if kind == "digit" else None,
                      direction="left to right" if kind == "motion" else None)
        assert all(wording_of(second_wording_text(event, topic)) == 1 for topic in EVENT_TOPICS[kind])
