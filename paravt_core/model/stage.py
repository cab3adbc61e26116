"""Model stage: put the base model on disk and return a reference to it.

`model.base: tiny` builds the tiny random-weight Qwen3-VL (`paravt_core.model.tiny`);
a local directory is used in place; any other value is a hub repo id fetched with
`huggingface_hub.snapshot_download` (honours HF_HUB_OFFLINE and HF_HOME as usual).
"""

from __future__ import annotations

import logging
from pathlib import Path

from paravt_core.config import PipelineConfig
from paravt_core.model.tiny import build_tiny_model
from paravt_core.refs import ArtifactRef, content_hash, source_digest

log = logging.getLogger(__name__)


# What the tiny model is built from; its folder name carries their digest.
BUILDER_FILES = ("tiny.py", "chat_template.jinja")


def base_model_dir(cfg: PipelineConfig) -> Path:
    """`<output_dir>/models/base-<hash of the model section>-<tiny builder code digest>`."""
    builder = source_digest("paravt_core.model", only=BUILDER_FILES)
    return cfg.run.output_dir / "models" / f"base-{cfg.section_hash('model')}-{builder}"


def run(cfg: PipelineConfig) -> ArtifactRef:
    if cfg.model.is_tiny:
        out = base_model_dir(cfg)
        if not (out / "config.json").is_file():
            log.info("building the tiny Qwen3-VL in %s", out)
            build_tiny_model(cfg.model.tiny, out)
        return ArtifactRef(kind="base_model", path=out.resolve(), sha256=content_hash(out))
    local = Path(cfg.model.base)
    if local.is_dir():
        return ArtifactRef(kind="base_model", path=local.resolve(), sha256=content_hash(local))
    from huggingface_hub import snapshot_download

    path = Path(snapshot_download(cfg.model.base, allow_patterns=["*.json", "*.safetensors", "*.jinja", "*.txt"]))
    return ArtifactRef(kind="base_model", path=path, sha256=content_hash(path))
