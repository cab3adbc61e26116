"""`data.max_quarantine_share` (issue #44 item 9): one bad video among many rows is set aside,
a quarantine that takes more than the ceiling stops the data stage naming what it set aside."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from paravt_core.config import ConfigError, PipelineConfig, load_config
from paravt_core.data.stage import QUARANTINE_LISTING, DataStageError, SetAside, check_quarantine_ceiling

REPO = Path(__file__).resolve().parents[2]


def config(**data) -> PipelineConfig:
    return PipelineConfig.model_validate({"data": {"on_bad_rows": "quarantine", **data}})


def set_aside(tmp_path: Path, rows_by_problem: dict[str, tuple[int, ...]], shard: str = "a.parquet") -> list[SetAside]:
    return [SetAside(kind="sft", table=tmp_path / shard, rows=rows, problem=problem)
            for problem, rows in rows_by_problem.items()]


def test_a_share_under_the_ceiling_passes_and_is_listed(tmp_path):
    aside = set_aside(tmp_path, {"video /m/x.mp4 cannot be used: the file is empty (0 bytes)": (7,)})
    check_quarantine_ceiling(config(max_quarantine_share=0.01), "sft", 100, aside, tmp_path)
    listed = json.loads((tmp_path / QUARANTINE_LISTING).read_text())
    assert listed == [{"kind": "sft", "table": str(tmp_path / "a.parquet"), "rows": [7],
                       "problem": "video /m/x.mp4 cannot be used: the file is empty (0 bytes)"}]


def test_a_share_over_the_ceiling_stops_naming_count_share_and_listing(tmp_path):
    # Rows 3 and 9 break two rules each: four rows are set aside, not six.
    aside = set_aside(tmp_path, {"empty video": (3, 9, 12), "duplicate id": (3, 9)}) + \
        set_aside(tmp_path, {"empty video": (1,)}, shard="b.parquet")
    check_quarantine_ceiling(config(max_quarantine_share=0.02), "sft", 200, aside, tmp_path)  # at it: passes
    with pytest.raises(DataStageError) as caught:
        check_quarantine_ceiling(config(max_quarantine_share=0.01), "sft", 200, aside, tmp_path)
    message = str(caught.value)
    assert re.search(r"the sft contracts set aside 4 of 200 rows \(2\.00%\), more than data\.max_quarantine_share "
                     r"allows \(1\.00%\)", message), message
    assert str(tmp_path / QUARANTINE_LISTING) in message and "raise data.max_quarantine_share" in message
    assert len(json.loads((tmp_path / QUARANTINE_LISTING).read_text())) == 3


def test_no_ceiling_keeps_todays_quarantine(tmp_path):
    check_quarantine_ceiling(config(), "rl", 10, set_aside(tmp_path, {"bad": tuple(range(1, 10))}), tmp_path)
    check_quarantine_ceiling(config(max_quarantine_share=0.0), "rl", 10, [], tmp_path)  # nothing set aside
    assert not (tmp_path.parent / QUARANTINE_LISTING).exists()


def test_the_ceiling_is_checked_at_load():
    tiny = REPO / "conf/pipeline/tiny.yaml"
    for bad in ("-0.1", "1.5"):
        with pytest.raises(ConfigError, match="max_quarantine_share"):
            load_config(tiny, ["data.on_bad_rows=quarantine", f"data.max_quarantine_share={bad}"])


def test_the_8b_config_quarantines_under_a_small_ceiling():
    data = load_config(REPO / "conf/pipeline/paravt_8b.yaml").data
    assert data.on_bad_rows == "quarantine" and data.max_quarantine_share is not None
    assert 0 < data.max_quarantine_share <= 0.01
    strict = load_config(REPO / "conf/pipeline/paravt_8b.yaml", ["data.on_bad_rows=fail"]).data
    assert strict.on_bad_rows == "fail"  # one override makes it strict again; the ceiling is then moot
