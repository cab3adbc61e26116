"""Benchmark loaders (SPEC §7) on EVERY real row in ../shared/benchmarks, jsonl and parquet.

Each test pairs the real annotation rows with a temporary video directory of empty
placeholder files under the names the dataset's own layout implies (worked out here from
the raw rows, independently of the loader), plus generated .srt files for videomme_wsub.
"""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from paravt_core.eval import cli as eval_cli
from paravt_core.eval.samples import (
    SUBTITLE_PREFIX,
    EvalSample,
    Row,
    RowError,
    load_split,
    inline_options_question,
    mcq_question,
    missing_videos,
    mlvu_sample,
    read_split,
    srt_to_text,
)

BENCHMARKS = Path(__file__).parents[2].parent / "shared" / "benchmarks"
FORMATS = ("jsonl", "parquet")

# split -> (folder under ../shared/benchmarks, video file name a raw row implies)
VIDEO_NAME: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "videomme": ("videomme", lambda row: f"{row['videoID']}.mp4"),
    "videomme_wsub": ("videomme", lambda row: f"{row['videoID']}.mp4"),
    "longvideobench": ("longvideobench", lambda row: row["video_path"]),
    "lvbench": ("lvbench", lambda row: f"{row['key']}.mp4"),
    "mlvu": ("mlvu", lambda row: row["video_name"]),
    "mmvu": ("mmvu", lambda row: row["video"].split("/main/", 1)[1]),
    "charades": ("charades", lambda row: row["video"]),
}


@pytest.fixture(scope="module")
def benchmarks() -> Path:
    if not BENCHMARKS.is_dir():
        pytest.skip(f"real benchmark rows not found at {BENCHMARKS} (shared folder absent)")
    return BENCHMARKS


def raw_rows(benchmarks: Path, folder: str) -> list[dict[str, Any]]:
    lines = (benchmarks / folder / f"{folder}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def rows_file(benchmarks: Path, folder: str, fmt: str) -> Path:
    return benchmarks / folder / f"{folder}.{fmt}"


def make_videos(video_dir: Path, names: set[str]) -> None:
    for name in names:
        path = video_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()


def video_names(benchmarks: Path, split: str) -> set[str]:
    folder, name_of = VIDEO_NAME[split]
    return {name_of(row) for row in raw_rows(benchmarks, folder)}


def load_with_all_videos(
    benchmarks: Path, split: str, fmt: str, tmp_path: Path
) -> list[EvalSample]:
    make_videos(tmp_path, video_names(benchmarks, split))
    return load_split(split, rows_file(benchmarks, VIDEO_NAME[split][0], fmt), tmp_path)


# --- every real row, both formats -----------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("split", sorted(VIDEO_NAME))
def test_every_real_row_loads_with_its_video(
    benchmarks: Path, split: str, fmt: str, tmp_path: Path
) -> None:
    samples = load_with_all_videos(benchmarks, split, fmt, tmp_path)
    folder, name_of = VIDEO_NAME[split]
    rows = raw_rows(benchmarks, folder)
    assert len(samples) == len(rows)
    assert len({sample.id for sample in samples}) == len(samples)
    assert missing_videos(samples) == []
    for sample, row in zip(samples, rows, strict=True):
        assert sample.split == split
        assert sample.video_path == tmp_path / name_of(row)
        assert sample.video_path.is_file()


@pytest.mark.parametrize("split", sorted(VIDEO_NAME))
def test_jsonl_and_parquet_give_the_same_samples(
    benchmarks: Path, split: str, tmp_path: Path
) -> None:
    jsonl, parquet = (load_with_all_videos(benchmarks, split, fmt, tmp_path) for fmt in FORMATS)
    assert jsonl == parquet


@pytest.mark.parametrize("split", ["videomme", "charades", "mmvu"])
def test_missing_videos_are_flagged_not_dropped(
    benchmarks: Path, split: str, tmp_path: Path
) -> None:
    folder, name_of = VIDEO_NAME[split]
    rows = raw_rows(benchmarks, folder)
    absent = name_of(rows[0])
    make_videos(tmp_path, video_names(benchmarks, split) - {absent})
    samples = load_split(split, rows_file(benchmarks, folder, "parquet"), tmp_path)
    assert len(samples) == len(rows)
    flagged = [sample.video_missing for sample in samples]
    assert flagged == [name_of(row) == absent for row in rows]
    assert all(sample.video_path == tmp_path / absent for sample in missing_videos(samples))


# --- per-dataset pitfalls -------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_mlvu_answers_stay_letters_and_options_are_listed_once(
    benchmarks: Path, fmt: str, tmp_path: Path
) -> None:
    samples = load_with_all_videos(benchmarks, "mlvu", fmt, tmp_path)
    for sample, row in zip(samples, raw_rows(benchmarks, "mlvu"), strict=True):
        assert sample.kind == "mcq"
        assert sample.answer == row["answer"]
        assert sample.options == tuple(row["candidates"])
        assert "Options:" not in sample.question
        for letter, text in zip("ABCDEFGHIJ", row["candidates"]):
            assert sample.question.count(f"({letter}) {text}") == 1
        assert sample.question.startswith("Question: ")
        assert sample.question.endswith("\nAnswer with the option letter only.")


