"""The generated world's knobs for the miniature reproduction (#15): perceivable topics only,
teacher crops that cover the video, sub-agent SFT rows and overview-answerable RL prompts."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from paravt_core.agent.prompts import subagent_instruction
from paravt_core.data.synth import PARQUET_REPO, SynthConfig, generate_world
from paravt_core.data.synth.paravt import RL_FILE
from paravt_core.data.synth.traces import segment_grid, summarize_window

KNOBS = SynthConfig(
    seed=3,
    train_videos=8,
    eval_videos_per_split=3,
    eval_rows_per_split=6,
    min_duration_s=34,
    max_duration_s=46,
    width=64,
    height=64,
    sft_traces_per_video=3,
    rl_prompts_per_video=3,
    no_tool_share=0.0,
    max_calls_per_trace=3,
    question_topics=("colour", "position"),
    teacher_windows="cover",
    subagent_traces_per_video=4,
    rl_overview_share=0.25,
    event_kinds=("shape",),
    max_events=2,
    prompts="eval",
    direct_share=0.25,
    final_reasoning="relevant",
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return generate_world(KNOBS, tmp_path_factory.mktemp("knobs"), progress=False)


@pytest.fixture(scope="module")
def videos(world) -> dict[str, dict]:
    return {v["sentinel"]: v["video"] for v in json.loads(world.manifest.read_text())["train"]}


def _sft_rows(world) -> list[dict]:
    repo = world.repos[PARQUET_REPO]
    return [row for path in repo.files if path.startswith("sft/") for row in pq.read_table(repo.folder / path).to_pylist()]


def _text(message: dict) -> str:
    return "".join(item["text"] for item in message["content"] if item["type"] == "text")


def test_cover_needs_enough_calls_for_the_longest_video():
    with pytest.raises(ValidationError, match="teacher_windows cover"):
        SynthConfig(**{**KNOBS.model_dump(), "max_duration_s": 60.0})
    with pytest.raises(ValidationError, match="question_topics"):
        SynthConfig(question_topics=("colour", "smell"))


def test_subagent_rows_show_grid_windows_then_random_ones_with_their_summary(world, videos):
    rows = [r for r in _sft_rows(world) if r["messages"][0]["role"] == "user"]
    assert len(rows) == KNOBS.train_videos * KNOBS.subagent_traces_per_video
    with_events, by_video = 0, {}
    for row in rows:
        user, assistant = row["messages"]
        (crop,) = [item for item in user["content"] if item["type"] == "video_url"]
        start, end = crop["video_start"], crop["video_end"]
        video = videos[row["videos"][0]]
        by_video.setdefault(row["videos"][0], []).append((start, end))
        assert crop["video_url"]["url"] == row["videos"][0]
        assert _text(user) == subagent_instruction(start, end)
        assert 0 <= start < end <= video["n_frames"] / video["fps"] and end - start <= KNOBS.max_crop_s
        events = [e for e in video["events"] if e["start_s"] < end and e["end_s"] > start]
        with_events += bool(events)
        summary = _text(assistant)
        assert ("Nothing notable" in summary) == (not events)
        for event in events:
            assert event["colour"] in summary
    for sentinel, windows in by_video.items():
        grid = _grid(videos[sentinel])
        assert sorted(windows[: len(grid)]) == grid  # every grid segment, then random windows
        assert len(set(windows)) == len(windows)
    assert with_events >= len(rows) // 2


def _grid(video: dict) -> list[tuple[int, int]]:
    from paravt_core.data.synth.world import Background, VideoSpec

    spec = VideoSpec("v", video["n_frames"], video["fps"], 64, 64, Background("grey", "left", 100, ()), ())
    return segment_grid(spec, int(KNOBS.max_crop_s))


def test_cover_traces_crop_every_segment_and_ask_only_allowed_topics(world, videos):
    traces = [r for r in _sft_rows(world) if r["messages"][0]["role"] == "system"]
    tool_traces = [r for r in traces if len(r["messages"]) > 3]
    assert tool_traces
    for row in tool_traces:
        video = videos[row["videos"][0]]
        calls = [json.loads(block.split("</tool_call>")[0])["arguments"]
                 for block in _text(row["messages"][2]).split("<tool_call>")[1:]]
        assert [(c["start_time"], c["end_time"]) for c in calls] == _grid(video)
        question = _text(row["messages"][1])
        assert any(word in question for word in ("What colour", "Where in the frame")), question


def test_rows_ask_as_the_evaluation_does_and_direct_rows_have_no_tools(world, videos):
    from paravt_core.eval.prompting import AGENTIC_MODES, DIRECT_MCQ_INSTRUCTION, DIRECT_SYSTEM, system_text

    traces = [r for r in _sft_rows(world) if r["messages"][0]["role"] == "system"]
    direct = [r for r in traces if _text(r["messages"][0]) == DIRECT_SYSTEM]
    agentic = [r for r in traces if _text(r["messages"][0]) == system_text("agentic_general")]
    assert "agentic_general" in AGENTIC_MODES and len(direct) + len(agentic) == len(traces)
    assert len(direct) == round(KNOBS.direct_share * KNOBS.train_videos * KNOBS.sft_traces_per_video)
    for row in direct:
        assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
        user = _text(row["messages"][1])
        assert "video path" not in user
        assert user.endswith(DIRECT_MCQ_INSTRUCTION) or "Answer with a short word or phrase." in user
    for row in agentic:
        user = _text(row["messages"][1])
        name = row["videos"][0].rsplit("/", 1)[1]
        assert user.endswith(f" The video path for this video is: {name}")


def test_event_kinds_restrict_the_events(videos):
    assert {e["kind"] for v in videos.values() for e in v["events"]} == {"shape"}
    assert any(len(v["events"]) == 2 for v in videos.values())


def test_rl_prompts_mix_overview_and_event_questions(world):
    rows = pq.read_table(world.repos[PARQUET_REPO].folder / RL_FILE).to_pylist()
    questions = [json.loads(r["extra_info"])["question"] for r in rows]
    background = [q for q in questions if "background" in q]
    assert len(background) == round(KNOBS.rl_overview_share * KNOBS.train_videos * KNOBS.rl_prompts_per_video)
    events = [q for q in questions if q not in background]
    assert events and all(q.startswith(("What colour", "Where in the frame")) for q in events)


def test_eval_questions_ask_only_allowed_topics(world):
    from paravt_core.data.synth.benchmarks import LAYOUTS

    layout = LAYOUTS["videomme"]
    snapshot = world.repos[layout.repo_id].folder
    rows = [row for path in world.repos[layout.repo_id].files if path.endswith(".parquet")
            for row in pq.read_table(snapshot / path).to_pylist()]
    assert rows and all(r["question"].startswith(("What colour", "Where in the frame")) for r in rows)


def test_summaries_match_the_rows(world, videos):
    """The summary a sub-agent row trains on is the one the teacher traces quote as a tool response."""
    from paravt_core.data.synth.world import Background, Event, VideoSpec

    for row in _sft_rows(world):
        if row["messages"][0]["role"] != "user":
            continue
        video = videos[row["videos"][0]]
        events = tuple(Event(**{k: e[k] for k in ("kind", "start_frame", "end_frame", "fps", "colour", "shape",
                                                   "position", "digit", "direction")}) for e in video["events"])
        spec = VideoSpec("v", video["n_frames"], video["fps"], 64, 64, Background("grey", "left", 100, ()), events)
        crop = row["messages"][0]["content"][0]
        summary = summarize_window(spec, crop["video_start"], crop["video_end"])
        if "Nothing notable" not in summary:
            assert _text(row["messages"][1]) == summary


def test_relevant_final_reasoning_quotes_only_the_crop_showing_the_asked_object():
    import random

    from paravt_core.data.synth.questions import event_question
    from paravt_core.data.synth.traces import tool_trace
    from paravt_core.data.synth.world import Background, Event, VideoSpec

    events = (Event("shape", 10, 14, 2.0, "red", "circle", "centre"), Event("shape", 70, 74, 2.0, "blue", "star", "top left"))
    spec = VideoSpec("v", 90, 2.0, 64, 64, Background("grey", "left", 100, ()), events)
    question = event_question(random.Random(0), spec, 1, "mcq", topic="colour")
    full = tool_trace(random.Random(0), spec, question, "v.mp4", 3, 16.0, cover=True)
    short = tool_trace(random.Random(0), spec, question, "v.mp4", 3, 16.0, cover=True, final_reasoning="relevant")
    assert full.calls == short.calls == ((0, 16), (16, 32), (32, 45))
    assert full.final_turn.count("reports:") == 3
    assert short.final_turn.count("reports:") == 1 and "00:32.0 to 00:45.0 reports: From 00:35.0" in short.final_turn
    assert "red" not in short.final_turn and short.final_turn.endswith(f"<answer>{question.answer}</answer>")


def test_event_final_reasoning_names_the_asked_event_without_windows_or_times():
    import random

    from paravt_core.data.synth.questions import event_question
    from paravt_core.data.synth.traces import tool_trace
    from paravt_core.data.synth.world import Background, Event, VideoSpec

    events = (Event("shape", 10, 14, 2.0, "red", "circle", "centre"), Event("shape", 70, 74, 2.0, "blue", "star", "top left"))
    spec = VideoSpec("v", 90, 2.0, 64, 64, Background("grey", "left", 100, ()), events)
    question = event_question(random.Random(0), spec, 1, "mcq", topic="colour")
    trace = tool_trace(random.Random(0), spec, question, "v.mp4", 3, 16.0, cover=True, final_reasoning="event")
    reasoning = trace.final_turn.split("So the answer is", 1)[0]
    assert reasoning == "<think>\nA crop reports that a blue star appears in the top left corner. "
    assert "red" not in trace.final_turn and trace.final_turn.endswith(f"<answer>{question.answer}</answer>")
    assert trace.tool_responses[1] == "Nothing notable happens in this window: only the plain background is visible."


def test_direct_trace_names_the_asked_object_as_the_question_does():
    """A direct-mode trace never names the answer before giving it: the event is named by what
    the question says of it ("the star"), not by its label ("the blue star")."""
    import random

    from paravt_core.data.synth.questions import event_question
    from paravt_core.data.synth.traces import direct_trace
    from paravt_core.data.synth.world import Background, Event, VideoSpec

    events = (Event("shape", 70, 74, 2.0, "blue", "star", "top left"),)
    spec = VideoSpec("v", 90, 2.0, 64, 64, Background("blue", "left", 100, ()), events)
    for topic, named, answer_word in (("colour", "the star", "blue"), ("shape", "the blue object", "star")):
        question = event_question(random.Random(0), spec, 0, "oe", topic=topic)
        reasoning = direct_trace(spec, question).final_turn.split("</think>", 1)[0]
        assert f"; {named} is not in them." in reasoning
        assert answer_word not in reasoning.replace(named, "")


def test_perception_windows_follow_the_manifest(world, tmp_path):
    from paravt_core.miniature.perception import window_truths

    record = json.loads(world.manifest.read_text())
    videos = record["eval"]["videomme"]["videos"][:2]
    for video in videos:
        (tmp_path / video["file_name"]).write_bytes(b"")
    truths = window_truths(world.manifest, "videomme", tmp_path, KNOBS.max_crop_s, max_videos=2)
    assert {t.video.name for t in truths} == {v["file_name"] for v in videos}
    for t in truths:
        video = next(v["video"] for v in videos if v["file_name"] == t.video.name)
        start, end = t.window
        assert t.colours == tuple(e["colour"] for e in video["events"] if e["start_s"] < end and e["end_s"] > start)
        assert t.positions == tuple(e["position"] for e in video["events"] if e["start_s"] < end and e["end_s"] > start)
    assert any(t.colours for t in truths) and any(not t.colours for t in truths)
    with pytest.raises(ValueError, match="no evaluation split 'nope'"):
        window_truths(world.manifest, "nope", tmp_path, KNOBS.max_crop_s, max_videos=2)
    (tmp_path / videos[0]["file_name"]).unlink()
    with pytest.raises(FileNotFoundError, match="run the data stage"):
        window_truths(world.manifest, "videomme", tmp_path, KNOBS.max_crop_s, max_videos=2)


@pytest.mark.parametrize("answer_index", [0, 2, 3])
def test_mcq_conclusions_read_the_options_in_order_up_to_the_answer(answer_index: int):
    """The letter is never looked up behind its option text: each option line is read, set
    beside the value (spelled as the option spells it) and judged, and the letter copied from
    the line that matched."""
    from paravt_core.data.synth.questions import Question
    from paravt_core.data.synth.traces import check_options, conclusion

    options = ("Top left", "Bottom right", "Centre", "Top right")
    letter = "ABCD"[answer_index]
    question = Question(video_id="v", qtype="mcq", topic="position", text="Where?", answer=letter,
                        answer_text=options[answer_index].lower(), options=options, event_index=0)
    value = options[answer_index]
    checks = " ".join(f"{x}. {o} vs {value}: {'same' if x == letter else 'different'}."
                      for x, o in zip("ABCD", options[:answer_index + 1]))
    assert check_options(question) == f"Checking the options: {checks} So the answer is option {letter}."
    assert conclusion(question, None).startswith(f"So the answer is {options[answer_index]}. Checking the options: A. ")
