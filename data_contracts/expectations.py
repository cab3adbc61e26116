"""Custom Great Expectations (1.x) expectations for nested ParaVT rows, one per contract rule.

GX's built-in expectations see a list cell as a scalar (their length rules measure
`str(value)`), so each rule of `data_contracts.rules` gets a column-map metric
(`ColumnMapMetricProvider` with a pandas `column_condition_partial`) or a multicolumn-map
metric (row rules that read several columns) and an expectation class that names it. They
are ordinary registered GX expectations: they appear by type (e.g.
`expect_column_values_to_be_chat_turns`) in the validation result and in Data Docs, where
their `description` says the rule in words (Data Docs renders descriptions as HTML, so
they avoid "<" and ">").

Each expectation also carries its pure rule (`problem`) and the names of its parameters
(`rule_params`), so `data_contracts.report` can say why a failing value failed.

Nulls: column-map metrics skip null cells, so every required column also gets GX's
`ExpectColumnValuesToNotBeNull` (see `data_contracts.suites`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal, Optional

import pandas as pd
from great_expectations.execution_engine import PandasExecutionEngine
from great_expectations.expectations.expectation import ColumnMapExpectation, MulticolumnMapExpectation
from great_expectations.expectations.metrics.map_metric_provider import (
    ColumnMapMetricProvider,
    MulticolumnMapMetricProvider,
    column_condition_partial,
    multicolumn_condition_partial,
)

from data_contracts import rules

Rule = Callable[..., Optional[str]]


def guarded_problem(problem: Rule, value: Any, **params: Any) -> str | None:
    """The rule's verdict; a rule that raises on an odd value fails that value instead of
    aborting the whole validation."""
    try:
        return problem(value, **params)
    except Exception as error:  # noqa: BLE001 - any crash on a value is that value's failure
        return f"rule raised {type(error).__name__}: {error}"


def cells_pass(column: pd.Series, problem: Rule, **params: Any) -> pd.Series:
    """True for each cell the rule finds no problem with."""
    verdicts = [guarded_problem(problem, value, **params) is None for value in column.tolist()]
    return pd.Series(verdicts, index=column.index, dtype=bool)


def rows_pass(frame: pd.DataFrame, problem: Rule, **params: Any) -> pd.Series:
    """True for each row (a dict of the domain's columns) the rule finds no problem with."""
    names = list(frame.columns)
    rows = (dict(zip(names, values, strict=True)) for values in frame.itertuples(index=False, name=None))
    verdicts = [guarded_problem(problem, row, **params) is None for row in rows]
    return pd.Series(verdicts, index=frame.index, dtype=bool)


class ContractRule:
    """Mixin of the expectations below: the pure rule and how to call it again.

    `explain(value, kwargs)` gives the problem text for one failing cell (column rules) or
    row dict (row rules), with the rule's parameters taken from the expectation's kwargs.
    """

    problem: ClassVar[Rule]
    rule_params: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def explain(cls, value: Any, kwargs: Mapping[str, Any]) -> str | None:
        # A configuration leaves out parameters equal to their defaults.
        params = {name: kwargs.get(name, cls.__fields__[name].default) for name in cls.rule_params}
        return guarded_problem(cls.problem, value, **params)


# --- column kinds ----------------------------------------------------------------------


class ColumnValuesOfKind(ColumnMapMetricProvider):
    condition_metric_name = "column_values.paravt_of_kind"
    condition_value_keys = ("kind",)

    @column_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column, kind, **kwargs):
        return cells_pass(column, rules.kind_problem, kind=kind)