@pytest.mark.parametrize("fmt", FORMATS)
def test_videomme_options_are_not_double_prefixed(
    benchmarks: Path, fmt: str, tmp_path: Path
) -> None:
    samples = load_with_all_videos(benchmarks, "videomme", fmt, tmp_path)
    for sample, row in zip(samples, raw_rows(benchmarks, "videomme"), strict=True):
        assert sample.answer == row["answer"]
        assert sample.options == tuple(option[3:] for option in row["options"])
        expected = "\n".join(
            [f"Question: {row['question']}", "Options:", *row["options"],
             "Answer with the option letter only."]
        )
        assert sample.question == expected
        assert "A. A." not in sample.question


def test_videomme_first_row_by_hand(benchmarks: Path, tmp_path: Path) -> None:
    sample = load_with_all_videos(benchmarks, "videomme", "jsonl", tmp_path)[0]
    assert sample.id == "001-1"
    assert sample.options[0] == "Apples."
    assert sample.answer == "C"
    assert sample.duration_group == "short"
    assert sample.category == "Counting Problem"


@pytest.mark.parametrize("fmt", FORMATS)
def test_mmvu_open_ended_rows_are_open(benchmarks: Path, fmt: str, tmp_path: Path) -> None:
    samples = load_with_all_videos(benchmarks, "mmvu", fmt, tmp_path)
    rows = raw_rows(benchmarks, "mmvu")
    for sample, row in zip(samples, rows, strict=True):
        assert sample.category == row["metadata"]["subject"]
        assert sample.answer == row["answer"]
        if row["question_type"] == "open-ended":
            assert (sample.kind, sample.options) == ("open", ())
            assert "Options:" not in sample.question
        else:
            assert sample.kind == "mcq"
            assert sample.options == tuple(row["choices"][letter] for letter in "ABCDE")
    kinds = [sample.kind for sample in samples]
    assert kinds.count("open") == sum(row["question_type"] == "open-ended" for row in rows)
    assert kinds.count("open") > 0 and kinds.count("mcq") > 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_longvideobench_drops_na_options(benchmarks: Path, fmt: str, tmp_path: Path) -> None:
    samples = load_with_all_videos(benchmarks, "longvideobench", fmt, tmp_path)
    rows = raw_rows(benchmarks, "longvideobench")
    assert any(row["option4"] == "N/A" for row in rows)
    for sample, row in zip(samples, rows, strict=True):
        given = [row[f"option{i}"] for i in range(5)]
        assert "N/A" not in sample.options
        assert len(sample.options) == 5 - given.count("N/A")
        chosen = sample.options["ABCDE".index(sample.answer)]
        assert chosen == given[row["correct_choice"]]


