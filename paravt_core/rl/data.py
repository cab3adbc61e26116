"""RL prompts from materialized ParaVT-Parquet RL rows (SPEC §8).

Rows carry `prompt` (role/content turns; `<video>` marks where the video goes), `videos`
(list of `{"video": path}`; `file://` URLs after materialize) and `extra_info` (JSON with
`answer`, `question_type` mcq|tvg|oe, optionally `question`). The rows' system prompt
already lists the tool schema, so prompts are built with no extra `tools=`.

`rollout_dropping_undecodable` runs a step's rollout without the prompts whose video does
not decode: such a prompt is dropped for the step with a warning naming its video, and
remembered so later steps skip it up front. One bad file never ends an RL run.

A prompt's id seeds its draws (gating's K, SPEC §5), so it is computed from the row's
content and the video's path relative to the media root (`video_key`), never from the
absolute path the materialize step wrote: moving the output folder must not change a run.
The media root is that of the data stage that wrote the rows (`rl.stage.media_root`), not
the row config's run.output_dir, so a row given another run's data draws as that run does.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paravt_core.agent.prompts import EpisodePrompt, messages_from_rl_prompt
from paravt_core.agent.rollout import run_dropping_undecodable
from paravt_core.sft.encode import media_path
from paravt_core.video.hashing import video_sha256

QUESTION_TYPES = ("mcq", "tvg", "oe")


class RLRowError(ValueError):
    """A row the RL stage cannot use; the message names file, row and field."""


@dataclass(frozen=True)
class RLPrompt:
    prompt: EpisodePrompt
    answer: str
    question_type: str
    question: str
    video_key: str = ""  # what the prompt id knows of its video (`video_key`), logged with each draw


def video_key(video: Path, media_root: Path | None) -> str:
    """What a prompt's id knows of its video: the path relative to `media_root` (the data
    stage's media folder, where every materialized RL video lies), else the sha256 of the
    file's bytes (read once per prompt, so keep RL videos under the media root). A file that
    cannot be read is keyed by its path as written: its prompt is dropped at its first
    rollout (`rollout_dropping_undecodable`), so no draw of it ever counts."""
    if media_root is not None:
        try:
            return Path(video).resolve().relative_to(Path(media_root).resolve()).as_posix()
        except ValueError:
            pass

    try:
        return "sha256:" + video_sha256(video)
    except OSError:
        return f"unreadable:{video}"


def rl_prompt_from_row(row: dict[str, Any], where: str, media_root: Path | None = None,
                       keys: dict[Path, str] | None = None) -> RLPrompt:
    """One RL prompt; `keys` caches `video_key` per video across rows (a video outside the
    media root is hashed whole, and several rows share a video)."""
    try:
        turns = row["prompt"]
        video = media_path({"url": row["videos"][0]["video"]})
        extra = json.loads(row["extra_info"]) if isinstance(row["extra_info"], str) else dict(row["extra_info"])
    except (KeyError, IndexError, TypeError, json.JSONDecodeError) as err:
        raise RLRowError(f"{where}: malformed RL row ({err!r}); validate the shard with the data contracts") from err
    if extra.get("question_type") not in QUESTION_TYPES:
        raise RLRowError(f"{where}: extra_info.question_type {extra.get('question_type')!r} not in {QUESTION_TYPES}")
    messages = messages_from_rl_prompt(turns)
    keys = {} if keys is None else keys
    if video not in keys:
        keys[video] = video_key(video, media_root)
    key = keys[video]
    digest = hashlib.sha256(json.dumps([turns, key, extra], sort_keys=True).encode()).hexdigest()[:16]
    prompt = EpisodePrompt(prompt_id=digest, video_path=video, messages=messages, tools=())
    return RLPrompt(prompt, str(extra.get("answer", "")), extra["question_type"], str(extra.get("question", "")), key)


def read_rl_prompts(files: Sequence[Path], question_types: Sequence[str] = QUESTION_TYPES,
                    media_root: Path | None = None) -> list[RLPrompt]:
    """Every row of `files` whose question type is in `question_types` (`rl.question_types`),
    in file and row order. Every row is parsed, so a malformed one fails the run even when its
    type is not trained on. `media_root`: what video paths are keyed relative to (`video_key`).

    Raises:
        RLRowError: a malformed row (naming file and row), or no row of the asked types.
    """
    import pyarrow.parquet as pq

    prompts, seen, keys = [], {t: 0 for t in QUESTION_TYPES}, {}
    for f in files:
        for i, row in enumerate(pq.read_table(f).to_pylist()):
            prompt = rl_prompt_from_row(row, f"{Path(f).name}: row {i}", media_root, keys)
            seen[prompt.question_type] += 1
            if prompt.question_type in question_types:
                prompts.append(prompt)
    if not prompts:
        counts = ", ".join(f"{t} {n}" for t, n in seen.items())
        raise RLRowError(f"no RL rows of types {list(question_types)} in {[str(f) for f in files]} (rows by type: "
                         f"{counts}); widen rl.question_types or check the RL shards")
    return prompts


def rollout_dropping_undecodable(prompts: Sequence[RLPrompt], run: Callable[[list[RLPrompt]], list],
                                 undecodable: set[str], warn: Callable[[str], None] = print) -> tuple[list, list]:
    """(prompts kept, their episodes) of `run(prompts)` without the prompts whose video does
    not decode; `undecodable` (video paths) is read and extended across steps
    (`agent.rollout.run_dropping_undecodable`, shared with the SFT grammar check).

    Raises:
        VideoDecodeError: every prompt of the step has an undecodable video.
    """
    return run_dropping_undecodable(prompts, run, lambda p: p.prompt.video_path, undecodable, warn,
                                    who="RL step")
