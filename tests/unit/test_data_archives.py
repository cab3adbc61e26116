"""Unzip step: unsafe members refused before anything is written, truncated or corrupt
archives named in the error, and completion markers that tell a finished extraction
from an interrupted one."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
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


# ----- tars split into parts (LongVideoBench) ----------------------------------------------


def make_tar(members: dict[str, bytes], *, link: str | None = None, fifo: str | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            archive.addfile(info)
        if fifo:
            info = tarfile.TarInfo(fifo)
            info.type = tarfile.FIFOTYPE
            archive.addfile(info)
    return buffer.getvalue()


def write_parts(folder: Path, data: bytes, count: int, stem: str = "videos.tar") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    size = -(-len(data) // count)
    paths = []
    for i in range(count):
        path = folder / f"{stem}.part.a{chr(97 + i)}"
        path.write_bytes(data[i * size:(i + 1) * size])
        paths.append(path)
    return paths


TAR_MEMBERS = {"videos/a.mp4": b"A" * 3000, "videos/sub/b.mp4": b"B" * 5000, "videos/c.mp4": b"C" * 10}


def test_split_tar_parts_extract_as_one_archive(tmp_path):
    parts = write_parts(tmp_path / "snap", make_tar(TAR_MEMBERS), 4)
    hashes = extract_all(list(reversed(parts)), tmp_path / "root", progress=False)  # any order in
    for name, data in TAR_MEMBERS.items():
        assert (tmp_path / "root" / name).read_bytes() == data
    assert list(hashes) == ["videos.tar"]
    record = json.loads((tmp_path / "root" / ".unzipped" / "videos.tar.json").read_text())
    assert record["parts"] == [p.name for p in parts] and sorted(record["members"]) == sorted(TAR_MEMBERS)
    assert not list((tmp_path / "root").glob(".extracting-*"))
    (tmp_path / "root" / "videos" / "a.mp4").write_bytes(b"edited")  # a finished extraction is not redone
    extract_all(parts, tmp_path / "root", progress=False)
    assert (tmp_path / "root" / "videos" / "a.mp4").read_bytes() == b"edited"


def test_a_lone_tar_and_the_synth_writer_round_trip(tmp_path):
    from paravt_core.data.synth.archives import split_parts, tar_bytes

    lone = tmp_path / "snap" / "subtitles.tar"
    lone.parent.mkdir()
    lone.write_bytes(tar_bytes({"subtitles/x.srt": b"1"}))
    assert extract_all([lone], tmp_path / "root", progress=False) == {"subtitles.tar": file_hash(lone)}
    pieces = split_parts("videos.tar", tar_bytes(TAR_MEMBERS), 3)
    assert list(pieces) == ["videos.tar.part.aa", "videos.tar.part.ab", "videos.tar.part.ac"]
    assert tar_bytes(TAR_MEMBERS) == tar_bytes(dict(reversed(TAR_MEMBERS.items())))  # deterministic
    for name, data in pieces.items():
        (tmp_path / "snap" / name).write_bytes(data)
    extract_all(sorted((tmp_path / "snap").glob("videos.tar.part.*")), tmp_path / "root", progress=False)
    assert (tmp_path / "root" / "videos" / "sub" / "b.mp4").read_bytes() == TAR_MEMBERS["videos/sub/b.mp4"]


def test_a_missing_part_is_named(tmp_path):
    parts = write_parts(tmp_path / "snap", make_tar({"videos/big.mp4": b"V" * 30000}), 4)
    with pytest.raises(ArchiveError, match=r"videos\.tar\.part\.ac are missing"):
        extract_all([parts[0], parts[1], parts[3]], tmp_path / "root", progress=False)
    with pytest.raises(ArchiveError, match="not a complete tar archive"):
        extract_all(parts[:3], tmp_path / "root", progress=False)  # no last part: the stream ends mid-member
    assert not (tmp_path / "root" / "videos").exists()


def test_a_truncated_part_leaves_nothing_behind(tmp_path):
    parts = write_parts(tmp_path / "snap", make_tar(TAR_MEMBERS), 2)
    parts[1].write_bytes(parts[1].read_bytes()[:100])
    with pytest.raises(ArchiveError, match="not a complete tar archive"):
        extract_all(parts, tmp_path / "root", progress=False)
    assert not [p for p in (tmp_path / "root").rglob("*") if p.is_file()]


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"members": {**TAR_MEMBERS, "../escaped.mp4": b"x"}}, "climbs out"),
        ({"members": {**TAR_MEMBERS, "/tmp/abs.mp4": b"x"}}, "absolute path"),
        ({"members": TAR_MEMBERS, "link": "videos/link.mp4"}, "is a link"),
        ({"members": TAR_MEMBERS, "fifo": "videos/pipe"}, "not a regular file"),
    ],
    ids=["dotdot", "absolute", "symlink", "fifo"],
)
def test_unsafe_tar_members_are_refused_and_nothing_is_written(tmp_path, kwargs, why):
    parts = write_parts(tmp_path / "snap", make_tar(**kwargs), 2)
    with pytest.raises(UnsafeArchiveError, match=why):
        extract_all(parts, tmp_path / "root", progress=False)
    assert not [p for p in (tmp_path / "root").rglob("*") if p.is_file()]
    assert not (tmp_path / "escaped.mp4").exists()


# ----- split tars: damaged parts are named, never extracted silently --------------------------


def _nothing_extracted(root: Path) -> bool:
    return not [p for p in root.rglob("*") if p.is_file()] if root.exists() else True


MANY = {f"videos/v{i}.mp4": bytes([65 + i]) * 2000 for i in range(8)}


@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_a_truncated_or_empty_middle_part_is_named(tmp_path, damage):
    parts = write_parts(tmp_path / "snap", make_tar(MANY), 4)
    data = parts[1].read_bytes()
    parts[1].write_bytes(data[: len(data) // 3] if damage == "truncated" else b"")
    with pytest.raises(ArchiveError, match=r"videos\.tar\.part\.ab"):
        extract_all(parts, tmp_path / "root", progress=False)
    assert _nothing_extracted(tmp_path / "root")


def test_two_parts_truncated_alike_are_both_blamed_not_the_intact_one(tmp_path):
    """Issue #33 item 8: with two equally truncated parts the most common size blamed the intact one."""
    parts = write_parts(tmp_path / "snap", make_tar(MANY), 4)
    assert len(parts) >= 4
    for part in parts[1:3]:
        part.write_bytes(part.read_bytes()[:500])
    with pytest.raises(ArchiveError) as caught:
        extract_all(parts, tmp_path / "root", progress=False)
    message = str(caught.value)
    assert "videos.tar.part.ab (500 bytes)" in message and "videos.tar.part.ac (500 bytes)" in message
    assert "part.aa (" not in message
    assert _nothing_extracted(tmp_path / "root")


