"""Data contracts (`data_contracts`): every rule catches a row that breaks it, good rows pass,
quarantine keeps the good rows, the GX result and Data Docs page are written, and the
real benchmark rows in ../shared/benchmarks pass their split's contract.

Good rows come from a small generated world (SPEC §8 rows, materialized here the way SPEC §8
says: archives unzipped into one root, sentinel paths rewritten to file:// URLs). Each case
copies one good row and corrupts one field; all cases of one contract go into ONE table,
validated once (GX validation is the slow part), and each case checks that its row is
flagged by its rule.
"""

from __future__ import annotations

import copy
import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from data_contracts import ContractError, ContractResult, validate
from data_contracts import rules
from data_contracts.tables import row_sha256
from paravt_core.data.synth import PARQUET_REPO, SOURCE_REPO, SynthConfig, generate_world
from paravt_core.data.synth.benchmarks import LAYOUTS
from paravt_core.data.synth.paravt import RL_FILE, RL_SCHEMA, SFT_SCHEMA, parquet_bytes
from paravt_core.eval.samples import SPLITS, load_split

BENCHMARKS = Path(__file__).resolve().parents[2].parent / "shared" / "benchmarks"
EVAL_SPLITS = SPLITS
SMALL = SynthConfig(train_videos=4, eval_videos_per_split=1, eval_rows_per_split=3, validation=True)
NULL = "expect_column_values_to_not_be_null"
KIND = "expect_column_values_to_be_of_kind"
UNIQUE = "expect_column_values_to_be_first_occurrences"
FILES = "expect_column_values_to_reference_existing_files"
ANSWER = "expect_mcq_answers_to_name_an_option"
LOADS = "expect_rows_to_load_as_eval_samples"


# --- the world, materialized --------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return generate_world(SMALL, tmp_path_factory.mktemp("contracts_world"), progress=False)


@pytest.fixture(scope="module")
def media_root(world, tmp_path_factory) -> Path:
    """ParaVT-Source unzipped into one root (SPEC §8 materialize, first half)."""
    root = tmp_path_factory.mktemp("media")
    source = world.repos[SOURCE_REPO].folder
    for archive in sorted(source.glob("*.zip")):
        with zipfile.ZipFile(archive) as members:
            members.extractall(root)
    return root


def _file_url(root: Path, sentinel: str) -> str:
    return f"file://{root}/{sentinel}"


def _materialized_sft(row: dict, root: Path) -> dict:
    for message in row["messages"]:
        for item in message["content"]:
            if item["type"] == "video_url":
                item["video_url"]["url"] = _file_url(root, item["video_url"]["url"])
    row["videos"] = [_file_url(root, path) for path in row["videos"]]
    return row


def _materialized_rl(row: dict, root: Path) -> dict:
    row["videos"] = [{**video, "video": _file_url(root, video["video"])} for video in row["videos"]]
    return row


def _unique(rows: list[dict]) -> list[dict]:
    """The rows without exact repeats (the generated world can repeat a row; the identity
    rule would flag the repeat, which is not what the good rows are for)."""
    seen, kept = set(), []
    for row in rows:
        key = row_sha256(list(row.values()))
        if key not in seen:
            seen.add(key)
            kept.append(row)
    return kept


@pytest.fixture(scope="module")
def good_rows(world, media_root) -> dict[str, list[dict]]:
    """Materialized SFT and RL rows of the world (all SFT shards together)."""
    folder = world.repos[PARQUET_REPO].folder
    sft = [r for path in sorted(folder.glob("sft/*.parquet")) for r in pq.read_table(path).to_pylist()]
    rl = pq.read_table(folder / RL_FILE).to_pylist()
    return {
        "sft": _unique([_materialized_sft(r, media_root) for r in sft]),
        "rl": _unique([_materialized_rl(r, media_root) for r in rl]),
    }


def _eval_rows(world, split: str) -> list[dict]:
    layout = LAYOUTS[split]
    return pq.read_table(world.repos[layout.repo_id].folder / layout.annotation_file).to_pylist()


