"""Media health (`paravt_core.video.health`): undecodable videos are found once, by content hash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paravt_core.video import health as health_module
from paravt_core.video.health import MediaHealthCache
from tests.conftest import write_test_video


@pytest.fixture()
def videos(tmp_path: Path) -> dict[str, Path]:
    good = write_test_video(tmp_path / "good.mp4", seconds=6.0)
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    text = tmp_path / "passwd.mp4"
    text.write_text("root:x:0:0:root:/root:/bin/bash\n")
    truncated = tmp_path / "truncated.mp4"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    return {"good": good, "empty": empty, "text": text, "truncated": truncated}


def test_good_and_bad_videos(videos, tmp_path):
    cache = MediaHealthCache(tmp_path / "cache")
    good = cache.check(videos["good"])
    assert good.ok and good.num_frames == 12 and good.duration == pytest.approx(6.0)
    assert "empty (0 bytes)" in cache.check(videos["empty"]).problem
    for name in ("text", "truncated"):
        verdict = cache.check(videos[name])
        assert not verdict.ok and verdict.problem, name
    with pytest.raises(FileNotFoundError):
        cache.check(tmp_path / "absent.mp4")


def test_verdicts_are_cached_by_content_hash(videos, tmp_path, monkeypatch):
    first = MediaHealthCache(tmp_path / "cache")
    verdict = first.check(videos["truncated"])
    stored = json.loads((tmp_path / "cache" / f"{verdict.sha256}.json").read_text())
    assert stored["problem"] == verdict.problem and stored["probe_version"] == health_module.PROBE_VERSION
    copy = tmp_path / "same-bytes-elsewhere.mp4"
    copy.write_bytes(videos["truncated"].read_bytes())
    monkeypatch.setattr(health_module, "_probe", lambda path: pytest.fail(f"probed {path} again"))
    again = MediaHealthCache(tmp_path / "cache")  # a later run: read from the cache folder
    assert again.check(copy) == verdict
    (tmp_path / "cache" / f"{verdict.sha256}.json").write_text("")  # a torn entry is probed again, not an error
    monkeypatch.setattr(health_module, "_probe", lambda path: (0, 0.0, "probed"))
    assert MediaHealthCache(tmp_path / "cache").check(copy).problem == "probed"


def _with_a_damaged_middle_keyframe(source: Path, out: Path) -> tuple[Path, int]:
    """A copy of `source` whose keyframe in the middle has its payload inverted; (path, its frame)."""
    import av

    with av.open(str(source)) as container:
        stream = container.streams.video[0]
        packets = [(packet.pos, packet.size) for packet in container.demux(stream) if packet.size and packet.is_keyframe]
    pos, size = packets[len(packets) // 2]
    data = bytearray(source.read_bytes())
    data[pos + 4 : pos + size] = bytes(b ^ 0xFF for b in data[pos + 4 : pos + size])
    out.write_bytes(bytes(data))
    return out, len(packets) // 2


def test_a_damaged_gop_in_the_middle_fails_the_probe(tmp_path):
    """Issue #33 item 1: the probe decoded only the first and last frame, so a broken middle passed."""
    from paravt_core.video import VideoFile

    good = write_test_video(tmp_path / "long.mp4", seconds=60.0, size=(128, 160))
    broken, _ = _with_a_damaged_middle_keyframe(good, tmp_path / "broken.mp4")
    with VideoFile(broken) as video:  # what the old probe did: first and last frame decode
        n = video.info.num_frames
        video.read([0, n - 1], height=16, width=16)
    cache = MediaHealthCache(tmp_path / "cache")
    assert cache.check(good).ok
    verdict = cache.check(broken)
    assert not verdict.ok and "decoding failed near frame" in verdict.problem


def test_probe_indices_cover_every_keyframe_and_spread_frames():
    indices = health_module.probe_indices(1000, [0, 250, 500, 750])
    assert {0, 250, 500, 750, 999} <= set(indices) and len(indices) == len(set(indices))
    assert len(indices) >= 64 and indices == sorted(indices)
    assert health_module.probe_indices(1, [0]) == [0]


def test_probing_in_a_pool_gives_the_serial_verdicts_in_order(videos, tmp_path, monkeypatch, caplog):
    """Issue #44 item 9: `check_all` probes in worker processes; the verdicts are `check`'s one at
    a time, in the order asked (a repeated path twice, an absent one None), and `check` then
    answers from memory."""
    import logging

    order = [videos["truncated"], videos["good"], tmp_path / "absent.mp4", videos["empty"], videos["text"],
             videos["good"]]
    serial = MediaHealthCache(tmp_path / "serial")
    expected = [serial.check(path) if path.exists() else None for path in order]
    pooled = MediaHealthCache(tmp_path / "pooled")
    monkeypatch.setattr(health_module, "MIN_VIDEOS_PER_WORKER", 1)  # a pool for four videos
    with caplog.at_level(logging.INFO, logger=health_module.__name__):
        assert pooled.check_all(order, workers=2) == expected
    assert "media health: probed 4 videos" in caplog.text and "2 processes" in caplog.text
    assert len(list((tmp_path / "pooled").glob("*.json"))) == 4  # stored by the workers, as `check` stores
    monkeypatch.setattr(health_module, "_probe", lambda path: pytest.fail(f"probed {path} again"))
    monkeypatch.setattr(health_module, "video_sha256", lambda path: pytest.fail(f"hashed {path} again"))
    assert [pooled.check(path) for path in order if path.exists()] == [v for v in expected if v is not None]
    assert pooled.check_all(order, workers=1) == expected
