"""Unzip step: unsafe members refused before anything is written, truncated or corrupt
archives named in the error, and completion markers that tell a finished extraction
from an interrupted one."""

from __future__ import annotations

import json
import os
import stat
import zipfile
from pathlib import Path

import pytest

from paravt_core.data import archives
from paravt_core.data.archives import ArchiveError, UnsafeArchiveError, extract_all, extract_archive, marker_path
from paravt_core.refs import file_hash

MEMBERS = {"selfqa/a.mp4": b"A" * 300, "museg/charades/B1.mp4": b"B" * 200}


def make_zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def make_symlink_zip(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        info = zipfile.ZipInfo("selfqa/link.mp4")
        info.create_system = 3
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(info, "/etc/passwd")
    return path


def test_extracts_every_member_and_writes_the_marker_last(tmp_path):
    archive = make_zip(tmp_path / "media.zip", MEMBERS)
    members = extract_archive(archive, tmp_path / "root", progress=False)
    assert sorted(members) == sorted(MEMBERS)
    for name, data in MEMBERS.items():
        assert (tmp_path / "root" / name).read_bytes() == data
    record = json.loads(marker_path(tmp_path / "root", archive).read_text())
    assert record["sha256"] == file_hash(archive)
    assert not list((tmp_path / "root").rglob("*.part"))


@pytest.mark.parametrize(
    "bad_name",
    ["../escaped.mp4", "selfqa/../../escaped.mp4", "/tmp/absolute.mp4", "C:/windows.mp4", "..\\escaped.mp4"],
    ids=["dotdot", "nested-dotdot", "absolute", "drive", "backslash-dotdot"],
)
def test_a_member_outside_the_target_is_refused_and_nothing_is_written(tmp_path, bad_name):
    archive = make_zip(tmp_path / "evil.zip", {"selfqa/fine.mp4": b"ok", bad_name: b"x"})
    target = tmp_path / "deep" / "root"
    with pytest.raises(UnsafeArchiveError, match="evil.zip") as caught:
        extract_archive(archive, target, progress=False)
    assert repr(bad_name) in str(caught.value)
    assert not (target / "selfqa" / "fine.mp4").exists()  # checked before anything is extracted
    assert not (tmp_path / "escaped.mp4").exists() and not (tmp_path / "deep" / "escaped.mp4").exists()
    assert not marker_path(target, archive).exists()


def test_a_symlink_member_is_refused(tmp_path):
    archive = make_symlink_zip(tmp_path / "links.zip")
    with pytest.raises(UnsafeArchiveError, match="symbolic link"):
        extract_archive(archive, tmp_path / "root", progress=False)
    assert not (tmp_path / "root" / "selfqa" / "link.mp4").exists()


def test_a_member_reaching_out_through_an_existing_symlink_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "root"
    target.mkdir()
    os.symlink(outside, target / "selfqa")
    archive = make_zip(tmp_path / "m.zip", {"selfqa/a.mp4": b"a"})
    with pytest.raises(UnsafeArchiveError, match="outside"):
        extract_archive(archive, target, progress=False)
    assert not (outside / "a.mp4").exists()


def test_a_truncated_zip_gives_an_error_naming_it(tmp_path):
    whole = make_zip(tmp_path / "whole.zip", MEMBERS).read_bytes()
    truncated = tmp_path / "museg_charades.zip"
    truncated.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ArchiveError, match="museg_charades.zip.*truncated") as caught:
        extract_archive(truncated, tmp_path / "root", progress=False)
    assert "re-run the download" in str(caught.value)
    assert not marker_path(tmp_path / "root", truncated).exists()


