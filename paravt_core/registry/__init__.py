"""Checkpoints as MLflow model versions with lineage tags and aliases.

A checkpoint becomes a model version of a registration run. In a local tracking store (the
default SQLite database in `run.output_dir`) the version's source is the checkpoint folder
itself: registering copies nothing (an 8B model is ~17.5 GB), and the weights stay where the
stage wrote them, under `run.output_dir`. In any other store (an MLflow server, which cannot
read this machine's folders) the folder is logged once as the run's `model` artifacts and the
version's source is `runs:/<id>/model` (`create_model_version` takes that source; MLflow's
`register_model` on a plain artifact folder fails). Registering a checkpoint whose content hash
is already registered returns the existing version, so weights are stored once.

Tags on every version: stage, parent_version, data_sha256, config_hash, git_revision,
checkpoint_sha256. Aliases: `sft`, `candidate` (the latest RL checkpoint) and `champion`
(moved by `promote` when a candidate's eval average beats the current champion's).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from paravt_core.model.integrity import ModelFolderError, verify_model_dir
from paravt_core.refs import ArtifactRef, content_hash
from paravt_core.tracking import experiment_id, local_store_dir, retry_when_busy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelVersion:
    name: str
    version: str
    source: str
    run_id: str
    checkpoint_sha256: str


def _client(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def find_version(tracking_uri: str, name: str, checkpoint_sha256: str) -> ModelVersion | None:
    client = _client(tracking_uri)
    for mv in client.search_model_versions(f"name = '{name}'"):
        if mv.tags.get("checkpoint_sha256") == checkpoint_sha256:
            return ModelVersion(name, str(mv.version), mv.source, mv.run_id, checkpoint_sha256)
    return None


@retry_when_busy("registering a model version")
def register_checkpoint(
    tracking_uri: str,
    experiment: str,
    name: str,
    checkpoint: ArtifactRef,
    *,
    stage: str,
    parent_version: str | None,
    data_sha256: str,
    config_hash: str,
    git_revision: str,
    alias: str | None = None,
) -> ModelVersion:
    """Register `checkpoint` (a HF model folder) as a version of `name`; idempotent on its hash.

    Raises:
        ModelFolderError: the folder is not whole (`model.integrity`), or its content is no
            longer the one hashed when the stage wrote it; nothing is registered or aliased.
    """
    from mlflow.exceptions import MlflowException

    # The folder's content hash covers every file, the weights' sha256 included: with it equal to
    # the one taken when the stage wrote the folder, the manifest's checksums need no second pass.
    verify_model_dir(checkpoint.path, checksums=False)
    if content_hash(checkpoint.path) != checkpoint.sha256:
        raise ModelFolderError(f"{checkpoint.path}: its files changed since the stage wrote it (content sha256 "
                               f"differs from {checkpoint.sha256[:12]}); run that stage again to rebuild it")
    client = _client(tracking_uri)
    existing = find_version(tracking_uri, name, checkpoint.sha256)
    if existing is None:
        try:
            client.create_registered_model(name)
        except MlflowException as err:
            if "already exists" not in str(err).lower() and "RESOURCE_ALREADY_EXISTS" not in str(err):
                raise
        exp_id = experiment_id(client, experiment, tracking_uri)
        tags = {
            "stage": stage,
            "parent_version": parent_version or "",
            "data_sha256": data_sha256,
            "config_hash": config_hash,
            "git_revision": git_revision,
            "checkpoint_sha256": checkpoint.sha256,
        }
        run_tags = {**tags, "stage": "register", "checkpoint_stage": stage}  # not a training run of that stage
        run = client.create_run(exp_id, run_name=f"register-{stage}", tags=run_tags)
        if local_store_dir(tracking_uri) is not None:  # by reference (module docstring)
            source = str(Path(checkpoint.path).resolve())
        else:
            client.log_artifacts(run.info.run_id, str(Path(checkpoint.path)), artifact_path="model")
            source = f"runs:/{run.info.run_id}/model"
        client.set_terminated(run.info.run_id)
        mv = client.create_model_version(name, source=source, run_id=run.info.run_id, tags=tags)
        existing = ModelVersion(name, str(mv.version), mv.source, run.info.run_id, checkpoint.sha256)
    if alias:
        client.set_registered_model_alias(name, alias, existing.version)
    return existing


@retry_when_busy("reading the model registry")
def version_by_alias(tracking_uri: str, name: str, alias: str) -> ModelVersion | None:
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    try:
        mv = client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None
    return ModelVersion(name, str(mv.version), mv.source, mv.run_id, mv.tags.get("checkpoint_sha256", ""))


def local_source(version: ModelVersion) -> Path | None:
    """The checkpoint folder of a version registered by reference (module docstring), else None."""
    return Path(version.source) if version.source.startswith("/") else None


def download_version(tracking_uri: str, version: ModelVersion, dst: Path) -> Path:
    """The version's model folder on local disk (the artifact store may be remote)."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    return Path(mlflow.artifacts.download_artifacts(artifact_uri=version.source, dst_path=str(dst)))


@retry_when_busy("moving the champion alias")
def promote(tracking_uri: str, name: str, candidate: ModelVersion, candidate_score: float,
            eval_key: str, metric_tag: str = "eval_average") -> bool:
    """Move `champion` to the candidate when its score beats the champion's (or there is none).

    Scores are only compared on the same evaluation: `eval_key` (a hash of the eval data and
    the eval settings) is tagged beside the score. A champion scored on another evaluation
    (new benchmark data, more samples per split) has no comparable score, so the candidate,
    scored on the current one, takes its place, with a log line saying so.
    """
    client = _client(tracking_uri)
    client.set_model_version_tag(name, candidate.version, metric_tag, f"{candidate_score:.6f}")
    client.set_model_version_tag(name, candidate.version, "eval_key", eval_key)
    champion = version_by_alias(tracking_uri, name, "champion")
    if champion is not None and champion.version != candidate.version:
        mv = client.get_model_version(name, champion.version)
        if mv.tags.get("eval_key") != eval_key:
            log.warning("champion v%s of %s was scored on another evaluation (eval_key %s, now %s); "
                        "v%s, scored on the current one, replaces it", champion.version, name,
                        mv.tags.get("eval_key"), eval_key, candidate.version)
        elif candidate_score <= float(mv.tags.get(metric_tag, "-inf")):
            return False
    client.set_registered_model_alias(name, "champion", candidate.version)
    return True
