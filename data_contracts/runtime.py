"""The one Great Expectations context of a process, and running a suite on a frame.

An ephemeral (in-memory) context, created once per process (context creation is the slow
part) with analytics and progress bars off; `GX_ANALYTICS_ENABLED=false` is also set by
`data_contracts/__init__.py` before GX is imported. Nothing is stored in the context: each
call validates a fresh batch of one pandas frame, and `data_contracts.report` writes the
result JSON and Data Docs page into the caller's report_dir.
"""

from __future__ import annotations

import functools
import logging

import great_expectations as gx
import pandas as pd
from great_expectations.core import ExpectationSuiteValidationResult
from great_expectations.data_context.types.base import (
    DataContextConfig,
    InMemoryStoreBackendDefaults,
    ProgressBarsConfig,
)

# COMPLETE gives every failing row's index (needed to quarantine rows); the values
# themselves are left out, as a failing cell can be a whole conversation.
RESULT_FORMAT = {
    "result_format": "COMPLETE",
    "partial_unexpected_count": 20,
    "exclude_unexpected_values": True,
    "return_unexpected_index_query": False,
}


@functools.cache
def batch_definition():
    """The whole-dataframe batch definition of the process's ephemeral context."""
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    config = DataContextConfig(
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False),
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
    )
    context = gx.get_context(mode="ephemeral", project_config=config)
    asset = context.data_sources.add_pandas("paravt_contracts").add_dataframe_asset("rows")
    return asset.add_batch_definition_whole_dataframe("whole_table")


def run_suite(frame: pd.DataFrame, suite: gx.ExpectationSuite) -> ExpectationSuiteValidationResult:
    """Validate the frame against the suite."""
    batch = batch_definition().get_batch(batch_parameters={"dataframe": frame})
    return batch.validate(suite, result_format=RESULT_FORMAT)
