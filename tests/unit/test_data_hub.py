"""Download step (SPEC §7, §8): the real `snapshot_download` against a synthetic offline mirror,
retries on transient failures only, and clear errors otherwise. Nothing here reaches a network."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
from huggingface_hub import errors as hf_errors

from paravt_core.config import PipelineConfig
from paravt_core.data import hub
from paravt_core.data.mirror import ensure_world, world_dir
from paravt_core.data.synth import PARQUET_REPO, SOURCE_REPO
from paravt_core.data.synth.benchmarks import LAYOUTS
from paravt_core.refs import content_hash

SMALL_SYNTH = dict(train_videos=4, eval_videos_per_split=1, eval_rows_per_split=2, min_duration_s=30,
                   max_duration_s=30, width=64, height=64)


def _download(cfg: PipelineConfig) -> hub.Downloads:
    """The download step from the generated world's mirror, as the data flow runs it."""
    return hub.download_all(cfg, progress=False, mirror=ensure_world(cfg, progress=False))


def small_config(output_dir: Path, **data) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {"run": {"output_dir": str(output_dir)}, "data": {"synth": SMALL_SYNTH, **data}}
    )


@pytest.fixture(scope="module")
def mirror(tmp_path_factory) -> tuple[PipelineConfig, hub.Downloads]:
    cfg = small_config(tmp_path_factory.mktemp("out"))
    return cfg, _download(cfg)


def _http_error(status: int) -> hf_errors.HfHubHTTPError:
    response = httpx2.Response(status, request=httpx2.Request("GET", "https://huggingface.co/api/datasets/x"))
    return hf_errors.HfHubHTTPError(f"{status} from the Hub", response=response)


def test_every_repo_comes_from_the_synth_mirror(mirror):
    cfg, downloads = mirror
    world = world_dir(cfg)
    assert downloads.parquet.repo_id == PARQUET_REPO and downloads.source.repo_id == SOURCE_REPO
    assert set(downloads.benchmarks) == {LAYOUTS[split].repo_id for split in cfg.eval.splits}
    for snapshot in [downloads.parquet, downloads.source, *downloads.benchmarks.values()]:
        assert snapshot.path.is_relative_to(world / "hub")
        assert snapshot.path.name == snapshot.commit
        assert snapshot.sha256 == content_hash(snapshot.path)  # the cheap hash is the real one
    assert sorted(p.name for p in downloads.source.path.glob("*.zip")) == [
        "longvt_source.zip", "museg_charades.zip", "museg_et_instruct_164k.zip", "selfqa.zip"]
    assert list(downloads.parquet.path.rglob("*.parquet"))
    for split in cfg.eval.splits:
        assert (downloads.benchmark(split).path / LAYOUTS[split].annotation_file).is_file()


def test_offline_is_scoped_to_the_call_not_the_environment(mirror, monkeypatch):
    """With HF_HUB_OFFLINE off, `local_files_only` alone keeps the download off the network."""
    import huggingface_hub.constants
    from huggingface_hub import HfApi

    cfg, first = mirror
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

    def no_network(*args, **kwargs):
        raise AssertionError("the synth download must not call the Hub")

    monkeypatch.setattr(HfApi, "repo_info", no_network)
    monkeypatch.setattr(HfApi, "list_repo_tree", no_network)
    again = _download(cfg)
    assert again == first


def test_a_complete_world_is_not_generated_again(mirror, monkeypatch):
    cfg, _ = mirror

    def regenerate(*args, **kwargs):
        raise AssertionError("the world was already complete")

    monkeypatch.setattr("paravt_core.data.mirror.generate_world", regenerate)
    assert ensure_world(cfg, progress=False) == hub.LocalMirror(hub_dir=world_dir(cfg) / "hub", revision="main")


def test_world_folder_depends_on_the_synth_config_only(tmp_path):
    a = small_config(tmp_path)
    b = small_config(tmp_path, download_retries=7)
    c = PipelineConfig.model_validate({"run": {"output_dir": str(tmp_path)},
                                       "data": {"synth": {**SMALL_SYNTH, "seed": 1}}})
    assert world_dir(a) == world_dir(b) != world_dir(c)
    assert world_dir(a).parent == tmp_path / "data"


def test_a_revision_the_mirror_lacks_is_refused_up_front(tmp_path):
    cfg = small_config(tmp_path, revision="v2")
    with pytest.raises(hub.DownloadError, match="data.synth.revision"):
        _download(cfg)


def test_the_download_code_asks_for_the_mirror_it_does_not_build(tmp_path):
    with pytest.raises(hub.DownloadError, match="build it first"):
        hub.download_all(small_config(tmp_path), progress=False)
    assert not (tmp_path / "data").exists()  # no world generated behind the caller's back


