"""The pretraining's content key and its filed models (#45 item 4): a new world whose pretraining
corpus is the same content reuses the pretraining; other content, settings or code do not."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from paravt_core.config import load_config
from paravt_core.miniature import pretrain, pretrain_cache
from paravt_core.refs import ArtifactRef, content_hash

REPO = Path(__file__).resolve().parents[2]
BASE = ArtifactRef(kind="base_model", path=Path("/nonexistent/base"), sha256="b" * 64)
QUIET = {"log_line": lambda line: None}


def _cfg(out: Path, *extra: str):
    return load_config(REPO / "conf/pipeline/reproduce.yaml", [
        f"run.output_dir={out}", "model.pretrain.videos=2", "model.pretrain.windows_per_video=3",
        "model.pretrain.reading_rows=6", "model.pretrain.sft_replay_rows=0", *extra])


@pytest.fixture()
def world_code(monkeypatch):
    """Set the world generator's code digest, as an edit to `paravt_core.data.synth` changes it:
    the corpus folder, so its rows' URIs and its parquet's bytes, change with it."""
    from paravt_core import refs

    real = refs.source_digest

    def set_digest(digest: str) -> None:
        def edited(package, only=None):
            return digest if package == "paravt_core.data.synth" else real(package, only)

        monkeypatch.setattr(refs, "source_digest", edited)
        monkeypatch.setattr(pretrain_cache, "source_digest", edited)  # imported at its top

    return set_digest


def _key(cfg, base: ArtifactRef, corpora: list[ArtifactRef]) -> str:
    return pretrain_cache.pretraining_key(pretrain.training_config(cfg), base, corpora)


def _corpora(cfg) -> list[ArtifactRef]:
    clips = pretrain.build_corpus(cfg, **QUIET)
    return [clips, pretrain.build_reading_corpus(cfg, clips, **QUIET)]


def test_a_new_world_with_the_same_corpus_content_has_the_same_key(tmp_path: Path, world_code):
    cfg = _cfg(tmp_path)
    world_code("a" * 16)
    first = _corpora(cfg)
    world_code("b" * 16)
    second = _corpora(cfg)
    # the corpora are copies in other folders: their files differ (absolute URIs), their content not
    assert first[0].path != second[0].path and first[0].sha256 != second[0].sha256
    assert first[1].sha256 != second[1].sha256
    assert _key(cfg, BASE, first) == _key(cfg, BASE, second)
    # so do settings that never reach the pretraining: another world's trace count, SFT's replay rows
    other = _cfg(tmp_path, "data.synth.sft_traces_per_video=3", "model.pretrain.sft_replay_rows=4")
    assert _key(other, BASE, second) == _key(cfg, BASE, first)


def _copy(corpus: ArtifactRef, to: Path) -> ArtifactRef:
    shutil.copytree(corpus.path, to)
    return corpus.model_copy(update={"path": to})


def test_one_changed_row_or_video_is_another_key(tmp_path: Path):
    cfg = _cfg(tmp_path / "out")
    clips, reading = _corpora(cfg)
    key = _key(cfg, BASE, [clips, reading])
    # one caption changed (the corpus rows point at the same videos)
    captioned = _copy(clips, tmp_path / "captioned")
    table = pq.read_table(captioned.path / pretrain.CORPUS_FILE).to_pylist()
    messages = json.loads(table[1]["messages"])
    messages[1]["content"][0]["text"] += " A red circle."
    table[1]["messages"] = json.dumps(messages)
    pq.write_table(pretrain._table([{**r, "messages": json.loads(r["messages"])} for r in table]),
                   captioned.path / pretrain.CORPUS_FILE)
    assert _key(cfg, BASE, [captioned, reading]) != key
    # one video's frames changed, the rows the same: a copy whose rows point at the copy's videos
    moved = _copy(clips, tmp_path / "moved")
    text = [r["messages"].replace(clips.path.as_uri(), moved.path.as_uri())
            for r in pq.read_table(moved.path / pretrain.CORPUS_FILE).to_pylist()]
    pq.write_table(pretrain._table([{"messages": json.loads(t), "videos": []} for t in text]),
                   moved.path / pretrain.CORPUS_FILE)
    assert _key(cfg, BASE, [moved, reading]) == key  # the same content
    first, second = sorted((moved.path / "videos").glob("*.mp4"))
    shutil.copyfile(second, first)
    assert _key(cfg, BASE, [moved, reading]) != key
    # one reading row changed
    reread = _copy(reading, tmp_path / "reread")
    rows = pq.read_table(reread.path / pretrain.READING_FILE).to_pylist()
    rows[0]["messages"] = rows[0]["messages"].replace("The notes say", "The note says")
    pq.write_table(pretrain._table([{"messages": json.loads(r["messages"]), "videos": []} for r in rows]),
                   reread.path / pretrain.READING_FILE)
    assert _key(cfg, BASE, [clips, reread]) != key


def test_the_key_follows_the_base_model_the_training_settings_and_the_trainer_code(tmp_path: Path, monkeypatch):
    from paravt_core import refs

    cfg = _cfg(tmp_path)
    corpora = _corpora(cfg)
    key = _key(cfg, BASE, corpora)
    other_base = BASE.model_copy(update={"sha256": "c" * 64})
    assert _key(cfg, other_base, corpora) != key
    for setting in ("model.pretrain.max_steps=7", "model.pretrain.learning_rate=0.01", "run.seed=1",
                    "video.max_pixels=8192", "sft.zero_stage=2", "model.dtype=bfloat16"):
        assert _key(_cfg(tmp_path, setting), BASE, corpora) != key, setting
    assert _key(_cfg(tmp_path, "sft.keep_last=2"), BASE, corpora) == key
    real = refs.source_digest
    monkeypatch.setattr(pretrain_cache, "source_digest",
                        lambda package, only=None: "0" * 16 if package == "paravt_core.sft" else real(package, only))
    assert _key(cfg, BASE, corpora) != key


def test_a_filed_model_is_reused_whole_and_a_damaged_entry_is_not(tmp_path: Path, tiny_model_dir: Path):
    cfg = _cfg(tmp_path)
    # the tiny model stands in for a pretrained one: filing and reuse do not look at its weights' values
    model = ArtifactRef(kind="sft_model", path=tiny_model_dir, sha256=content_hash(tiny_model_dir))
    lines: list[str] = []
    assert pretrain_cache.reuse(cfg, "k1", lines.append) is None and lines == []
    filed = pretrain_cache.store(cfg, "k1", model, lines.append)
    entry = tmp_path / "cache" / "pretrain" / "k1"
    assert filed == ArtifactRef(kind="base_model", path=(entry / "model").resolve(), sha256=model.sha256)
    assert pretrain_cache.reuse(cfg, "k1", lines.append) == filed
    assert lines[-1] == f"reused pretraining k1 from {entry}"
    assert pretrain_cache.reuse(cfg, "k2", lines.append) is None  # another key is another entry
    # damaged: a weight file truncated or zero-filled, a config file changed, the record gone
    weights = entry / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])
    assert pretrain_cache.reuse(cfg, "k1", lines.append) is None
    assert "is not reused" in lines[-1] and str(weights) in lines[-1]
    pretrain_cache.store(cfg, "k1", model, lines.append)  # filed again over the damaged entry
    assert pretrain_cache.reuse(cfg, "k1", lines.append) == filed
    for damaged in (weights, entry / "model" / "config.json"):
        damaged.write_bytes(damaged.read_bytes()[:-8] + b"\0" * 8)
        assert pretrain_cache.reuse(cfg, "k1", lines.append) is None and "no longer has the content" in lines[-1]
        pretrain_cache.store(cfg, "k1", model, lines.append)
    (entry / pretrain_cache.ENTRY_FILE).unlink()
    assert pretrain_cache.reuse(cfg, "k1", lines.append) is None and "unreadable" in lines[-1]
    # an interrupted filing leaves no entry behind (atomic): only the finished folder is a candidate
    assert [p.name for p in entry.parent.iterdir()] == ["k1"]


def test_a_missing_corpus_video_is_named(tmp_path: Path):
    cfg = _cfg(tmp_path)
    clips, reading = _corpora(cfg)
    video = next((clips.path / "videos").glob("*.mp4"))
    video.unlink()
    with pytest.raises(FileNotFoundError, match=f"{video}.* is missing; delete {clips.path}"):
        _key(cfg, BASE, [clips, reading])
