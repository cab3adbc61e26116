"""RL rows fanned out (issue #45 item 5): the knobs, the per-run thread budget, the launch ports."""

from __future__ import annotations

from pathlib import Path

import pytest

from paravt_core.config import ConfigError, load_config
from paravt_core.dist import launch
from paravt_core.rl.stage import threads_per_rank

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_fanout_is_checked_at_load_and_never_changes_a_cache_key():
    shipped = load_config(CONF / "pipeline" / "reproduce.yaml").run.fanout
    assert (shipped.max_concurrent, shipped.threads_per_run) == (2, 1)  # the default reproduction's, #46 item 5
    base = load_config(CONF / "pipeline" / "reproduce.yaml",
                       ["run.fanout.max_concurrent=1", "run.fanout.threads_per_run=null"])
    assert (base.run.fanout.max_concurrent, base.run.fanout.threads_per_run) == (1, None)  # sequential, as before
    fanned = load_config(CONF / "pipeline" / "reproduce.yaml",
                         ["run.fanout.max_concurrent=2", "run.fanout.threads_per_run=1"])
    assert (fanned.run.fanout.max_concurrent, fanned.run.fanout.threads_per_run) == (2, 1)
    # A row's run folder and cached result are keyed by these: fanned out, it finds its finished work.
    assert fanned.section_hash("rl", "video", "run") == base.section_hash("rl", "video", "run")
    assert fanned.section_hash() == base.section_hash()
    for knob in ("run.fanout.max_concurrent", "run.fanout.threads_per_run"):
        with pytest.raises(ConfigError, match=knob.replace(".", r"\.")):
            load_config(CONF / "pipeline" / "reproduce.yaml", [f"{knob}=0"])


@pytest.mark.parametrize(("budget", "ranks", "expected"), [(None, 1, None), (1, 1, 1), (4, 2, 2), (1, 2, 1), (5, 2, 2)])
def test_the_thread_budget_is_shared_by_the_ranks_of_a_run(budget, ranks, expected):
    overrides = [f"rl.num_ranks={ranks}", "rl.prompts_per_step=2"]
    if budget is not None:
        overrides.append(f"run.fanout.threads_per_run={budget}")
    assert threads_per_rank(load_config(CONF / "pipeline" / "tiny.yaml", overrides)) == expected


def test_launches_at_once_never_share_a_master_port(monkeypatch):
    """The port names a launch's shared-memory segments and which ones its cleanup unlinks:
    a second launch while the first runs gets another port even when the OS offers the same."""
    offered = iter([41000, 41000, 41000, 41001])
    monkeypatch.setattr(launch, "free_port", lambda: next(offered))
    first = launch._claim_launch_port()
    second = launch._claim_launch_port()
    assert (first, second) == (41000, 41001)
    launch._launch_ports.difference_update({first, second})



@pytest.mark.parametrize("flow_params", ["reproduce", "ablations"])
def test_rows_at_once_are_refused_before_any_stage_where_they_would_share_gpus(monkeypatch, tmp_path, flow_params):
    import torch
    from pydantic import ValidationError

    from flows.ablations import AblationParams
    from flows.reproduce import ReproduceParams

    make = {"reproduce": lambda o: ReproduceParams(config_path=str(CONF / "pipeline" / "reproduce.yaml"), overrides=o),
            "ablations": lambda o: AblationParams(config_path=str(CONF / "pipeline" / "tiny.yaml"), overrides=o)}
    overrides = [f"run.output_dir={tmp_path}", "run.fanout.max_concurrent=2"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValidationError, match=r"run\.fanout\.max_concurrent=2 runs RL rows at once.*share cards"):
        make[flow_params](overrides)
    make[flow_params]([f"run.output_dir={tmp_path}", "run.fanout.max_concurrent=1"])  # one row at a time is fine there
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    make[flow_params](overrides)  # and rows at once on a CPU machine


def test_the_sft_measurements_fill_the_tail_side_by_side_and_go_first_one_at_a_time():
    from flows.reproduce import job_order
    from paravt_core.config import FanoutConfig

    rl, sft = [("vanilla_grpo seed 0", None), ("paragrpo seed 0", None)], [("sft", None), ("sft at K=2", None)]
    labels = lambda jobs: [label for label, _ in jobs]  # noqa: E731
    assert labels(job_order(FanoutConfig(max_concurrent=2, threads_per_run=1), rl, sft)) == [
        "vanilla_grpo seed 0", "paragrpo seed 0", "sft", "sft at K=2"]
    assert labels(job_order(FanoutConfig(max_concurrent=1), rl, sft)) == [
        "sft", "sft at K=2", "vanilla_grpo seed 0", "paragrpo seed 0"]