def _write_jsonl(rows: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _touch_media(split: str, rows_path: Path, video_dir: Path) -> None:
    """Empty files where the split's loader looks for each row's video (and .srt)."""
    video_dir.mkdir(parents=True, exist_ok=True)
    for sample in load_split(split, rows_path, video_dir):
        sample.video_path.parent.mkdir(parents=True, exist_ok=True)
        sample.video_path.touch()
    if split == "videomme_wsub":
        for row in pd.read_json(rows_path, lines=True, dtype=False).to_dict("records"):
            (video_dir / f"{row['videoID']}.srt").write_text("1\n00:00:00,000 --> 00:00:01,000\nhello\n")


# --- the cases: one corrupted copy of a good row each --------------------------------------


@dataclass(frozen=True)
class Case:
    """Corrupt a copy of good row `base` with `corrupt`; `rule` must flag that row."""

    contract: str  # "sft", "rl" or an eval split
    name: str
    corrupt: Callable[[dict], Any]
    rule: str
    base: Callable[[dict], bool] = lambda row: True


def _set(**fields) -> Callable[[dict], None]:
    return lambda row: row.update(fields)


def _truth(**fields) -> Callable[[dict], None]:
    return lambda row: row.update(extra_info=json.dumps(fields))


def _question_type(row: dict) -> str:
    return json.loads(row["extra_info"])["question_type"]


def _user_turn(row: dict) -> dict:
    return next(turn for turn in row["prompt"] if turn["role"] == "user")


def _role(index: int, role: str) -> Callable[[dict], None]:
    return lambda row: row["messages" if "messages" in row else "prompt"][index].update(role=role)


def _first_item(row: dict, kind: str) -> dict:
    return next(i for m in row["messages"] for i in m["content"] if i["type"] == kind)


CASES = [
    Case("sft", "messages null", _set(messages=None), NULL),
    Case("sft", "messages empty", _set(messages=[]), "expect_column_values_to_be_chat_turns"),
    Case("sft", "unknown content item", lambda r: _first_item(r, "text").update(type="audio"),
         "expect_column_values_to_be_chat_turns"),
    Case("sft", "role not allowed", _role(1, "narrator"), "expect_column_values_to_use_chat_roles"),
    Case("sft", "no final assistant turn", lambda r: r["messages"].pop(), "expect_column_values_to_end_with_role"),
    Case("sft", "videos empty", _set(videos=[]), "expect_column_values_to_be_video_lists"),
    Case("sft", "videos not materialized", lambda r: r.update(videos=["selfqa/x.mp4"]), FILES),
    Case("sft", "message video missing",
         lambda r: _first_item(r, "video_url").update(video_url={"url": "file:///no/such/video.mp4"}), FILES),
    Case("sft", "repeated row", lambda r: None, UNIQUE),
    Case("rl", "prompt null", _set(prompt=None), NULL),
    Case("rl", "blank turn content", lambda r: r["prompt"][0].update(content=" "),
         "expect_column_values_to_be_chat_turns"),
    Case("rl", "role not allowed", _role(0, "developer"), "expect_column_values_to_use_chat_roles"),
    Case("rl", "prompt ends with system", lambda r: r.update(prompt=r["prompt"][:1]),
         "expect_column_values_to_end_with_role"),
    Case("rl", "video entry without path", _set(videos=[{"video": ""}]), "expect_column_values_to_be_video_lists"),
    Case("rl", "video not materialized", _set(videos=[{"video": "selfqa/x.mp4"}]), FILES),
    Case("rl", "two video markers", lambda r: _user_turn(r).update(content="<video>\n" + _user_turn(r)["content"]),
         "expect_prompts_to_mark_their_video"),
    Case("rl", "extra_info not JSON", _set(extra_info="answer: B"), "expect_column_values_to_be_reward_ground_truth"),
    Case("rl", "unknown question type", _truth(answer="B", question_type="mc"),
         "expect_column_values_to_be_reward_ground_truth"),
    Case("rl", "mcq answer not A-D", _truth(answer="E", question_type="mcq"),
         "expect_column_values_to_have_scorable_answers"),
    Case("rl", "tvg start after end", _truth(answer="[5.0, 3.0]", question_type="tvg"),
         "expect_column_values_to_have_scorable_answers"),
    Case("rl", "oe answer without a word", _truth(answer="?!", question_type="oe"),
         "expect_column_values_to_have_scorable_answers"),
    Case("rl", "mcq answer but prompt lists no options", _truth(answer="B", question_type="mcq"),
         "expect_mcq_answers_to_name_a_prompt_option", base=lambda r: _question_type(r) != "mcq"),
    Case("rl", "repeated row", lambda r: None, UNIQUE),
    Case("videomme", "answer beyond the options", _set(answer="E"), ANSWER),
    Case("videomme", "options not lettered", lambda r: r.update(options=[o[3:] for o in r["options"]]),
         "expect_column_values_to_be_lettered_options"),
    Case("videomme", "unknown duration", _set(duration="huge"), "expect_column_values_to_be_in_set"),
    Case("videomme", "blank question", _set(question="  "), KIND),
    Case("videomme", "null question_id", _set(question_id=None), NULL),
    Case("videomme", "repeated question_id", lambda r: None, UNIQUE),
    Case("videomme", "video missing", _set(videoID="NoSuchVideo"), "expect_rows_to_name_existing_videos"),
    Case("videomme_wsub", "subtitles missing", _set(videoID="NoSubtitles"), "expect_rows_to_name_existing_videos"),
    Case("longvideobench", "answer is an N/A option", _set(option4="N/A", correct_choice=4), ANSWER),
    Case("longvideobench", "correct_choice as text", _set(correct_choice="1"), KIND),
    Case("longvideobench", "duration as text", _set(duration="long"), KIND),
    Case("lvbench", "answer beyond the options", _set(answer="F"), ANSWER),
    Case("lvbench", "question_type empty", _set(question_type=[]), KIND),
    Case("mlvu", "answer neither letter nor candidate", _set(answer="Z"), ANSWER),
    Case("mlvu", "question lists more options than candidates", lambda r: r["candidates"].pop(), ANSWER),
    Case("mmvu", "unknown question type", _set(question_type="essay"), "expect_column_values_to_be_in_set"),
    Case("mmvu", "metadata not an object", _set(metadata="Geometry"), KIND),
    Case("mmvu", "gap in the choices", lambda r: r["choices"].update(B=""), ANSWER,
         base=lambda r: r["question_type"] == "multiple-choice"),
    Case("mmvu", "subject missing (loader rejects)", lambda r: r["metadata"].update(subject=""), LOADS),
    Case("charades", "start after end", _set(timestamp=[9.0, 3.0]), "expect_column_values_to_be_time_windows"),
    Case("charades", "blank caption", _set(caption=""), KIND),
    Case("charades", "repeated video and caption", lambda r: None, UNIQUE),
]


def _corrupted(case: Case, good: list[dict]) -> dict:
    row = copy.deepcopy(next(r for r in good if case.base(r)))
    case.corrupt(row)
    return row


def _validate_cases(contract: str, good: list[dict], folder: Path, **options) -> tuple[ContractResult, dict]:
    """One table: the good rows, then one corrupted row per case. Returns the result and the
    row number of each case."""
    like = {"videomme_val": "videomme"}.get(contract, contract)  # the validation split: Video-MME's rows
    cases = [c for c in CASES if c.contract == like]
    rows = good + [_corrupted(c, good) for c in cases]
    numbers = {c.name: len(good) + i + 1 for i, c in enumerate(cases)}
    if contract in ("sft", "rl"):
        path = folder / f"{contract}.parquet"
        path.write_bytes(parquet_bytes(rows, SFT_SCHEMA if contract == "sft" else RL_SCHEMA))
        kind, split = contract, None
    else:
        path = _write_jsonl(rows, folder / f"{contract}.jsonl")
        kind, split = "eval", contract
    with pytest.raises(ContractError) as raised:
        validate(kind, path, split=split, report_dir=folder / "report", **options)
    return raised.value.result, numbers


@pytest.fixture(scope="module")
def case_outcomes(world, good_rows, tmp_path_factory) -> dict[str, tuple[ContractResult, dict, int]]:
    """contract -> (result, case row numbers, number of good rows)."""
    outcomes = {}
    for contract in ("sft", "rl"):
        folder = tmp_path_factory.mktemp(contract)
        result, numbers = _validate_cases(contract, good_rows[contract], folder)
        outcomes[contract] = (result, numbers, len(good_rows[contract]))
    for split in EVAL_SPLITS:
        folder = tmp_path_factory.mktemp(split)
        good = _eval_rows(world, "videomme" if split == "videomme_wsub" else split)
        video_dir = folder / "videos"
        _touch_media(split, _write_jsonl(good, folder / "good.jsonl"), video_dir)
        (video_dir / "NoSubtitles.mp4").touch()
        result, numbers = _validate_cases(split, good, folder, video_dir=video_dir)
        outcomes[split] = (result, numbers, len(good))
    return outcomes


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.contract}: {c.name}")
def test_each_rule_catches_its_bad_row(case_outcomes, case):
    result, numbers, _ = case_outcomes[case.contract]
    row = numbers[case.name]
    flagged = {f.rule for f in result.failures if f.row == row}
    assert case.rule in flagged, f"row {row} ({case.name}) was flagged by {sorted(flagged)}"


