"""The evaluation resume key (`paravt_core.eval.stage`): a finished record is reused only for
the same checkpoint, result settings, prompt wording and split data (SPEC §7 "Re-runs resume")."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from paravt_core.config import PipelineConfig
from paravt_core.eval import stage as eval_stage
from paravt_core.eval.results import EpisodeOutcome
from paravt_core.eval.samples import EvalSample
from paravt_core.refs import ArtifactRef, content_hash

MODEL = ArtifactRef(kind="model", path=Path("/models/m"), sha256="a" * 64)


def lvbench_row(uid: str, answer: str) -> dict:
    """An LVBench annotation row in the dataset's own layout (options inside the question)."""
    return {"key": f"video{uid}", "type": "cartoon", "uid": uid, "answer": answer,
            "question": f"What year is shown ({uid})?\n(A) 1636\n(B) 1366\n(C) 1363\n(D) 1633",
            "question_type": ["key information retrieval"], "time_reference": "00:15-00:19"}


def write_rows(eval_root: Path, rows: Sequence[dict]) -> None:
    """The split folder the data stage prepares: annotation rows and split.json (SPEC §7)."""
    folder, videos = eval_root / "lvbench", eval_root.parent / "videos"
    folder.mkdir(parents=True, exist_ok=True)
    videos.mkdir(exist_ok=True)
    for row in rows:
        (videos / f"{row['key']}.mp4").write_bytes(b"")  # present; the runner below never decodes it
    (folder / "lvbench.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    record = {"split": "lvbench", "rows": str(folder / "lvbench.jsonl"), "video_dir": str(videos),
              "subtitle_dir": None}
    (folder / "split.json").write_text(json.dumps(record))


def eval_data(eval_root: Path) -> ArtifactRef:
    return ArtifactRef(kind="eval_data", path=eval_root, sha256=content_hash(eval_root))


class AnswersA:
    """A runner whose every episode answers "A"; records the sample ids it was asked for."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def outcomes(self, samples: Sequence[EvalSample]) -> Iterator[tuple[EvalSample, EpisodeOutcome]]:
        for sample in samples:
            self.asked.append(sample.id)
            yield sample, EpisodeOutcome("<answer>A</answer>", 1, 0, 0, 0, 0, "answer")


@pytest.fixture()
def cfg(tmp_path: Path) -> PipelineConfig:
    return PipelineConfig.model_validate({"run": {"output_dir": str(tmp_path / "out")}})


def evaluate(cfg: PipelineConfig, eval_root: Path) -> tuple[eval_stage.SplitRun, list[str]]:
    runner = AnswersA()
    run = eval_stage.evaluate_prepared_split(cfg, MODEL, eval_data(eval_root), "lvbench", runner=runner,
                                             progress=False)
    return run, runner.asked


def test_an_unchanged_split_resumes_and_runs_nothing(tmp_path, cfg):
    root = tmp_path / "eval"
    write_rows(root, [lvbench_row("1", "A"), lvbench_row("2", "B")])
    first, asked = evaluate(cfg, root)
    assert asked == ["1", "2"] and first.summary["accuracy"] == 0.5
    again, asked = evaluate(cfg, root)
    assert asked == [] and again.evaluated == 0 and again.summary == first.summary


def test_re_prepared_rows_invalidate_the_finished_records(tmp_path, cfg):
    """Same sample ids, other answers: the old records must not be reused."""
    root = tmp_path / "eval"
    write_rows(root, [lvbench_row("1", "A"), lvbench_row("2", "B")])
    first, _ = evaluate(cfg, root)
    first_pin = eval_stage.split_data_hash(eval_data(root), "lvbench")
    write_rows(root, [lvbench_row("1", "B"), lvbench_row("2", "A")])
    second, asked = evaluate(cfg, root)
    assert asked == ["1", "2"] and second.evaluated == 2
    records = json.loads(second.results_json.read_text())["samples"]
    assert [(r["id"], r["answer"], r["correct"]) for r in records] == [("1", "B", False), ("2", "A", True)]
    folder = second.results_json.parent
    old_log = (folder / f"lvbench.jsonl.stale-{first_pin[:12]}").read_text().splitlines()
    assert [json.loads(line)["answer"] for line in old_log] == ["A", "B"]  # the old records, kept aside
    assert (folder / f"lvbench.json.stale-{first_pin[:12]}").is_file()
    pinned = json.loads((folder / "lvbench.source.json").read_text())["split_sha256"]
    assert pinned == eval_stage.split_data_hash(eval_data(root), "lvbench")
    assert len((folder / "lvbench.jsonl").read_text().splitlines()) == 2
    _, asked = evaluate(cfg, root)  # and the new records resume in turn
    assert asked == []


def test_a_log_without_a_readable_pin_is_set_aside(tmp_path, cfg):
    root = tmp_path / "eval"
    write_rows(root, [lvbench_row("1", "A")])
    first, _ = evaluate(cfg, root)
    folder = first.results_json.parent
    (folder / "lvbench.source.json").write_text("not json")
    _, asked = evaluate(cfg, root)
    assert asked == ["1"]
    assert (folder / "lvbench.jsonl.stale-unpinned").is_file()
    (folder / "lvbench.source.json").unlink()  # a log from before pins existed, or copied in
    _, asked = evaluate(cfg, root)
    assert asked == ["1"] and (folder / "lvbench.jsonl.stale-unpinned.1").is_file()


def test_prompt_wording_sources_are_part_of_the_results_folder_key(cfg, monkeypatch):
    before = eval_stage.results_dir(cfg, MODEL)
    assert eval_stage.results_config(cfg)["prompt_sources"] == eval_stage.prompt_sources_digest()
    monkeypatch.setattr(eval_stage, "source_digest", lambda package, only: f"reworded-{package}")
    assert eval_stage.results_dir(cfg, MODEL) != before
