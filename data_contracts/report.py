"""What a contract leaves behind: failures as (file, row, column, rule, value), the GX
validation result as JSON and its Data Docs page, and the failure table of `ContractError`.

Failures are read from the GX result (each failed expectation's `unexpected_index_list`,
whose indices are row numbers, see `data_contracts.tables`). The value column says why: the
rule's own problem text for our expectations (`ContractRule.explain`), the offending value
for GX's built-ins. A table-level failure (a missing column, no rows, an expectation that
raised) has no row.

The Data Docs page is rendered with GX's own renderers (`ValidationResultsPageRenderer`,
`DefaultJinjaPageView`: the page a Data Docs site shows for one validation), written as a
single file so each report_dir holds exactly the results of its tables.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from great_expectations.core import ExpectationSuiteValidationResult, ExpectationValidationResult
from great_expectations.expectations.registry import get_expectation_impl

from data_contracts.expectations import ContractRule, ExpectColumnValuesToBeFirstOccurrences
from data_contracts.result import Failure
from data_contracts.rules import identity_key, short
from paravt_core.atomic import atomic_write_text

TABLE_LIMIT = 20


def _domain(kwargs: Mapping[str, Any]) -> list[str]:
    if kwargs.get("column"):
        return [kwargs["column"]]
    return list(kwargs.get("column_list") or [])


def _exception_messages(info: Mapping[str, Any]) -> list[str]:
    """Messages of an expectation's exception info (flat, or keyed by metric)."""
    if "raised_exception" in info:
        return [info.get("exception_message") or "unknown error"] if info["raised_exception"] else []
    return [m for nested in info.values() if isinstance(nested, Mapping) for m in _exception_messages(nested)]


def _cell_value(frame: pd.DataFrame, row: int, columns: Sequence[str]) -> Any:
    if len(columns) == 1:
        return frame.at[row, columns[0]]
    return {column: frame.at[row, column] for column in columns}


def _first_rows(column: pd.Series) -> dict[Any, int]:
    """Each id's first row number."""
    first: dict[Any, int] = {}
    for row, value in column.items():
        first.setdefault(identity_key(value), int(row))
    return first


def _repeats(ids: pd.Series, rows: list[int], file: str, rule: str) -> Iterator[Failure]:
    """Failures of repeated ids, each naming the row it repeats."""
    first = _first_rows(ids)
    for row in rows:
        value = ids.at[row]
        yield Failure(file, row, str(ids.name), rule, f"{short(value, 24)} repeats row {first[identity_key(value)]}")


def explain(expectation_type: str, kwargs: Mapping[str, Any], frame: pd.DataFrame, row: int) -> str:
    """Why `row` fails this expectation, in words, with the offending value cut short."""
    columns = _domain(kwargs)
    value = _cell_value(frame, row, columns)
    impl = get_expectation_impl(expectation_type)
    if issubclass(impl, ContractRule):
        return impl.explain(value, kwargs) or short(value)
    if expectation_type == "expect_column_values_to_not_be_null":
        return "null"
    if "value_set" in kwargs:
        return f"{short(value)} not in {kwargs['value_set']}"
    return short(value)


def _table_level_value(result: ExpectationValidationResult) -> str:
    details = (result.result or {}).get("details") or {}
    missing = (details.get("mismatched") or {}).get("missing")
    if missing:
        return f"missing columns {sorted(missing)}"
    return f"observed {short((result.result or {}).get('observed_value'))}"


def _failures_of(result: ExpectationValidationResult, frame: pd.DataFrame, file: str) -> Iterator[Failure]:
    config = result.expectation_config
    kwargs = config.kwargs
    column = ",".join(_domain(kwargs)) or "(table)"
    errors = _exception_messages(result.exception_info or {})
    if errors:
        yield Failure(file, None, column, config.type, f"rule raised: {errors[0]}")
        return
    rows = (result.result or {}).get("unexpected_index_list")
    if rows is None:
        yield Failure(file, None, column, config.type, _table_level_value(result))
        return
    if config.type == ExpectColumnValuesToBeFirstOccurrences.expectation_type:
        yield from _repeats(frame[kwargs["column"]], [int(r) for r in rows], file, config.type)
        return
    for row in rows:
        yield Failure(file, int(row), column, config.type, explain(config.type, kwargs, frame, int(row)))


def collect_failures(result: ExpectationSuiteValidationResult, frame: pd.DataFrame, file: Path) -> list[Failure]:
    """All failures of a suite result, table-level first, then by row."""
    found = [f for r in result.results if not r.success for f in _failures_of(r, frame, str(file))]
    return sorted(found, key=lambda f: (f.row is not None, f.row or 0, f.rule, f.column))


def failure_table(failures: Sequence[Failure], limit: int = TABLE_LIMIT) -> str:
    """The failures as aligned text columns (file name, row, column, rule, value), at most
    `limit` lines plus a count of the rest."""
    header = ("file", "row", "column", "rule", "value")
    shown = [
        (Path(f.file).name, "-" if f.row is None else str(f.row), f.column, f.rule, f.value) for f in failures[:limit]
    ]
    widths = [max(len(line[i]) for line in (header, *shown)) for i in range(len(header) - 1)]
    padded = ([cell.ljust(width) for cell, width in zip(line, widths, strict=False)] for line in (header, *shown))
    lines = ["  ".join([*cells, line[-1]]) for cells, line in zip(padded, (header, *shown), strict=True)]
    if len(failures) > limit:
        lines.append(f"... and {len(failures) - limit} more failures (all of them in ContractResult.failures)")
    return "\n".join(lines)


def write_validation_json(result: ExpectationSuiteValidationResult, path: Path) -> Path:
    """The GX validation result as JSON."""
    return atomic_write_text(path, json.dumps(result.to_json_dict(), indent=1, ensure_ascii=False))


def write_data_docs(result: ExpectationSuiteValidationResult, path: Path) -> Path:
    """The Data Docs page of this validation result, rendered by GX."""
    from great_expectations.render.renderer import ValidationResultsPageRenderer
    from great_expectations.render.view import DefaultJinjaPageView

    document = ValidationResultsPageRenderer().render(result)
    return atomic_write_text(path, DefaultJinjaPageView().render(document))
