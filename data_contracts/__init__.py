"""Data contracts (Great Expectations 1.x suites) for every table of rows the pipeline reads.

`validate(kind, table_path, *, split=None, on_bad_rows="fail", report_dir, video_dir=None,
subtitle_dir=None) -> ContractResult` checks SFT and RL rows (SPEC §8, after materialize)
and the annotation rows of the seven evaluation splits (SPEC §7). Modules:

- `rules`: the rules as pure functions (value -> problem text or None);
- `expectations`: a custom GX expectation (and metric) per rule, for nested columns;
- `suites`: the suite of each table kind, with the rules listed in its docstring;
- `tables`: reading .parquet/.jsonl/.json rows and writing kept/quarantined subsets;
- `runtime`: the process's ephemeral GX context; `report`: failures, JSON and Data Docs;
- `contract`: `validate` itself; `result`: `ContractResult`, `ContractError`, `Failure`.

GX usage statistics are switched off here, before GX can be imported.
"""

import os

os.environ["GX_ANALYTICS_ENABLED"] = "false"

from data_contracts.contract import validate  # noqa: E402 - after the analytics switch
from data_contracts.result import ContractError, ContractResult, Failure  # noqa: E402

__all__ = ["ContractError", "ContractResult", "Failure", "validate"]
