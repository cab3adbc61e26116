"""The data tasks' cache keys and retry rule, without a Prefect server: keys follow content
hashes (not path strings) and the output folder's epoch; only transient failures retry."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx2
import pytest
from prefect.states import Failed

from paravt_core.config import PipelineConfig
from paravt_core.data.hub import DownloadError, Downloads, Snapshot
from paravt_core.data.materialize import Materialized, RootMedia
from paravt_core.data.stage import Media, SplitMedia, Validated
from paravt_core.refs import ArtifactRef
from tasks import data as data_tasks


def snapshot(repo_id: str, sha: str, path: Path) -> Snapshot:
    return Snapshot(repo_id=repo_id, revision="main", commit="c" * 40, path=path, sha256=sha)


@pytest.fixture()
def inputs(tmp_path):
    cfg = PipelineConfig.model_validate({"run": {"output_dir": str(tmp_path / "out")},
                                         "eval": {"splits": ["mlvu"]}})
    downloads = Downloads(parquet=snapshot("ParaVT/ParaVT-Parquet", "p" * 64, tmp_path / "a"),
                          source=snapshot("ParaVT/ParaVT-Source", "s" * 64, tmp_path / "b"),
                          benchmarks={"sy1998/MLVU_dev": snapshot("sy1998/MLVU_dev", "m" * 64, tmp_path / "c")})
    media = Media(paravt_root=tmp_path / "media", paravt_archives={"selfqa.zip": "z" * 64},
                  splits={"mlvu": SplitMedia(video_dir=tmp_path / "c" / "video")})
    return cfg, downloads, media


def materialize_key(cfg, downloads, media) -> str:
    return data_tasks._materialize_key(None, {"cfg": cfg, "downloads": downloads, "media": media})


def test_materialize_key_follows_content_hashes_not_paths(inputs, tmp_path):
    cfg, downloads, media = inputs
    for kind in ("sft", "rl"):
        (cfg.run.output_dir / "data" / "materialized" / kind).mkdir(parents=True)
    key = materialize_key(cfg, downloads, media)
    moved = downloads.model_copy(update={"parquet": downloads.parquet.model_copy(update={"path": tmp_path / "x"})})
    assert materialize_key(cfg, moved, media) == key
    changed = downloads.model_copy(update={"parquet": downloads.parquet.model_copy(update={"sha256": "q" * 64})})
    assert materialize_key(cfg, changed, media) != key
    new_archive = media.model_copy(update={"paravt_archives": {"selfqa.zip": "y" * 64}})
    assert materialize_key(cfg, downloads, new_archive) != key


def test_materialize_key_changes_when_an_output_folder_is_deleted(inputs):
    cfg, downloads, media = inputs
    out = cfg.run.output_dir / "data" / "materialized"
    (out / "sft").mkdir(parents=True)
    (out / "rl").mkdir()
    key = materialize_key(cfg, downloads, media)
    assert materialize_key(cfg, downloads, media) == key  # stable while both folders stay
    shutil.rmtree(out / "rl")
    assert materialize_key(cfg, downloads, media) != key


def test_validate_key_follows_tables_contracts_mode_and_media(inputs, tmp_path):
    cfg, downloads, media = inputs
    ref = ArtifactRef(kind="sft_data", path=tmp_path / "sft", sha256="1" * 64)
    tables = Materialized(sft=ref, rl=ref.model_copy(update={"sha256": "2" * 64}),
                          media={"selfqa": RootMedia(referenced=1, missing=0)})
    (cfg.run.output_dir / "data" / "validated").mkdir(parents=True)

    def key(**changes) -> str:
        params = {"cfg": cfg, "tables": tables, "downloads": downloads, "media": media, **changes}
        return data_tasks._validate_key(None, params)

    base = key()
    assert key() == base
    quarantine = cfg.model_copy(update={"data": cfg.data.model_copy(update={"on_bad_rows": "quarantine"})})
    assert key(cfg=quarantine) != base
    capped = quarantine.model_copy(update={"data": quarantine.data.model_copy(update={"max_quarantine_share": 0.01})})
    assert key(cfg=capped) != key(cfg=quarantine)  # a cached pass under no ceiling is checked again
    workers = quarantine.model_copy(update={"data": quarantine.data.model_copy(update={"probe_workers": 7})})
    assert key(cfg=workers) == key(cfg=quarantine)  # how many processes probe changes no verdict
    assert key(tables=tables.model_copy(update={"sft": ref.model_copy(update={"sha256": "3" * 64})})) != base
    moved_videos = media.model_copy(update={"splits": {"mlvu": SplitMedia(video_dir=tmp_path / "elsewhere")}})
    assert key(media=moved_videos) != base


def test_eval_key_follows_the_kept_rows(inputs, tmp_path):
    cfg, downloads, media = inputs
    rows = ArtifactRef(kind="eval_rows_mlvu", path=tmp_path / "rows.parquet", sha256="4" * 64)
    (cfg.run.output_dir / "data" / "eval").mkdir(parents=True)

    def key(checked: Validated) -> str:
        return data_tasks._eval_key(None, {"cfg": cfg, "downloads": downloads, "media": media, "checked": checked})

    checked = Validated(sft=rows, rl=rows, eval_rows={"mlvu": rows})
    fewer = Validated(sft=rows, rl=rows, eval_rows={"mlvu": rows.model_copy(update={"sha256": "5" * 64})})
    assert key(checked) == key(checked) != key(fewer)


def _failed_with(error: BaseException) -> Failed:
    try:
        raise DownloadError("could not download") from error
    except DownloadError as wrapped:
        return Failed(data=wrapped)


def test_download_task_retries_transient_failures_only():
    retry = data_tasks._download_failed_transiently
    assert retry(None, None, _failed_with(httpx2.ConnectError("down")))
    assert not retry(None, None, _failed_with(FileNotFoundError("no such repo in the cache")))
