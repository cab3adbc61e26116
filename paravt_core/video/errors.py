"""The error every video reader in the pipeline raises for a file it cannot decode."""

from __future__ import annotations

import os

_DEFAULT_ADVICE = (
    "Re-download or re-extract the file, or re-encode it "
    "(`ffmpeg -i IN -c:v libx264 -pix_fmt yuv420p OUT.mp4`), then run the stage again."
)


class VideoDecodeError(RuntimeError):
    """A video file exists but is unreadable, empty (0 frames) or truncated.

    The message names the file, what is wrong with it and what to do about it
    (STYLE §12). A missing file raises `FileNotFoundError` instead.
    """

    def __init__(self, path: str | os.PathLike[str], problem: str, advice: str = _DEFAULT_ADVICE):
        self.path = os.fspath(path)
        self.problem = problem
        super().__init__(f"cannot read video {self.path}: {problem}. {advice}")
