"""The data stage as its own Prefect flow, `paravt-data`.

    download -> unzip -> materialize -> validate -> prepare eval splits -> DataBundle

`data_stage(cfg)` chains the tasks and is what the full pipeline flow calls; the
`paravt-data` flow runs it alone from the same `PipelineParams`.
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from flows.params import PipelineParams
from paravt_core.config import PipelineConfig
from paravt_core.data.stage import DataBundle, bundle
from paravt_core.run_lock import hold_output_dir
from tasks.data import download, materialize, prepare_eval, synth_world, unzip, validate


def data_stage(cfg: PipelineConfig) -> DataBundle:
    """The data stage's tasks in order; call it inside a flow."""
    mirror = synth_world(cfg) if cfg.data.source == "synth" else None
    downloads = download(cfg, mirror)
    media = unzip(cfg, downloads)
    tables = materialize(cfg, downloads, media)
    checked = validate(cfg, tables, downloads, media)
    eval_ref = prepare_eval(cfg, downloads, media, checked)
    return bundle(tables, checked, eval_ref)


@flow(name="paravt-data", log_prints=True)
def data_flow(params: PipelineParams = PipelineParams()) -> DataBundle:
    cfg = params.load()
    with hold_output_dir(cfg.run.output_dir, "paravt-data flow"):
        data = data_stage(cfg)
        log = get_run_logger()
        log.info("SFT data %s (sha256 %s)", data.sft.path, data.sft.sha256[:12])
        log.info("RL data %s (sha256 %s)", data.rl.path, data.rl.sha256[:12])
        log.info("eval splits %s (sha256 %s); missing media per root %s", data.eval.path, data.eval.sha256[:12],
                 data.missing)
        return data
