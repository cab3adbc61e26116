"""Cold-start SFT as its own Prefect flow, `paravt-sft` (data and base model come from cache)."""

from __future__ import annotations

from prefect import flow

from flows.data import data_stage
from flows.params import PipelineParams
from paravt_core.preflight import needs_gpu
from paravt_core.refs import ArtifactRef
from paravt_core.run_lock import hold_output_dir
from tasks.model import base_stage
from tasks.preflight import preflight
from tasks.sft import sft


@flow(name="paravt-sft", log_prints=True)
def sft_flow(params: PipelineParams = PipelineParams()) -> ArtifactRef:
    cfg = params.load()
    with hold_output_dir(cfg.run.output_dir, "paravt-sft flow"):
        if needs_gpu(cfg):  # the machine and the memory plan, before any stage (#44)
            preflight(cfg)
        data = data_stage(cfg)
        return sft(cfg, base_stage(cfg), data.sft)