@pytest.mark.parametrize("fmt", FORMATS)
def test_charades_float16_times_read_as_given(
    benchmarks: Path, fmt: str, tmp_path: Path
) -> None:
    samples = load_with_all_videos(benchmarks, "charades", fmt, tmp_path)
    rows = raw_rows(benchmarks, "charades")
    for sample, row in zip(samples, rows, strict=True):
        assert sample.kind == "grounding"
        assert (sample.gt_start, sample.gt_end) == tuple(row["timestamp"])
        assert sample.answer == (sample.gt_start, sample.gt_end)
        assert row["caption"] in sample.question
    assert (samples[0].gt_start, samples[0].gt_end) == (24.296875, 30.40625)
    assert samples[0].id == "3MSZA_1"


def test_charades_question_is_the_release_wording(benchmarks: Path, tmp_path: Path) -> None:
    """The release's `paravt/eval/utils.py` question, with the row's caption."""
    sample = load_with_all_videos(benchmarks, "charades", "jsonl", tmp_path)[0]
    caption = raw_rows(benchmarks, "charades")[0]["caption"]
    assert sample.question == (
        "Please find the visual event described by a sentence in the video, determining its starting and ending "
        "times. The format should be: 'The event happens in the start time - end time'. For example, The event "
        f"'person turn a light on' happens in the 24.3 - 30.4 seconds. Now I will give you the textual sentence: "
        f'"{caption}". Please return its start time and end time.')


@pytest.mark.parametrize("fmt", FORMATS)
def test_lvbench_options_come_from_the_question(
    benchmarks: Path, fmt: str, tmp_path: Path
) -> None:
    (sample,) = load_with_all_videos(benchmarks, "lvbench", fmt, tmp_path)
    assert sample.options == ("1636", "1366", "1363", "1633")
    assert sample.answer == "D"
    assert sample.question.count("(A) 1636") == 1
    assert "Options:" not in sample.question
    row = raw_rows(benchmarks, "lvbench")[0]
    assert sample.question == f"{row['question']}\nAnswer with the option letter only."  # no "Question: " label
    assert sample.category == "key information retrieval"


def test_pandas_rows_with_numpy_list_cells_load_alike(benchmarks: Path, tmp_path: Path) -> None:
    path = rows_file(benchmarks, "mlvu", "parquet")
    frame = pd.read_parquet(path)
    from_pandas = [
        mlvu_sample(Row(path, index + 1, record), tmp_path)
        for index, record in enumerate(frame.to_dict("records"))
    ]
    assert from_pandas == load_split("mlvu", path, tmp_path)


# --- Video-MME with subtitles -----------------------------------------------------------