def test_a_member_failing_its_crc_gives_an_error_naming_archive_and_member(tmp_path):
    data = bytearray(make_zip(tmp_path / "ok.zip", {"selfqa/a.mp4": b"A" * 300}).read_bytes())
    offset = data.index(b"A" * 300)
    data[offset + 10] = ord("Z")  # same size, wrong content: only the CRC can tell
    corrupt = tmp_path / "selfqa.zip"
    corrupt.write_bytes(bytes(data))
    with pytest.raises(ArchiveError, match="selfqa.zip.*'selfqa/a.mp4'.*damaged"):
        extract_archive(corrupt, tmp_path / "root", progress=False)
    assert not (tmp_path / "root" / "selfqa" / "a.mp4").exists()
    assert not marker_path(tmp_path / "root", corrupt).exists()


def test_a_finished_extraction_is_not_redone(tmp_path, monkeypatch):
    archive = make_zip(tmp_path / "media.zip", MEMBERS)
    extract_archive(archive, tmp_path / "root", progress=False)

    def must_not_copy(*args, **kwargs):
        raise AssertionError("already extracted")

    monkeypatch.setattr(archives, "_copy_member", must_not_copy)
    assert sorted(extract_archive(archive, tmp_path / "root", progress=False)) == sorted(MEMBERS)


def test_an_interrupted_extraction_is_redone(tmp_path, monkeypatch):
    archive = make_zip(tmp_path / "media.zip", MEMBERS)
    real_copy = archives._copy_member
    copied = []

    def crash_after_first(*args):
        if copied:
            raise KeyboardInterrupt
        copied.append(args[1].filename)
        real_copy(*args)

    monkeypatch.setattr(archives, "_copy_member", crash_after_first)
    with pytest.raises(KeyboardInterrupt):
        extract_archive(archive, tmp_path / "root", progress=False)
    assert not marker_path(tmp_path / "root", archive).exists()

    monkeypatch.setattr(archives, "_copy_member", real_copy)
    extract_archive(archive, tmp_path / "root", progress=False)
    for name, data in MEMBERS.items():
        assert (tmp_path / "root" / name).read_bytes() == data


def test_a_changed_archive_or_a_deleted_file_is_extracted_again(tmp_path):
    root = tmp_path / "root"
    archive = make_zip(tmp_path / "media.zip", MEMBERS)
    extract_archive(archive, root, progress=False)
    (root / "selfqa" / "a.mp4").unlink()
    extract_archive(archive, root, progress=False)
    assert (root / "selfqa" / "a.mp4").read_bytes() == MEMBERS["selfqa/a.mp4"]

    make_zip(archive, {**MEMBERS, "selfqa/a.mp4": b"new release"})
    extract_archive(archive, root, progress=False)
    assert (root / "selfqa" / "a.mp4").read_bytes() == b"new release"
    assert json.loads(marker_path(root, archive).read_text())["sha256"] == file_hash(archive)


def test_hub_blob_names_stand_for_the_archive_hash(tmp_path):
    data = make_zip(tmp_path / "scratch.zip", MEMBERS).read_bytes()
    blob = tmp_path / "blobs" / file_hash(tmp_path / "scratch.zip")
    blob.parent.mkdir()
    blob.write_bytes(data)
    link = tmp_path / "snapshot" / "selfqa.zip"
    link.parent.mkdir()
    os.symlink(os.path.relpath(blob, link.parent), link)
    assert archives.archive_sha256(link) == blob.name
    assert archives.archive_sha256(tmp_path / "scratch.zip") == blob.name


def test_several_archives_go_into_one_root(tmp_path):
    first = make_zip(tmp_path / "selfqa.zip", {"selfqa/a.mp4": b"a"})
    second = make_zip(tmp_path / "museg_charades.zip", {"museg/charades/B.mp4": b"b"})
    hashes = extract_all([first, second], tmp_path / "root", progress=False)
    assert hashes == {"selfqa.zip": file_hash(first), "museg_charades.zip": file_hash(second)}
    assert (tmp_path / "root" / "selfqa" / "a.mp4").is_file()
    assert (tmp_path / "root" / "museg" / "charades" / "B.mp4").is_file()
