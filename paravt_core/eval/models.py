"""Which checkpoint to evaluate: an MLflow alias, a version number, "base", or a local folder.

`resolve_model(cfg, reference)` turns the reference into a typed `ArtifactRef` (STYLE §3):
- an existing local folder: used in place (its content hash is computed); a reference that
  can only be a path (it holds a path separator, or starts with "." or "~") and names no
  folder is refused as a missing folder, not looked up as an alias;
- "base": the model stage's base model (`paravt_core.model.stage.run`);
- digits ("3"): that version of `model.registered_name` in the MLflow registry;
- anything else: a registry alias ("champion", "candidate", "sft").
A registry version is downloaded once into `<output_dir>/eval/models/<name>-v<version>/`
(atomically) and checked against the version's `checkpoint_sha256` tag.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from paravt_core import registry
from paravt_core.atomic import atomic_dir
from paravt_core.config import PipelineConfig
from paravt_core.model import stage as model_stage
from paravt_core.refs import ArtifactRef, content_hash
from paravt_core.tracking import retry_when_busy


class ModelReferenceError(ValueError):
    """A model reference that names no checkpoint; the message says what exists."""


class ResolvedModel(BaseModel):
    """A checkpoint to evaluate, its default table label and registry version (if any)."""

    model_config = ConfigDict(frozen=True)

    artifact: ArtifactRef
    label: str
    version: str | None = None


@retry_when_busy("reading the model registry")
def _registry_version(cfg: PipelineConfig, number: str) -> registry.ModelVersion:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    uri, name = cfg.mlflow_uri(), cfg.model.registered_name
    try:
        mv = MlflowClient(uri, registry_uri=uri).get_model_version(name, number)
    except MlflowException as exc:
        raise ModelReferenceError(f"model {name} has no version {number} in the registry at {uri}") from exc
    return registry.ModelVersion(name, str(mv.version), mv.source, mv.run_id, mv.tags.get("checkpoint_sha256", ""))


@retry_when_busy("reading the model registry")
def _aliased_version(cfg: PipelineConfig, alias: str) -> registry.ModelVersion:
    version = registry.version_by_alias(cfg.mlflow_uri(), cfg.model.registered_name, alias)
    if version is None:
        raise ModelReferenceError(
            f"no version of model {cfg.model.registered_name} has the alias {alias!r} in the registry at "
            f"{cfg.mlflow_uri()}; pass an alias that exists (sft, candidate, champion), a version number, "
            "'base' or a local model folder")
    return version


def downloaded_version(cfg: PipelineConfig, version: registry.ModelVersion) -> ArtifactRef:
    """The version's model folder on local disk, hash-checked: the registered folder itself where
    the version was registered by reference (`registry`), else downloaded once."""
    target = cfg.run.output_dir / "eval" / "models" / f"{version.name}-v{version.version}"
    folder = registry.local_source(version) or target / "model"
    if folder != target / "model" and not folder.is_dir():
        raise ModelReferenceError(f"{version.name} v{version.version} was registered as the folder {folder}, which "
                                  "no longer exists: run the stage that wrote it again, or pass a model folder")
    if folder == target / "model" and not (folder.is_dir() and content_hash(folder) == version.checkpoint_sha256):
        shutil.rmtree(target, ignore_errors=True)
        with atomic_dir(target) as tmp:
            registry.download_version(cfg.mlflow_uri(), version, tmp)
    sha256 = content_hash(folder)
    if version.checkpoint_sha256 and sha256 != version.checkpoint_sha256:
        raise ModelReferenceError(
            f"{version.name} v{version.version}: the downloaded checkpoint hashes to {sha256[:12]}, not the "
            f"registered {version.checkpoint_sha256[:12]}; the artifact store is inconsistent (a folder registered "
            "by reference was changed after registration: run its stage again)")
    return ArtifactRef(kind="model", path=folder.resolve(), sha256=sha256)


def _is_path(reference: str) -> bool:
    """Whether `reference` can only mean a path: registry aliases and version numbers hold no
    separator and do not start with "." or "~"."""
    separators = [os.sep, *([os.altsep] if os.altsep else [])]
    return any(sep in reference for sep in separators) or reference.startswith((".", "~"))


def resolve_model(cfg: PipelineConfig, reference: str) -> ResolvedModel:
    """The checkpoint a reference names (module docstring)."""
    local = Path(reference).expanduser()
    if local.is_dir():
        artifact = ArtifactRef(kind="model", path=local.resolve(), sha256=content_hash(local))
        return ResolvedModel(artifact=artifact, label=local.name)
    if _is_path(reference):
        what = "is a file, not a model folder" if local.exists() else "does not exist"
        raise ModelReferenceError(f"model folder {local}: it {what}; pass an existing model folder (config.json and "
                                  "weights), or a registry alias (sft, candidate, champion), a version number or "
                                  "'base'")
    if reference == "base":
        return ResolvedModel(artifact=model_stage.run(cfg), label="base")
    version = _registry_version(cfg, reference) if reference.isdigit() else _aliased_version(cfg, reference)
    label = f"v{version.version}" if reference.isdigit() else reference
    return ResolvedModel(artifact=downloaded_version(cfg, version), label=label, version=version.version)
