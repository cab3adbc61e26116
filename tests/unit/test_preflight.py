"""`paravt preflight` and the gate before a GPU run: each failure given by a fake probe, one at a time."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from paravt_core import preflight as pf
from paravt_core.cli import main
from paravt_core.config import load_config
from paravt_core.plan import GIB
from paravt_core.preflight import CudaFacts, Probes, PreflightFailed, needs_gpu, run_preflight

REPO = Path(__file__).resolve().parents[2]
CONFIG_8B = str(REPO / "conf/pipeline/paravt_8b.yaml")
TINY = str(REPO / "conf/pipeline/tiny.yaml")
EIGHT_H100 = CudaFacts("2.14.1+cu130", "13.0", (79 * GIB,) * 8)


def ready(**changes) -> Probes:
    """A machine with all the 8B run needs; `changes` replace probes."""
    probes = Probes(python_version=lambda: (3, 12, 3), cuda=lambda: EIGHT_H100, driver_version=lambda: "580.159.04",
                    free_disk=lambda path: 4 * 10**12, has_module=lambda python, name: True,
                    free_shm=lambda: 64 * 10**9)
    return dataclasses.replace(probes, **changes)


def failed(probes: Probes, overrides: list[str] = ()) -> dict[str, pf.Check]:
    report = run_preflight(load_config(CONFIG_8B, list(overrides)), probes)
    return {c.name: c for c in report.checks if not c.ok}


def test_a_ready_machine_passes_every_check_and_plans_the_run():
    report = run_preflight(load_config(CONFIG_8B), ready())
    assert report.ok, report.format()
    assert [c.name for c in report.checks] == ["python", "cuda", "gpu count", "driver", "disk", "shared memory",
                                               "deepspeed", "rollout server", "serve venv", "memory plan"]
    assert report.plan is not None and report.plan.fits


@pytest.mark.parametrize("changes, names, fix", [
    ({"python_version": lambda: (3, 10, 12)}, {"python"}, "Python 3.11 and 3.12"),
    ({"cuda": lambda: CudaFacts(None, None, error="ModuleNotFoundError: No module named 'torch'")},
     {"cuda", "gpu count", "memory plan"}, "make install-gpu"),
    ({"cuda": lambda: CudaFacts("2.14.1+cpu", None)}, {"cuda", "gpu count", "memory plan"}, "built for CUDA"),
    ({"cuda": lambda: CudaFacts("2.14.1+cu130", "13.0")}, {"cuda", "gpu count", "memory plan"}, "nvidia-smi"),
    ({"cuda": lambda: CudaFacts("2.14.1+cu130", "13.0", (79 * GIB,) * 4)}, {"gpu count", "memory plan"},
     "8 GPUs"),
    ({"driver_version": lambda: "550.54.15"}, {"driver"}, ">= 580"),
    ({"driver_version": lambda: None}, {"driver"}, "install the NVIDIA driver"),
    ({"free_disk": lambda path: 500 * 10**9}, {"disk"}, "rl.checkpoint_every"),
    ({"has_module": lambda python, name: name != "deepspeed"}, {"deepspeed"}, "make install-gpu"),
    ({"has_module": lambda python, name: name != "vllm"}, {"rollout server"}, "make install-serve"),
    ({"cuda": lambda: CudaFacts("2.14.1+cu130", "13.0", (40 * GIB,) * 8)}, {"memory plan"}, "over budget"),
], ids=["python-3.10", "no-torch", "cpu-torch", "no-gpu-visible", "too-few-gpus", "old-driver", "no-driver",
        "disk", "no-deepspeed", "no-vllm", "memory"])
def test_each_failure_is_named_with_what_to_do(changes, names, fix):
    problems = failed(ready(**changes))
    assert set(problems) == names
    assert any(fix in c.fix or fix in c.detail for c in problems.values()), {n: c.fix for n, c in problems.items()}


def test_an_evaluation_served_here_needs_a_server_in_the_serve_interpreter():
    # The rollout server's interpreter named too: otherwise it is found as the evaluation's is
    # (.venv-serve where `make install-serve` made one), and the result would depend on the machine.
    problems = failed(ready(has_module=lambda python, name: python == sys.executable),
                      ["eval.server_python=/opt/serve/bin/python", f"rl.rollout.vllm.python={sys.executable}"])
    assert set(problems) == {"serve venv"}
    assert "/opt/serve/bin/python" in problems["serve venv"].detail and "make install-serve" in problems["serve venv"].fix


def test_the_memory_check_names_the_over_budget_stage_and_its_knob():
    problems = failed(ready(), ["rl.gradient_checkpointing=false", "rl.micro_batch_size=4"])
    assert set(problems) == {"memory plan"}
    assert "RL policy pass" in problems["memory plan"].fix and "rl.gradient_checkpointing: true" in problems["memory plan"].fix


def test_the_disk_check_looks_where_the_output_folder_will_be(tmp_path):
    seen = []
    run_preflight(load_config(CONFIG_8B, [f"run.output_dir={tmp_path / 'not' / 'yet'}"]),
                  ready(free_disk=lambda path: seen.append(path) or 4 * 10**12))
    assert seen == [tmp_path.resolve()]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_servers_given_by_url_need_no_local_install(engine):
    overrides = [f"rl.rollout.engine={engine}", f"rl.rollout.{engine}.url=http://10.0.0.7:30000",
                 "eval.endpoint=http://10.0.0.8:30000/v1"]
    problems = failed(ready(has_module=lambda python, name: name == "deepspeed"), overrides)
    assert problems == {}


def test_only_real_checkpoints_need_a_gpu():
    assert not needs_gpu(load_config(TINY)) and needs_gpu(load_config(CONFIG_8B))


def test_paravt_preflight_lists_what_is_missing_and_exits_1(monkeypatch, capsys):
    monkeypatch.setattr(pf, "system_probes", lambda: ready(driver_version=lambda: None,
                                                           free_disk=lambda path: 10**9))
    assert main(["preflight", "--config", CONFIG_8B]) == 1
    captured = capsys.readouterr()
    assert "FAIL  driver" in captured.out and "FAIL  disk" in captured.out and "2 of 10 checks failed" in captured.out
    assert "not ready" in captured.err


def test_paravt_preflight_passes_a_ready_machine_and_a_tiny_config(monkeypatch, capsys):
    monkeypatch.setattr(pf, "system_probes", ready)
    assert main(["preflight", "--config", CONFIG_8B]) == 0
    assert main(["preflight", "--config", TINY]) == 0
    assert "nothing to check" in capsys.readouterr().out


def test_paravt_preflight_exits_2_on_a_config_that_does_not_load(capsys):
    assert main(["preflight", "--config", CONFIG_8B, "--set", "rl.micro_batch_size=0"]) == 2
    assert "rl.micro_batch_size" in capsys.readouterr().err


def test_paravt_run_refuses_an_unready_machine_before_any_stage(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(REPO)  # the flows' default parameters name conf/pipeline/tiny.yaml from the root
    monkeypatch.setattr(pf, "system_probes", lambda: ready(python_version=lambda: (3, 10, 12)))
    out = tmp_path / "run"
    assert main(["run", "--config", CONFIG_8B, "--set", f"run.output_dir={out}"]) == 2
    assert not out.exists()  # no stage started, not even the output folder's lock
    err = capsys.readouterr().err
    assert "nothing was run" in err and "FAIL  python" in err


def test_the_flows_preflight_task_raises_with_the_list(monkeypatch):
    from tasks.preflight import preflight

    monkeypatch.setattr("tasks.preflight.system_probes", lambda: ready(driver_version=lambda: "535.1"))
    with pytest.raises(PreflightFailed, match="FAIL  driver"):
        preflight.fn(load_config(CONFIG_8B))


def test_a_model_of_unknown_shape_is_named_and_the_other_checks_still_run():
    problems = failed(ready(), ["model.base=someone/else"])
    assert set(problems) == {"model shape"} and "no shape known" in problems["model shape"].detail


# The real probes, on whatever machine runs the tests.
def _script(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("body, driver", [("echo 580.159.04; echo 580.159.04", "580.159.04"),
                                          ("echo 'NVIDIA-SMI has failed' >&2; exit 9", None)])
def test_the_driver_is_read_from_nvidia_smi(tmp_path, monkeypatch, body, driver):
    _script(tmp_path / "bin", "nvidia-smi", body)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert pf._nvidia_driver() == driver


def test_no_nvidia_smi_is_no_driver(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert pf._nvidia_driver() is None


def test_modules_are_looked_up_in_the_interpreter_named(tmp_path):
    other = _script(tmp_path / "bin", "python", f'exec "{sys.executable}" "$@"')
    assert pf._has_module(str(other), "json") and not pf._has_module(str(other), "no_such_module_paravt")
    assert not pf._has_module(str(tmp_path / "missing" / "python"), "json")
    assert pf._has_module(sys.executable, "json") and not pf._has_module(sys.executable, "no_such_module_paravt")


def test_torch_facts_agree_with_torch():
    import torch

    facts = pf._torch_facts()
    assert facts.torch_version == torch.__version__ and facts.cuda_build == torch.version.cuda
    assert len(facts.device_bytes) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)


def test_the_disk_check_counts_only_the_checkpoints_keep_last_keeps():
    """Issue #44 item 9: the 8B config keeps 2 checkpoints per stage (3 at once while the newest
    is written), ~0.8 TB at its peak instead of ~2.6 TB for all 15 SFT and 6 RL checkpoints."""
    params = pf.model_shape(load_config(CONFIG_8B).model.base).params
    kept, every = load_config(CONFIG_8B), load_config(CONFIG_8B, ["sft.keep_last=null", "rl.keep_last=null"])
    per_checkpoint = pf.CHECKPOINT_BYTES_PER_PARAM * params
    models = pf.EXPORTED_MODELS * 2 * params
    assert pf.checkpoint_bytes(kept, params) == (3 + 3) * per_checkpoint + models
    assert pf.checkpoint_bytes(every, params) == (15 + 6) * per_checkpoint + models
    one_tb = ready(free_disk=lambda path: 10**12)
    assert "disk" not in failed(one_tb)
    assert "sft.keep_last / rl.keep_last" in failed(one_tb, ["sft.keep_last=null", "rl.keep_last=null"])["disk"].fix


def test_the_evaluations_own_servers_need_the_server_asked_for():
    """paravt_8b.yaml names no eval endpoint: the evaluation starts its servers itself (#44)."""
    only_vllm = ready(has_module=lambda python, name: name != "sglang")
    problems = failed(only_vllm, ["eval.server=sglang"])
    assert set(problems) == {"serve venv"} and "sglang asked" in problems["serve venv"].detail
    assert failed(only_vllm) == {}  # auto: vLLM will do


DOCKER_DEFAULT_SHM = 64 * 2**20


def test_dockers_default_shared_memory_fails_the_8b_config_naming_the_fix():
    """#60 finding 4: SFT's data workers (8 ranks x 4 workers x 2 ready micro-batches of 64 frames
    of 50,176 float32 pixels x 3 channels) and NCCL pass through /dev/shm; Docker gives 64 MB."""
    from paravt_core.preflight import NCCL_SHM_BYTES, sft_shm_bytes

    cfg = load_config(CONFIG_8B)
    assert sft_shm_bytes(cfg) == 8 * 4 * 2 * 64 * 50176 * 3 * 4  # 38.5 MB a micro-batch, 2.47 GB in all
    check = failed(ready(free_shm=lambda: DOCKER_DEFAULT_SHM))["shared memory"]
    assert check.detail.startswith(f"67 MB free in /dev/shm, {(sft_shm_bytes(cfg) + NCCL_SHM_BYTES) / 1e6:.0f} MB "
                                   "needed (SFT's data workers: 8 ranks x 4 workers x 2 ready micro-batches")
    assert "`docker run --shm-size=4g` (or `--ipc=host`" in check.fix and "lower sft.data_workers" in check.fix
    assert "shared memory" not in failed(ready(free_shm=lambda: 4 * 10**9))


@pytest.mark.parametrize("overrides, needed", [
    (["sft.data_workers=0"], 1 << 30),  # NCCL's alone
    (["sft.data_workers=0", "sft.num_ranks=1", "rl.num_ranks=1", "rl.rollout.vllm.gpus=[1]"], 0),
    (["sft.host_pixel_dtype=bfloat16"], 8 * 4 * 2 * 64 * 50176 * 3 * 2 + (1 << 30)),
])
def test_the_shared_memory_needed_follows_the_workers_ranks_and_pixel_dtype(overrides, needed):
    free = {"bytes": needed}
    assert "shared memory" not in failed(ready(free_shm=lambda: free["bytes"]), overrides)
    if needed:
        free["bytes"] = needed - 1
        assert "shared memory" in failed(ready(free_shm=lambda: free["bytes"]), overrides)


def test_no_dev_shm_is_a_failure():
    assert "no /dev/shm" in failed(ready(free_shm=lambda: None))["shared memory"].detail
