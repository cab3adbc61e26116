"""World version 3's teacher (#46 item 2): rows carry the overview budget K the teacher read, the
teacher says only what those K frames show, the sub-agent it distils is sometimes wrong, and the
pretraining corpus teaches reading an overview."""

from __future__ import annotations

import collections
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from paravt_core.config import load_config
from paravt_core.data.synth import paravt as P
from paravt_core.data.synth.traces import SEEN_OPENING, Reporter, event_clause
from paravt_core.data.synth.world import derived_rng, event_on_overview, sample_video, youtube_like_id
from paravt_core.sft.encode import ConversationError

REPO = Path(__file__).resolve().parents[2]
WORLD3 = ["data.synth.teacher_budgets=[2,3,4,6]", "data.synth.second_wording_look=1.0",
          "data.synth.crop_opening=own_token", "data.synth.subagent_error_rate=0.6",
          "data.synth.visible_event_share=0.7", "data.synth.skip_when_seen=0.3", "model.pretrain.overview_rows=2",
          "data.synth.direct_check=false"]
# World version 2 (the reproduce config's world before version 3c became its default): no overview teacher.
WORLD2 = ["data.synth.teacher_budgets=null", "data.synth.second_wording_look=0.5", "data.synth.crop_opening=shared",
          "data.synth.subagent_error_rate=0.0", "data.synth.visible_event_share=0.5", "data.synth.skip_when_seen=1.0",
          "model.pretrain.overview_rows=0", "data.synth.direct_check=false"]


def _world3(*extra: str):
    return load_config(REPO / "conf/pipeline/reproduce.yaml", [*WORLD3, *extra])


def _world2(*extra: str):
    return load_config(REPO / "conf/pipeline/reproduce.yaml", [*WORLD2, *extra])


def _videos(synth, n: int = 120) -> list[P.TrainVideo]:
    videos = []
    for i in range(n):
        rng = derived_rng(synth.seed, "test-world3", i)
        spec = sample_video(rng, synth, youtube_like_id(rng))
        videos.append(P.TrainVideo(spec, P.sentinel_path("selfqa", spec.video_id)))
    return videos


def test_every_main_agent_row_reads_its_own_budget_and_says_only_what_those_frames_show():
    synth = _world3().data.synth
    kinds = collections.Counter()
    for video, trace in P.teacher_traces(synth, _videos(synth)):
        assert trace.nframes in synth.teacher_budgets
        assert P.sft_messages(trace, video, synth.prompts)[1]["content"][0]["nframes"] == trace.nframes
        if trace.question.event_index is None:
            kinds["background"] += 1
            continue
        event = video.spec.events[trace.question.event_index]
        shown = event_on_overview(video.spec, event, trace.nframes)
        think = trace.final_turn.removeprefix("<think>\n")
        if trace.calls:  # cropped: where the frames miss the event, or by habit where they show it
            kinds["crop, shown" if shown else "crop, not shown"] += 1
        elif trace.direct:
            kinds["direct"] += 1
            assert think.startswith(SEEN_OPENING if shown else "The overview frames show only the plain background")
        else:  # answered from the overview: only where the event is on the K frames, named as it is
            assert shown, (video.spec.video_id, trace.nframes)
            assert think.startswith(f"{SEEN_OPENING} {event_clause(event)}.")
            assert trace.question.answer in trace.final_turn
            kinds["seen"] += 1
    # every kind of row is written (a world where each is drawn)
    assert set(kinds) == {"background", "crop, shown", "crop, not shown", "direct", "seen"}, kinds
    # skip_when_seen 0.3: most slots whose frames show the event still crop
    assert 0.15 < kinds["seen"] / (kinds["seen"] + kinds["crop, shown"]) < 0.45, kinds


