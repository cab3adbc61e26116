"""Typed references that stages hand to each other (STYLE §3): a path plus a content hash."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import BaseModel, ConfigDict


class ArtifactRef(BaseModel):
    """A stage output: what it is, where it lies and the hash of its content."""

    model_config = ConfigDict(frozen=True)

    kind: str
    path: Path
    sha256: str

    def check(self) -> ArtifactRef:
        """Fail clearly if the artifact is gone or changed since it was produced."""
        if not self.path.exists():
            raise FileNotFoundError(f"{self.kind} artifact {self.path} is missing; re-run the stage that makes it")
        actual = content_hash(self.path)
        if actual != self.sha256:
            raise ValueError(
                f"{self.kind} artifact {self.path} changed since it was produced "
                f"(hash {actual[:12]} != {self.sha256[:12]}); re-run the stage that makes it"
            )
        return self


def file_hash(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def content_hash(path: str | Path) -> str:
    """sha256 of a file, or of a folder's relative file names and file hashes in sorted order."""
    path = Path(path)
    if path.is_file():
        return file_hash(path)
    digest = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f.relative_to(path).as_posix().encode())
        digest.update(b"\0")
        digest.update(file_hash(f).encode())
    return digest.hexdigest()


def source_digest(package: str, only: tuple[str, ...] | None = None) -> str:
    """sha256 (16 hex) of the source files of `package` (its .py and .jinja files, or just the
    ones named in `only`, relative to the package folder).

    Outputs that are pure functions of a config AND of the code that builds them (the tiny
    model, the synthetic world) put this in their folder name and cache key, so that a
    change to the builder's code builds them again instead of reusing a stale folder. `only`
    keeps edits to the package's other files (its CLI, loaders) from rebuilding everything.
    """
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"source_digest: no package {package!r}")
    root = Path(spec.origin).parent
    digest = hashlib.sha256()
    files = ([root / name for name in only] if only is not None else
             [p for p in root.rglob("*") if p.suffix in (".py", ".jinja") and "__pycache__" not in p.parts])
    for f in sorted(files):
        digest.update(f.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        digest.update(f.read_bytes())
    return digest.hexdigest()[:16]
