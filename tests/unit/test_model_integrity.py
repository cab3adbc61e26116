"""A model folder is verified before it is registered, aliased or loaded (`paravt_core.model.integrity`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from paravt_core import registry
from paravt_core.model.integrity import MANIFEST, ModelFolderError, verify_model_dir, write_manifest


@pytest.fixture()
def model_dir(tiny_model_dir: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    return folder


def test_the_tiny_kit_writes_a_manifest_and_a_whole_folder_passes(model_dir: Path):
    recorded = json.loads((model_dir / MANIFEST).read_text())["weights"]
    assert set(recorded) == {"model.safetensors"} and recorded["model.safetensors"]["bytes"] > 0
    verify_model_dir(model_dir)


def test_a_folder_without_its_weights_is_refused(model_dir: Path):
    """Issue #33 item 2: a deleted model.safetensors was registered and aliased."""
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(ModelFolderError, match=rf"{model_dir}: no weights .*export or download the model again"):
        verify_model_dir(model_dir)


def test_a_zero_filled_weights_file_of_the_right_size_is_refused(model_dir: Path):
    """Issue #33 item 2: a zero-filled safetensors loaded silently and scored 0.0."""
    weights = model_dir / "model.safetensors"
    weights.write_bytes(bytes(weights.stat().st_size))
    with pytest.raises(ModelFolderError, match="header length field reads 0 .* zero-filled or damaged"):
        verify_model_dir(model_dir)


def test_a_changed_byte_in_the_weights_fails_the_recorded_checksum(model_dir: Path):
    weights = model_dir / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0xFF  # inside the tensor data: the header still parses
    weights.write_bytes(bytes(data))
    verify_model_dir(model_dir, checksums=False)  # sizes agree
    with pytest.raises(ModelFolderError, match="changed since it was written"):
        verify_model_dir(model_dir)


def test_a_truncated_weights_file_and_a_missing_shard_are_named(model_dir: Path):
    weights = model_dir / "model.safetensors"
    (model_dir / MANIFEST).unlink()  # a hub folder: structural checks only
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ModelFolderError, match="it is truncated"):
        verify_model_dir(model_dir)
    weights.unlink()
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-00001.safetensors"}}))
    with pytest.raises(ModelFolderError, match="weight shard model-00001.safetensors .* is missing"):
        verify_model_dir(model_dir)


def test_loading_a_damaged_folder_fails_before_anything_is_built(model_dir: Path):
    from paravt_core.model.loading import load_model

    (model_dir / "model.safetensors").unlink()
    with pytest.raises(ModelFolderError, match="no weights"):
        load_model(model_dir)


def test_registration_refuses_a_damaged_folder_and_registers_nothing(tmp_path: Path, fake_checkpoint):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ckpt = fake_checkpoint(tmp_path / "sft", "weights-1")
    (Path(ckpt.path) / "model.safetensors").unlink()
    with pytest.raises(ModelFolderError, match="no weights"):
        registry.register_checkpoint(uri, "exp", "paravt-test", ckpt, stage="sft", parent_version=None,
                                     data_sha256="d", config_hash="c", git_revision="abc", alias="candidate")
    again = fake_checkpoint(tmp_path / "rl", "weights-2")
    (Path(again.path) / "extra.txt").write_text("added after the stage hashed the folder")
    with pytest.raises(ModelFolderError, match="changed since the stage wrote it"):
        registry.register_checkpoint(uri, "exp", "paravt-test", again, stage="rl", parent_version=None,
                                     data_sha256="d", config_hash="c", git_revision="abc", alias="candidate")
    assert registry.version_by_alias(uri, "paravt-test", "candidate") is None


def test_write_manifest_needs_weights(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelFolderError, match="no weights"):
        write_manifest(tmp_path)
