"""MLflow registry: versions with lineage tags, idempotent registration, aliases, promotion."""

from __future__ import annotations

from pathlib import Path

import pytest

from paravt_core import registry
from paravt_core.refs import content_hash


@pytest.fixture()
def uri(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def _register(uri, ckpt, stage, parent=None, alias=None):
    return registry.register_checkpoint(uri, "exp", "paravt-test", ckpt, stage=stage, parent_version=parent,
                                        data_sha256="d" * 8, config_hash="c" * 8, git_revision="abc", alias=alias)


def test_register_is_idempotent_and_tags_lineage(uri, tmp_path, fake_checkpoint):
    sft = fake_checkpoint(tmp_path / "sft", "weights-1")
    v1 = _register(uri, sft, "sft", alias="sft")
    again = _register(uri, sft, "sft", alias="sft")
    assert again.version == v1.version and again.run_id == v1.run_id
    rl = _register(uri, fake_checkpoint(tmp_path / "rl", "weights-2"), "rl", parent=v1.version, alias="candidate")
    assert rl.version != v1.version

    from mlflow.tracking import MlflowClient

    mv = MlflowClient(uri, registry_uri=uri).get_model_version("paravt-test", rl.version)
    assert mv.tags["parent_version"] == v1.version and mv.tags["stage"] == "rl"
    assert mv.tags["checkpoint_sha256"] == rl.checkpoint_sha256
    assert registry.version_by_alias(uri, "paravt-test", "sft").version == v1.version
    assert registry.version_by_alias(uri, "paravt-test", "champion") is None

    local = registry.download_version(uri, rl, tmp_path / "dl")
    assert content_hash(local) == rl.checkpoint_sha256


def test_promote_moves_champion_only_on_improvement(uri, tmp_path, fake_checkpoint):
    a = _register(uri, fake_checkpoint(tmp_path / "a", "A"), "rl")
    b = _register(uri, fake_checkpoint(tmp_path / "b", "B"), "rl")
    assert registry.promote(uri, "paravt-test", a, 0.40, "eval-1") is True
    assert registry.promote(uri, "paravt-test", b, 0.35, "eval-1") is False
    assert registry.version_by_alias(uri, "paravt-test", "champion").version == a.version
    assert registry.promote(uri, "paravt-test", b, 0.45, "eval-1") is True
    assert registry.version_by_alias(uri, "paravt-test", "champion").version == b.version


def test_a_champion_scored_on_another_evaluation_is_not_compared(uri, tmp_path, caplog, fake_checkpoint):
    a = _register(uri, fake_checkpoint(tmp_path / "a", "A"), "rl")
    b = _register(uri, fake_checkpoint(tmp_path / "b", "B"), "rl")
    assert registry.promote(uri, "paravt-test", a, 0.90, "old-benchmark-data") is True
    with caplog.at_level("WARNING"):
        assert registry.promote(uri, "paravt-test", b, 0.10, "new-benchmark-data") is True
    assert "scored on another evaluation" in caplog.text
    assert registry.version_by_alias(uri, "paravt-test", "champion").version == b.version


def test_registering_in_the_local_store_copies_no_model_and_writes_nothing_outside_its_folder(
        tmp_path, fake_checkpoint, monkeypatch):
    """#60 finding 5: each registration copied the model (~17.5 GB at 8B) into MLflow's default
    artifact location, `./mlruns` of the working folder, outside run.output_dir."""
    out, elsewhere = tmp_path / "out", tmp_path / "cwd"
    out.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    uri = f"sqlite:///{out / 'mlflow.db'}"
    ckpt = fake_checkpoint(out / "sft" / "model", "weights-1")
    version = _register(uri, ckpt, "sft", alias="sft")
    assert list(elsewhere.iterdir()) == []
    assert version.source == str(Path(ckpt.path).resolve())
    copies = [p for p in out.rglob("*") if p.is_file() and p.name == "model.safetensors"]
    assert copies == [Path(ckpt.path) / "model.safetensors"], copies
    local = registry.download_version(uri, version, tmp_path / "dl")  # what `paravt eval --model sft` reads
    assert content_hash(local) == ckpt.sha256


def test_a_remote_store_still_gets_the_model_as_artifacts(tmp_path, fake_checkpoint, monkeypatch):
    """An MLflow server cannot read this machine's folders: the model is uploaded, once (here a
    local database stands in for the server's, and its artifacts lie next to it)."""
    from paravt_core import tracking

    monkeypatch.setattr(registry, "local_store_dir", lambda uri: None)
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    version = _register(uri, fake_checkpoint(tmp_path / "rl", "weights-2"), "rl")
    assert version.source == f"runs:/{version.run_id}/model"
    uploaded = sorted(tmp_path.glob("mlartifacts/exp/*/artifacts/model/model.safetensors"))
    assert len(uploaded) == 1 and not (tmp_path / "mlruns").exists()
    assert tracking.local_store_dir(uri) == tmp_path and tracking.local_store_dir("http://mlflow:5000") is None