def test_the_teacher_reports_a_wrong_colour_at_the_error_rate_and_answers_by_its_report():
    synth = _world3().data.synth
    reporter = Reporter.of(synth)
    videos = _videos(synth, 300)
    events = [(v.spec, e) for v in videos for e in v.spec.events]
    wrong = [reporter.event(spec, e).colour != e.colour for spec, e in events]
    assert 0.5 < sum(wrong) / len(wrong) < 0.7  # 0.6
    assert all(reporter.event(spec, e) == reporter.event(spec, e) for spec, e in events)  # stable
    assert all(reporter.event(spec, e).colour in synth.colours for spec, e in events)
    followed = 0
    for video, trace in P.teacher_traces(synth, videos):
        if not trace.calls:
            continue
        event = video.spec.events[trace.question.event_index]
        reported = reporter.event(video.spec, event)
        # the tool responses that hold the event name the reported colour, the answer is its option
        holding = [r for r in trace.tool_responses if reported.label in r]
        assert holding and not any(f"{event.label} " in r for r in trace.tool_responses if reported != event)
        assert trace.question.answer_text == reported.colour
        question = trace.question
        if question.qtype == "mcq":
            assert question.options[question.letters.index(question.answer)].lower() == reported.colour
        else:
            assert question.answer.lower() == reported.colour
        followed += reported != event
    assert followed > 0
    # the sub-agent's own rows report as the main agent's tool responses do
    for video in videos[:40]:
        for window in P.subagent_windows(synth, video):
            summary = P.subagent_sft_row(video, window, reporter)["messages"][1]["content"][0]["text"]
            for event in video.spec.events:
                if event.start_s < window[1] and event.end_s > window[0]:
                    assert reporter.event(video.spec, event).label in summary


def test_direct_rows_whose_frames_show_the_event_end_with_the_option_check_when_asked():
    """`data.synth.direct_check`: the shown direct rows end as the agentic skips do, the answer
    named and the options checked; every other row is the row version 3 wrote."""
    plain, checked = _world3().data.synth, _world3("data.synth.direct_check=true").data.synth
    videos = _videos(plain)
    before, after = P.teacher_traces(plain, videos), P.teacher_traces(checked, videos)
    assert [v.spec.video_id for v, _ in before] == [v.spec.video_id for v, _ in after]
    changed = 0
    for (video, old), (_, new) in zip(before, after, strict=True):
        event_index = new.question.event_index
        shown = event_index is not None and event_on_overview(video.spec, video.spec.events[event_index], new.nframes)
        if not (new.direct and shown):
            assert new == old
            continue
        think = new.final_turn.removeprefix("<think>\n")
        assert think.startswith(f"{SEEN_OPENING} {event_clause(video.spec.events[event_index])}.")
        assert not new.calls and new.nframes == old.nframes and new.question == old.question
        if new.question.qtype == "mcq":
            assert f"So the answer is option {new.question.answer}.\n</think>" in new.final_turn, new.final_turn
            assert "Checking the options:" in new.final_turn and "Checking the options:" not in old.final_turn
        assert new.final_turn.endswith(f"<answer>{new.question.answer}</answer>")
        changed += 1
    assert changed > 5  # the world draws such rows


def test_no_error_rate_and_no_budgets_write_the_rows_they_always_wrote():
    synth = _world2().data.synth
    assert Reporter.of(synth).event(*_first_event(synth)) == _first_event(synth)[1]
    traces = P.teacher_traces(synth, _videos(synth, 30))
    assert all(t.nframes is None for _, t in traces)
    rows = [P.sft_row(t, v, synth.prompts) for v, t in traces]
    assert all("nframes" not in row["messages"][1]["content"][0] for row in rows)


def _first_event(synth):
    video = _videos(synth, 1)[0]
    return video.spec, video.spec.events[0]


