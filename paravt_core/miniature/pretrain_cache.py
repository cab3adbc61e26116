"""Finished perception pretrainings kept by what they trained on, reused across worlds (#45 item 4).

Pretraining takes about 27 minutes in the reproduce config. Its run folders
(`<output_dir>/pretrain/<key>`, `sft.stage.run_dir`) are keyed by the corpus parquet's file
hash, and the corpus rows hold absolute URIs of the corpus videos inside a folder whose name
carries the world generator's code digest (`pretrain.corpus_dir`). So every edit to
`paravt_core.data.synth` (a new world) renamed the corpus, changed that hash and trained again,
though every clip, caption and reading row was byte for byte the same.

A finished pretraining is therefore also filed under `<output_dir>/cache/pretrain/<key>`, the key
a digest of what the training reads and how it trains on it:

- the rows of each phase's shards as the trainer reads them (`sft.stage.sft_shards`, then
  `sft.dataset.read_sft_rows`: shard name, row order, messages), each media item's URI
  replaced by the sha256 of the file it points at. That is the identity the SFT frame cache
  gives a video (`sft.dataset.FrameCache`): the frames the trainer sees are a function of
  those bytes, the item's window and the `video` section;
- how it trains: `pretrain.training_config`'s `sft` and `video` sections (`section_hash`),
  `model.pretrain` but for `sft_replay_rows` (read by cold-start SFT, not here), the model
  section's dtype and attention settings, and `run.seed`;
- what it starts from: the base model's content hash (the tiny model's initial weights);
- the pretraining's own code (`CODE`): `miniature/pretrain.py` and the SFT trainer's files,
  never the world generator's.

An entry is reused only when its record names that key and its model folder still has the
content hash recorded when it was filed; otherwise the stage trains (or resumes, or finds its
finished run folder) and files the model again.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from paravt_core.atomic import atomic_dir
from paravt_core.cache_identity import pretrain_model_settings
from paravt_core.config import PipelineConfig
from paravt_core.dist.launch import LogLine
from paravt_core.model.integrity import model_dir_problem
from paravt_core.refs import ArtifactRef, content_hash, source_digest
from paravt_core.sft.dataset import read_sft_rows
from paravt_core.sft.encode import MEDIA_TYPES, media_path
from paravt_core.sft.stage import sft_shards
from paravt_core.video import video_sha256

ENTRY_FILE = "entry.json"
# The code a pretrained model depends on beyond its rows and settings: the stage (its training
# settings, `training_config`) and the trainer that runs it (rows to batches, loss, steps).
CODE = {"paravt_core.miniature": ("pretrain.py",),
        "paravt_core.sft": ("dataset.py", "encode.py", "loader.py", "loss.py", "worker.py")}
_URL_KEYS = ("url", "video", "image", "video_url", "image_url")  # where `sft.encode.media_path` looks


def entry_dir(cfg: PipelineConfig, key: str) -> Path:
    return cfg.run.output_dir / "cache" / "pretrain" / key


def rows_digest(corpus: ArtifactRef) -> str:
    """sha256 of the rows the trainer reads from `corpus`'s shards, media URIs replaced by the
    sha256 of their files: the same for two copies of a corpus in different folders.

    Raises:
        FileNotFoundError: a row's media file is missing (named with its shard and row).
    """
    media: dict[Path, str] = {}  # a video is shown by several clips: hash it once

    def file_digest(row: dict, item: dict) -> str:
        path = media_path(item)
        if path not in media:
            if not path.is_file():
                raise FileNotFoundError(f"pretraining corpus {corpus.path}, row {row['source']}: its media file "
                                        f"{path} is missing; delete {corpus.path} to build the corpus again")
            media[path] = video_sha256(path)
        return media[path]

    def by_content(row: dict, item):
        if not (isinstance(item, dict) and item.get("type") in MEDIA_TYPES):
            return item
        return {**{k: v for k, v in item.items() if k not in _URL_KEYS}, "sha256": file_digest(row, item)}

    digest = hashlib.sha256()
    for row in read_sft_rows(sft_shards(corpus)):
        messages = [{**m, "content": [by_content(row, item) for item in m["content"]]}
                    if isinstance(m.get("content"), list) else m for m in row["messages"]]
        digest.update(json.dumps({"source": row["source"], "messages": messages}, sort_keys=True).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def pretraining_key(training: PipelineConfig, base: ArtifactRef, corpora: list[ArtifactRef]) -> str:
    """The content key of a pretraining (module docstring) from `base` on `corpora`, one per phase
    in order, under `training`: the config the phases train under (`pretrain.training_config`)."""
    settings = {
        "rows": [rows_digest(corpus) for corpus in corpora],
        "pretrain": training.model.pretrain.model_dump(mode="json", exclude={"sft_replay_rows"}),
        "model": pretrain_model_settings(training.model),
        "trainer": training.section_hash("sft", "video"),
        "seed": training.run.seed,
        "base": base.sha256,
        "code": {package: source_digest(package, only=files) for package, files in sorted(CODE.items())},
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:24]


def reuse(cfg: PipelineConfig, key: str, log_line: LogLine = print) -> ArtifactRef | None:
    """The filed model of `key`, or None when there is none or it is damaged or incomplete."""
    entry = entry_dir(cfg, key)
    if not entry.exists():
        return None
    model = entry / "model"
    try:
        record = json.loads((entry / ENTRY_FILE).read_text())
        problem = model_dir_problem(model)
        if problem is None and (record.get("key") != key or content_hash(model) != record.get("model_sha256")):
            problem = f"{model} no longer has the content recorded in {entry / ENTRY_FILE}"
    except (OSError, ValueError, AttributeError) as error:  # no record, or not a JSON object
        problem = f"{entry / ENTRY_FILE} is unreadable ({error})"
    if problem:
        log_line(f"warning: pretraining cache entry {entry} is not reused: {problem}; pretraining again")
        return None
    log_line(f"reused pretraining {key} from {entry}")
    return ArtifactRef(kind="base_model", path=model.resolve(), sha256=record["model_sha256"])


def store(cfg: PipelineConfig, key: str, model: ArtifactRef, log_line: LogLine = print) -> ArtifactRef:
    """File a copy of the pretrained `model` under `key` (whole or not at all) and return it."""
    entry = entry_dir(cfg, key)
    with atomic_dir(entry) as tmp:
        shutil.copytree(model.path, tmp / "model")
        sha256 = content_hash(tmp / "model")
        if sha256 != model.sha256:  # changed while copied: file nothing rather than a mix
            raise RuntimeError(f"the pretrained model {model.path} changed while it was filed under {entry}; "
                               "run the stage again")
        record = {"key": key, "model_sha256": sha256, "trained_in": str(Path(model.path).parent)}
        (tmp / ENTRY_FILE).write_text(json.dumps(record, indent=2))
    log_line(f"pretraining {key} filed in {entry}")
    return ArtifactRef(kind="base_model", path=(entry / "model").resolve(), sha256=sha256)