@pytest.mark.parametrize("contract", ["sft", "rl", *EVAL_SPLITS])
def test_good_rows_pass_and_only_corrupted_rows_fail(case_outcomes, contract):
    result, numbers, n_good = case_outcomes[contract]
    assert result.n_rows == n_good + len(numbers)
    assert {f.row for f in result.failures} == set(numbers.values())
    assert result.n_bad == len(numbers) and not result.passed and result.kept_path is None


def test_failure_values_say_why(case_outcomes):
    result, numbers, _ = case_outcomes["rl"]
    values = {f.rule: f.value for f in result.failures if f.row == numbers["tvg start after end"]}
    assert values["expect_column_values_to_have_scorable_answers"].startswith("tvg answer '[5.0, 3.0]'")
    repeat = next(f for f in result.failures if f.row == numbers["repeated row"])
    assert repeat.value.endswith("repeats row 1")


# --- whole-table behaviour -----------------------------------------------------------------


def _sft_table(rows: list[dict], path: Path) -> Path:
    path.write_bytes(parquet_bytes(rows, SFT_SCHEMA))
    return path


def test_good_rows_pass_with_the_input_as_the_table_to_continue_with(good_rows, tmp_path):
    table = _sft_table(good_rows["sft"], tmp_path / "shard.parquet")
    result = validate("sft", table, report_dir=tmp_path / "report")
    assert result.passed and result.n_bad == 0 and not result.failures
    assert result.kept_path == table and result.quarantine_path is None
    assert result.validation_json.is_file() and result.docs_html.is_file()


