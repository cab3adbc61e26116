"""The full ParaVT pipeline as one Prefect flow.

Deployment `paravt/full-pipeline` (prefect.yaml) runs it on the process work pool;
`paravt run --config ...` runs it in-process. Stages are cached tasks; each is a thin
wrapper over one `paravt_core` stage.
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from flows.params import PipelineParams
from tasks.model import base_model


@flow(name="paravt", log_prints=True)
def full_pipeline(params: PipelineParams = PipelineParams()) -> dict[str, str]:
    cfg = params.load()
    log = get_run_logger()
    log.info("pipeline %s -> %s", cfg.run.name, cfg.run.output_dir.resolve())
    base = base_model(cfg)
    log.info("base model %s (sha256 %s)", base.path, base.sha256[:12])
    return {"base_model": str(base.path)}
