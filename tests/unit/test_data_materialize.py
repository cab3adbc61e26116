"""Materialize step (SPEC §8): sentinel paths in SFT `messages` / `videos` and RL `videos`
become `file://<root>/<sentinel>`, every other path is left alone, column types survive,
and missing files are counted per root."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from paravt_core.data.materialize import (
    SentinelRewriter,
    classify_shards,
    materialize_release,
    materialize_table,
    missing_table,
    sentinel_root,
)
from paravt_core.data.synth.paravt import RL_SCHEMA, SENTINEL_ROOTS, SFT_SCHEMA
from paravt_core.refs import content_hash

PRESENT = ("longvt_source/synthworld/v1.mp4", "museg/charades/AB12C.mp4", "selfqa/q1.mp4")
ABSENT = ("museg/et_instruct_164k/gone.mp4", "selfqa/gone.mp4")
OTHER = ("/data/elsewhere/x.mp4", "https://example.org/v.mp4", "museg/other/x.mp4", "videos/selfqa/x.mp4")


@pytest.fixture()
def media_root(tmp_path: Path) -> Path:
    root = tmp_path / "media"
    for sentinel in PRESENT:
        (root / sentinel).parent.mkdir(parents=True, exist_ok=True)
        (root / sentinel).write_bytes(b"mp4")
    return root


def video_item(url: str) -> dict:
    return {"type": "video_url", "video_url": {"url": url}}


def text_item(text: str) -> dict:
    return {"type": "text", "text": text}


def sft_row(url: str, extra_urls: tuple[str, ...] = ()) -> dict:
    user = [video_item(url), *[video_item(u) for u in extra_urls], text_item(f"The video path is: {url}")]
    return {
        "messages": [
            {"role": "system", "content": [text_item("You are a helpful assistant.")]},
            {"role": "user", "content": user},
            {"role": "assistant", "content": [text_item("<answer>A</answer>")]},
        ],
        "videos": [url, *extra_urls],
    }


def rl_row(path: str) -> dict:
    prompt = [{"role": "user", "content": f"<video>\nWhat happens in {path}?"}]
    return {"prompt": prompt, "videos": [{"video": path}], "extra_info": json.dumps({"answer": "A"})}


def uri(root: Path, sentinel: str) -> str:
    return (root.resolve() / sentinel).as_uri()


@pytest.mark.parametrize("path", PRESENT + ABSENT)
def test_sentinel_paths_are_recognised(path):
    assert sentinel_root(path) in SENTINEL_ROOTS


@pytest.mark.parametrize("path", OTHER + ("selfqa", "longvt_source", "file:///x/selfqa/a.mp4"))
def test_other_paths_are_not_sentinels(path):
    assert sentinel_root(path) is None


def test_sft_messages_and_videos_are_rewritten_and_other_paths_kept(media_root):
    rows = [sft_row(PRESENT[0], (OTHER[0],)), sft_row(ABSENT[0]), sft_row(OTHER[2])]
    table = pa.Table.from_pylist(rows, schema=SFT_SCHEMA)
    out = materialize_table(table, "sft", SentinelRewriter(media_root))
    assert out.schema == SFT_SCHEMA
    first, second, third = out.to_pylist()
    user = first["messages"][1]["content"]
    assert user[0]["video_url"]["url"] == uri(media_root, PRESENT[0]) == first["videos"][0]
    assert user[1]["video_url"]["url"] == OTHER[0] == first["videos"][1]
    assert user[2]["text"] == f"The video path is: {PRESENT[0]}"  # text is never touched
    assert second["videos"] == [uri(media_root, ABSENT[0])]  # missing files are rewritten too, and counted
    assert third == pa.Table.from_pylist([rows[2]], schema=SFT_SCHEMA).to_pylist()[0]


def test_rl_videos_are_rewritten_prompt_and_extra_info_kept(media_root):
    rows = [rl_row(PRESENT[1]), rl_row(OTHER[1])]
    table = pa.Table.from_pylist(rows, schema=RL_SCHEMA)
    out = materialize_table(table, "rl", SentinelRewriter(media_root))
    assert out.schema == RL_SCHEMA
    first, second = out.to_pylist()
    assert first["videos"] == [{"video": uri(media_root, PRESENT[1])}]
    assert first["prompt"] == rows[0]["prompt"] and first["extra_info"] == rows[0]["extra_info"]
    assert second["videos"] == [{"video": OTHER[1]}]


def test_messages_stored_as_json_text_stay_text(media_root):
    schema = pa.schema([("messages", pa.string()), ("videos", pa.list_(pa.string()))])
    row = sft_row(PRESENT[2])
    table = pa.Table.from_pylist([{"messages": json.dumps(row["messages"]), "videos": row["videos"]}], schema=schema)
    out = materialize_table(table, "sft", SentinelRewriter(media_root))
    assert out.schema == schema
    messages = json.loads(out.column("messages")[0].as_py())
    assert messages[1]["content"][0]["video_url"]["url"] == uri(media_root, PRESENT[2])


def test_image_items_and_qwen_style_video_items_are_rewritten(media_root):
    item = pa.struct([("type", pa.string()), ("video", pa.string()), ("image_url", pa.struct([("url", pa.string())]))])
    schema = pa.schema([("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.list_(item))])))])
    content = [{"type": "video", "video": PRESENT[0]}, {"type": "image_url", "image_url": {"url": PRESENT[1]}}]
    table = pa.Table.from_pylist([{"messages": [{"role": "user", "content": content}]}], schema=schema)
    out = materialize_table(table, "sft", SentinelRewriter(media_root)).to_pylist()[0]
    video, image = out["messages"][0]["content"]
    assert video["video"] == uri(media_root, PRESENT[0])
    assert image["image_url"]["url"] == uri(media_root, PRESENT[1])


def test_missing_files_are_counted_per_root_once_each(media_root):
    rewrite = SentinelRewriter(media_root)
    for path in PRESENT + ABSENT + ABSENT + OTHER:
        rewrite(path)
    report = rewrite.report()
    assert list(report) == list(SENTINEL_ROOTS)
    assert {root: r.missing for root, r in report.items()} == {
        "longvt_source": 0, "museg/charades": 0, "museg/et_instruct_164k": 1, "selfqa": 1}
    assert {root: r.referenced for root, r in report.items()} == {
        "longvt_source": 1, "museg/charades": 1, "museg/et_instruct_164k": 1, "selfqa": 2}
    assert report["selfqa"].missing_examples == ("selfqa/gone.mp4",)
    table = missing_table(report)
    assert "museg/et_instruct_164k" in table and "missing under selfqa: selfqa/gone.mp4" in table


def write_snapshot(folder: Path) -> Path:
    (folder / "sft").mkdir(parents=True)
    (folder / "rl").mkdir()
    pq.write_table(pa.Table.from_pylist([sft_row(PRESENT[0]), sft_row(ABSENT[1])], schema=SFT_SCHEMA),
                   folder / "sft" / "paravt_sft_selftrace.parquet")
    pq.write_table(pa.Table.from_pylist([sft_row(PRESENT[1])], schema=SFT_SCHEMA),
                   folder / "sft" / "paravt_sft_charades.parquet")
    pq.write_table(pa.Table.from_pylist([rl_row(PRESENT[2])], schema=RL_SCHEMA),
                   folder / "rl" / "paravt_rl_diverse_4k4.parquet")
    pq.write_table(pa.table({"stat": [1]}), folder / "stats.parquet")
    return folder


def test_materialize_release_writes_both_folders_with_shard_names_kept(tmp_path, media_root):
    snapshot = write_snapshot(tmp_path / "snapshot")
    out = tmp_path / "materialized"
    result = materialize_release(snapshot, media_root, out, progress=False)
    assert sorted(p.name for p in (out / "sft").iterdir()) == ["paravt_sft_charades.parquet",
                                                              "paravt_sft_selftrace.parquet"]
    assert [p.name for p in (out / "rl").iterdir()] == ["paravt_rl_diverse_4k4.parquet"]
    assert result.sft.sha256 == content_hash(out / "sft") and result.rl.sha256 == content_hash(out / "rl")
    assert result.missing == {"longvt_source": 0, "museg/charades": 0, "museg/et_instruct_164k": 0, "selfqa": 1}
    shard = pq.read_table(out / "sft" / "paravt_sft_selftrace.parquet")
    assert shard.schema == SFT_SCHEMA
    assert shard.column("videos").to_pylist() == [[uri(media_root, PRESENT[0])], [uri(media_root, ABSENT[1])]]
    assert sorted(p.name for p in out.iterdir()) == ["rl", "sft"]  # no temporary folders left behind

    again = materialize_release(snapshot, media_root, out, progress=False)
    assert again == result


def test_a_failed_materialize_leaves_the_previous_output_whole(tmp_path, media_root, monkeypatch):
    snapshot = write_snapshot(tmp_path / "snapshot")
    out = tmp_path / "materialized"
    before = materialize_release(snapshot, media_root, out, progress=False)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("paravt_core.data.materialize.materialize_table", broken)
    with pytest.raises(OSError, match="disk full"):
        materialize_release(snapshot, media_root, out, progress=False)
    assert content_hash(out / "sft") == before.sft.sha256 and content_hash(out / "rl") == before.rl.sha256
    assert sorted(p.name for p in out.iterdir()) == ["rl", "sft"]


def test_shards_are_classified_by_their_columns(tmp_path):
    snapshot = write_snapshot(tmp_path / "snapshot")
    shards = classify_shards(snapshot)
    assert [p.name for p in shards["sft"]] == ["paravt_sft_charades.parquet", "paravt_sft_selftrace.parquet"]
    assert [p.name for p in shards["rl"]] == ["paravt_rl_diverse_4k4.parquet"]
    (snapshot / "rl" / "paravt_rl_diverse_4k4.parquet").unlink()
    with pytest.raises(FileNotFoundError, match="no RL shards"):
        classify_shards(snapshot)


def test_sentinels_that_escape_the_media_root_are_refused_and_reported(media_root, tmp_path):
    secret = tmp_path / "secret.mp4"
    secret.write_bytes(b"not media")
    (media_root / "selfqa" / "link").symlink_to(tmp_path)
    rewrite = SentinelRewriter(media_root)
    climbing = "selfqa/../../../../../../../etc/passwd"
    through_link = "selfqa/link/secret.mp4"
    assert rewrite(climbing) == climbing and rewrite(through_link) == through_link  # left as written
    assert rewrite(PRESENT[2]) == uri(media_root, PRESENT[2])
    report = rewrite.report()
    assert report["selfqa"].escaping == 2 and report["selfqa"].referenced == 1
    assert set(report["selfqa"].escaping_examples) == {climbing, through_link}
    assert "refused, outside the media root (2): " in missing_table(report)


def test_a_malformed_json_messages_cell_is_left_for_the_contract_to_name(media_root):
    """Issue #33 item 6: a bare JSONDecodeError stopped the stage even under quarantine."""
    schema = pa.schema([("messages", pa.string()), ("videos", pa.list_(pa.string()))])
    good = sft_row(PRESENT[2])
    table = pa.Table.from_pylist([{"messages": '[{"role": "user", "content": ', "videos": good["videos"]},
                                  {"messages": json.dumps(good["messages"]), "videos": good["videos"]}],
                                 schema=schema)
    out = materialize_table(table, "sft", SentinelRewriter(media_root))
    assert out.column("messages")[0].as_py() == '[{"role": "user", "content": '
    assert json.loads(out.column("messages")[1].as_py())[1]["content"][0]["video_url"]["url"] == \
        uri(media_root, PRESENT[2])


def test_a_truncated_release_shard_is_named_with_what_to_do(tmp_path, media_root):
    snapshot = write_snapshot(tmp_path / "snapshot")
    shard = next(snapshot.rglob("paravt_sft_selftrace.parquet"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(ValueError, match=rf"{shard}: not a readable parquet file .* delete this file and run the "
                                         r"data stage again"):
        materialize_release(snapshot, media_root, tmp_path / "materialized", progress=False)
