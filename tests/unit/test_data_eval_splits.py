"""Data stage steps on a small synthetic world: the unzip step's media folders and the
prepared evaluation splits (SPEC §7), whose split.json `load_split` reads with every video there.

The data contracts (Great Expectations, slower) run in tests/integration/test_data_stage.py;
here the evaluation splits are prepared from the downloaded annotation rows as they are,
which is what the validate step hands on when every row passes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from paravt_core.config import EVAL_SPLITS, PipelineConfig
from paravt_core.data import stage
from paravt_core.data.synth.benchmarks import LAYOUTS
from paravt_core.eval.prepared import load_split_file
from paravt_core.eval.samples import load_split
from paravt_core.refs import ArtifactRef, content_hash

SMALL_SYNTH = dict(train_videos=4, eval_videos_per_split=2, eval_rows_per_split=3, min_duration_s=30,
                   max_duration_s=30, width=64, height=64)


def all_rows_passed(cfg: PipelineConfig, tables, downloads) -> stage.Validated:
    """The validate step's result when no row breaks a contract: its inputs, unchanged."""
    rows = {split: downloads.benchmark(split).path / LAYOUTS[split].annotation_file for split in cfg.eval.splits}
    eval_rows = {split: ArtifactRef(kind=f"eval_rows_{split}", path=path, sha256=content_hash(path))
                 for split, path in rows.items()}
    return stage.Validated(sft=tables.sft, rl=tables.rl, eval_rows=eval_rows)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The download, unzip and materialize steps once."""
    cfg = PipelineConfig.model_validate(
        {"run": {"output_dir": str(tmp_path_factory.mktemp("out"))}, "data": {"synth": SMALL_SYNTH}}
    )
    downloads = stage.download(cfg, progress=False)
    media = stage.unzip(cfg, downloads, progress=False)
    tables = stage.materialize(cfg, downloads, media, progress=False)
    return cfg, downloads, media, all_rows_passed(cfg, tables, downloads)


def test_the_paravt_archives_share_one_media_root(prepared):
    cfg, downloads, media, _ = prepared
    assert media.paravt_root == (stage.media_dir(cfg) / "paravt").resolve()
    assert sorted(media.paravt_archives) == sorted(p.name for p in downloads.source.path.glob("*.zip"))
    for root in ("longvt_source", "museg/charades", "museg/et_instruct_164k", "selfqa"):
        assert list((media.paravt_root / root).rglob("*.mp4")), root


def test_archived_benchmark_videos_are_extracted_loose_ones_stay_in_the_snapshot(prepared):
    cfg, downloads, media, _ = prepared
    video_mme = stage.media_dir(cfg) / "lmms-lab--Video-MME"
    assert media.splits["videomme"].video_dir == (video_mme / "data").resolve()
    assert media.splits["videomme_wsub"].subtitle_dir == (video_mme / "subtitle").resolve()
    assert list(media.splits["videomme_wsub"].subtitle_dir.glob("*.srt"))
    assert media.splits["charades"].video_dir == (stage.media_dir(cfg) / "lmms-lab--charades_sta"
                                                   / "Charades_v1_480").resolve()
    assert media.splits["lvbench"].video_dir == downloads.benchmark("lvbench").path / "videos"
    assert media.splits["mmvu"].video_dir == downloads.benchmark("mmvu").path
    assert media.splits["lvbench"].archives == {}


def test_every_split_json_loads_through_load_split_with_no_missing_video(prepared):
    cfg, downloads, media, checked = prepared
    ref = stage.prepare_eval(cfg, downloads, media, checked)
    assert ref.path == stage.eval_dir(cfg).resolve() and ref.sha256 == content_hash(ref.path)
    assert sorted(p.name for p in ref.path.iterdir()) == sorted(EVAL_SPLITS)
    for split in EVAL_SPLITS:
        record = json.loads((ref.path / split / "split.json").read_text())
        assert set(record) == {"split", "rows", "video_dir", "subtitle_dir"} and record["split"] == split
        assert Path(record["rows"]).is_absolute() and Path(record["rows"]).parent == ref.path / split
        assert Path(record["rows"]).name == Path(LAYOUTS[split].annotation_file).name
        subtitle_dir = Path(record["subtitle_dir"]) if record["subtitle_dir"] else None
        samples = load_split(split, Path(record["rows"]), Path(record["video_dir"]), subtitle_dir)
        assert len(samples) == SMALL_SYNTH["eval_rows_per_split"]
        assert not [s for s in samples if s.video_missing], split
        assert load_split_file(ref.path / split / "split.json") == samples
    wsub = load_split_file(ref.path / "videomme_wsub" / "split.json")
    assert all(s.question.startswith("This video's subtitles are listed below:") for s in wsub)
    source = json.loads((ref.path / "videomme" / "source.json").read_text())
    assert source["commit"] == downloads.benchmark("videomme").commit
    assert set(source["archives"]) == {"videos_chunked_01.zip"}


def test_a_missing_video_fails_prepare_eval_and_keeps_the_last_eval_folder(prepared, tmp_path):
    cfg, downloads, media, checked = prepared
    before = stage.prepare_eval(cfg, downloads, media, checked)
    charades = media.splits["charades"].video_dir
    kept = tmp_path / "kept"
    shutil.copytree(charades, kept)
    try:
        next(charades.glob("*.mp4")).unlink()
        with pytest.raises(stage.DataStageError, match=r"split charades: [12] of 3 samples have no video"):
            stage.prepare_eval(cfg, downloads, media, checked)
        assert content_hash(stage.eval_dir(cfg)) == before.sha256
    finally:
        shutil.rmtree(charades)
        shutil.copytree(kept, charades)


def test_unzip_without_source_archives_says_to_download_again(prepared, tmp_path):
    cfg, downloads, _, _ = prepared
    empty = downloads.source.model_copy(update={"path": tmp_path})
    with pytest.raises(stage.DataStageError, match="no zip archives in ParaVT/ParaVT-Source"):
        stage.unzip(cfg, downloads.model_copy(update={"source": empty}), progress=False)


def test_only_the_configured_splits_are_prepared(prepared, tmp_path):
    cfg, downloads, media, checked = prepared
    narrow = cfg.model_copy(update={"run": cfg.run.model_copy(update={"output_dir": tmp_path}),
                                    "eval": cfg.eval.model_copy(update={"splits": ("mlvu", "charades")})})
    ref = stage.prepare_eval(narrow, downloads, media, checked)
    assert sorted(p.name for p in ref.path.iterdir()) == ["charades", "mlvu"]