class ExpectColumnValuesToBeOfKind(ContractRule, ColumnMapExpectation):
    """Each value has the column's kind: non-blank text, integer, finite number, non-empty
    list of non-blank texts, or mapping (list cells may be lists or numpy arrays)."""

    map_metric: ClassVar[str] = "column_values.paravt_of_kind"
    success_keys: ClassVar[tuple[str, ...]] = ("mostly", "kind")
    problem: ClassVar[Rule] = staticmethod(rules.kind_problem)
    rule_params: ClassVar[tuple[str, ...]] = ("kind",)
    kind: Literal["text", "integer", "number", "text_list", "mapping"]
    description: Optional[str] = "values have the column's kind"


# --- chat turns ------------------------------------------------------------------------


class ColumnValuesChatTurns(ColumnMapMetricProvider):
    condition_metric_name = "column_values.paravt_chat_turns"
    condition_value_keys = ("content",)

    @column_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column, content, **kwargs):
        return cells_pass(column, rules.chat_turns_problem, content=content)


class ExpectColumnValuesToBeChatTurns(ContractRule, ColumnMapExpectation):
    """Each value is a non-empty list of {role, content} turns; content "items" allows text
    or content items (text, video_url, image_url with a url), "text" only text (SPEC §8)."""

    map_metric: ClassVar[str] = "column_values.paravt_chat_turns"
    success_keys: ClassVar[tuple[str, ...]] = ("mostly", "content")
    problem: ClassVar[Rule] = staticmethod(rules.chat_turns_problem)
    rule_params: ClassVar[tuple[str, ...]] = ("content",)
    content: Literal["items", "text"] = "items"
    description: Optional[str] = "values are non-empty lists of well-formed chat turns (SPEC §8)"


class ColumnValuesChatRoles(ColumnMapMetricProvider):
    condition_metric_name = "column_values.paravt_chat_roles"
    condition_value_keys = ("roles",)

    @column_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column, roles, **kwargs):
        return cells_pass(column, rules.chat_roles_problem, roles=roles)


class ExpectColumnValuesToUseChatRoles(ContractRule, ColumnMapExpectation):
    """Every turn of each value has one of the allowed roles."""

    map_metric: ClassVar[str] = "column_values.paravt_chat_roles"
    success_keys: ClassVar[tuple[str, ...]] = ("mostly", "roles")
    problem: ClassVar[Rule] = staticmethod(rules.chat_roles_problem)
    rule_params: ClassVar[tuple[str, ...]] = ("roles",)
    roles: list[str] = list(rules.CHAT_ROLES)
    description: Optional[str] = "every turn's role is system, user, assistant or tool"


class ColumnValuesFinalRole(ColumnMapMetricProvider):
    condition_metric_name = "column_values.paravt_final_role"
    condition_value_keys = ("role",)

    @column_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column, role, **kwargs):
        return cells_pass(column, rules.final_role_problem, role=role)


class ExpectColumnValuesToEndWithRole(ContractRule, ColumnMapExpectation):
    """The last turn of each value has the given role."""

    map_metric: ClassVar[str] = "column_values.paravt_final_role"
    success_keys: ClassVar[tuple[str, ...]] = ("mostly", "role")
    problem: ClassVar[Rule] = staticmethod(rules.final_role_problem)
    rule_params: ClassVar[tuple[str, ...]] = ("role",)
    role: str


# --- videos ----------------------------------------------------------------------------


class ColumnValuesVideoLists(ColumnMapMetricProvider):
    condition_metric_name = "column_values.paravt_video_lists"
    condition_value_keys = ("entry",)

    @column_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column, entry, **kwargs):
        return cells_pass(column, rules.video_list_problem, entry=entry)


class ExpectColumnValuesToBeVideoLists(ContractRule, ColumnMapExpectation):
    """Each value is a non-empty list of videos: paths ("path") or {"video": path} ("mapping")."""

    map_metric: ClassVar[str] = "column_values.paravt_video_lists"
    success_keys: ClassVar[tuple[str, ...]] = ("mostly", "entry")
    problem: ClassVar[Rule] = staticmethod(rules.video_list_problem)
    rule_params: ClassVar[tuple[str, ...]] = ("entry",)
    entry: Literal["path", "mapping"] = "path"
    description: Optional[str] = "values are non-empty lists of videos (SPEC §8)"