def test_quarantine_keeps_the_good_rows_and_sets_the_bad_ones_aside(good_rows, tmp_path):
    good = good_rows["sft"]
    bad = [copy.deepcopy(good[0]) | {"videos": []}, copy.deepcopy(good[1]) | {"messages": []}]
    table = _sft_table([bad[0], *good, bad[1]], tmp_path / "shard.parquet")
    report_dir = tmp_path / "report"
    result = validate("sft", table, on_bad_rows="quarantine", report_dir=report_dir)
    assert not result.passed and result.n_rows == len(good) + 2 and result.n_bad == 2
    assert result.kept_path == report_dir / "sft_rows.shard.kept.parquet"
    assert result.quarantine_path == report_dir / "sft_rows.shard.quarantine.parquet"
    assert pq.read_table(result.kept_path).to_pylist() == good
    assert pq.read_table(result.quarantine_path).to_pylist() == bad
    assert pq.read_table(result.kept_path).schema == pq.read_table(table).schema
    assert validate("sft", result.kept_path, report_dir=report_dir).passed
    assert not list(report_dir.glob(".*"))  # atomic writes leave no temporary files


def test_quarantine_of_jsonl_rows_keeps_the_original_lines(world, tmp_path):
    good = _eval_rows(world, "charades")
    table = _write_jsonl([*good, good[0] | {"timestamp": [4.0, 1.0]}], tmp_path / "charades.jsonl")
    result = validate("eval", table, split="charades", on_bad_rows="quarantine", report_dir=tmp_path)
    assert result.kept_path.name == "eval_charades.charades.kept.jsonl"
    assert result.kept_path.read_text().splitlines() == table.read_text().splitlines()[:-1]
    assert result.quarantine_path.read_text().splitlines() == table.read_text().splitlines()[-1:]


def test_contract_error_holds_a_capped_failure_table_and_the_report_paths(world, tmp_path):
    folder = world.repos[PARQUET_REPO].folder
    rows = [r for path in sorted(folder.glob("sft/*.parquet")) for r in pq.read_table(path).to_pylist()]
    table = _sft_table(_unique(rows), tmp_path / "raw.parquet")  # sentinel paths: not materialized
    with pytest.raises(ContractError) as raised:
        validate("sft", table, report_dir=tmp_path / "report")
    message, result = str(raised.value), raised.value.result
    assert len(result.failures) == 2 * result.n_rows > 20
    lines = message.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:5] == ["file", "row", "column", "rule", "value"])
    assert all(line.startswith("raw.parquet") for line in lines[header + 1 : header + 21])
    assert lines[header + 21].startswith(f"... and {len(result.failures) - 20} more failures")
    assert "run the materialize step" in message
    assert str(result.validation_json) in message and str(result.docs_html) in message