def test_the_budget_survives_the_shard_and_wins_over_the_sft_draw(monkeypatch):
    from paravt_core.sft import dataset as D

    synth = _world3().data.synth
    video, trace = next((v, t) for v, t in P.teacher_traces(synth, _videos(synth, 10)) if t.nframes)
    table = pq.read_table(io.BytesIO(P.parquet_bytes([P.sft_row(trace, video, synth.prompts)], P.SFT_SCHEMA)))
    messages = table.to_pylist()[0]["messages"]
    assert D.row_budget(messages) == trace.nframes
    assert D.row_budget(json.loads(json.dumps(messages))) == trace.nframes  # the pretraining corpus's JSON cells

    seen = []

    class Cache:
        sampling = D.FrameSampling(fps=1.0, max_frames=6, min_pixels=784, max_pixels=12288)

        def load(self, path, window=None, max_frames=None):
            seen.append(max_frames)
            raise D.VideoDecodeError(path, "not decoded in this test")

    data = D.SFTDataset([{"source": "paravt_sft_selftrace.parquet:0", "messages": messages}], processor=None,
                        cache=Cache(), overlong=D.OverlongPolicy(2048, "skip"), frame_choices=(2, 3, 4, 6))
    assert data.encode(0) is None and seen == [trace.nframes]


@pytest.mark.parametrize("value,match", [(0, "positive"), (2.5, "positive"), ("4", "positive"), (True, "positive")])
def test_a_bad_budget_is_refused_naming_the_value(value, match):
    from paravt_core.sft.dataset import row_budget

    with pytest.raises(ConversationError, match=match):
        row_budget([{"role": "user", "content": [{"type": "video_url", "nframes": value}]}])
    with pytest.raises(ConversationError, match="different nframes"):
        row_budget([{"role": "user", "content": [{"type": "video_url", "nframes": 2},
                                                 {"type": "video_url", "nframes": 4}]}])


def test_the_contract_checks_the_budget():
    from data_contracts.rules import _content_item_problem

    item = {"type": "video_url", "video_url": {"url": "file:///x.mp4"}}
    assert _content_item_problem({**item, "nframes": 4}) is None
    assert _content_item_problem({**item, "nframes": None}) is None
    assert "positive whole number" in _content_item_problem({**item, "nframes": 0})
    assert "positive whole number" in _content_item_problem({**item, "nframes": 2.5})
    assert "on a window" in _content_item_problem({**item, "nframes": 4, "video_start": 0.0, "video_end": 4.0})


def test_the_config_refuses_what_the_overview_teacher_cannot_write():
    with pytest.raises(ValueError, match="second_wording_look"):
        _world3("data.synth.second_wording_look=0.5")
    with pytest.raises(ValueError, match="sft_max_frames"):
        _world3("data.synth.teacher_budgets=[2,8]")
    with pytest.raises(ValueError, match="reading_transcripts"):
        _world3("model.pretrain.reading_transcripts=0.2")
    with pytest.raises(ValueError, match="overview_rows 5: .* there are 4"):  # never a silent cap
        _world3("model.pretrain.overview_rows=5")
    assert _world3("model.pretrain.overview_rows=4").model.pretrain.overview_rows == 4
    with pytest.raises(ValueError, match="skip_when_seen"):
        _world2("data.synth.skip_when_seen=0.5")
    with pytest.raises(ValueError, match="direct_check"):
        _world2("data.synth.direct_check=true")
    with pytest.raises(ValueError, match="exactly 4 colours"):
        _world2("data.synth.subagent_error_rate=0.2", "data.synth.colours=[blue,green,red,yellow,purple]")
    # the new knobs at their defaults leave every cache key as it was
    # (tiny.yaml leaves them unset; the reproduce config now sets them, version 3c)
    plain = load_config(REPO / "conf/pipeline/tiny.yaml")
    explicit = load_config(REPO / "conf/pipeline/tiny.yaml", [
        "data.synth.skip_when_seen=1.0", "data.synth.subagent_error_rate=0.0", "model.pretrain.overview_rows=0",
        "data.synth.direct_check=false"])
    assert plain.section_hash("data", "model") == explicit.section_hash("data", "model")
    from paravt_core.cache_identity import HASHED_ONLY_WHEN_SET

    assert {("data.synth", "teacher_budgets"), ("data.synth", "skip_when_seen"), ("data.synth", "subagent_error_rate"),
            ("model.pretrain", "overview_rows"), ("data.synth", "direct_check")} <= set(HASHED_ONLY_WHEN_SET)
    assert _world3().section_hash("data", "model") != _world2().section_hash("data", "model")
    assert _world3("data.synth.direct_check=true").section_hash("data") != _world3().section_hash("data")


