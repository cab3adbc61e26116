"""What `validate` returns or raises (no Great Expectations import: cheap to import)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple


class Failure(NamedTuple):
    """One failing (row, rule) pair.

    `file` is the table's path; `row` the 1-based row number (the line number for .jsonl,
    as `paravt_core.eval.samples` counts), None for a table-level failure; `column` the
    column(s) the rule reads; `rule` the GX expectation type; `value` why it failed.
    """

    file: str
    row: int | None
    column: str
    rule: str
    value: str


@dataclass(frozen=True)
class ContractResult:
    """The outcome of one contract on one table.

    Attributes:
        passed: every rule held for every row.
        n_rows: rows in the table.
        n_bad: rows that broke at least one rule.
        kept_path: the table to continue with: the input itself when all rows pass, the
            `<name>.kept.<ext>` file after quarantine, None when the contract failed.
        quarantine_path: the `<name>.quarantine.<ext>` file of the bad rows, if any.
        validation_json: the GX validation result.
        docs_html: the GX Data Docs page of that result.
        failures: every failure, table-level first, then by row.
        suite: the expectation suite's name (`sft_rows`, `rl_rows`, `eval_<split>`).
    """

    passed: bool
    n_rows: int
    n_bad: int
    kept_path: Path | None
    quarantine_path: Path | None
    validation_json: Path
    docs_html: Path
    failures: list[Failure] = field(default_factory=list)
    suite: str = ""


class ContractError(RuntimeError):
    """A table broke its data contract; the message holds the failure table and says where
    the GX validation result and Data Docs page are. `result` is None when the table could
    not be read at all."""

    def __init__(self, message: str, result: ContractResult | None = None) -> None:
        super().__init__(message)
        self.result = result
