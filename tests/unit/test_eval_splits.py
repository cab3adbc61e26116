"""The evaluation's split records (`eval/splits.py`, SPEC §7): one record per split, read by the
config, the download, the data stage, the generated world and the report; a toy split added to
the records reaches each of them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

from paravt_core.eval import samples, splits

REPO = Path(__file__).resolve().parents[2]


def test_every_split_has_a_loader_under_its_name_and_a_row_format():
    from data_contracts.suites import ROW_FORMATS

    assert set(samples.SAMPLE_BUILDERS) == set(splits.SPLITS)
    assert {record.row_format for record in splits.SPLITS.values()} <= set(ROW_FORMATS)


def test_the_records_give_what_the_readers_had():
    from paravt_core.config import EVAL_SPLITS, KNOWN_SPLITS
    from paravt_core.data.synth.benchmarks import GENERATED_SPLITS, VALIDATION_SPLIT
    from paravt_core.data.synth.config import VideoSet
    from paravt_core.eval.report import PAPER_TABLE1, TABLE1_HEADERS, TABLE1_SPLITS

    assert EVAL_SPLITS == TABLE1_SPLITS == ("videomme", "videomme_wsub", "longvideobench", "lvbench", "mlvu", "mmvu",
                                            "charades")
    assert KNOWN_SPLITS == (*EVAL_SPLITS, "videomme_val") and VALIDATION_SPLIT == "videomme_val"
    assert set(typing.get_args(VideoSet)) == {"train", *GENERATED_SPLITS} and "videomme_wsub" not in GENERATED_SPLITS
    assert TABLE1_HEADERS[0] == "VideoMME w/o sub" and TABLE1_HEADERS[-1] == "Charades-STA mIoU"
    assert PAPER_TABLE1["ParaVT-8B (paper)"] == (62.1, 69.4, 60.4, 39.8, 65.0, 68.6, 50.1)
    assert all(set(r.paper) == set(splits.PAPER_ROWS) for r in splits.SPLITS.values() if r.benchmark)


# Run in a fresh interpreter: the toy record goes into `eval/splits.py`'s records (a copy of the
# file with one more record, loaded in its place) before anything reads them, as an edit would;
# its loader goes under its name beside Video-MME's, whose rows (and row format) it shares.
TOY = textwrap.dedent('''
    import importlib.util, json, sys
    from pathlib import Path

    import paravt_core.eval
    source = Path(paravt_core.eval.__file__).with_name("splits.py").read_text()
    toy = (
        'EvalSplit("toy", BenchmarkLayout("toy", "toy-org/ToyBench", "data/test.parquet", "clips",'
        ' video_archive="clips.zip"), "videomme", "ToyBench", {QWEN: 10.0, PARAVT: 20.0}),\\n'
    )
    marker = "\\n)\\n\\nSPLITS"
    assert marker in source
    copy = Path(sys.argv[1]) / "splits.py"
    copy.write_text(source.replace(marker, "\\n    " + toy + ")\\n\\nSPLITS", 1))
    spec = importlib.util.spec_from_file_location("paravt_core.eval.splits", copy)
    module = importlib.util.module_from_spec(spec)
    sys.modules["paravt_core.eval.splits"] = module
    spec.loader.exec_module(module)

    from paravt_core.eval import samples
    samples.SAMPLE_BUILDERS["toy"] = lambda row, video_dir: samples.videomme_sample(row, video_dir, split="toy")
    samples.SPLITS = tuple(samples.SAMPLE_BUILDERS)
    from data_contracts import suites

    from data_contracts.contract import _check_arguments
    from paravt_core.config import EVAL_SPLITS, load_config
    from paravt_core.data import hub, stage
    from paravt_core.eval.report import build_report, format_table

    out = {"eval_splits": list(EVAL_SPLITS)}
    cfg = load_config(Path(sys.argv[2]) / "conf/pipeline/tiny.yaml", ["eval.splits=[toy]"])
    out["config_splits"] = list(cfg.eval.splits)
    out["requests"] = [[r.repo_id, list(r.allow_patterns)] for r in hub.benchmark_requests("main", ("toy",))]
    out["stage_layout"] = stage.LAYOUTS["toy"].annotation_file
    row = {"question_id": "q1", "videoID": "v1", "video_id": "001", "duration": "short", "domain": "d",
           "sub_category": "s", "task_type": "t", "question": "Which?", "options": ["A. red", "B. blue"],
           "answer": "B"}
    rows = Path(sys.argv[1]) / "rows.jsonl"
    rows.write_text(json.dumps(row) + "\\n")
    loaded = samples.read_split("toy", rows, Path(sys.argv[1]))
    out["loaded"] = [[s.split, s.answer, s.kind] for s in loaded.samples]
    _check_arguments("eval", "toy", "fail", (None, None))
    out["row_format"] = suites.row_format("eval", "toy", row).id_column
    def rules(split):
        fmt = suites.row_format("eval", split, row)
        return sorted(type(e).__name__ for e in suites.column_rules(fmt) + suites.eval_rules(split, fmt, None, None))

    rules = {split: rules(split) for split in ("toy", "videomme")}
    out["contract_rules"] = [rules["toy"], rules["videomme"]]
    summary = {"primary": {"name": "accuracy", "value": 0.5}, "n": 1}
    report = build_report("rl", "ab" * 32, Path(sys.argv[1]), {"toy": summary})
    out["table"] = format_table({"rl": report})
    print(json.dumps(out))
''')


def test_a_toy_split_added_to_the_records_reaches_every_reader(tmp_path):
    done = subprocess.run([sys.executable, "-c", TOY, str(tmp_path), str(REPO)], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["eval_splits"][-1] == "toy" and out["config_splits"] == ["toy"]
    assert out["requests"] == [["toy-org/ToyBench", ["data/test.parquet", "clips.zip"]]]
    assert out["stage_layout"] == "data/test.parquet"
    assert out["loaded"] == [["toy", "B", "mcq"]] and out["row_format"] == "question_id"
    toy_rules, videomme_rules = out["contract_rules"]
    assert toy_rules == videomme_rules and "ExpectColumnValuesToBeLetteredOptions" in toy_rules
    header, _, ours, qwen, paravt, *_ = out["table"].splitlines()
    assert header.endswith("| ToyBench | avg |") and ours.endswith("| 50.0 | 50.0* |")
    assert qwen.split("|")[-3].strip() == "10.0" and paravt.split("|")[-3].strip() == "20.0"


def test_the_generated_world_moves_with_the_split_records(monkeypatch, tmp_path):
    """The world writes the records' layouts: an edit of `eval/splits.py` is a new world folder."""
    from paravt_core.config import load_config
    from paravt_core.data import mirror
    from paravt_core.data.mirror import world_dir

    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", [f"run.output_dir={tmp_path}"])
    before, real = world_dir(cfg), mirror.source_digest
    monkeypatch.setattr(mirror, "source_digest", lambda package, only=None: real(package, only) + (
        "edited" if (package, only) == ("paravt_core.eval", ("splits.py",)) else ""))
    assert world_dir(cfg) != before