def write_srt(path: Path, video_id: str) -> None:
    path.write_text(
        f"1\n00:00:01,000 --> 00:00:02,500\n<i>Hello</i> from {video_id}\n\n"
        "2\n00:00:03,000 --> 00:00:04,000\nsecond cue,\nsplit over two lines\n",
        encoding="utf-8",
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_videomme_wsub_prepends_subtitles(benchmarks: Path, fmt: str, tmp_path: Path) -> None:
    rows = raw_rows(benchmarks, "videomme")
    subtitle_dir = tmp_path / "subtitles"
    subtitle_dir.mkdir()
    for video_id in {row["videoID"] for row in rows}:
        write_srt(subtitle_dir / f"{video_id}.srt", video_id)
    make_videos(tmp_path, video_names(benchmarks, "videomme"))
    with_sub = load_split("videomme_wsub", rows_file(benchmarks, "videomme", fmt), tmp_path,
                          subtitle_dir)
    plain = load_split("videomme", rows_file(benchmarks, "videomme", fmt), tmp_path)
    for sample, bare, row in zip(with_sub, plain, rows, strict=True):
        text = f"Hello from {row['videoID']}\nsecond cue, split over two lines"
        assert sample.question == (
            f"This video's subtitles are listed below:\n{text}\n\n" + bare.question
        )
        assert sample.subtitle_path == subtitle_dir / f"{row['videoID']}.srt"


def test_videomme_wsub_without_srt_has_no_prefix(benchmarks: Path, tmp_path: Path) -> None:
    samples = load_split("videomme_wsub", rows_file(benchmarks, "videomme", "jsonl"), tmp_path)
    assert all(sample.subtitle_path is None for sample in samples)
    assert all(sample.question.startswith("Question: ") for sample in samples)


def test_subtitle_prefix_is_the_spec_text() -> None:
    assert SUBTITLE_PREFIX.format(text="hi") == "This video's subtitles are listed below:\nhi\n\n"


def test_srt_to_text() -> None:
    srt = (
        "\ufeff1\r\n00:00:00,000 --> 00:00:01,000\r\n<font color=\"#fff\">One</font>\r\n\r\n"
        "2\r\n00:00:01.500 --> 00:00:02.000\r\n42\r\nis the answer\r\n\r\n"
        "3\r\n00:00:03,000 --> 00:00:04,000\r\n\r\n"
    )
    assert srt_to_text(srt) == "One\n42 is the answer"


# --- bad rows -------------------------------------------------------------------------


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("answer", ["E", "AB", "b", "", None, 1])
def test_bad_jsonl_row_names_file_row_and_field(
    benchmarks: Path, tmp_path: Path, answer: Any
) -> None:
    good, bad = raw_rows(benchmarks, "videomme")[:2]
    path = write_jsonl(tmp_path / "rows.jsonl", [good, {**bad, "answer": answer}])
    with pytest.raises(RowError, match=r"rows\.jsonl: row 2: field 'answer'") as caught:
        load_split("videomme", path, tmp_path)
    assert (caught.value.row, caught.value.field_name) == (2, "answer")


@pytest.mark.parametrize(
    ("options", "problem"),
    [([], "expected 1 to 10 options"), (["A. x", "C. y"], "does not start with 'B. '")],
)
def test_bad_videomme_options(
    benchmarks: Path, tmp_path: Path, options: list[str], problem: str
) -> None:
    row = {**raw_rows(benchmarks, "videomme")[0], "options": options, "answer": "A"}
    path = write_jsonl(tmp_path / "rows.jsonl", [row])
    with pytest.raises(RowError, match=f"row 1: field 'options': .*{problem}"):
        load_split("videomme", path, tmp_path)


def test_bad_parquet_row_names_file_row_and_field(benchmarks: Path, tmp_path: Path) -> None:
    rows = raw_rows(benchmarks, "longvideobench")[:3]
    rows[2]["correct_choice"] = 4  # option4 is "N/A" in this row
    assert rows[2]["option4"] == "N/A"
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(RowError, match=r"rows\.parquet: row 3: field 'correct_choice'"):
        load_split("longvideobench", path, tmp_path)


@pytest.mark.parametrize(
    ("change", "field_name"),
    [
        ({"video": "../../etc/passwd"}, "video"),
        ({"timestamp": [5.0]}, "timestamp"),
        ({"timestamp": [9.0, 3.0]}, "timestamp"),
        ({"caption": ""}, "caption"),
    ],
)
def test_bad_charades_rows(tmp_path: Path, change: dict[str, Any], field_name: str) -> None:
    row = {"video": "X.mp4", "caption": "a person sits.", "timestamp": [1.0, 2.0], **change}
    path = write_jsonl(tmp_path / "charades.jsonl", [row])
    with pytest.raises(RowError, match=f"row 1: field '{field_name}'"):
        load_split("charades", path, tmp_path)


def test_invalid_json_line_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    good = {"video": "X.mp4", "caption": "a person sits.", "timestamp": [1.0, 2.0]}
    path.write_text(json.dumps(good) + "\n\n{not json\n", encoding="utf-8")
    with pytest.raises(RowError, match=r"row 3: field '\(row\)': not valid JSON"):  # line 3
        load_split("charades", path, tmp_path)


def test_mlvu_row_with_candidate_text_answer_maps_to_its_letter(tmp_path: Path) -> None:
    row = {"video_name": "v.mp4", "duration": 10.0, "question": "Which?",
           "candidates": ["red", "blue"], "answer": "blue", "task_type": "plotQA",
           "question_id": "Q1"}
    (sample,) = load_split("mlvu", write_jsonl(tmp_path / "mlvu.jsonl", [row]), tmp_path)
    assert sample.answer == "B"
    assert sample.question == (
        "Question: Which?\nOptions:\nA. red\nB. blue\nAnswer with the option letter only."
    )


# --- CLI ------------------------------------------------------------------------------


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="paravt")
    eval_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_eval_is_a_registered_command_module() -> None:
    from paravt_core.cli import COMMAND_MODULES

    assert "paravt_core.eval.cli" in COMMAND_MODULES


