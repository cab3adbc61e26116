"""Model references of the evaluation: registry aliases, version numbers and local folders."""

from __future__ import annotations


import pytest

from paravt_core import registry
from paravt_core.config import PipelineConfig
from paravt_core.eval.models import ModelReferenceError, resolve_model
from paravt_core.refs import ArtifactRef, content_hash


@pytest.fixture()
def cfg(tmp_path) -> PipelineConfig:
    return PipelineConfig.model_validate({"run": {"output_dir": str(tmp_path / "out")}})


def register(cfg: PipelineConfig, ckpt: ArtifactRef, alias: str) -> registry.ModelVersion:
    return registry.register_checkpoint(cfg.mlflow_uri(), cfg.mlflow.experiment, cfg.model.registered_name, ckpt,
                                        stage="rl", parent_version=None, data_sha256="d", config_hash="c",
                                        git_revision="g", alias=alias)


def test_aliases_and_versions_resolve_to_the_registered_folders_hash_checked(cfg, tmp_path, fake_checkpoint):
    """The local store registers by reference (#60 finding 5): the version is its folder, not a copy."""
    sft = register(cfg, fake_checkpoint(tmp_path / "sft", "weights-1"), "sft")
    rl = register(cfg, fake_checkpoint(tmp_path / "rl", "weights-2"), "champion")

    by_alias = resolve_model(cfg, "champion")
    assert (by_alias.label, by_alias.version) == ("champion", rl.version)
    assert by_alias.artifact.sha256 == rl.checkpoint_sha256 == content_hash(by_alias.artifact.path)
    assert by_alias.artifact.path == (tmp_path / "rl").resolve()

    by_number = resolve_model(cfg, sft.version)
    assert (by_number.label, by_number.version) == (f"v{sft.version}", sft.version)
    assert by_number.artifact.sha256 == sft.checkpoint_sha256
    assert not (cfg.run.output_dir / "eval" / "models").exists()  # nothing copied


def test_a_registered_folder_changed_or_gone_is_refused(cfg, tmp_path, fake_checkpoint):
    import shutil

    register(cfg, fake_checkpoint(tmp_path / "rl", "weights-2"), "champion")
    (tmp_path / "rl" / "config.json").write_text('{"model": "other"}')
    with pytest.raises(ModelReferenceError, match="hashes to .* registered by reference was changed"):
        resolve_model(cfg, "champion")
    shutil.rmtree(tmp_path / "rl")
    with pytest.raises(ModelReferenceError, match=r"registered as the folder .*rl, which no longer exists"):
        resolve_model(cfg, "champion")


def test_a_version_uploaded_to_a_server_is_downloaded_once(cfg, tmp_path, fake_checkpoint, monkeypatch):
    monkeypatch.setattr(registry, "local_store_dir", lambda uri: None)  # as for an MLflow server
    rl = register(cfg, fake_checkpoint(tmp_path / "rl", "weights-2"), "champion")
    by_alias = resolve_model(cfg, "champion")
    assert by_alias.artifact.sha256 == rl.checkpoint_sha256
    assert by_alias.artifact.path.is_relative_to((cfg.run.output_dir / "eval" / "models").resolve())
    weights = by_alias.artifact.path / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert resolve_model(cfg, "champion") == by_alias and weights.stat().st_mtime_ns == stamp  # no second download


def test_a_local_folder_is_used_in_place(cfg, tmp_path, fake_checkpoint):
    ckpt = fake_checkpoint(tmp_path / "my-model", "w")
    resolved = resolve_model(cfg, str(ckpt.path))
    assert resolved.artifact.path == ckpt.path.resolve() and resolved.artifact.sha256 == ckpt.sha256
    assert (resolved.label, resolved.version) == ("my-model", None)


def test_unknown_alias_and_version_name_what_to_pass(cfg, tmp_path, fake_checkpoint):
    register(cfg, fake_checkpoint(tmp_path / "a", "w"), "sft")
    with pytest.raises(ModelReferenceError, match="alias 'candidate'.*version number, 'base' or a local model"):
        resolve_model(cfg, "candidate")
    with pytest.raises(ModelReferenceError, match="has no version 9"):
        resolve_model(cfg, "9")


@pytest.mark.parametrize("reference", ["outputs/tiny/sft/model", "./model", "~/no-such-model", "/no/such/model"])
def test_a_path_that_names_no_folder_is_a_missing_folder_not_an_unknown_alias(cfg, reference):
    with pytest.raises(ModelReferenceError, match="model folder .*: it does not exist; pass an existing model folder"):
        resolve_model(cfg, reference)


def test_a_file_given_as_the_model_is_named_as_a_file(cfg, tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x")
    with pytest.raises(ModelReferenceError, match="model.safetensors: it is a file, not a model folder"):
        resolve_model(cfg, str(tmp_path / "model.safetensors"))
