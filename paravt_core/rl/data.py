"""RL prompts from materialized ParaVT-Parquet RL rows (SPEC §8).

Rows carry `prompt` (role/content turns; `<video>` marks where the video goes), `videos`
(list of `{"video": path}`; `file://` URLs after materialize) and `extra_info` (JSON with
`answer`, `question_type` mcq|tvg|oe, optionally `question`). The rows' system prompt
already lists the tool schema, so prompts are built with no extra `tools=`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paravt_core.agent.prompts import EpisodePrompt, messages_from_rl_prompt
from paravt_core.sft.encode import media_path

QUESTION_TYPES = ("mcq", "tvg", "oe")


class RLRowError(ValueError):
    """A row the RL stage cannot use; the message names file, row and field."""


@dataclass(frozen=True)
class RLPrompt:
    prompt: EpisodePrompt
    answer: str
    question_type: str
    question: str


def rl_prompt_from_row(row: dict[str, Any], where: str) -> RLPrompt:
    try:
        turns = row["prompt"]
        video = media_path({"url": row["videos"][0]["video"]})
        extra = json.loads(row["extra_info"]) if isinstance(row["extra_info"], str) else dict(row["extra_info"])
    except (KeyError, IndexError, TypeError, json.JSONDecodeError) as err:
        raise RLRowError(f"{where}: malformed RL row ({err!r}); validate the shard with the data contracts") from err
    if extra.get("question_type") not in QUESTION_TYPES:
        raise RLRowError(f"{where}: extra_info.question_type {extra.get('question_type')!r} not in {QUESTION_TYPES}")
    messages = messages_from_rl_prompt(turns)
    digest = hashlib.sha256(json.dumps([turns, str(video), extra], sort_keys=True).encode()).hexdigest()[:16]
    prompt = EpisodePrompt(prompt_id=digest, video_path=video, messages=messages, tools=())
    return RLPrompt(prompt, str(extra.get("answer", "")), extra["question_type"], str(extra.get("question", "")))


def read_rl_prompts(files: Sequence[Path]) -> list[RLPrompt]:
    import pyarrow.parquet as pq

    prompts = []
    for f in files:
        for i, row in enumerate(pq.read_table(f).to_pylist()):
            prompts.append(rl_prompt_from_row(row, f"{Path(f).name}: row {i}"))
    if not prompts:
        raise RLRowError(f"no RL rows in {[str(f) for f in files]}")
    return prompts
