"""`rl.question_types` picks which RL rows are trained on; every row is still checked."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from paravt_core.config import RLConfig
from paravt_core.rl.data import RLRowError, read_rl_prompts


def _row(qtype: str, answer: str) -> dict:
    prompt = [{"role": "system", "content": "You answer questions about videos."},
              {"role": "user", "content": f"<video>\nA {qtype} question?"}]
    return {"prompt": prompt, "videos": [{"video": "file:///videos/a.mp4"}],
            "extra_info": json.dumps({"answer": answer, "question_type": qtype, "question": f"A {qtype} question?"})}


def _shard(path, rows) -> None:
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_only_the_asked_types_are_kept_in_row_order(tmp_path):
    f = tmp_path / "rl.parquet"
    _shard(f, [_row("mcq", "A"), _row("oe", "red"), _row("tvg", "[1, 2]"), _row("mcq", "C")])
    assert [p.answer for p in read_rl_prompts([f])] == ["A", "red", "[1, 2]", "C"]
    assert [p.answer for p in read_rl_prompts([f], ("mcq",))] == ["A", "C"]
    assert [p.question_type for p in read_rl_prompts([f], ("oe", "tvg"))] == ["oe", "tvg"]


def test_no_row_of_the_asked_types_is_an_error_with_the_counts(tmp_path):
    f = tmp_path / "rl.parquet"
    _shard(f, [_row("mcq", "A"), _row("oe", "red")])
    with pytest.raises(RLRowError, match=r"no RL rows of types \['tvg'\].*mcq 1, tvg 0, oe 1.*rl.question_types"):
        read_rl_prompts([f], ("tvg",))


def test_a_malformed_row_fails_even_when_its_type_is_not_trained(tmp_path):
    f = tmp_path / "rl.parquet"
    bad = _row("oe", "red")
    bad["extra_info"] = json.dumps({"answer": "red", "question_type": "essay"})
    _shard(f, [_row("mcq", "A"), bad])
    with pytest.raises(RLRowError, match="rl.parquet: row 1"):
        read_rl_prompts([f], ("mcq",))


def test_the_config_defaults_to_every_type_and_rejects_unknown_or_none():
    assert RLConfig().question_types == ("mcq", "tvg", "oe")
    assert RLConfig(question_types=["mcq"]).question_types == ("mcq",)
    with pytest.raises(ValueError):
        RLConfig(question_types=["essay"])
    with pytest.raises(ValueError):
        RLConfig(question_types=[])
