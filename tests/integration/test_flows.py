"""The pipeline flow under a Prefect test harness: it runs, and its cached stage hits the cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def fast_overrides(out: Path) -> list[str]:
    """The tiny pipeline, shrunk so the whole DAG runs in a couple of minutes."""
    return [
        f"run.output_dir={out}", "data.synth.train_videos=4", "data.synth.eval_videos_per_split=1",
        "data.synth.eval_rows_per_split=2", "data.synth.max_duration_s=40", "sft.max_steps=2",
        "sft.checkpoint_every=2", "rl.max_steps=1", "rl.prompts_per_step=1", "rl.group_size=2",
        "rl.rollout.max_new_tokens=8", "rl.rollout.subagent_max_new_tokens=4", "rl.rollout.max_turns=1",
        "video.nframes=4", "video.sft_max_frames=4", "eval.max_new_tokens=8", "eval.max_samples_per_split=1",
    ]


def _states(runs: dict[str, list]) -> dict[str, str]:
    return {name: group[-1].state.name for name, group in runs.items()}


def test_full_pipeline_runs_and_caches(prefect_harness, task_runs, tmp_path: Path):
    from flows.full_pipeline import full_pipeline
    from flows.params import PipelineParams

    params = PipelineParams(config_path=str(REPO / "conf/pipeline/tiny.yaml"), overrides=fast_overrides(tmp_path))
    first = full_pipeline(params, return_state=True)
    assert first.is_completed()
    outputs = first.result()
    assert (Path(outputs["base_model"]) / "config.json").is_file()
    assert _states(task_runs(first.state_details.flow_run_id))["base-model"] == "Completed"

    second = full_pipeline(params, return_state=True)
    assert second.is_completed()
    states = _states(task_runs(second.state_details.flow_run_id))
    assert {"base-model", "sft", "rl", "register", "data-materialize", "data-validate"} <= set(states)
    # download/unzip re-check their (pinned) sources every run and return at once; promote
    # re-reads the registry's champion (it may have moved since) and is idempotent.
    heavy = {name: state for name, state in states.items() if name not in ("data-download", "data-unzip", "promote")}
    assert all(state == "Cached" for state in heavy.values()), states
    assert second.result() == outputs

    # A cached result whose output folder was deleted must not be reused.
    import shutil

    shutil.rmtree(outputs["base_model"])
    third = full_pipeline(params, return_state=True)
    assert _states(task_runs(third.state_details.flow_run_id))["base-model"] == "Completed"
    assert (Path(outputs["base_model"]) / "config.json").is_file()

    # Changing only the RL config re-runs only RL and what follows it.
    rl_changed = PipelineParams(config_path=params.config_path, overrides=[*params.overrides, "rl.max_steps=2"])
    fourth = full_pipeline(rl_changed, return_state=True)
    runs = task_runs(fourth.state_details.flow_run_id)
    assert runs["sft"][0].state.name == "Cached" and runs["data-materialize"][0].state.name == "Cached"
    assert runs["sft-grammar"][0].state.name == "Cached"
    assert runs["rl"][0].state.name == "Completed"
    assert sorted(r.state.name for r in runs["register"]) == ["Cached", "Completed"]  # sft cached, rl new


def test_injected_failure_is_retried_without_redoing_finished_stages(prefect_harness, task_runs, tmp_path: Path,
                                                                     monkeypatch):
    """SFT is killed once mid-run (a real SIGKILL); its task retries, resumes from the
    checkpoint, and the flow completes; the stages before it come from the cache."""
    from flows.full_pipeline import full_pipeline
    from flows.params import PipelineParams

    overrides = [*fast_overrides(tmp_path), "sft.max_steps=4", "sft.checkpoint_every=2"]
    params = PipelineParams(config_path=str(REPO / "conf/pipeline/tiny.yaml"), overrides=overrides)
    monkeypatch.setenv("PARAVT_TEST_KILL_AT_STEP", "3")
    monkeypatch.setenv("PARAVT_TEST_KILL_ONCE_MARKER", str(tmp_path / "killed-once"))
    state = full_pipeline(params, return_state=True)
    assert state.is_completed()
    assert (tmp_path / "killed-once").read_text() == "3"
    runs = task_runs(state.state_details.flow_run_id)
    (sft_run,) = runs["sft"]
    assert sft_run.run_count == 2 and sft_run.state.name == "Completed"
    assert all(r.run_count == 1 for name in ("data-materialize", "base-model", "rl") for r in runs[name])
    import json

    sft_dir = Path(state.result()["sft_model"]).parent
    steps = [json.loads(line)["step"] for line in (sft_dir / "losses.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # killed after step 3, resumed from the step-2 checkpoint: step 3 logged once


def test_planted_empty_videos_do_not_sink_the_run_and_the_summary_names_them(prefect_harness, tmp_path: Path):
    """Issue #12's demo, shrunk: one 0-byte training video and one 0-byte Charades video in
    the generated world; under quarantine the run completes and its outputs (what `paravt
    run` prints) and set_aside.json name both files with the stage that set them aside."""
    import json

    from flows.full_pipeline import full_pipeline
    from flows.params import PipelineParams
    from paravt_core.config import load_config
    from paravt_core.data.mirror import world_dir as synth_world_dir

    # 8 training videos: two per sentinel root, so the emptied one's shard keeps good rows.
    overrides = [*fast_overrides(tmp_path), "data.synth.train_videos=8", "data.synth.eval_videos_per_split=2",
                 "eval.splits=[charades, mlvu]", "data.on_bad_rows=quarantine",
                 "data.synth.empty_videos=[train, charades]"]
    params = PipelineParams(config_path=str(REPO / "conf/pipeline/tiny.yaml"), overrides=overrides)
    state = full_pipeline(params, return_state=True)
    assert state.is_completed()

    manifest = json.loads((synth_world_dir(load_config(params.config_path, overrides)) / "manifest.json").read_text())
    train_video, eval_video = manifest["empty_videos"]
    eval_video = eval_video.removeprefix("charades/")
    summary = state.result()["set aside"]
    lines = summary.splitlines()
    assert any(line.startswith("data contract sft (quarantined): ") and train_video in line for line in lines)
    assert any(line.startswith("data contract eval/charades (quarantined): ") and eval_video in line
               for line in lines), summary
    written = json.loads((tmp_path / "set_aside.json").read_text())
    assert {entry["stage"] for entry in written} == {
        "data contract sft (quarantined)", "data contract rl (quarantined)",
        "data contract eval/charades (quarantined)"}


def test_bad_parameters_refused_before_any_stage(tmp_path: Path):
    from pydantic import ValidationError

    from flows.params import PipelineParams

    with pytest.raises(ValidationError, match="sft.max_stepz"):
        PipelineParams(config_path=str(REPO / "conf/pipeline/tiny.yaml"), overrides=["sft.max_stepz=1"])
    with pytest.raises(ValidationError, match="does not exist"):
        PipelineParams(config_path=str(tmp_path / "missing.yaml"))


def test_ablation_flow_rows_from_one_sft_checkpoint(prefect_harness, task_runs, tmp_path: Path):
    """Two RL rows from one SFT checkpoint, each an MLflow run tagged with its row; the
    report then has both rows with fτ and κ."""
    from flows.ablations import AblationParams, ablations
    from paravt_core.config import load_config
    from paravt_core.eval.experiment_report import write_report

    overrides = [*fast_overrides(tmp_path), "eval.splits=[videomme, charades]"]
    params = AblationParams(config_path=str(REPO / "conf/pipeline/tiny.yaml"), overrides=overrides,
                            rows=["paragrpo", "vanilla_grpo"], sequential_eval=True)
    state = ablations(params, return_state=True)
    assert state.is_completed()
    table = state.result()
    assert "| paragrpo |" in table and "| vanilla_grpo |" in table and "| paragrpo-sequential |" in table
    runs = task_runs(state.state_details.flow_run_id)
    assert len(runs["sft"]) == 1 and len(runs["rl"]) == 2

    cfg = load_config(params.config_path, overrides)
    text = write_report(cfg.mlflow_uri(), cfg.mlflow.experiment, tmp_path / "report").read_text()
    assert "| paragrpo | " in text and "| vanilla_grpo | " in text
    assert (tmp_path / "report" / "kappa_per_step.png").is_file()


def reproduce_overrides(out: Path) -> list[str]:
    """conf/pipeline/reproduce.yaml shrunk to a couple of steps per stage."""
    return [
        f"run.output_dir={out}", "data.synth.train_videos=4", "data.synth.eval_videos_per_split=1",
        "data.synth.eval_rows_per_split=2", "data.synth.sft_traces_per_video=2",
        "data.synth.subagent_traces_per_video=1", "data.synth.rl_prompts_per_video=2",  # 4 of them multiple choice
        "model.pretrain.videos=2", "model.pretrain.windows_per_video=2", "model.pretrain.max_steps=2",
        "model.pretrain.micro_batch_size=2", "model.pretrain.reading_rows=8", "model.pretrain.reading_steps=2",
        "model.pretrain.sft_replay_rows=4", "sft.max_steps=2",
        "sft.checkpoint_every=2", "rl.max_steps=2",
        "rl.prompts_per_step=1", "rl.group_size=2", "rl.checkpoint_every=2", "rl.rollout.max_new_tokens=8",
        "rl.rollout.subagent_max_new_tokens=4", "eval.max_new_tokens=8", "eval.max_samples_per_split=2",
        "reproduce.seeds=[0]", "reproduce.rows=[vanilla_grpo, paragrpo]",
        "reproduce.probe.questions=2", "reproduce.probe.samples=2",
    ]


def test_reproduce_flow_reports_rows_over_seeds_resumes_finished_rows_and_fans_rows_out(prefect_harness, task_runs,
                                                                                        tmp_path: Path):
    """SFT once, each RL row per seed, every model evaluated with and without tools; a second
    run with one more seed, two rows at a time (`run.fanout.max_concurrent` 2), trains only the
    new seed's rows and the finished row whose folder was deleted (the others come from the
    cache), and that row, trained beside another, gives the metrics and weights it gave alone
    (issue #45 item 5; the same `threads_per_run` both times). One test, not two: each
    reproduction is minutes of `make test`."""
    import json
    import shutil

    import torch

    from flows.reproduce import ReproduceParams, reproduce
    from paravt_core.refs import content_hash, file_hash

    config = str(REPO / "conf/pipeline/reproduce.yaml")
    # One row at a time in the first run (the default config runs two), two in the second.
    overrides = [*reproduce_overrides(tmp_path), "run.fanout.threads_per_run=1", "run.fanout.max_concurrent=1"]
    # The first run also evaluates its RL runs on validation; the second does not (the config's default).
    first_only = ["reproduce.rl_validation=true"]

    def row_runs(state) -> list[dict]:
        runs = json.loads((Path(state.result()).parent / "runs.json").read_text())
        for run in runs:  # what a step took to run is no metric of the row
            run["steps"] = [{k: v for k, v in step.items() if not k.startswith("time_")} for step in run["steps"]]
        return runs

    def weights(folder: Path) -> dict[str, str]:
        # The weight files only: the export's paravt_meta.json also names the MLflow run and full config.
        return {f.name: file_hash(f) for f in sorted((folder / "model").glob("*.safetensors"))}

    first = reproduce(ReproduceParams(config_path=config, overrides=[*overrides, *first_only]), return_state=True)
    assert first.is_completed()
    assert all(0.0 <= m["accuracy_val"] <= 1.0 for m in row_runs(first))
    runs = task_runs(first.state_details.flow_run_id)
    assert len(runs["pretrain"]) == 1 and len(runs["sft"]) == 1 and len(runs["rl"]) == 2
    (alone,) = [run for run in row_runs(first) if run["row"] == "paragrpo"]
    (paragrpo_dir,) = (tmp_path / "rl").glob("paragrpo-*")
    alone_weights = weights(paragrpo_dir)
    assert alone_weights
    # paragrpo seed 0 is trained and evaluated again in the second run, beside another row.
    for results in (tmp_path / "eval").glob(f"{content_hash(paragrpo_dir / 'model')[:12]}-*"):
        shutil.rmtree(results)
    shutil.rmtree(paragrpo_dir)

    fanned = [*overrides, "reproduce.seeds=[0, 1]"] + ([] if torch.cuda.is_available() else  # refused on GPUs
                                                        ["run.fanout.max_concurrent=2"])
    second = reproduce(ReproduceParams(config_path=config, overrides=fanned), return_state=True)
    assert second.is_completed()
    runs = task_runs(second.state_details.flow_run_id)
    assert runs["sft"][0].state.name == "Cached"
    # One fanned-out job per RL run, one for the SFT model's held-out measurements, one per other K of its sweep.
    assert len(runs["fanned-out"]) == 4 + 1 + 3
    assert sorted(r.state.name for r in runs["rl"]) == ["Cached", "Completed", "Completed", "Completed"]
    trained = [r for r in runs["rl"] if r.state.name == "Completed"]
    if not torch.cuda.is_available():  # two of them at the same time
        assert any(a.start_time < b.end_time and b.start_time < a.end_time
                   for i, a in enumerate(trained) for b in trained[i + 1:])
    (together,) = [run for run in row_runs(second) if run["row"] == "paragrpo" and run["seed"] == 0]
    assert together["accuracy_val"] is None  # reproduce.rl_validation: false
    assert together == {**alone, "accuracy_val": None}
    assert weights(paragrpo_dir) == alone_weights

    report = Path(second.result())
    text = report.read_text()
    for row in ("sft", "vanilla_grpo", "paragrpo"):
        assert f"| {row} | " in text
    assert "Tools necessary:" in text and "paragrpo vs SFT:" in text
    measured = json.loads((report.parent / "runs.json").read_text())
    assert [(m["row"], m["seed"]) for m in measured] == [
        ("sft", None), ("vanilla_grpo", 0), ("vanilla_grpo", 1), ("paragrpo", 0), ("paragrpo", 1)]
    assert all(len(m["steps"]) == 2 for m in measured[1:])
    assert all(0.0 <= m["answer_tag_rate"] <= 1.0 for m in measured)  # the held-out answer format, every model
    # The SFT model is also measured on the validation split, in both modes (the RL runs were in the first run,
    # with tools), and the report says which is which.
    assert 0.0 <= measured[0]["accuracy_val"] <= 1.0 and all(m["accuracy_val"] is None for m in measured[1:])
    assert 0.0 <= measured[0]["accuracy_direct_val"] <= 1.0 and all(m["accuracy_direct_val"] is None for m in measured[1:])
    assert "## Validation split" in text and "Knobs, rates and budgets are chosen on this one" in text
    # Per-question correctness on test, what the paired bootstrap resamples
    assert measured[0]["correct"] and all(m["correct"].keys() == measured[0]["correct"].keys() for m in measured)
    # Before RL: the SFT model at each gating budget on validation, with the visible share
    budget = json.loads((report.parent / "budget.json").read_text())
    assert [p["k"] for p in budget] == [2, 3, 4, 6] and all(0.0 <= p["visible"] <= 1.0 for p in budget)
    assert "## Before RL: the SFT model at each overview budget K" in text
    assert "Both together win" in text and "PARA-GRPO improves on its SFT model" in text
    # The held-out sampled probe: every model on the same questions (the split's first, here its only one), κ and
    # format per question, what the κ verdict compares (it no longer says "not measured"); the finished models'
    # probes come from the cache.
    assert all(m["probe_calls"] and m["probe_calls"].keys() == measured[0]["correct"].keys()
               and m["probe_format"].keys() == m["probe_calls"].keys() for m in measured)
    assert all(0.0 <= v <= 1.0 for m in measured for v in m["probe_format"].values())
    assert len(list((tmp_path / "probe").glob("*.json"))) >= len(measured)
    assert sorted(r.state.name for r in runs["sampled-probe"]).count("Cached") >= 2
    assert "GRPO after SFT collapses κ" in text and "no held-out probe" not in text
    assert (report.parent / "steps.png").stat().st_size > 1000


def _files(folder: Path) -> dict[str, int]:
    """Every file under `folder` with its modification time (ns)."""
    return {str(f.relative_to(folder)): f.stat().st_mtime_ns for f in sorted(folder.rglob("*")) if f.is_file()}


def test_the_replay_profile_reuses_the_defaults_stages_and_repeats_its_run_bit_for_bit(prefect_harness, task_runs,
                                                                                         tmp_path: Path):
    """`make replay-falls` (#62), its own `--set`s read from the Makefile, on the shrunk reproduction after a
    default run in the same folder: nothing before RL runs again, each variant trains a run of its own, the
    unchanged variant gives the default run's weights bit for bit (same seed, one thread), and the default's
    report stays as it was."""
    import json

    from flows.reproduce import ReproduceParams, reproduce
    from paravt_core.refs import file_hash
    from tests.unit.test_replay_profile import EARLIER, replay_falls_sets

    config = str(REPO / "conf/pipeline/reproduce.yaml")
    small = [*reproduce_overrides(tmp_path), "run.fanout.threads_per_run=1", "run.fanout.max_concurrent=1"]
    # The default as it was when the replay ran (the profile pins those RL settings, the Makefile's
    # EARLIER_BUDGET), at the shrunk run's step count, which the profile's pinned 12 steps would undo.
    steps = next(o for o in small if o.startswith("rl.max_steps="))
    default = reproduce(ReproduceParams(config_path=config,
                                        overrides=[*small, *EARLIER, steps, "reproduce.rows=[paragrpo]"]),
                        return_state=True)
    assert default.is_completed()
    report = (tmp_path / "report" / "report.md").read_bytes()
    pretrained = _files(tmp_path / "cache" / "pretrain")
    assert pretrained

    replay = reproduce(ReproduceParams(config_path=config, overrides=[*small, *replay_falls_sets("[0]"), steps]),
                       return_state=True)
    assert replay.is_completed()
    runs = task_runs(replay.state_details.flow_run_id)
    before_rl = ("data-synth-world", "data-materialize", "data-validate", "data-eval", "base-model", "sft")
    assert {stage: {r.state.name for r in runs[stage]} for stage in before_rl} == dict.fromkeys(before_rl, {"Cached"})
    assert pretrained == _files(tmp_path / "cache" / "pretrain")  # its own cache (not Prefect's): reused, nothing new
    # the SFT model's measurements too: its evaluations and probe come from the cache (only their MLflow log is new)
    assert {r.state.name for r in runs["sampled-probe"]} >= {"Cached"}
    sft_evals = [r for r in runs["eval-checkpoint"] if r.state.name == "Cached"]
    assert len(sft_evals) >= 2 + 2 * 3  # with tools and direct, and each other K of the budget sweep
    assert sorted(r.state.name for r in runs["rl"]) == ["Completed"] * 5

    def weights(row: str) -> dict[str, str]:
        (folder,) = (tmp_path / "rl").glob(f"{row}-*")
        return {f.name: file_hash(f) for f in sorted((folder / "model").glob("*.safetensors"))}

    assert weights("paragrpo.unchanged") and weights("paragrpo.unchanged") == weights("paragrpo")
    assert weights("paragrpo.lr_half") != weights("paragrpo")
    assert (tmp_path / "report" / "report.md").read_bytes() == report
    measured = json.loads((Path(replay.result()).parent / "runs.json").read_text())
    assert Path(replay.result()).parent == tmp_path / "report-replay-falls"
    assert [(m["row"], m["seed"]) for m in measured] == [
        ("sft", None), ("paragrpo.unchanged", 0), ("paragrpo.lr_half", 0), ("paragrpo.subagents_untrained", 0),
        ("paragrpo.draw_key_1", 0), ("paragrpo.kl_in_loss", 0)]
    (alone,) = [m for m in json.loads((tmp_path / "report" / "runs.json").read_text()) if m["row"] == "paragrpo"]
    assert measured[1]["accuracy"] == alone["accuracy"] and measured[1]["correct"] == alone["correct"]


def test_several_sft_builds_share_the_base_and_each_trains_its_rows(prefect_harness, task_runs, tmp_path: Path,
                                                                    monkeypatch):
    """`reproduce.sft_seeds` (#62 item 4): one pretraining, one SFT model per seed from it, each
    measured and each the start of every row x seed, each run labelled with its build for the
    verdicts; the budget sweep on the first build only."""
    import json
    from dataclasses import asdict

    from flows import fanout
    from flows import reproduce as reproduce_flow
    from flows.reproduce import ReproduceParams, reproduce
    from paravt_core.job_tally import JobTally
    from paravt_core.refs import content_hash

    said: list[str] = []

    class Kept(JobTally):  # the flow's tallies, whose lines are also kept here
        def __init__(self, total, at_once, say, **timing):
            super().__init__(total, at_once, lambda line: (said.append(line), say(line)), **timing)

    monkeypatch.setattr(fanout, "JobTally", Kept)
    monkeypatch.setattr(reproduce_flow, "JobTally", Kept)

    config = str(REPO / "conf/pipeline/reproduce.yaml")
    small = [*reproduce_overrides(tmp_path), "run.fanout.threads_per_run=1", "run.fanout.max_concurrent=1",
             "reproduce.rows=[paragrpo]", "reproduce.sft_seeds=[3, 4]", "reproduce.report_dir=report-builds"]
    state = reproduce(ReproduceParams(config_path=config, overrides=small), return_state=True)
    assert state.is_completed()
    runs = task_runs(state.state_details.flow_run_id)
    assert len(runs["pretrain"]) == 1 and len(runs["sft"]) == 2 and len(runs["rl"]) == 2
    # each build's held-out measurements, the other K of the first build's sweep, the two RL runs
    assert len(runs["fanned-out"]) == 2 + 3 + 2
    # the builds, then the fan-out's jobs, counted as each ends
    assert [line.split(" took ")[0] for line in said[:2]] == ["1 of 2 jobs done (sft3", "2 of 2 jobs done (sft4"]
    assert [line.split(" (")[0] for line in said[2:]] == [f"{n} of 7 jobs done" for n in range(1, 8)], said

    def job(folder: Path) -> dict:
        return json.loads((folder / "job.json").read_text())

    sft_models = {job(folder)["config"]["sft"]["seed"]: content_hash(folder / "model")
                  for folder in (tmp_path / "sft").iterdir()}
    assert sorted(sft_models) == [3, 4] and len(set(sft_models.values())) == 2  # two seeds, two SFT models
    # and each RL run started from its own build's model
    assert {job(folder)["config"]["sft"]["seed"]: job(folder)["init_model_sha256"]
            for folder in (tmp_path / "rl").iterdir()} == sft_models
    measured = json.loads((Path(state.result()).parent / "runs.json").read_text())
    assert [(m["row"], m["seed"], m["sft_build"]) for m in measured] == [
        ("sft", None, "sft3"), ("sft", None, "sft4"), ("paragrpo", 0, "sft3"), ("paragrpo", 0, "sft4")]
    budget = json.loads((Path(state.result()).parent / "budget.json").read_text())
    assert [p["k"] for p in budget] == [2, 3, 4, 6]
    text = Path(state.result()).read_text()
    assert "SFT build sft3 answers" in text and "SFT build sft4 answers" in text
    # Every model, SFT and RL, recorded the host numerics it was trained under, and the report
    # names that one host.
    import torch

    from paravt_core.provenance import accelerator_model, cpu_model, training_device

    device = training_device()  # the card too, where the ranks train on one
    card = {"accelerator": accelerator_model(device)} if device != "cpu" else {}
    host = {"host_cpus": os.cpu_count(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch": torch.__version__, "cpu": cpu_model(), **card}
    assert all(m["numerics"] == {**host, "torch_threads": m["numerics"]["torch_threads"]} for m in measured)
    assert len({m["numerics"]["torch_threads"] for m in measured if m["row"] != "sft"}) == 1
    assert (f"Trained on (each model's `numerics` in its `paravt_meta.json`): "
            f"{''.join(f'{c}, ' for c in card.values())}{os.cpu_count()} cores, "
            f"{host['cpu']}, {host['cpu_capability']}, torch {torch.__version__}: 2 SFT models on ") in text
    assert "host settings" not in text
    # and its running time, from the flow's own heartbeats: this one invocation, ended
    clocks = list((tmp_path / "clock").glob("report-builds-*/*.json"))
    assert len(clocks) == 1 and json.loads(clocks[0].read_text())["status"] == "completed"
    assert "over 1 invocation of `paravt reproduce` with this config" in text
    from paravt_core.run_clock import machine

    assert json.loads(clocks[0].read_text())["machine"] == machine() and f"), on {machine()}; from" in text
    assert json.loads((Path(state.result()).parent / "running_time.json").read_text())["invocations"] == 1
    # The same profile in parts, one build each (a profile that outlasts a machine runs so), from the
    # cache: merged, the parts give the whole's measurements and budget sweep.
    from paravt_core.config import load_config
    from paravt_core.miniature.reproduce import Profile, read_parts, read_profile

    whole = Path(state.result()).parent
    assert read_profile(whole) == Profile.of(load_config(config, small)) and read_profile(whole).sft_seeds == (3, 4)
    parts = []
    for seed in (3, 4):
        part = reproduce(ReproduceParams(config_path=config, overrides=[
            *small, f"reproduce.sft_seeds=[{seed}]", f"reproduce.report_dir=report-part{seed}"]), return_state=True)
        assert part.is_completed()
        parts.append(Path(part.result()).parent)
    assert sorted(sft_models) == sorted(job(folder)["config"]["sft"]["seed"] for folder in (tmp_path / "sft").iterdir())
    assert len(list((tmp_path / "rl").iterdir())) == 2  # each part's runs found in the whole's cache
    merged, budget_merged, running, profile = read_parts(parts)
    assert [asdict(run) for run in merged] == measured and [asdict(p) for p in budget_merged] == budget
    assert profile == Profile(read_profile(whole).key, (3, 4)) and running.parts == 2 and running.invocations == 2


def test_reproduce_refuses_an_unknown_row_before_any_stage(tmp_path: Path):
    from pydantic import ValidationError

    from flows.reproduce import ReproduceParams

    with pytest.raises(ValidationError, match="no_such_row"):
        ReproduceParams(config_path=str(REPO / "conf/pipeline/reproduce.yaml"),
                        overrides=[f"run.output_dir={tmp_path}", "reproduce.rows=[paragrpo, no_such_row]"])
