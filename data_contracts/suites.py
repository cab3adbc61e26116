"""The expectation suites: one for SFT rows, one for RL rows, one per evaluation split.

Every suite checks, in this order: the table has rows, the required columns are present (GX
`ExpectTableColumnsToMatchSet`, extra columns allowed), none of them is null, each has its
kind, row ids are unique, then the rules of the row format (SPEC §7, §8):

- `sft_rows`: messages are chat turns with roles in system/user/assistant/tool ending
  with an assistant turn (the trained answer); videos is a non-empty list of paths; every
  video/image the messages or videos name is a materialized file:// URL of an existing file.
- `rl_rows`: prompt turns have text content, allowed roles, end with a user turn and hold
  one `<video>` marker for the row's one video; videos are `{"video": path}` entries of
  existing files; extra_info is JSON with answer and question_type in mcq | tvg | oe, the
  answer fits its type (SPEC §4.2) and an mcq letter is among the prompt's options.
- every suite, when built with a media-health cache folder: each video decodes, with
  frames and a duration (`paravt_core.video.health`);
- `eval_<split>`: the fields the split's loader reads, with their kinds; value rules
  (Video-MME duration short/medium/long and options lettered "A. ", MMVU question_type
  multiple-choice/open-ended, Charades-STA timestamp a window with start < end); the answer
  names an option (MCQ splits); the loader accepts the row; with a video_dir, the loader
  finds its video (and the .srt for videomme_wsub).

Row identity: eval rows use the dataset's id field (Video-MME and MLVU `question_id`,
LongVideoBench `id`, MMVU `id`). Rows without one get a derived id in `ROW_ID`: the sha256
of the canonical JSON of (messages, videos) for SFT, (prompt, videos, extra_info) for RL,
(video, caption) for Charades-STA, whose loader numbers rows instead, and (question, answer,
time_reference, type) for LVBench, whose real rows can have a null `uid` (the loader then
derives one). MLVU `candidates` may hold blanks (real rows do; the loader drops them), so
their kind is left to the answer and loader rules.

Rules on a column the table lacks are left out; the required-columns rule reports it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import great_expectations as gx
import great_expectations.expectations as gxe
from great_expectations.expectations.expectation import Expectation

from data_contracts import expectations as px
from paravt_core.eval.splits import SPLITS

EVAL_SPLITS = tuple(SPLITS)
ROW_ID = "_row_sha256"
KINDS = ("sft", "rl", "eval")
KIND_WORDS = {
    "text": "non-blank text",
    "integer": "an integer",
    "number": "a finite number",
    "text_list": "a non-empty list of non-blank texts",
    "mapping": "an object",
}


@dataclass(frozen=True)
class RowFormat:
    """What a suite requires of a table: columns with their kinds (None: a format rule checks
    the type), the id column and, for a derived id, the columns it hashes."""

    columns: dict[str, str | None]
    id_column: str
    identity: tuple[str, ...] = ()
    answer_layout: str | None = None


_VIDEOMME = RowFormat(
    columns={
        **dict.fromkeys(("video_id", "duration", "domain", "sub_category", "videoID"), "text"),
        **dict.fromkeys(("question_id", "task_type", "question", "answer"), "text"),
        "options": "text_list",
    },
    id_column="question_id",
    answer_layout="videomme",
)
ROW_FORMATS: dict[str, RowFormat] = {
    "sft": RowFormat({"messages": None, "videos": None}, ROW_ID, ("messages", "videos")),
    "rl": RowFormat({"prompt": None, "videos": None, "extra_info": None}, ROW_ID, ("prompt", "videos", "extra_info")),
    # the evaluation's, under the names the split records give (`EvalSplit.row_format`)
    "videomme": _VIDEOMME,
    "longvideobench": RowFormat(
        columns={
            **dict.fromkeys(("id", "video_path", "subtitle_path", "question"), "text"),
            **{f"option{i}": "text" for i in range(5)},
            "correct_choice": "integer",
            "duration": "number",
            "duration_group": "integer",
            "question_category": "text",
            "topic_category": "text",
        },
        id_column="id",
        answer_layout="longvideobench",
    ),
    "lvbench": RowFormat(
        columns={
            **dict.fromkeys(("type", "question", "answer", "time_reference"), "text"),
            "question_type": "text_list",
            "key": "text",
        },
        id_column=ROW_ID,
        identity=("question", "answer", "time_reference", "type"),
        answer_layout="lvbench",
    ),
    "mlvu": RowFormat(
        columns={
            **dict.fromkeys(("video_name", "question", "answer", "task_type", "question_id"), "text"),
            "duration": "number",
            "candidates": None,
        },
        id_column="question_id",
        answer_layout="mlvu",
    ),
    "mmvu": RowFormat(
        columns={
            **dict.fromkeys(("id", "video", "question_type", "question", "answer"), "text"),
            "metadata": "mapping",
            "choices": "mapping",
        },
        id_column="id",
        answer_layout="mmvu",
    ),
    "charades": RowFormat({"video": "text", "caption": "text", "timestamp": None}, ROW_ID, ("video", "caption")),
}


def row_format(kind: str, split: str | None, table_columns: Iterable[str]) -> RowFormat:
    """The row format of a kind (and split); LVBench's lmms-lab copy names its video by
    `video_path` instead of `key` (SPEC §7 loader)."""
    name = kind if kind != "eval" else (SPLITS[split].row_format if split in SPLITS else None)
    if name not in ROW_FORMATS:
        raise ValueError(f"unknown contract {kind!r}/{split!r}; kinds {KINDS}, eval splits {EVAL_SPLITS}")
    fmt = ROW_FORMATS[name]
    if name == "lvbench" and "video_path" in set(table_columns):
        columns = {("video_path" if c == "key" else c): k for c, k in fmt.columns.items()}
        fmt = RowFormat(columns, fmt.id_column, fmt.identity, fmt.answer_layout)
    return fmt


def suite_name(kind: str, split: str | None) -> str:
    return f"eval_{split}" if kind == "eval" else f"{kind}_rows"


# --- shared rules ----------------------------------------------------------------------


def column_rules(fmt: RowFormat) -> list[Expectation]:
    """Rows exist; required columns present, not null, of their kind; unique row ids."""
    found: list[Expectation] = [
        gxe.ExpectTableRowCountToBeBetween(min_value=1, description="the table has rows"),
        gxe.ExpectTableColumnsToMatchSet(
            column_set=sorted(fmt.columns), exact_match=False, description="the required columns are present"
        ),
    ]
    for column, kind in fmt.columns.items():
        found.append(gxe.ExpectColumnValuesToNotBeNull(column=column, description=f"{column} is never null"))
        if kind is not None:
            words = KIND_WORDS[kind]
            found.append(px.ExpectColumnValuesToBeOfKind(column=column, kind=kind, description=f"{column} is {words}"))
    found.append(px.ExpectColumnValuesToBeFirstOccurrences(column=fmt.id_column))
    return found


def sft_rules(media_root: Path | None = None, media_health: Path | None = None) -> list[Expectation]:
    """SFT rows (SPEC §8; the SFT encoder trains on the assistant turns)."""
    return [
        px.ExpectColumnValuesToBeChatTurns(column="messages", content="items"),
        px.ExpectColumnValuesToUseChatRoles(column="messages"),
        px.ExpectColumnValuesToEndWithRole(
            column="messages", role="assistant", description="the conversation ends with the assistant's answer"
        ),
        px.ExpectColumnValuesToBeVideoLists(column="videos", entry="path"),
        *_existing_files("messages", media_root),
        *_existing_files("videos", media_root),
        *_healthy_videos("videos", media_health, media_root),
    ]


def _healthy_videos(column: str, media_health: Path | None, media_root: Path | None) -> list[Expectation]:
    if media_health is None:
        return []
    root = str(media_root) if media_root is not None else None
    return [px.ExpectColumnValuesToReferenceHealthyVideos(column=column, health_cache=str(media_health),
                                                          media_root=root)]


def _existing_files(column: str, media_root: Path | None) -> list[Expectation]:
    root = str(media_root) if media_root is not None else None
    return [px.ExpectColumnValuesToReferenceExistingFiles(column=column, media_root=root)]


def rl_rules(media_root: Path | None = None, media_health: Path | None = None) -> list[Expectation]:
    """RL rows (SPEC §8; rewards of SPEC §4.2)."""
    return [
        px.ExpectColumnValuesToBeChatTurns(column="prompt", content="text"),
        px.ExpectColumnValuesToUseChatRoles(column="prompt"),
        px.ExpectColumnValuesToEndWithRole(
            column="prompt", role="user", description="the prompt ends with the user's question"
        ),
        px.ExpectColumnValuesToBeVideoLists(column="videos", entry="mapping"),
        *_existing_files("videos", media_root),
        *_healthy_videos("videos", media_health, media_root),
        px.ExpectPromptsToMarkTheirVideo(column_list=["prompt", "videos"]),
        px.ExpectColumnValuesToBeRewardGroundTruth(column="extra_info"),
        px.ExpectColumnValuesToHaveScorableAnswers(column="extra_info"),
        px.ExpectMcqAnswersToNameAPromptOption(column_list=["prompt", "extra_info"]),
    ]


# --- evaluation splits -----------------------------------------------------------------


def value_rules(row_format: str) -> list[Expectation]:
    """Value rules beyond the kinds, per row format (a split's `EvalSplit.row_format`)."""
    if row_format == "videomme":
        return [
            gxe.ExpectColumnValuesToBeInSet(
                column="duration", value_set=["short", "medium", "long"], description="duration is short/medium/long"
            ),
            px.ExpectColumnValuesToBeLetteredOptions(column="options"),
        ]
    if row_format == "mmvu":
        return [
            gxe.ExpectColumnValuesToBeInSet(
                column="question_type",
                value_set=["multiple-choice", "open-ended"],
                description="question_type is multiple-choice or open-ended",
            )
        ]
    if row_format == "charades":
        return [px.ExpectColumnValuesToBeTimeWindows(column="timestamp")]
    return []


_ANSWER_COLUMNS = {
    "videomme": ("options", "answer"),
    "longvideobench": ("correct_choice", *(f"option{i}" for i in range(5))),
    "lvbench": ("question", "answer"),
    "mlvu": ("question", "candidates", "answer"),
    "mmvu": ("question_type", "choices", "answer"),
}


def eval_rules(split: str, fmt: RowFormat, video_dir: Path | None, subtitle_dir: Path | None,
               media_health: Path | None = None) -> list[Expectation]:
    """Answers, loader acceptance and (with a video_dir) existing media of one split."""
    columns = sorted(fmt.columns)
    found = value_rules(SPLITS[split].row_format)
    if fmt.answer_layout:
        answer_columns = [c for c in columns if c in _ANSWER_COLUMNS[fmt.answer_layout]]
        found.append(px.ExpectMcqAnswersToNameAnOption(column_list=answer_columns, layout=fmt.answer_layout))
    found.append(px.ExpectRowsToLoadAsEvalSamples(column_list=columns, split=split))
    if video_dir is not None:
        if split == "videomme_wsub":
            subtitle_dir = subtitle_dir or video_dir  # the loader's default (SPEC §7)
        found.append(
            px.ExpectRowsToNameExistingVideos(
                column_list=columns,
                split=split,
                video_dir=str(video_dir),
                subtitle_dir=str(subtitle_dir) if subtitle_dir else None,
            )
        )
        if media_health is not None:
            found.append(px.ExpectRowsToNameHealthyVideos(column_list=columns, split=split, video_dir=str(video_dir),
                                                          health_cache=str(media_health)))
    return found


# --- the suite ---------------------------------------------------------------------------


def _domain_columns(expectation: Expectation) -> list[str]:
    column = getattr(expectation, "column", None)
    return [column] if column else list(getattr(expectation, "column_list", None) or [])


def applicable(found: Sequence[Expectation], table_columns: Iterable[str]) -> list[Expectation]:
    """The rules whose columns the table has (table-level rules always apply)."""
    present = set(table_columns)
    return [e for e in found if set(_domain_columns(e)) <= present]


def build_suite(
    kind: str,
    split: str | None,
    table_columns: Sequence[str],
    video_dir: Path | None = None,
    subtitle_dir: Path | None = None,
    media_root: Path | None = None,
    media_health: Path | None = None,
) -> gx.ExpectationSuite:
    """The suite for one table of `kind` (and eval `split`); `table_columns` are the columns
    of the frame GX validates (`ROW_ID` included when the derived id was computed)."""
    fmt = row_format(kind, split, table_columns)
    found = column_rules(fmt)
    if kind == "sft":
        found += sft_rules(media_root, media_health)
    elif kind == "rl":
        found += rl_rules(media_root, media_health)
    else:
        found += eval_rules(split, fmt, video_dir, subtitle_dir, media_health)
    suite = gx.ExpectationSuite(name=suite_name(kind, split))
    for expectation in applicable(found, table_columns):
        suite.add_expectation(expectation)
    return suite
