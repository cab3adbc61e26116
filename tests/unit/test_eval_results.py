"""Per-sample scoring, the durable results log and split summaries (SPEC §7 "Output")."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from paravt_core.eval.results import (
    TRUNCATED_MARK,
    EpisodeOutcome,
    ResultsLog,
    SampleResult,
    score_sample,
    summarize,
    truncate_response,
    write_split_results,
)
from paravt_core.eval.samples import EvalSample

VIDEO = Path("/videos/v.mp4")


def outcome(text: str, tool_calls: int = 0) -> EpisodeOutcome:
    return EpisodeOutcome(text, turns=1 + (tool_calls > 0), tool_calls=tool_calls, parse_failures=0,
                          rejected_calls=0, unanswered_calls=0, end_reason="answer")


def result(kind: str, score: float, tool_calls: int = 0, duration: str | None = None,
           category: str | None = None, sample_id: str = "s") -> SampleResult:
    answer = [1.0, 2.0] if kind == "grounding" else "A"
    return SampleResult(id=sample_id, split="x", kind=kind, answer=answer, pred=None, score=score,
                        correct=(score == 1.0) if kind == "mcq" else None,
                        scorer={"mcq": "mcq_letter", "grounding": "iou", "open": "token_f1"}[kind],
                        tool_calls=tool_calls, turns=1, parse_failures=0, rejected_calls=0, unanswered_calls=0,
                        end_reason="answer", duration_group=duration, category=category, response="")


def test_mcq_scoring_uses_the_spec_7_letter_rules():
    sample = EvalSample(id="q", split="videomme", video_path=VIDEO, question="Q", answer="B", kind="mcq",
                        options=("x", "y"), duration_group="short", category="Counting")
    scored = score_sample(sample, outcome("I checked.\n</think>\n<answer>B</answer>", tool_calls=2))
    assert (scored.pred, scored.score, scored.correct, scored.scorer) == ("B", 1.0, True, "mcq_letter")
    assert (scored.tool_calls, scored.turns, scored.duration_group, scored.category) == (2, 2, "short", "Counting")
    wrong = score_sample(sample, outcome("I think it is B"))  # rule 4 takes the standalone "I" (release quirk)
    assert (wrong.pred, wrong.score, wrong.correct) == ("I", 0.0, False)


def test_grounding_scoring_is_the_iou_of_the_extracted_span():
    sample = EvalSample(id="g", split="charades", video_path=VIDEO, question="Q", answer=(4.0, 8.0),
                        kind="grounding", gt_start=4.0, gt_end=8.0)
    scored = score_sample(sample, outcome("The event happens in the 2.0 - 6.0 seconds."))
    assert scored.pred == [2.0, 6.0] and scored.score == pytest.approx(2.0 / 6.0)
    assert scored.answer == [4.0, 8.0] and scored.correct is None and scored.scorer == "iou"
    assert score_sample(sample, outcome("no idea")).pred is None


def test_open_ended_scoring_is_token_f1_of_the_extracted_answer():
    sample = EvalSample(id="o", split="mmvu", video_path=VIDEO, question="Q", answer="blue square", kind="open")
    exact = score_sample(sample, outcome("<answer>A blue square.</answer>"))
    assert (exact.pred, exact.score, exact.scorer, exact.correct) == ("A blue square.", 1.0, "token_f1", None)
    partial = score_sample(sample, outcome("<answer>blue circle</answer>"))
    assert partial.score == pytest.approx(0.5)


def test_long_responses_are_truncated_with_a_mark():
    assert truncate_response("abc", 5) == "abc"
    assert truncate_response("x" * 10, 4) == "xxxx [truncated]"


def test_mcq_summary_accuracy_tool_use_and_breakdowns():
    results = [result("mcq", 1.0, 2, "short", "Counting", "a"), result("mcq", 0.0, 0, "short", "OCR", "b"),
               result("mcq", 1.0, 1, "long", "Counting", "c"), result("mcq", 1.0, 0, None, "OCR", "d")]
    summary = summarize("videomme", results)
    assert summary["primary"] == {"name": "accuracy", "value": 0.75}
    assert summary["accuracy"] == 0.75 and summary["n"] == 4 and summary["kinds"] == {"mcq": 4}
    assert summary["avg_tool_calls"] == 0.75 and summary["tool_usage_rate"] == 0.5
    assert summary["by_duration"]["short"]["accuracy"] == 0.5 and summary["by_duration"]["short"]["n"] == 2
    assert summary["by_duration"]["long"]["accuracy"] == 1.0 and summary["by_duration"]["unknown"]["n"] == 1
    assert summary["by_category"]["Counting"]["accuracy"] == 1.0
    assert summary["by_category"]["OCR"]["accuracy"] == 0.5
    assert summary["by_category"]["Counting"]["tool_usage_rate"] == 1.0
    assert summary["end_reasons"] == {"answer": 4}


def test_the_summary_counts_answers_in_the_format_asked_for():
    sample = EvalSample(id="q", split="videomme", video_path=VIDEO, question="Q", answer="D", kind="mcq",
                        options=("w", "x", "y", "z"))
    long_reasoning = "Checking the options. " * 200  # past RESPONSE_MAX_CHARS, as an 8B model's can be
    texts = [long_reasoning + "So the answer is option D.\n</think>\n<answer>D</answer>",
             "So the answer is option D.\n</think>\n<answer_path</answer>",  # a broken tag (seen after RL)
             "<answer> </answer>",  # blank
             "no tags at all"]
    results = [score_sample(replace(sample, id=str(i)), outcome(text)) for i, text in enumerate(texts)]
    assert results[0].response.endswith(TRUNCATED_MARK) and "<answer>" not in results[0].response
    assert [r.answer_tag for r in results] == [True, False, False, False]  # judged on the whole text
    assert summarize("videomme", results)["answer_tag_rate"] == 0.25
    # records written before the flag was kept load, and are not counted
    old = {k: v for k, v in results[0].to_record().items() if k != "answer_tag"}
    assert SampleResult.from_record(old).answer_tag is None
    assert summarize("videomme", [SampleResult.from_record(old)])["answer_tag_rate"] is None


def test_grounding_summary_miou_and_recall_at_k():
    ious = [0.9, 0.6, 0.4, 0.1]
    summary = summarize("charades", [result("grounding", iou, sample_id=str(i)) for i, iou in enumerate(ious)])
    assert summary["primary"]["name"] == "mIoU" and summary["mIoU"] == pytest.approx(0.5)
    assert (summary["R@0.3"], summary["R@0.5"], summary["R@0.7"]) == (0.75, 0.5, 0.25)
    assert summary["by_duration"]["unknown"]["mIoU"] == pytest.approx(0.5)


def test_mixed_mcq_and_open_split_reports_the_mean_score_and_each_part():
    results = [result("mcq", 1.0, sample_id="a"), result("mcq", 0.0, sample_id="b"),
               result("open", 0.5, sample_id="c")]
    summary = summarize("mmvu", results)
    assert summary["primary"] == {"name": "score", "value": pytest.approx(0.5)}
    assert summary["mcq_accuracy"] == 0.5 and summary["open_token_f1"] == 0.5
    assert summary["kinds"] == {"mcq": 2, "open": 1}


def test_summary_of_nothing_is_an_error_naming_the_split():
    with pytest.raises(ValueError, match="split lvbench"):
        summarize("lvbench", [])


def test_results_log_round_trips_and_appends(tmp_path):
    log = ResultsLog(tmp_path / "results" / "videomme.jsonl")
    assert log.load() == {}
    first, second = result("mcq", 1.0, sample_id="a"), result("mcq", 0.0, sample_id="b")
    log.append(first.to_record())
    log.append(second.to_record())
    loaded = log.load()
    assert list(loaded) == ["a", "b"]
    assert SampleResult.from_record(loaded["b"]) == second
    assert len(log.path.read_text().splitlines()) == 2


def test_a_torn_last_line_is_cut_and_the_log_goes_on(tmp_path):
    log = ResultsLog(tmp_path / "split.jsonl")
    log.append(result("mcq", 1.0, sample_id="a").to_record())
    with log.path.open("a") as f:
        f.write('{"id": "b", "split": "x", "ki')  # the process died mid-write
    assert list(log.load()) == ["a"]
    assert log.path.read_text().endswith("\n") and len(log.path.read_text().splitlines()) == 1
    log.append(result("mcq", 0.0, sample_id="c").to_record())
    assert list(log.load()) == ["a", "c"]


def test_a_corrupt_complete_line_is_an_error_naming_file_and_line(tmp_path):
    log = ResultsLog(tmp_path / "split.jsonl")
    log.append(result("mcq", 1.0, sample_id="a").to_record())
    with log.path.open("a") as f:
        f.write("not json\n")
    with pytest.raises(ValueError, match=r"split\.jsonl: line 2 is not JSON"):
        log.load()


def test_split_json_holds_summary_and_samples_in_order(tmp_path):
    results = [result("mcq", 1.0, sample_id="b"), result("mcq", 0.0, sample_id="a")]
    path = write_split_results(tmp_path / "videomme.json", "videomme", summarize("videomme", results), results)
    document = json.loads(path.read_text())
    assert document["split"] == "videomme" and document["summary"]["accuracy"] == 0.5
    assert [sample["id"] for sample in document["samples"]] == ["b", "a"]
    assert set(document["samples"][0]) >= {"id", "answer", "pred", "correct", "score", "tool_calls", "response"}


def test_quarantined_rows_are_in_the_split_summary(tmp_path):
    from paravt_core.eval.evaluator import evaluate_split

    video = tmp_path / "v.mp4"
    video.write_bytes(b"x")
    sample = EvalSample(id="q", split="mlvu", video_path=video, question="Q", answer="A", kind="mcq",
                        options=("x", "y"))

    class AnswersA:
        def outcomes(self, samples):
            return ((s, outcome("<answer>A</answer>")) for s in samples)

    bad = {"file": "/rows/mlvu.jsonl", "row": 7, "field": "answer", "reason": "'Z' is not a letter"}
    run = evaluate_split("mlvu", [sample], AnswersA(), tmp_path, progress=False, quarantined=[bad])
    written = json.loads(run.results_json.read_text())
    assert run.summary["quarantined_rows"] == [bad] == written["summary"]["quarantined_rows"]
    assert run.summary["n"] == 1 and run.summary["accuracy"] == 1.0
