"""Cache keys of the evaluation task (one checkpoint, its splits): what invalidates a cached
evaluation, what does not."""

from __future__ import annotations

from pathlib import Path

from paravt_core.config import PipelineConfig
from paravt_core.eval import stage as eval_stage
from paravt_core.refs import ArtifactRef, content_hash
from tasks.eval import _model_key

MODEL = ArtifactRef(kind="model", path=Path("/models/m"), sha256="a" * 64)


def eval_data(root: Path) -> ArtifactRef:
    folder = root / "eval" / "videomme"
    folder.mkdir(parents=True)
    (folder / "split.json").write_text('{"split": "videomme"}')
    (folder / "rows.jsonl").write_text('{"question_id": "1"}\n')
    return ArtifactRef(kind="eval_data", path=root / "eval", sha256=content_hash(root / "eval"))


def config(root: Path, **eval_fields) -> PipelineConfig:
    return PipelineConfig.model_validate({"run": {"output_dir": str(root / "out")}, "eval": eval_fields})


def key(cfg: PipelineConfig, data: ArtifactRef, model: ArtifactRef = MODEL, label: str = "base") -> str:
    return _model_key(None, {"cfg": cfg, "model": model, "eval_data": data, "label": label, "splits": ("videomme",)})


def results_written(cfg: PipelineConfig, model: ArtifactRef = MODEL) -> Path:
    """The split's results JSON, present: the key then keeps its epoch (tasks._cache)."""
    results = eval_stage.results_dir(cfg, model) / "videomme.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text("{}")
    return results


def test_key_is_stable_and_ignores_scheduling_knobs(tmp_path):
    data = eval_data(tmp_path)
    results_written(config(tmp_path))
    first = key(config(tmp_path), data)
    assert key(config(tmp_path), data) == first
    assert key(config(tmp_path, concurrency=8, splits=["videomme"]), data) == first
    own_server = {"engine": "openai", "server": "vllm", "gpus": [0, 1], "server_startup_timeout_s": 60}
    results_written(config(tmp_path, engine="openai"))
    assert key(config(tmp_path, engine="openai"), data) == key(config(tmp_path, **own_server), data)


def test_key_changes_with_settings_model_samples_and_split_data(tmp_path):
    data = eval_data(tmp_path)
    results_written(config(tmp_path))
    first = key(config(tmp_path), data)
    other_model = MODEL.model_copy(update={"sha256": "b" * 64})
    variants = [(config(tmp_path, max_new_tokens=64), MODEL), (config(tmp_path, dispatch="sequential"), MODEL),
                (config(tmp_path, max_samples_per_split=5), MODEL), (config(tmp_path), other_model)]
    for cfg, model in variants:
        results_written(cfg, model)  # each variant's output present, so only the key's hashes differ
        assert key(cfg, data, model) == key(cfg, data, model) != first
    assert key(config(tmp_path), data, label="sft") != first  # the report carries the label
    (data.path / "videomme" / "rows.jsonl").write_text('{"question_id": "2"}\n')
    assert key(config(tmp_path), data) != first


def test_a_deleted_results_file_renews_the_key(tmp_path):
    data, cfg = eval_data(tmp_path), config(tmp_path)
    first = key(cfg, data)  # output missing: a fresh epoch is stamped
    results = results_written(cfg)
    kept = key(cfg, data)
    assert key(cfg, data) == kept
    results.unlink()
    assert key(cfg, data) not in (kept, first)


def test_results_folder_is_keyed_by_model_and_result_settings_only(tmp_path):
    base = eval_stage.results_dir(config(tmp_path), MODEL)
    assert base.parent == tmp_path / "out" / "eval" and base.name.startswith("a" * 12 + "-")
    assert eval_stage.results_dir(config(tmp_path, concurrency=4, max_samples_per_split=2), MODEL) == base
    assert eval_stage.results_dir(config(tmp_path, tool_mode="subagent"), MODEL) != base
