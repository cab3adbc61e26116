"""The run's set-aside list: quarantined rows, skipped SFT samples and eval video errors,
each named with its stage and the file, as the full pipeline prints and writes it."""

from __future__ import annotations

import json
from pathlib import Path

from paravt_core.data.stage import SetAside
from paravt_core.eval.report import build_report
from paravt_core.eval.results import score_sample, summarize, video_error_outcome
from paravt_core.eval.samples import EvalSample
from paravt_core.set_aside import (
    format_set_aside,
    from_data_contracts,
    from_eval_reports,
    from_sft_model,
    write_set_aside,
)
from paravt_core.video.errors import VideoDecodeError

EMPTY_TRAIN = "/out/data/media/paravt/selfqa/abc.mp4"
EMPTY_EVAL = "/out/data/media/lmms-lab--charades_sta/Charades_v1_480/XYZ12.mp4"


def _eval_report(label: str):
    sample = EvalSample(id="XYZ12_0", split="charades", video_path=Path(EMPTY_EVAL), question="when?",
                        answer=(1.0, 3.0), kind="grounding", gt_start=1.0, gt_end=3.0)
    error = VideoDecodeError(EMPTY_EVAL, "the file is empty (0 bytes)")
    results = [score_sample(sample, video_error_outcome(error))]
    return build_report(label, "a" * 64, Path("/results"), {"charades": summarize("charades", results)})


def test_each_stage_names_what_it_set_aside_and_the_file(tmp_path):
    quarantined = [SetAside(kind="sft", table=Path("/out/sft/paravt_sft_x.parquet"), rows=(1, 9, 17),
                            problem=f"video {EMPTY_TRAIN} cannot be used: the file is empty (0 bytes)")]
    (tmp_path / "paravt_meta.json").write_text(json.dumps({
        "media_skipped": {"paravt_sft_x.parquet:4": str(VideoDecodeError(EMPTY_TRAIN, "no frames"))}}))
    entries = [*from_data_contracts(quarantined), *from_sft_model(tmp_path),
               *from_eval_reports({"base": _eval_report("base")})]

    lines = format_set_aside(entries).splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("data contract sft (quarantined): paravt_sft_x.parquet rows 1, 9, 17: video ")
    assert lines[1].startswith("SFT (sample skipped): paravt_sft_x.parquet:4: cannot read video ")
    assert lines[2].startswith("eval base/charades (scored 0): sample XYZ12_0: cannot read video ")
    assert EMPTY_TRAIN in lines[0] and EMPTY_TRAIN in lines[1] and EMPTY_EVAL in lines[2]

    written = json.loads(write_set_aside(tmp_path / "set_aside.json", entries).read_text())
    assert [entry["stage"] for entry in written] == [entry.stage for entry in entries]
    assert written[2]["why"].startswith(f"cannot read video {EMPTY_EVAL}: the file is empty (0 bytes).")


def test_nothing_set_aside_says_so(tmp_path):
    (tmp_path / "paravt_meta.json").write_text(json.dumps({"media_skipped": {}}))
    clean = build_report("sft", "b" * 64, Path("/r"), {"mlvu": {"n": 2, "primary": {"name": "accuracy", "value": 1.0},
                                                                "errors": []}})
    entries = [*from_data_contracts([]), *from_sft_model(tmp_path), *from_eval_reports({"sft": clean})]
    assert entries == [] and format_set_aside(entries) == "nothing (every row and sample was used)"


def test_long_row_lists_are_cut_with_a_count():
    aside = SetAside(kind="rl", table=Path("/t/rl.parquet"), rows=tuple(range(1, 13)), problem="p")
    assert from_data_contracts([aside])[0].where == "rl.parquet rows 1, 2, 3, 4, 5, 6, 7, 8 (+4)"
