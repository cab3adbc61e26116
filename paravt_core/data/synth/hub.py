"""A local Hugging Face hub cache holding dataset repos, written file by file.

The layout is the one `huggingface_hub` (2.x) reads offline (checked against
`file_download.repo_folder_name`, `_snapshot_download.snapshot_download` and
`_tree_cache`):

    {cache}/datasets--{org}--{name}/
        blobs/{sha256 for LFS files, git blob sha1 otherwise}
        snapshots/{commit}/{path}      relative symlinks into blobs/
        refs/{revision}                the commit hash, no trailing newline
        trees/{commit}.json            the tree listing, so a partial snapshot is detected

With `HF_HUB_OFFLINE=1`, `snapshot_download(repo_id, repo_type="dataset",
cache_dir=cache, revision=...)` resolves `refs/{revision}` to the commit and returns
`snapshots/{commit}` after checking it against the tree listing; `hf_hub_download` finds
single files the same way. The commit hash is the sha1 of the repo id and its sorted
listing of (path, sha256, size), so the same content always gets the same commit.

Every file is written to a temporary name in its folder and moved into place with
`os.replace`, so a reader never sees a partial blob, link or ref.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from paravt_core.atomic import atomic_write_bytes, atomic_write_text

# Files stored through git-LFS on the Hub (blob named by sha256); the rest are git blobs.
LFS_SUFFIXES = (".parquet", ".zip", ".mp4", ".tar", ".arrow")
GITATTRIBUTES = "".join(f"*{suffix} filter=lfs diff=lfs merge=lfs -text\n" for suffix in LFS_SUFFIXES)
TREE_CACHE_FORMAT_VERSION = 1


@dataclass(frozen=True)
class RepoSnapshot:
    """Where one written repo lives and what it holds."""

    repo_id: str
    revision: str
    commit: str
    folder: Path  # the snapshot folder: {cache}/datasets--.../snapshots/{commit}
    files: tuple[str, ...]
    size_bytes: int


def repo_folder(cache_dir: Path, repo_id: str) -> Path:
    """`datasets--{org}--{name}`, as `huggingface_hub.file_download.repo_folder_name`."""
    return cache_dir / "--".join(["datasets", *repo_id.split("/")])


def is_lfs(path: str) -> bool:
    return path.endswith(LFS_SUFFIXES)


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob with this content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def tree_entry(path: str, data: bytes) -> tuple[str, dict]:
    """(blob file name, tree-listing entry) of one file, as the Hub reports it."""
    if not is_lfs(path):
        sha1 = git_blob_sha1(data)
        return sha1, {"size": len(data), "blob_id": sha1}
    sha256 = hashlib.sha256(data).hexdigest()
    pointer_id = git_blob_sha1(lfs_pointer(sha256, len(data)))
    return sha256, {"size": len(data), "blob_id": pointer_id, "lfs_sha256": sha256, "lfs_size": len(data)}


def commit_hash(repo_id: str, files: Mapping[str, bytes]) -> str:
    """A 40-hex commit id that depends only on the repo id and its files' content."""
    digest = hashlib.sha1(f"paravt-synth\n{repo_id}\n".encode())
    for path in sorted(files):
        digest.update(f"{path}\t{hashlib.sha256(files[path]).hexdigest()}\t{len(files[path])}\n".encode())
    return digest.hexdigest()


def _atomic_symlink(target: str, link: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.{uuid.uuid4().hex}.tmp")
    os.symlink(target, tmp)
    os.replace(tmp, link)


def write_dataset_repo(
    cache_dir: Path, repo_id: str, files: Mapping[str, bytes], revision: str = "main"
) -> RepoSnapshot:
    """Write one dataset repo (repo path -> bytes, plus a .gitattributes) into the cache."""
    files = {".gitattributes": GITATTRIBUTES.encode(), **files}
    storage = repo_folder(Path(cache_dir), repo_id)
    commit = commit_hash(repo_id, files)
    snapshot = storage / "snapshots" / commit
    listing = {}
    for path in sorted(files):
        blob_name, listing[path] = tree_entry(path, files[path])
        blob = storage / "blobs" / blob_name
        if not blob.exists():
            atomic_write_bytes(blob, files[path])
        link = snapshot / path
        _atomic_symlink(os.path.relpath(blob, link.parent), link)
    tree = {"format_version": TREE_CACHE_FORMAT_VERSION, "files": listing}
    atomic_write_text(storage / "trees" / f"{commit}.json", json.dumps(tree, indent=1))
    atomic_write_text(storage / "refs" / revision, commit)
    return RepoSnapshot(
        repo_id=repo_id,
        revision=revision,
        commit=commit,
        folder=snapshot,
        files=tuple(sorted(files)),
        size_bytes=sum(len(b) for b in files.values()),
    )