def test_quarantine_refuses_table_level_failures(good_rows, tmp_path):
    table = tmp_path / "no_videos.parquet"
    pd.DataFrame({"messages": [r["messages"] for r in good_rows["sft"]]}).to_parquet(table)
    with pytest.raises(ContractError, match="table-level") as raised:
        validate("sft", table, on_bad_rows="quarantine", report_dir=tmp_path)
    failure = raised.value.result.failures[0]
    assert (failure.row, failure.rule) == (None, "expect_table_columns_to_match_set")
    assert "missing columns ['videos']" in failure.value


def test_an_empty_table_fails(tmp_path):
    table = _sft_table([], tmp_path / "empty.parquet")
    with pytest.raises(ContractError, match="expect_table_row_count_to_be_between"):
        validate("sft", table, report_dir=tmp_path)


def test_gx_result_and_data_docs_show_the_custom_expectations(case_outcomes):
    result, _, _ = case_outcomes["rl"]
    record = json.loads(result.validation_json.read_text())
    failed = {r["expectation_config"]["type"] for r in record["results"] if not r["success"]}
    assert {"expect_column_values_to_be_chat_turns", "expect_prompts_to_mark_their_video"} <= failed
    assert record["suite_name"] == "rl_rows"
    page = result.docs_html.read_text()
    assert page.lstrip().lower().startswith("<!doctype html") and "rl_rows" in page
    assert "the prompt has exactly one video marker" in page


def test_arguments_and_unreadable_tables_are_refused(tmp_path):
    with pytest.raises(ValueError, match="kind"):
        validate("dpo", tmp_path / "x.parquet", report_dir=tmp_path)
    with pytest.raises(ValueError, match="split"):
        validate("eval", tmp_path / "x.parquet", split="nextqa", report_dir=tmp_path)
    with pytest.raises(ValueError, match="eval tables only"):
        validate("rl", tmp_path / "x.parquet", video_dir=tmp_path, report_dir=tmp_path)
    with pytest.raises(ValueError, match="on_bad_rows"):
        validate("sft", tmp_path / "x.parquet", on_bad_rows="drop", report_dir=tmp_path)
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(ContractError, match="not a readable parquet file"):
        validate("eval", tmp_path / "bad.parquet", split="charades", report_dir=tmp_path)
    (tmp_path / "bad.jsonl").write_text('{"video": "a.mp4"}\nnot json\n')
    with pytest.raises(ContractError, match="line 2 is not valid JSON"):
        validate("eval", tmp_path / "bad.jsonl", split="charades", report_dir=tmp_path)
    with pytest.raises(ContractError, match="table not found"):
        validate("sft", tmp_path / "absent.parquet", report_dir=tmp_path)


def test_lvbench_rows_may_name_their_video_by_video_path(world, tmp_path):
    """The lmms-lab LVBench copy carries `video_path` instead of `key` (SPEC §7 loader)."""
    rows = [{**row, "video_path": f"{row.pop('key')}.mp4"} for row in _eval_rows(world, "lvbench")]
    table = _write_jsonl(rows, tmp_path / "lvbench.jsonl")
    _touch_media("lvbench", table, tmp_path / "videos")
    assert validate("eval", table, split="lvbench", report_dir=tmp_path, video_dir=tmp_path / "videos").passed
    (tmp_path / "videos" / rows[0]["video_path"]).unlink()
    with pytest.raises(ContractError, match="expect_rows_to_name_existing_videos"):
        validate("eval", table, split="lvbench", report_dir=tmp_path, video_dir=tmp_path / "videos")


# --- the pure rules on pandas' numpy cells ------------------------------------------------


def test_rules_accept_the_numpy_cells_pandas_reads(good_rows, tmp_path):
    """`pd.read_parquet` gives numpy arrays for list cells; the rules read them as lists."""
    table = _sft_table(good_rows["sft"][:1], tmp_path / "one.parquet")
    row = pd.read_parquet(table).iloc[0]
    assert isinstance(row["messages"], np.ndarray)
    assert rules.chat_turns_problem(row["messages"]) is None
    assert rules.chat_roles_problem(row["messages"]) is None
    assert rules.final_role_problem(row["messages"], "assistant") is None
    assert rules.video_list_problem(row["videos"]) is None
    assert rules.media_files_problem(row["messages"]) is None
    assert rules.kind_problem(np.array(["a", "b"], dtype=object), "text_list") is None