def test_retries_a_transient_failure_then_succeeds(mirror, monkeypatch):
    cfg, downloads = mirror
    calls, delays = [], []
    real = hub._snapshot_download

    def flaky(request, cache_dir, offline):
        calls.append(request.repo_id)
        if len(calls) < 3:
            raise [httpx2.ConnectError("connection reset"), _http_error(503)][len(calls) - 1]
        return real(request, cache_dir, offline)

    monkeypatch.setattr(hub, "_snapshot_download", flaky)
    request = hub.release_requests(cfg)[0]
    snapshot = hub.download_repo(request, cache_dir=world_dir(cfg) / "hub", offline=True, retries=3,
                                 backoff_s=0.5, sleep=delays.append)
    assert snapshot == downloads.parquet
    assert len(calls) == 3
    assert delays == [0.5, 1.0]  # exponential backoff


def test_transient_failures_that_outlast_the_retries_give_up_clearly(monkeypatch):
    def always_down(request, cache_dir, offline):
        raise _http_error(502)

    monkeypatch.setattr(hub, "_snapshot_download", always_down)
    delays: list[float] = []
    request = hub.RepoRequest(repo_id="ParaVT/ParaVT-Parquet", revision="main", allow_patterns=("*.parquet",))
    with pytest.raises(hub.DownloadError) as caught:
        hub.download_repo(request, cache_dir=None, offline=False, retries=2, sleep=delays.append)
    message = str(caught.value)
    assert "ParaVT/ParaVT-Parquet" in message and "'main'" in message and "after 3 attempts" in message
    assert "What to do" in message and "network" in message
    assert delays == [1.0, 2.0]


def test_a_permanent_failure_is_not_retried_and_says_what_to_do(tmp_path):
    """The real snapshot_download, offline, asked for a repo the cache does not hold."""
    delays: list[float] = []
    request = hub.RepoRequest(repo_id="ParaVT/No-Such-Repo", revision="v9", allow_patterns=("*.parquet",))
    with pytest.raises(hub.DownloadError) as caught:
        hub.download_repo(request, cache_dir=tmp_path, offline=True, retries=3, sleep=delays.append)
    message = str(caught.value)
    assert "ParaVT/No-Such-Repo" in message and "'v9'" in message and "What to do" in message
    assert "HF_HUB_OFFLINE" in message
    assert delays == []
    assert isinstance(caught.value.__cause__, hf_errors.LocalEntryNotFoundError)


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (httpx2.ConnectError("refused"), True),
        (httpx2.ReadTimeout("slow"), True),
        (ConnectionResetError("reset"), True),
        (_http_error(500), True),
        (_http_error(503), True),
        (_http_error(429), True),
        (_http_error(404), False),
        (_http_error(401), False),
        (hf_errors.OfflineModeIsEnabled("offline"), False),
        (ValueError("bad pattern"), False),
    ],
    ids=["connect", "timeout", "reset", "500", "503", "429", "404", "401", "offline", "value"],
)
def test_which_errors_are_transient(error, transient):
    assert hub.is_transient(error) is transient


def test_a_cache_miss_caused_by_a_connection_error_is_transient():
    """snapshot_download raises LocalEntryNotFoundError *from* the failed Hub call."""
    try:
        try:
            raise httpx2.ConnectError("name resolution failed")
        except httpx2.ConnectError as cause:
            raise hf_errors.LocalEntryNotFoundError("cannot find the snapshot") from cause
    except hf_errors.LocalEntryNotFoundError as error:
        assert hub.is_transient(error)
    assert not hub.is_transient(hf_errors.LocalEntryNotFoundError("outgoing traffic has been disabled"))


def test_benchmark_requests_merge_the_splits_of_one_repo():
    requests = {r.repo_id: r for r in hub.benchmark_requests("main")}
    assert len(requests) == 6  # videomme and videomme_wsub share Video-MME
    videomme = requests["lmms-lab/Video-MME"].allow_patterns
    assert videomme == ("videomme/test-00000-of-00001.parquet", "videos_chunked_*.zip", "subtitle.zip")
    assert requests["longvideobench/LongVideoBench"].allow_patterns == (
        "validation-00000-of-00001.parquet", "videos.tar.part.*")
    assert requests["yale-nlp/MMVU"].allow_patterns[1] == "*.mp4"
    assert requests["lmms-lab/charades_sta"].allow_patterns[1] == "Charades_v1_480.zip"


def test_only_the_benchmark_repos_of_the_configured_splits_are_fetched(mirror):
    cfg, full = mirror
    narrow = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"splits": ("mlvu", "videomme_wsub")})})
    downloads = _download(narrow)
    assert set(downloads.benchmarks) == {"sy1998/MLVU_dev", "lmms-lab/Video-MME"}
    assert downloads.benchmark("mlvu") == full.benchmark("mlvu")