def test_the_runner_defaults_to_threads_is_checked_at_load_and_never_changes_a_cache_key():
    base = load_config(CONF / "pipeline" / "tiny.yaml")
    assert (base.run.fanout.runner, base.run.fanout.work_pool) == ("threads", "paravt-rows")
    pooled = load_config(CONF / "pipeline" / "tiny.yaml", ["run.fanout.runner=work_pool", "run.fanout.work_pool=gpus"])
    assert pooled.section_hash() == base.section_hash()  # a row's result does not depend on where it ran
    assert pooled.section_hash("rl", "video", "run") == base.section_hash("rl", "video", "run")
    with pytest.raises(ConfigError, match=r"run\.fanout\.runner"):
        load_config(CONF / "pipeline" / "tiny.yaml", ["run.fanout.runner=dask"])


def _spec(tmp_path, fake_checkpoint, **update):
    from flows.fanout import row_spec
    from paravt_core.data.stage import DataBundle
    from paravt_core.refs import ArtifactRef

    model = fake_checkpoint(tmp_path / "sft", "weights")
    folder = tmp_path / "data"
    folder.mkdir()
    ref = ArtifactRef(kind="data", path=folder, sha256="0" * 64)
    data = DataBundle(sft=ref, rl=ref, eval=ref, missing={})
    overrides = [f"run.output_dir={tmp_path / 'out'}"]
    spec = row_spec("ablation", "paragrpo", str(CONF / "pipeline" / "tiny.yaml"), overrides,
                    CONF / "rl" / "paragrpo.yaml", model, data)
    return spec.model_copy(update=update)


def test_a_worker_that_cannot_see_the_shared_location_or_loads_another_config_says_so(tmp_path, fake_checkpoint):
    from flows.fanout import _mark_shared, check_shared

    spec = _mark_shared(_spec(tmp_path, fake_checkpoint))
    assert Path(spec.shared_check).parent == (tmp_path / "out" / "rows").resolve()
    check_shared(spec, spec.config())  # the parent's own host sees it all
    elsewhere = spec.model_copy(update={"shared_check": str(tmp_path / "not-mounted" / "mark.txt")})
    with pytest.raises(FileNotFoundError, match=r"row paragrpo: run\.output_dir .* not reachable from the worker on "
                                                r".*mounts at the same path"):
        check_shared(elsewhere, elsewhere.config())
    edited = load_config(CONF / "pipeline" / "tiny.yaml", [*spec.overrides, "rl.max_steps=7"], spec.rl_row)
    with pytest.raises(ValueError, match=r"row paragrpo: .* loads differently on .* same checkout"):
        check_shared(spec, edited)


def test_a_worker_is_alive_while_it_heart_beats_and_a_row_names_its_worker():
    from datetime import datetime, timedelta, timezone
    from types import SimpleNamespace

    from flows.fanout import worker_alive, worker_text

    now = datetime(2026, 11, 29, 8, 0, tzinfo=timezone.utc)
    beat = lambda seconds_ago, interval=10: SimpleNamespace(  # noqa: E731
        last_heartbeat_time=now - timedelta(seconds=seconds_ago), heartbeat_interval_seconds=interval)
    assert worker_alive(beat(29), now) and not worker_alive(beat(31), now)  # three intervals late: offline
    assert worker_alive(beat(10, interval=1), now)  # a loaded node's late heartbeats: never under 30 s
    assert not worker_alive(beat(100, interval=30), now) and worker_alive(beat(80, interval=30), now)
    assert not worker_alive(SimpleNamespace(last_heartbeat_time=None, heartbeat_interval_seconds=10), now)
    run = SimpleNamespace(labels={"prefect.worker.name": "rows-node3"}, infrastructure_pid="4242",
                          work_pool_name="paravt-rows")
    assert worker_text(run) == "worker rows-node3 of pool paravt-rows, pid 4242"
    assert worker_text(SimpleNamespace(labels={}, infrastructure_pid=None, work_pool_name="paravt-rows")) == \
        "no worker (it was never picked up)"
