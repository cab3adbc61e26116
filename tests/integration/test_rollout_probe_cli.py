"""`paravt miniature rollout-probe` end to end on the tiny model: RL shards in, one table line per truth out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paravt_core.cli import main

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _rows(video: Path, answers: list[str]) -> list[dict]:
    rows = []
    for i, answer in enumerate(answers):
        question = f"<video>\nQuestion {i}: what colour was the square?\nA. Red\nB. Blue\nAnswer with the option letter only."
        rows.append({"prompt": [{"role": "user", "content": question}], "videos": [{"video": f"file://{video}"}],
                     "extra_info": json.dumps({"answer": answer, "question_type": "mcq", "question": question})})
    return rows


def _args(out: Path, model: Path) -> list[str]:
    return ["miniature", "rollout-probe", "--config", str(REPO / "conf/pipeline/tiny.yaml"), "--set", f"run.output_dir={out}",
            "--set", "rl.rollout.max_new_tokens=12", "--set", "rl.rollout.subagent_max_new_tokens=6",
            "--model", str(model), "--prompts", "3", "--group-size", "2"]


def test_probe_reports_each_ground_truth_and_greedy_groups_never_mix(tmp_path, tiny_model_dir, short_video, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    shards = tmp_path / "out" / "data" / "materialized" / "rl"
    shards.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(_rows(short_video, ["A", "A", "B"])), shards / "rl.parquet")
    code = main([*_args(tmp_path / "out", tiny_model_dir), "--temperature", "1.0", "--temperature", "0"])
    assert code == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[1:]]
    assert [(c[0], c[1], c[2], c[3]) for c in cells] == [
        ("1", "all", "3", "6"), ("1", "A", "2", "4"), ("1", "B", "1", "2"),
        ("0", "all", "3", "6"), ("0", "A", "2", "4"), ("0", "B", "1", "2")]
    greedy = cells[3]
    assert greedy[5] == "0.00" and greedy[6] == "0.00"  # greedy rollouts of one prompt are the same text


def test_probe_without_rl_shards_says_to_run_the_data_stage(tmp_path, tiny_model_dir, capsys):
    assert main(_args(tmp_path / "empty", tiny_model_dir)) == 2
    assert "run the data stage" in capsys.readouterr().err