def test_a_middle_part_cut_to_the_same_size_as_the_others_is_caught_by_its_header(tmp_path):
    """Equal sizes but a header overwritten in the second part: tarfile alone would stop there
    and call the archive complete, with the later members missing."""
    tar = bytearray(make_tar(MANY))
    parts_before = write_parts(tmp_path / "plain", bytes(tar), 4)
    header = tar.index(b"videos/v5.mp4")  # a member header inside the third part
    tar[header : header + 512] = b"\xff" * 512
    parts = write_parts(tmp_path / "snap", bytes(tar), 4)
    assert [p.stat().st_size for p in parts] == [p.stat().st_size for p in parts_before]
    with pytest.raises(ArchiveError, match=r"unreadable header at byte \d+ \(in videos\.tar\.part\.a[bc]\)"):
        extract_all(parts, tmp_path / "root", progress=False)
    assert _nothing_extracted(tmp_path / "root")
    assert not (tmp_path / "root" / ".unzipped" / "videos.tar.json").exists()


def test_non_zero_bytes_after_the_end_of_the_archive_are_an_error(tmp_path):
    parts = write_parts(tmp_path / "snap", make_tar(TAR_MEMBERS) + b"\0" * 512 + b"junk", 2)
    with pytest.raises(ArchiveError, match="non-zero byte at .* after the end-of-archive header"):
        extract_all(parts, tmp_path / "root", progress=False)
    assert _nothing_extracted(tmp_path / "root")


def test_part_sizes_from_the_download_metadata_are_checked(tmp_path):
    parts = write_parts(tmp_path / "snap", make_tar(TAR_MEMBERS), 2)
    sizes = {p.name: p.stat().st_size for p in parts}
    with pytest.raises(ArchiveError, match=r"part .*videos\.tar\.part\.ab is \d+ bytes but the download's metadata"):
        extract_all(parts, tmp_path / "root", progress=False, part_sizes={**sizes, parts[1].name: 99999})
    assert extract_all(parts, tmp_path / "root", progress=False, part_sizes=sizes) == {
        "videos.tar": json.loads((tmp_path / "root" / ".unzipped" / "videos.tar.json").read_text())["sha256"]}


def test_a_hub_blob_part_must_match_its_recorded_sha256(tmp_path):
    data = write_parts(tmp_path / "scratch", make_tar(MANY), 3)
    snapshot, blobs = tmp_path / "snap", tmp_path / "blobs"
    snapshot.mkdir()
    blobs.mkdir()
    links = []
    for index, part in enumerate(data):
        content = part.read_bytes()
        blob = blobs / file_hash(part)
        # same size, one flipped byte inside a member's data: only the hash can tell
        blob.write_bytes(content[:-700] + bytes([content[-700] ^ 1]) + content[-699:] if index == 1 else content)
        link = snapshot / part.name
        os.symlink(os.path.relpath(blob, snapshot), link)
        links.append(link)
    with pytest.raises(ArchiveError, match=r"part .*videos\.tar\.part\.ab has sha256 .* but the hub recorded"):
        extract_all(links, tmp_path / "root", progress=False)
    assert _nothing_extracted(tmp_path / "root")


@pytest.mark.parametrize("content", ["", "{", "[]", '{"sha256": 1}', '{"sha256": "x", "members": "a"}'])
def test_an_empty_or_corrupt_marker_means_not_complete(tmp_path, content):
    parts = write_parts(tmp_path / "snap", make_tar(TAR_MEMBERS), 2)
    zipped = make_zip(tmp_path / "selfqa.zip", MEMBERS)
    root = tmp_path / "root"
    for name in ("videos.tar", "selfqa.zip"):
        (root / ".unzipped").mkdir(parents=True, exist_ok=True)
        (root / ".unzipped" / f"{name}.json").write_text(content)
    hashes = extract_all([*parts, zipped], root, progress=False)
    assert set(hashes) == {"videos.tar", "selfqa.zip"}
    assert (root / "videos" / "a.mp4").read_bytes() == TAR_MEMBERS["videos/a.mp4"]
    assert archives.read_marker(root / ".unzipped" / "videos.tar.json")["members"] == sorted(TAR_MEMBERS)