class ColumnValuesExistingFiles(ColumnMapMetricProvider):
    condition_metric_name = "column_values.paravt_existing_files"
    condition_value_keys = ("media_root",)

    @column_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column, media_root=None, **kwargs):
        is_file = functools.lru_cache(maxsize=None)(os.path.isfile)  # rows share videos
        return cells_pass(column, rules.media_files_problem, is_file=is_file, media_root=media_root)


class ExpectColumnValuesToReferenceExistingFiles(ContractRule, ColumnMapExpectation):
    """Every media file a value references is a local file:// URL (or absolute path) that
    exists: the materialize step has run (SPEC §8)."""

    map_metric: ClassVar[str] = "column_values.paravt_existing_files"
    success_keys: ClassVar[tuple[str, ...]] = ("mostly", "media_root")
    problem: ClassVar[Rule] = staticmethod(rules.media_files_problem)
    rule_params: ClassVar[tuple[str, ...]] = ("media_root",)
    media_root: Optional[str] = None
    description: Optional[str] = "referenced media are materialized file:// URLs of existing files (SPEC §8)"


class RowsMarkOneVideo(MulticolumnMapMetricProvider):
    condition_metric_name = "multicolumn_values.paravt_one_video_marker"

    @multicolumn_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column_list, **kwargs):
        return rows_pass(column_list, rules.one_video_marker_problem)


class ExpectPromptsToMarkTheirVideo(ContractRule, MulticolumnMapExpectation):
    """The prompt holds one `<video>` marker and the row one video (SPEC §2, §8)."""

    map_metric: ClassVar[str] = "multicolumn_values.paravt_one_video_marker"
    problem: ClassVar[Rule] = staticmethod(rules.one_video_marker_problem)
    description: Optional[str] = "the prompt has exactly one video marker and the row exactly one video"


# --- RL ground truth -------------------------------------------------------------------


class ColumnValuesGroundTruth(ColumnMapMetricProvider):
    condition_metric_name = "column_values.paravt_ground_truth"

    @column_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column, **kwargs):
        return cells_pass(column, rules.ground_truth_problem)


class ExpectColumnValuesToBeRewardGroundTruth(ContractRule, ColumnMapExpectation):
    """Each value is a JSON object with a text answer and a question_type in mcq | tvg | oe."""

    map_metric: ClassVar[str] = "column_values.paravt_ground_truth"
    problem: ClassVar[Rule] = staticmethod(rules.ground_truth_problem)
    description: Optional[str] = "extra_info is JSON with answer and question_type in mcq | tvg | oe (SPEC §8)"


class ColumnValuesScorableAnswers(ColumnMapMetricProvider):
    condition_metric_name = "column_values.paravt_scorable_answers"

    @column_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column, **kwargs):
        return cells_pass(column, rules.scorable_answer_problem)


class ExpectColumnValuesToHaveScorableAnswers(ContractRule, ColumnMapExpectation):
    """Each answer is valid for its question type: the SPEC §4.2 scorer can credit it."""

    map_metric: ClassVar[str] = "column_values.paravt_scorable_answers"
    problem: ClassVar[Rule] = staticmethod(rules.scorable_answer_problem)
    description: Optional[str] = (
        "answers fit their type: mcq one letter A-D, tvg [s, e] with s before e, oe a word (SPEC §4.2)"
    )


class RowsPromptOptions(MulticolumnMapMetricProvider):
    condition_metric_name = "multicolumn_values.paravt_prompt_options"

    @multicolumn_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column_list, **kwargs):
        return rows_pass(column_list, rules.prompt_option_problem)