@pytest.mark.parametrize(
    ("extra_info", "problem"),
    [
        ('{"answer": "B", "question_type": "mcq"}', None),
        ('{"answer": " c ", "question_type": "mcq"}', None),
        ('{"answer": "[12.0, 15.5]", "question_type": "tvg"}', None),
        ('{"answer": "a red circle", "question_type": "oe"}', None),
        ('{"answer": "E", "question_type": "mcq"}', "mcq answer 'E' is not one letter A-D (SPEC §4.2)"),
        ('{"answer": "[3, 3]", "question_type": "tvg"}', "tvg answer '[3, 3]' is not an [s, e] pair"),
        ('{"answer": "the", "question_type": "oe"}', "oe answer 'the' is not a phrase with at least one word"),
    ],
)
def test_scorable_answers_follow_the_reward_scorers(extra_info, problem):
    found = rules.scorable_answer_problem(extra_info)
    assert found == problem if problem is None else found.startswith(problem)


# --- the real benchmark rows ------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
@pytest.mark.parametrize("split", [s for s in EVAL_SPLITS if s != "videomme_val"])  # the benchmarks' own rows
def test_real_benchmark_rows_pass_their_contract(split, fmt, tmp_path):
    name = "videomme" if split == "videomme_wsub" else split
    rows_path = BENCHMARKS / name / f"{name}.{fmt}"
    if not rows_path.is_file():
        pytest.skip(f"real benchmark rows not found at {rows_path} (../shared/benchmarks is absent)")
    jsonl = BENCHMARKS / name / f"{name}.jsonl"
    _touch_media(split, jsonl, tmp_path / "videos")
    result = validate("eval", rows_path, split=split, report_dir=tmp_path / "report", video_dir=tmp_path / "videos")
    assert result.passed, result.failures[:5]
    assert result.n_rows == len(jsonl.read_text().splitlines())
    without_videos = validate("eval", rows_path, split=split, report_dir=tmp_path / "report")
    assert without_videos.passed