def test_overview_rows_caption_what_the_k_frames_show(tmp_path):
    from paravt_core.miniature.pretrain import OVERVIEW_REQUEST, overview_caption, overview_row, overview_row_budgets

    cfg = _world3()
    synth = cfg.data.synth
    shown_rows = blank_rows = 0
    for video in _videos(synth, 60):
        spec = video.spec
        budgets = overview_row_budgets(derived_rng(0, "t", spec.video_id), cfg, spec)
        assert len(budgets) == len(set(budgets)) == 2 and set(budgets) <= set(synth.teacher_budgets)
        for k in budgets:
            caption = overview_caption(spec, k)
            shown = [e for e in spec.events if event_on_overview(spec, e, k)]
            if shown:
                shown_rows += 1
                assert caption == f"{SEEN_OPENING} {event_clause(shown[0])}."
            else:
                blank_rows += 1
                assert caption.startswith("The overview frames show only the plain") and "background" in caption
            row = overview_row(tmp_path / "v.mp4", k, caption)
            assert row["messages"][0]["content"][0]["nframes"] == k
            assert row["messages"][0]["content"][1]["text"] == OVERVIEW_REQUEST
    assert shown_rows > 30 and blank_rows > 10  # half the draws aim at budgets that show the event


@pytest.mark.parametrize("k", [2, 3, 4, 6])
def test_the_frames_sft_decodes_at_a_rows_budget_are_the_ones_the_teacher_judged(tmp_path, k):
    """The teacher says what the pipeline's K overview frames show (`event_on_overview`); SFT must
    decode those very frames from the rendered video, or its traces are false."""
    from paravt_core.data.synth.render import encode_mp4
    from paravt_core.sft.dataset import FrameCache, FrameSampling
    from paravt_core.video.sampling import overview_frame_indices

    cfg = _world3()
    spec = _videos(cfg.data.synth, 1)[0].spec
    path = tmp_path / "v.mp4"
    path.write_bytes(encode_mp4(spec, cfg.data.synth.codec))
    video = cfg.video
    cache = FrameCache(tmp_path / "cache", FrameSampling(fps=video.sft_fps, max_frames=video.sft_max_frames,
                                                          min_pixels=video.min_pixels, max_pixels=video.max_pixels))
    frames, meta = cache.load(path, None, max_frames=k)
    assert len(frames) == k
    assert list(meta.frames_indices) == overview_frame_indices(spec.n_frames, k)


def test_pa_schema_has_the_budget_field():
    assert P.SFT_SCHEMA.field("messages").type.value_type.field("content").type.value_type.field("nframes").type \
        == pa.int64()


def test_the_probes_force_the_skip_plan_this_teacher_writes():
    from paravt_core.miniature.opening_probe import config_openings, is_crop, skip_opening

    cfg = _world3()
    openings = config_openings(cfg)
    assert skip_opening(cfg) == "no crop: seen" and "no crop: enough" not in openings
    skip = openings["no crop: seen"]
    firsts = collections.Counter()
    for video, trace in P.teacher_traces(cfg.data.synth, _videos(cfg.data.synth, 60)):
        think = (trace.first_turn or trace.final_turn).removeprefix("<think>\n")
        if trace.calls:
            assert any(think.startswith(openings[n]) for n in openings if is_crop(n))
        elif not trace.direct and trace.question.event_index is not None:
            assert think.startswith(skip)
        firsts[("crop" if trace.calls else "other", think.split()[0])] += 1
    # the crop plans' first word opens no other think: the first token is the decision
    assert {w for kind, w in firsts if kind == "crop"} == {"Short"}
    assert "Short" not in {w for kind, w in firsts if kind == "other"}
    plain = _world2()
    assert skip_opening(plain) == "no crop: enough" and skip_opening(plain) in config_openings(plain)
