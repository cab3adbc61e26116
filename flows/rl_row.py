"""One RL row as a flow run of its own, the `paravt/rl-row` deployment (issue #66).

With `run.fanout.runner: work_pool` the ablations and reproduce flows submit each row here
(flows/fanout.py) instead of running it in their process; a worker of the rows' pool takes
it. The row is rebuilt from its `RowSpec` (the parent's config path, overrides and RL row
file, the SFT model and data references) and runs the very function the in-process fan-out
calls (`ablation_row`, `reproduce_row`) through the same `fanned-out` task, so its RL run,
evaluations, MLflow runs and cache keys are those of the same row run in process. Before any
stage it checks that the config loads as the parent's did and that the parent's artifacts
are reachable from this node (`check_shared`).
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.ablations import ablation_row
from flows.fanout import RowSpec, check_shared, run_row
from flows.reproduce import reproduce_row
from paravt_core.preflight import needs_gpu
from tasks.preflight import preflight

ROW_JOBS = {"ablation": ablation_row, "reproduce": reproduce_row}


# retries: a row that raises runs again in its flow run (its RL run resumes from its checkpoint);
# a row whose worker is lost is submitted again by the parent (flows/fanout.py).
@flow(name="paravt", log_prints=True, retries=1, retry_delay_seconds=10, persist_result=True)
def rl_row(spec: RowSpec) -> Any:
    cfg = spec.config()
    check_shared(spec, cfg)
    if needs_gpu(cfg):  # this node's GPUs and the memory plan, before the row's stages (#44)
        preflight(cfg)
    return run_row(lambda: ROW_JOBS[spec.job](spec), spec.label, cfg.run.fanout.threads_per_run)
