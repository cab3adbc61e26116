"""PARA-GRPO as its own Prefect flow, `paravt-rl`: from the (cached) SFT checkpoint of the same config."""

from __future__ import annotations

from prefect import flow

from flows.data import data_stage
from flows.params import PipelineParams
from paravt_core.preflight import needs_gpu
from paravt_core.refs import ArtifactRef
from paravt_core.run_lock import hold_output_dir
from tasks.model import base_stage
from tasks.preflight import preflight
from tasks.rl import rl
from tasks.sft import sft


@flow(name="paravt-rl", log_prints=True)
def rl_flow(params: PipelineParams = PipelineParams()) -> ArtifactRef:
    cfg = params.load()
    with hold_output_dir(cfg.run.output_dir, "paravt-rl flow"):
        if needs_gpu(cfg):  # the machine and the memory plan, before any stage (#44)
            preflight(cfg)
        data = data_stage(cfg)
        sft_model = sft(cfg, base_stage(cfg), data.sft)
        return rl(cfg, sft_model, data.rl)