def _real_jsonl(name: str) -> list[dict]:
    path = BENCHMARKS / name / f"{name}.jsonl"
    if not path.is_file():
        pytest.skip(f"real benchmark rows not found at {path} (../shared/benchmarks is absent)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_real_quirks_pass_their_contract_as_the_loader_reads_them(tmp_path):
    """Blank MLVU candidates and a null LVBench uid (both in real rows) are not contract failures."""
    mlvu = _real_jsonl("mlvu")[:3]
    mlvu[1] = {**mlvu[1], "candidates": [*mlvu[1]["candidates"], ""]}
    (lvbench,) = _real_jsonl("lvbench")
    for split, rows in (("mlvu", mlvu), ("lvbench", [{**lvbench, "uid": None}])):
        path = _write_jsonl(rows, tmp_path / f"{split}.jsonl")
        _touch_media(split, path, tmp_path / "videos")
        result = validate("eval", path, split=split, report_dir=tmp_path / split, video_dir=tmp_path / "videos")
        assert result.passed, result.failures[:5]


# --- media outside the root; messages as JSON strings -------------------------------------


def test_media_outside_the_media_root_fail_the_sft_and_rl_contracts(good_rows, media_root, tmp_path):
    outside = tmp_path / "elsewhere.mp4"
    outside.write_bytes(b"not under the root")
    sft = copy.deepcopy(good_rows["sft"][0])
    sft["videos"] = ["file:///etc/passwd"]
    climbing = copy.deepcopy(good_rows["sft"][1])
    climbing["videos"] = [f"file://{media_root}/selfqa/../../{outside.parent.name}/{outside.name}"]
    table = _sft_table([sft, climbing, *good_rows["sft"][2:]], tmp_path / "shard.parquet")
    assert validate("sft", table, report_dir=tmp_path / "open").passed  # both files exist
    result = validate("sft", table, report_dir=tmp_path / "report", media_root=media_root,
                      on_bad_rows="quarantine")
    assert sorted(f.row for f in result.failures if f.column == "videos") == [1, 2]
    assert all("outside the media root" in f.value for f in result.failures if f.column == "videos")
    rl = copy.deepcopy(good_rows["rl"][0])
    rl["videos"] = [{**rl["videos"][0], "video": "/etc/passwd"}]
    path = tmp_path / "rl.parquet"
    path.write_bytes(parquet_bytes([rl, *good_rows["rl"][1:]], RL_SCHEMA))
    result = validate("rl", path, report_dir=tmp_path / "rl", media_root=media_root, on_bad_rows="quarantine")
    assert [f.row for f in result.failures] == [1]


def test_sft_messages_stored_as_json_strings_pass_like_lists(good_rows, media_root, tmp_path):
    rows = [{**row, "messages": json.dumps(row["messages"])} for row in good_rows["sft"]]
    path = _write_jsonl(rows, tmp_path / "sft.jsonl")
    assert validate("sft", path, report_dir=tmp_path / "report", media_root=media_root).passed
    broken = [{**rows[0], "messages": "[{not json"}, *rows[1:]]
    result = validate("sft", _write_jsonl(broken, tmp_path / "bad.jsonl"), report_dir=tmp_path / "bad",
                      on_bad_rows="quarantine")
    assert {f.row for f in result.failures} == {1}


# --- media health: undecodable videos are contract failures named with their row ----------


def test_an_undecodable_sft_video_is_quarantined_with_its_row(good_rows, media_root, tmp_path):
    broken = tmp_path / "media" / "selfqa" / "zero.mp4"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"")
    text = broken.with_name("text.mp4")
    text.write_text("not a video\n")
    rows = copy.deepcopy(good_rows["sft"][:4])
    rows[1]["videos"] = [f"file://{broken}"]
    rows[3]["videos"] = [f"file://{text}"]
    table = _sft_table(rows, tmp_path / "shard.parquet")
    assert validate("sft", table, report_dir=tmp_path / "plain").passed  # the files exist: only probing tells
    result = validate("sft", table, report_dir=tmp_path / "report", on_bad_rows="quarantine",
                      media_health=tmp_path / "health")
    health = {f.row: f.value for f in result.failures if f.rule == "expect_column_values_to_reference_healthy_videos"}
    assert sorted(health) == [2, 4]
    assert f"video {broken} cannot be used: the file is empty (0 bytes)" in health[2]
    assert pq.read_table(result.kept_path).num_rows == 2
    assert len(list((tmp_path / "health").glob("*.json"))) >= 3  # verdicts cached by content hash


def test_an_undecodable_eval_video_is_quarantined_with_its_row(tmp_path):
    from tests.conftest import write_test_video

    videos = tmp_path / "videos"
    videos.mkdir()
    write_test_video(videos / "GOOD1.mp4", seconds=4.0)
    (videos / "EMPTY.mp4").write_bytes(b"")
    rows = [{"video": "GOOD1.mp4", "caption": "a person sits.", "timestamp": [1.0, 2.0]},
            {"video": "EMPTY.mp4", "caption": "a person stands.", "timestamp": [0.5, 1.5]}]
    path = _write_jsonl(rows, tmp_path / "charades.jsonl")
    result = validate("eval", path, split="charades", report_dir=tmp_path / "report", video_dir=videos,
                      media_health=tmp_path / "health", on_bad_rows="quarantine")
    assert [(f.row, f.rule) for f in result.failures] == [(2, "expect_rows_to_name_healthy_videos")]
    assert "EMPTY.mp4 cannot be used: the file is empty" in result.failures[0].value
    assert result.kept_path.read_text().splitlines() == [json.dumps(rows[0])]


def test_probing_videos_in_processes_reports_what_a_serial_run_reports(good_rows, media_root, tmp_path, caplog,
                                                                       monkeypatch):
    """Issue #44 item 9: `probe_workers` probes a table's videos in a process pool before the
    rules run; the failures (rows, rules, messages, order) and the kept rows are the serial run's."""
    import logging

    from paravt_core.video import health as health_module

    monkeypatch.setattr(health_module, "MIN_VIDEOS_PER_WORKER", 1)  # a pool however few the videos

    bad = tmp_path / "media" / "selfqa"
    bad.mkdir(parents=True)
    (bad / "zero.mp4").write_bytes(b"")
    (bad / "text.mp4").write_text("not a video\n")
    rows = copy.deepcopy(good_rows["sft"][:6])
    rows[4]["videos"] = [f"file://{bad / 'zero.mp4'}"]
    rows[1]["videos"] = [f"file://{bad / 'text.mp4'}"]
    rows[2]["videos"] = [f"file://{bad / 'zero.mp4'}"]
    table = _sft_table(rows, tmp_path / "shard.parquet")

    def run(workers: int):
        return validate("sft", table, report_dir=tmp_path / f"report{workers}", on_bad_rows="quarantine",
                        media_health=tmp_path / f"health{workers}", probe_workers=workers)

    serial = run(1)
    with caplog.at_level(logging.INFO, logger="paravt_core.video.health"):
        pooled = run(2)
    assert "2 processes" in caplog.text
    assert [f.row for f in serial.failures if "healthy" in f.rule] == [2, 3, 5]
    assert pooled.failures == serial.failures
    assert pq.read_table(pooled.kept_path).equals(pq.read_table(serial.kept_path))