class ExpectMcqAnswersToNameAPromptOption(ContractRule, MulticolumnMapExpectation):
    """An mcq answer letter is among the options listed in the prompt's user turns."""

    map_metric: ClassVar[str] = "multicolumn_values.paravt_prompt_options"
    problem: ClassVar[Rule] = staticmethod(rules.prompt_option_problem)
    description: Optional[str] = "an mcq answer letter is one of the options the prompt lists"


# --- row identity ----------------------------------------------------------------------


class ColumnValuesFirstOccurrences(ColumnMapMetricProvider):
    condition_metric_name = "column_values.paravt_first_occurrences"

    @column_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column, **kwargs):
        return pd.Series(rules.first_occurrences(column.tolist()), index=column.index, dtype=bool)


class ExpectColumnValuesToBeFirstOccurrences(ColumnMapExpectation):
    """No value repeats an earlier row's: ids are unique, and only repeats are flagged, so
    quarantine keeps the first copy (GX's own uniqueness rule flags every copy). The report
    names the row each repeat copies."""

    map_metric: ClassVar[str] = "column_values.paravt_first_occurrences"
    description: Optional[str] = "row ids are unique (later repeats of an id are flagged)"


# --- evaluation splits -----------------------------------------------------------------


class ColumnValuesLetteredOptions(ColumnMapMetricProvider):
    condition_metric_name = "column_values.paravt_lettered_options"

    @column_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column, **kwargs):
        return cells_pass(column, rules.lettered_options_problem)


class ExpectColumnValuesToBeLetteredOptions(ContractRule, ColumnMapExpectation):
    """Each value lists option texts prefixed "A. ", "B. ", ... in order (Video-MME)."""

    map_metric: ClassVar[str] = "column_values.paravt_lettered_options"
    problem: ClassVar[Rule] = staticmethod(rules.lettered_options_problem)
    description: Optional[str] = 'options are texts prefixed "A. ", "B. ", ... in order'


class ColumnValuesTimeWindows(ColumnMapMetricProvider):
    condition_metric_name = "column_values.paravt_time_windows"

    @column_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column, **kwargs):
        return cells_pass(column, rules.time_window_problem)


class ExpectColumnValuesToBeTimeWindows(ContractRule, ColumnMapExpectation):
    """Each value is a grounding window [start, end] in seconds with 0 <= start < end."""

    map_metric: ClassVar[str] = "column_values.paravt_time_windows"
    problem: ClassVar[Rule] = staticmethod(rules.time_window_problem)
    description: Optional[str] = "timestamps are [start, end] seconds, start at least 0 and before end (SPEC §7)"


class RowsMcqAnswers(MulticolumnMapMetricProvider):
    condition_metric_name = "multicolumn_values.paravt_mcq_answers"
    condition_value_keys = ("layout",)

    @multicolumn_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column_list, layout, **kwargs):
        return rows_pass(column_list, rules.mcq_answer_problem, layout=layout)


class ExpectMcqAnswersToNameAnOption(ContractRule, MulticolumnMapExpectation):
    """The answer names one of the row's options, read in the dataset's layout (SPEC §7)."""

    map_metric: ClassVar[str] = "multicolumn_values.paravt_mcq_answers"
    success_keys: ClassVar[tuple[str, ...]] = ("mostly", "layout")
    problem: ClassVar[Rule] = staticmethod(rules.mcq_answer_problem)
    rule_params: ClassVar[tuple[str, ...]] = ("layout",)
    layout: Literal["videomme", "longvideobench", "lvbench", "mlvu", "mmvu"]
    description: Optional[str] = "the answer names one of the row's options"


class RowsLoadAsSamples(MulticolumnMapMetricProvider):
    condition_metric_name = "multicolumn_values.paravt_loads_as_sample"
    condition_value_keys = ("split",)

    @multicolumn_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column_list, split, **kwargs):
        return rows_pass(column_list, rules.loads_as_sample_problem, split=split)


