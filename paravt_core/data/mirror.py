"""The generated world as a local hub mirror (`data.source: synth`).

`ensure_world` generates the world (`data.synth.generate.generate_world`) into
`<output_dir>/data/world-<hash of data.synth and the generator's code>` once, and hands the
download step (`data.hub.download_all`) its hub cache as a `LocalMirror`: the download code
then runs exactly as against the Hub, offline.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from paravt_core.config import PipelineConfig
from paravt_core.data.hub import DownloadError, LocalMirror
from paravt_core.data.synth.generate import HUB_DIR, MANIFEST, generate_world
from paravt_core.refs import source_digest

log = logging.getLogger(__name__)


def world_dir(cfg: PipelineConfig) -> Path:
    """`<output_dir>/data/world-<hash of data.synth and the generator's code>`: one folder per world.
    The code includes the split records (`eval/splits.py`), whose real hub layouts the world writes."""
    code = source_digest("paravt_core.data.synth") + source_digest("paravt_core.eval", only=("splits.py",))
    dumped = json.dumps(cfg.data.synth.model_dump(mode="json"), sort_keys=True) + code
    return cfg.run.output_dir / "data" / f"world-{hashlib.sha256(dumped.encode()).hexdigest()[:16]}"


def world_complete(out: Path, cfg: PipelineConfig) -> bool:
    """The manifest is written last, so its presence (for this config) means the world is whole."""
    manifest = out / MANIFEST
    if not manifest.is_file():
        return False
    recorded = json.loads(manifest.read_text()).get("config")
    return recorded == cfg.data.synth.model_dump(mode="json")


def ensure_world(cfg: PipelineConfig, progress: bool = True) -> LocalMirror:
    """Generate the synthetic world unless already complete; returns its hub cache as a mirror."""
    if cfg.data.synth.revision != cfg.data.revision:
        raise DownloadError(
            f"data.revision {cfg.data.revision!r} differs from data.synth.revision {cfg.data.synth.revision!r}: "
            f"the synthetic mirror only holds the latter; set both to the same value"
        )
    out = world_dir(cfg)
    if world_complete(out, cfg):
        log.info("synthetic world already complete in %s", out)
    else:
        log.info("generating the synthetic world into %s", out)
        world = generate_world(cfg.data.synth, out, progress=progress)
        log.info("synthetic world generated in %.1f s (%d repos)", world.seconds, len(world.repos))
    return LocalMirror(hub_dir=out / HUB_DIR, revision=cfg.data.synth.revision)