def test_the_probe_pool_never_reads_a_video_outside_the_media_root(good_rows, media_root, tmp_path, monkeypatch):
    from paravt_core.video import health as health_module

    monkeypatch.setattr(health_module, "MIN_VIDEOS_PER_WORKER", 1)

    outside = tmp_path / "elsewhere" / "huge.mp4"
    outside.parent.mkdir()
    outside.write_bytes(b"\0" * 1024)
    asked: list[str] = []
    real = health_module.MediaHealthCache.check_all
    monkeypatch.setattr(health_module.MediaHealthCache, "check_all",
                        lambda self, paths, **kw: asked.extend(map(str, paths)) or real(self, paths, **kw))
    rows = copy.deepcopy(good_rows["sft"][:3])
    rows[1]["videos"] = [f"file://{outside}"]
    result = validate("sft", _sft_table(rows, tmp_path / "shard.parquet"), report_dir=tmp_path / "report",
                      on_bad_rows="quarantine", media_root=media_root, media_health=tmp_path / "health",
                      probe_workers=2)
    assert {f.row for f in result.failures} == {2}
    assert asked and str(outside) not in asked


@pytest.mark.parametrize(
    ("window", "problem"),
    [
        ({}, None),
        ({"video_start": None, "video_end": None}, None),
        ({"video_start": float("nan"), "video_end": float("nan")}, None),  # pandas' null
        ({"video_start": 16.0, "video_end": 32.0}, None),
        ({"video_start": 0, "video_end": 4}, None),
        ({"video_start": 32.0, "video_end": 16.0}, "0 <= start < end"),
        ({"video_start": -1.0, "video_end": 4.0}, "0 <= start < end"),
        ({"video_start": 3.0, "video_end": None}, "0 <= start < end"),
        ({"video_start": "0", "video_end": 4.0}, "0 <= start < end"),
    ],
)
def test_a_video_item_window_must_be_ordered_seconds(window, problem):
    """#15: sub-agent rows show a crop as a video item with video_start / video_end (SPEC §3)."""
    turns = [
        {"role": "user", "content": [{"type": "video_url", "video_url": {"url": "selfqa/a.mp4"}, **window},
                                     {"type": "text", "text": "Summarize."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Nothing."}]},
    ]
    found = rules.chat_turns_problem(turns)
    assert found is None if problem is None else problem in found


def test_a_video_outside_the_media_root_is_never_read_by_the_health_probe(good_rows, media_root, tmp_path,
                                                                          monkeypatch):
    """Issue #33 item 8: a 30 GB file outside the data root was hashed and decoded (78 s) before it was
    quarantined; containment now comes first."""
    from paravt_core.video import health as health_module

    outside = tmp_path / "elsewhere" / "huge.mp4"
    outside.parent.mkdir()
    outside.write_bytes(b"\0" * 1024)
    probed: list[str] = []
    real = health_module.MediaHealthCache.check
    monkeypatch.setattr(health_module.MediaHealthCache, "check",
                        lambda self, path: probed.append(str(path)) or real(self, path))
    rows = copy.deepcopy(good_rows["sft"][:3])
    rows[1]["videos"] = [f"file://{outside}"]
    table = _sft_table(rows, tmp_path / "shard.parquet")
    result = validate("sft", table, report_dir=tmp_path / "report", on_bad_rows="quarantine", media_root=media_root,
                      media_health=tmp_path / "health")
    assert {f.row for f in result.failures} == {2}
    assert all("outside the media root" in f.value for f in result.failures)
    assert str(outside) not in probed and probed  # the others were probed, the outside file never