class ExpectRowsToLoadAsEvalSamples(ContractRule, MulticolumnMapExpectation):
    """The split's loader in `paravt_core.eval.samples` accepts each row (SPEC §7)."""

    map_metric: ClassVar[str] = "multicolumn_values.paravt_loads_as_sample"
    success_keys: ClassVar[tuple[str, ...]] = ("mostly", "split")
    problem: ClassVar[Rule] = staticmethod(rules.loads_as_sample_problem)
    rule_params: ClassVar[tuple[str, ...]] = ("split",)
    split: str
    description: Optional[str] = "the split's loader (paravt_core.eval.samples) accepts the row"


class RowsMediaExist(MulticolumnMapMetricProvider):
    condition_metric_name = "multicolumn_values.paravt_media_exist"
    condition_value_keys = ("split", "video_dir", "subtitle_dir")

    @multicolumn_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column_list, split, video_dir, subtitle_dir, **kwargs):
        return rows_pass(
            column_list, rules.media_exist_problem, split=split, video_dir=video_dir, subtitle_dir=subtitle_dir
        )


class ExpectRowsToNameExistingVideos(ContractRule, MulticolumnMapExpectation):
    """The loader finds each row's video under video_dir (and, for videomme_wsub, its .srt)."""

    map_metric: ClassVar[str] = "multicolumn_values.paravt_media_exist"
    success_keys: ClassVar[tuple[str, ...]] = ("mostly", "split", "video_dir", "subtitle_dir")
    problem: ClassVar[Rule] = staticmethod(rules.media_exist_problem)
    rule_params: ClassVar[tuple[str, ...]] = ("split", "video_dir", "subtitle_dir")
    split: str
    video_dir: str
    subtitle_dir: Optional[str] = None
    description: Optional[str] = "each row's video (and subtitles for videomme_wsub) exists"


class ColumnValuesHealthyVideos(ColumnMapMetricProvider):
    condition_metric_name = "column_values.paravt_healthy_videos"
    condition_value_keys = ("health_cache", "media_root")

    @column_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column, health_cache, media_root=None, **kwargs):
        return cells_pass(column, rules.video_health_problem, health_cache=health_cache, media_root=media_root)


class ExpectColumnValuesToReferenceHealthyVideos(ContractRule, ColumnMapExpectation):
    """Every video a value references decodes, has frames and a duration (media health);
    a file outside `media_root` is never read (the existing-files rule names it)."""

    map_metric: ClassVar[str] = "column_values.paravt_healthy_videos"
    success_keys: ClassVar[tuple[str, ...]] = ("mostly", "health_cache", "media_root")
    problem: ClassVar[Rule] = staticmethod(rules.video_health_problem)
    rule_params: ClassVar[tuple[str, ...]] = ("health_cache", "media_root")
    health_cache: str
    media_root: Optional[str] = None
    description: Optional[str] = "referenced videos decode, with frames and a duration"


class RowsHealthyVideos(MulticolumnMapMetricProvider):
    condition_metric_name = "multicolumn_values.paravt_healthy_videos"
    condition_value_keys = ("split", "video_dir", "health_cache")

    @multicolumn_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column_list, split, video_dir, health_cache, **kwargs):
        return rows_pass(column_list, rules.eval_video_health_problem, split=split, video_dir=video_dir,
                         health_cache=health_cache)


class ExpectRowsToNameHealthyVideos(ContractRule, MulticolumnMapExpectation):
    """Each row's video (when found under video_dir) decodes, has frames and a duration."""

    map_metric: ClassVar[str] = "multicolumn_values.paravt_healthy_videos"
    success_keys: ClassVar[tuple[str, ...]] = ("mostly", "split", "video_dir", "health_cache")
    problem: ClassVar[Rule] = staticmethod(rules.eval_video_health_problem)
    rule_params: ClassVar[tuple[str, ...]] = ("split", "video_dir", "health_cache")
    split: str
    video_dir: str
    health_cache: str
    description: Optional[str] = "each row's video decodes, with frames and a duration"
