"""Prefect task: a GPU run stops before any stage when this machine or the memory plan is not ready."""

from __future__ import annotations

from prefect import task

from paravt_core.config import PipelineConfig
from paravt_core.preflight import PreflightFailed, run_preflight, system_probes


@task(name="preflight")
def preflight(cfg: PipelineConfig) -> None:
    """`paravt preflight` inside the flow, so a deployment run is refused as `paravt run` is."""
    report = run_preflight(cfg, system_probes())
    if not report.ok:
        raise PreflightFailed(f"this machine is not ready for a {cfg.model.base} run; nothing was run "
                              f"(`paravt preflight` prints the same):\n{report.format()}")
