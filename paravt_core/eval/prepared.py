"""A split the data stage prepared: its `split.json` (rows, videos and subtitles folders) read back.

Kept apart from `samples.py`, whose source keys the evaluation's result folders
(`eval.stage.PROMPT_SOURCES`).
"""

from __future__ import annotations

import json
from pathlib import Path

from paravt_core.eval.samples import load_split


def load_split_file(split_json: Path) -> list:
    """The `EvalSample`s of a prepared split, from its `split.json`."""
    record = json.loads(Path(split_json).read_text())
    subtitle_dir = Path(record["subtitle_dir"]) if record["subtitle_dir"] else None
    return load_split(record["split"], Path(record["rows"]), Path(record["video_dir"]), subtitle_dir)