def test_cli_eval_samples(benchmarks: Path, tmp_path: Path, capsys) -> None:
    rows = raw_rows(benchmarks, "charades")
    make_videos(tmp_path, video_names(benchmarks, "charades") - {"3MSZA.mp4"})
    code = run_cli(["eval", "samples", "charades", "--rows",
                    str(rows_file(benchmarks, "charades", "jsonl")), "--video-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    records = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert len(records) == len(rows)
    assert records[0] == {
        "id": "3MSZA_1",
        "video_path": str(tmp_path / "3MSZA.mp4"),
        "question": records[0]["question"],
        "answer": [24.296875, 30.40625],
        "kind": "grounding",
        "options": [],
        "gt_start": 24.296875,
        "gt_end": 30.40625,
        "video_missing": True,
    }
    missing = [record["id"] for record in records if record.get("video_missing")]
    assert missing == [f"3MSZA_{n}" for n in range(1, 5)]
    assert "3MSZA_1: video missing" in err


def test_cli_eval_samples_mcq_keys(benchmarks: Path, tmp_path: Path, capsys) -> None:
    make_videos(tmp_path, video_names(benchmarks, "mlvu"))
    code = run_cli(["eval", "samples", "mlvu", "--rows",
                    str(rows_file(benchmarks, "mlvu", "parquet")), "--video-dir", str(tmp_path)])
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert code == 0
    assert set(first) == {"id", "video_path", "question", "answer", "kind", "options"}
    assert (first["id"], first["answer"], first["kind"]) == ("Q1113", "A", "mcq")


def test_cli_eval_samples_with_no_readable_row_exits_2(tmp_path: Path, capsys) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", [{"video": "X.mp4", "caption": "x"}])
    code = run_cli(["eval", "samples", "charades", "--rows", str(path),
                    "--video-dir", str(tmp_path)])
    assert code == 2
    assert "row 1: field 'timestamp': missing" in capsys.readouterr().err


def test_cli_eval_score(monkeypatch, capsys) -> None:
    lines = [
        {"kind": "mcq", "response": "<answer>B</answer>", "answer": "B"},
        {"kind": "mcq", "response": "I think B", "answer": "B"},
        {"kind": "grounding", "response": "The event happens in the 12 - 18 seconds.",
         "answer": [10, 20]},
        {"kind": "grounding", "response": "no idea", "answer": [10, 20]},
    ]
    stdin = "\n".join(json.dumps(line) for line in lines) + "\n\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    assert run_cli(["eval", "score"]) == 0
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert results[:2] == [{"pred": "B", "score": 1.0}, {"pred": "I", "score": 0.0}]
    assert results[2]["pred"] == [12.0, 18.0]
    assert results[2]["score"] == pytest.approx(0.6)
    assert results[3] == {"pred": None, "score": 0.0}


@pytest.mark.parametrize(
    "bad_line",
    [
        "{not json",
        json.dumps({"kind": "open", "response": "x", "answer": "y"}),
        json.dumps({"kind": "grounding", "response": "1 - 2", "answer": [1]}),
        json.dumps({"kind": "mcq", "response": None, "answer": "A"}),
        json.dumps({"kind": "grounding", "response": "1 - 2", "answer": [5, 3]}),
        '{"kind": "grounding", "response": "1 - 2", "answer": [NaN, Infinity]}',
    ],
)
def test_cli_eval_score_reports_each_bad_line_and_goes_on(monkeypatch, capsys, bad_line: str) -> None:
    """Issue #33 item 8: scoring stopped at the first bad line and accepted [5, 3] or [NaN, Inf]."""
    good = json.dumps({"kind": "mcq", "response": "A", "answer": "A"})
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{good}\n{bad_line}\n{good}\n{bad_line}\n"))
    assert run_cli(["eval", "score"]) == 2
    out, err = capsys.readouterr()
    results = [json.loads(line) for line in out.splitlines()]
    assert results[0] == results[2] == {"pred": "A", "score": 1.0}
    assert results[1]["score"] is None and results[1]["error"].startswith("line 2: ")
    assert results[3]["error"].startswith("line 4: ")
    assert "stdin line 2" in err and "stdin line 4" in err and "2 bad line(s)" in err


# --- real quirks and quarantine (issue: one bad row never sinks a split) -----------------


def test_mlvu_real_rows_with_blank_candidates_drop_them_and_keep_their_letters(
    benchmarks: Path, tmp_path: Path
) -> None:
    """SPEC §7: a benchmark's letters are its ground truth; blanks go, letters stay (issue #33 item 9)."""
    rows = raw_rows(benchmarks, "mlvu")[:4]
    # a blank at the end, as real MLVU rows store it: the question lists the others, letters unchanged
    trailing = {**rows[0], "candidates": [*rows[0]["candidates"], ""]}
    # a blank in the middle (listed as an empty "(B)" line): the options after it keep their letters
    middle = dict(rows[1])
    texts = list(middle["candidates"])
    answer_text = texts[ord(middle["answer"]) - ord("A")]
    stored = [texts[0], "  ", *texts[1:]]
    stem = middle["question"].split("\n(A)")[0]
    listed = "".join(f"\n({'ABCDEFGHIJ'[i]}) {t}" for i, t in enumerate(stored))
    middle.update(candidates=stored, question=stem + listed + "\n",
                  answer="ABCDEFGHIJ"[stored.index(answer_text)])
    # the real row of the probe: ["", X, Y, ""], answer B, no options in the question
    archery = {**rows[3], "candidates": ["", "There is an archery scene", "There is no archery scene", ""],
               "answer": "B", "question": "Is there an archery scene in the video?"}
    # an answer naming the blank is an error: that row is quarantined
    names_blank = {**rows[2], "candidates": [rows[2]["candidates"][0], "", *rows[2]["candidates"][1:]],
                   "answer": "B"}
    path = write_jsonl(tmp_path / "mlvu.jsonl", [trailing, middle, archery, names_blank])
    make_videos(tmp_path, {row["video_name"] for row in rows})

    loaded = read_split("mlvu", path, tmp_path)

    first, second, third = loaded.samples
    assert first.options == tuple(rows[0]["candidates"]) and first.answer == rows[0]["answer"]
    assert first.option_letters == tuple("ABCDEFGHIJ"[: len(first.options)])
    assert first.question == inline_options_question(rows[0]["question"].strip())
    assert second.options == tuple(texts) and second.answer == middle["answer"]
    assert second.option_letters == ("A", *"CDEFGHIJ"[: len(texts) - 1])
    assert second.options[second.option_letters.index(second.answer)] == answer_text
    assert second.question == mcq_question(stem, texts, second.option_letters)
    assert third.answer == "B" and third.option_letters == ("B", "C")
    assert third.options == ("There is an archery scene", "There is no archery scene")
    assert "\nB. There is an archery scene\nC. There is no archery scene\n" in third.question
    assert "A. " not in third.question
    assert [(q.row, q.field) for q in loaded.quarantined] == [(4, "answer")]
    assert "names a blank candidate" in loaded.quarantined[0].reason


def test_lvbench_real_row_with_null_uid_gets_a_stable_id(benchmarks: Path, tmp_path: Path) -> None:
    (row,) = raw_rows(benchmarks, "lvbench")
    other = {**row, "uid": None, "question": row["question"].replace("year", "date")}
    path = write_jsonl(tmp_path / "lvbench.jsonl", [{**row, "uid": None}, other])
    first = read_split("lvbench", path, tmp_path)
    again = read_split("lvbench", path, tmp_path)
    ids = [sample.id for sample in first.samples]
    assert first.quarantined == [] and len(set(ids)) == 2
    assert ids == [sample.id for sample in again.samples]
    assert all(sample_id.startswith("lvbench-") for sample_id in ids)
    (kept,) = load_split("lvbench", write_jsonl(tmp_path / "uid.jsonl", [row]), tmp_path)
    assert kept.id == row["uid"]


def test_malformed_rows_are_quarantined_with_file_row_and_reason(benchmarks: Path, tmp_path: Path) -> None:
    rows = raw_rows(benchmarks, "videomme")[:4]
    path = tmp_path / "rows.jsonl"
    lines = [json.dumps(rows[0]), "{not json", json.dumps({**rows[1], "answer": "Z"}), json.dumps(rows[2]),
             json.dumps(rows[2]), "[1, 2]"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    loaded = read_split("videomme", path, tmp_path)
    assert [sample.id for sample in loaded.samples] == [rows[0]["question_id"], rows[2]["question_id"]]
    assert [q.to_record() | {"reason": ""} for q in loaded.quarantined] == [
        {"file": str(path), "row": row, "field": field, "reason": ""}
        for row, field in ((2, "(row)"), (3, "answer"), (5, "(id)"), (6, "(row)"))
    ]
    assert "already used by row 4" in loaded.quarantined[2].reason
    with pytest.raises(RowError, match=r"rows\.jsonl: row 2: field '\(row\)': not valid JSON"):
        load_split("videomme", path, tmp_path)


def test_cli_eval_samples_prints_good_rows_and_names_quarantined_ones(
    benchmarks: Path, tmp_path: Path, capsys
) -> None:
    rows = raw_rows(benchmarks, "mlvu")[:3]
    rows[1] = {**rows[1], "candidates": [*rows[1]["candidates"], ""]}
    rows[2] = {**rows[2], "answer": "Q"}
    path = write_jsonl(tmp_path / "mlvu.jsonl", rows)
    make_videos(tmp_path, {row["video_name"] for row in rows})
    code = run_cli(["eval", "samples", "mlvu", "--rows", str(path), "--video-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0
    assert [json.loads(line)["id"] for line in out.splitlines()] == [rows[0]["question_id"], rows[1]["question_id"]]
    assert f"quarantined {path}: row 3: field 'answer'" in err
    assert "1 rows quarantined, 2 samples printed" in err


def test_a_grounding_answer_other_than_its_interval_is_refused():
    """The check sat after a `return` (unreachable) until 2026-11-26; found by `vulture`."""
    ok = EvalSample(id="g", split="charades", video_path=Path("v.mp4"), question="q", answer=(1.0, 3.0),
                    kind="grounding", gt_start=1.0, gt_end=3.0)
    assert ok.answer == (ok.gt_start, ok.gt_end)
    with pytest.raises(ValueError, match="grounding answer must equal"):
        EvalSample(id="g", split="charades", video_path=Path("v.mp4"), question="q", answer=(1.0, 2.0),
                   kind="grounding", gt_start=1.0, gt_end=3.0)
