"""The pipeline flow under a Prefect test harness: it runs, and its cached stage hits the cache."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _task_states(flow_run_id) -> dict[str, str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return {r.name.rsplit("-", 1)[0]: r.state.name for r in runs}


def test_full_pipeline_runs_and_caches(prefect_harness, tmp_path: Path):
    from flows.full_pipeline import full_pipeline
    from flows.params import PipelineParams

    params = PipelineParams(
        config_path=str(REPO / "conf/pipeline/tiny.yaml"), overrides=[f"run.output_dir={tmp_path}"]
    )
    first = full_pipeline(params, return_state=True)
    assert first.is_completed()
    outputs = first.result()
    assert (Path(outputs["base_model"]) / "config.json").is_file()
    assert _task_states(first.state_details.flow_run_id)["base-model"] == "Completed"

    second = full_pipeline(params, return_state=True)
    assert second.is_completed()
    assert _task_states(second.state_details.flow_run_id)["base-model"] == "Cached"
    assert second.result() == outputs

    # A cached result whose output folder was deleted must not be reused.
    import shutil

    shutil.rmtree(outputs["base_model"])
    third = full_pipeline(params, return_state=True)
    assert _task_states(third.state_details.flow_run_id)["base-model"] == "Completed"
    assert (Path(outputs["base_model"]) / "config.json").is_file()


def test_bad_parameters_refused_before_any_stage(tmp_path: Path):
    from pydantic import ValidationError

    from flows.params import PipelineParams

    with pytest.raises(ValidationError, match="sft.max_stepz"):
        PipelineParams(config_path=str(REPO / "conf/pipeline/tiny.yaml"), overrides=["sft.max_stepz=1"])
    with pytest.raises(ValidationError, match="does not exist"):
        PipelineParams(config_path=str(tmp_path / "missing.yaml"))
