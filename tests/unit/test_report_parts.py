"""A profile run in parts (#62 item 4: `make reproduce-conclusive` outlasts a machine here):
each part's report folder records its profile, and `paravt miniature report --from A --from B`
merges parts of one profile into its report, refusing anything else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paravt_core.miniature.measurements import BudgetPoint, ModelRun
from paravt_core.miniature.reproduce import PROFILE, Profile, read_parts, read_profile, write_report
from paravt_core.run_clock import ClockSummary, clock_markdown, combined


def _build(seed: int, accuracy: float) -> list[ModelRun]:
    build = f"sft{seed}"
    return [ModelRun("sft", None, 0.5, 0.2, 2.8, sft_build=build),
            *(ModelRun(row, s, accuracy + 0.01 * s, 0.2, 2.7, sft_build=build)
              for row in ("vanilla_grpo", "paragrpo") for s in range(2))]


def _clock(running_s: float, start: str, end: str, machine: str) -> ClockSummary:
    return ClockSummary(running_s=running_s, left_out_s=0.0, invocations=2, hosts=("vm",), first_start=start,
                        last_beat=end, machines=(machine,))


def _part(folder, seeds, key="k1", running=None, budget_k=2):
    runs = [run for seed in seeds for run in _build(seed, 0.6 + 0.02 * seed)]
    write_report(runs, folder, "part", budget=[BudgetPoint(budget_k, 0.7, 0.3, 2.5, 0.1, 16)],
                 running=running, profile=Profile(key, tuple(seeds)))
    return runs


def _report(*argv: str) -> int:
    import argparse

    from paravt_core.miniature import cli

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["miniature", "report", *argv])
    return args.func(args)


def test_the_profile_key_ignores_which_builds_and_where_but_not_a_setting():
    from paravt_core.config import load_config

    def key(*sets: str) -> Profile:
        return Profile.of(load_config("conf/pipeline/reproduce.yaml", list(sets)))

    whole = key("reproduce.sft_seeds=[0,1,2,3]")
    assert whole.sft_seeds == (0, 1, 2, 3)
    part = key("reproduce.sft_seeds=[2,3]", "reproduce.report_dir=report-part", "run.output_dir=/elsewhere",
               "run.name=other", "mlflow.experiment=parts")
    assert part.key == whole.key and part.sft_seeds == (2, 3)
    for setting in ("rl.learning_rate=1.0e-4", "reproduce.seeds=[0,1]", "reproduce.rows=[paragrpo]", "sft.max_steps=7"):
        assert key("reproduce.sft_seeds=[0,1,2,3]", setting).key != whole.key, setting


def test_parts_merge_into_the_report_the_profile_gives_whole(tmp_path, capsys):
    first = _part(tmp_path / "a", [0, 1], running=_clock(3600, "2026-12-01T01:00:00+00:00",
                                                         "2026-12-01T03:00:00+00:00", "2 cores, X"))
    second = _part(tmp_path / "b", [2], running=_clock(1800, "2026-12-02T01:00:00+00:00",
                                                       "2026-12-02T02:00:00+00:00", "2 cores, Y"), budget_k=6)
    # in any order: the parts go by their first builds
    assert _report("--from", str(tmp_path / "b"), "--from", str(tmp_path / "a"), "--out", str(tmp_path / "out")) == 0
    merged = json.loads((tmp_path / "out" / "runs.json").read_text())
    every = [*first, *second]
    # every SFT model first, then the RL runs build by build: as one invocation of all three lists them
    whole = [*(r for r in every if r.row == "sft"), *(r for r in every if r.row != "sft")]
    write_report(whole, tmp_path / "whole", "part", budget=[BudgetPoint(2, 0.7, 0.3, 2.5, 0.1, 16)])
    assert merged == json.loads((tmp_path / "whole" / "runs.json").read_text())
    assert (tmp_path / "out" / "budget.json").read_text() == (tmp_path / "a" / "budget.json").read_text()
    assert read_profile(tmp_path / "out") == Profile("k1", (0, 1, 2))
    running = json.loads((tmp_path / "out" / "running_time.json").read_text())
    assert (running["running_s"], running["invocations"], running["parts"]) == (5400, 4, 2)
    assert (running["first_start"], running["last_beat"]) == ("2026-12-01T01:00:00+00:00", "2026-12-02T02:00:00+00:00")
    text = (tmp_path / "out" / "report.md").read_text()
    assert "Running time: 1.5 h over 4 invocations of `paravt reproduce` in 2 parts" in text
    assert "2 kinds of machine (2 cores, X; 2 cores, Y)" in text and "world and pretraining again" in text
    # the verdicts are the whole profile's: the report differs only in its title and running time
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Running time"))
    assert lines[at + 1] == "" and lines[1:at] + lines[at + 2:] == (tmp_path / "whole" / "report.md").read_text().splitlines()[1:]
    # a merged report is a part again: it merges with the next
    _part(tmp_path / "c", [3])
    assert _report("--from", str(tmp_path / "out"), "--from", str(tmp_path / "c"), "--out", str(tmp_path / "all")) == 0
    assert read_profile(tmp_path / "all").sft_seeds == (0, 1, 2, 3)
    # a part without a running time: the sum would leave it out, so the merged report gives none
    assert not (tmp_path / "all" / "running_time.json").exists()
    capsys.readouterr()


def test_the_merged_report_logs_to_mlflow_and_rebuilds_from_there(tmp_path, capsys):
    from paravt_core.eval.experiment_report import _client
    from paravt_core.miniature.reproduce import latest_logged

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # a report rebuilt from MLflow is there already
    assert _report("--experiment", "merged", "--tracking-uri", uri, "--log-to", "merged") == 2
    assert "--log-to" in capsys.readouterr().err and not (tmp_path / "mlflow.db").exists()
    first = _part(tmp_path / "a", [0], running=_clock(600, "2026-12-01T01:00:00+00:00", "2026-12-01T01:10:00+00:00", "X"))
    second = _part(tmp_path / "b", [1], running=_clock(900, "2026-12-02T01:00:00+00:00", "2026-12-02T01:15:00+00:00",
                                                       "X"), budget_k=6)
    assert _report("--from", str(tmp_path / "a"), "--from", str(tmp_path / "b"), "--out", str(tmp_path / "out"),
                   "--log-to", "merged", "--tracking-uri", uri) == 0
    assert "logged to MLflow experiment 'merged'" in capsys.readouterr().out
    runs, budget, running = latest_logged(uri, "merged")
    assert runs == [first[0], second[0], *first[1:], *second[1:]] and [p.k for p in budget] == [2]
    assert (running.running_s, running.parts) == (1500, 2)
    client = _client(uri)
    (logged,) = client.search_runs([client.get_experiment_by_name("merged").experiment_id])
    assert logged.data.tags["rebuilt_from"] == f"{tmp_path / 'a'}, {tmp_path / 'b'}"
    assert logged.data.metrics["vanilla_grpo_accuracy"] == pytest.approx((0.60 + 0.61 + 0.62 + 0.63) / 4)
    assert logged.data.metrics["running_time_h"] == pytest.approx(1500 / 3600)
    assert {Path(f.path).name for f in client.list_artifacts(logged.info.run_id, "reproduce")} == {
        "report.md", "steps.png", "runs.json", "budget.json", "running_time.json", "profile.json"}


def test_a_merged_report_whose_mlflow_log_fails_is_written_and_says_so(tmp_path, capsys):
    _part(tmp_path / "a", [0])
    _part(tmp_path / "b", [1])
    (tmp_path / "file").write_text("")  # a store under a file cannot be created
    uri = f"sqlite:///{tmp_path / 'file' / 'mlflow.db'}"
    assert _report("--from", str(tmp_path / "a"), "--from", str(tmp_path / "b"), "--out", str(tmp_path / "out"),
                   "--log-to", "merged", "--tracking-uri", uri) == 2
    err = capsys.readouterr().err
    assert f"the report is written to {tmp_path / 'out'}" in err and "'merged'" in err and uri in err
    assert "Traceback" not in err and read_profile(tmp_path / "out").sft_seeds == (0, 1)


@pytest.mark.parametrize(("second", "message"), [
    ({"seeds": [1, 2]}, "SFT build 1 is in"),
    ({"seeds": [2], "key": "k2"}, "comes from other settings than"),
    ({"seeds": [2], "profile": None}, f"{PROFILE} does not exist"),
    ({"seeds": [], "profile": "single"}, "trains one SFT model not named by build"),
])
def test_parts_that_are_not_one_profile_s_are_refused_naming_the_folder(tmp_path, capsys, second, message):
    _part(tmp_path / "a", [0, 1])
    if second.get("profile", "") is None:
        _part(tmp_path / "b", second["seeds"])
        (tmp_path / "b" / PROFILE).unlink()
    elif second.get("profile") == "single":
        write_report([ModelRun("sft", None, 0.5, 0.2, 2.8)], tmp_path / "b", "one", profile=Profile("k1", ()))
    else:
        _part(tmp_path / "b", second["seeds"], key=second.get("key", "k1"))
    assert _report("--from", str(tmp_path / "a"), "--from", str(tmp_path / "b"), "--out", str(tmp_path / "out")) == 2
    err = capsys.readouterr().err
    assert message in err and str(tmp_path / "b") in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_several_parts_need_an_out_folder_and_one_folder_rebuilds_as_before(tmp_path, capsys):
    runs = _part(tmp_path / "a", [0])
    _part(tmp_path / "b", [1])
    assert _report("--from", str(tmp_path / "a"), "--from", str(tmp_path / "b")) == 2
    assert "give --out" in capsys.readouterr().err
    assert _report("--from", str(tmp_path / "a")) == 0
    assert read_parts([tmp_path / "a-rebuilt"])[0] == runs and read_profile(tmp_path / "a-rebuilt") == Profile("k1", (0,))
    capsys.readouterr()


def test_a_report_without_a_profile_drops_an_earlier_one_and_a_damaged_record_is_named(tmp_path):
    from paravt_core.miniature.measurements import MeasurementsError

    _part(tmp_path / "a", [0])
    write_report(_build(0, 0.6), tmp_path / "a", "again")
    assert read_profile(tmp_path / "a") is None
    (tmp_path / "a" / PROFILE).write_text('{"key": "k1"}')
    with pytest.raises(MeasurementsError, match=f"{PROFILE}: not a profile record"):
        read_profile(tmp_path / "a")


def test_combined_running_times_add_up_and_say_how_many_parts():
    one = _clock(60, "2026-12-01T00:00:00+00:00", "2026-12-01T00:01:00+00:00", "2 cores, X")
    both = combined([one, ClockSummary(**{**one.__dict__, "unrecorded": 1, "machines": ()})])
    assert (both.running_s, both.invocations, both.parts, both.machines, both.unrecorded) == (120, 4, 2, ("2 cores, X",), 1)
    assert "with this config" in clock_markdown(one, "c") and "in 2 parts" in clock_markdown(both, "c")
    assert ClockSummary.from_json(both.to_json(), "x") == both
    assert ClockSummary.from_json(json.dumps({k: v for k, v in one.__dict__.items() if k != "parts"}), "x").parts == 1
    with pytest.raises(ValueError, match="no running time"):
        combined([])


def test_the_kept_parts_of_the_conclusive_profile_are_its_parts_and_merge(tmp_path, capsys):
    """docs/log/conclusive/part-*: the report folders of the conclusive profile's finished parts
    (kept in the repo, since a machine here does not last the profile's day). They are parts of what
    `make reproduce-conclusive` runs now, each build once, and they merge."""
    from pathlib import Path

    from tests.unit.test_replay_profile import CONFIG, load_config, replay_falls_sets

    kept = sorted(Path(__file__).resolve().parents[2].glob("docs/log/conclusive/part-*"))
    assert kept, "no kept part under docs/log/conclusive"
    cfg = load_config(CONFIG, replay_falls_sets("[0,1,2,3,4,5,6,7,8,9,10,11,12]", "reproduce-conclusive",
                                                "CONCLUSIVE_BUILDS"))
    profile = Profile.of(cfg)
    for part in kept:
        assert read_profile(part).key == profile.key, (
            f"{part} is a part of other settings than `make reproduce-conclusive` runs now: its runs are not this "
            "profile's; move it to a dated folder and run the part again")
        assert set(read_profile(part).sft_seeds) <= set(profile.sft_seeds)
    runs, _, running, merged = read_parts(kept)
    per_build = 1 + len(cfg.reproduce.rows) * len(cfg.reproduce.seeds)  # its SFT model and its RL runs
    assert len(runs) == per_build * len(merged.sft_seeds) and running is not None
    out = tmp_path / "merged"
    assert _report(*(arg for part in kept for arg in ("--from", str(part))), "--out", str(out)) == 0
    assert read_profile(out) == merged
    capsys.readouterr()


def test_a_part_whose_runs_name_another_part_s_build_is_refused(tmp_path, capsys):
    """The profile records say builds 0-1 and 2, but the second folder's runs are build 0's: the
    run-level check (`measurements.check_distinct`) still catches the run counted twice."""
    _part(tmp_path / "a", [0, 1])
    write_report(_build(0, 0.6), tmp_path / "b", "mislabelled", profile=Profile("k1", (2,)))
    assert _report("--from", str(tmp_path / "a"), "--from", str(tmp_path / "b"), "--out", str(tmp_path / "out")) == 2
    assert "a second SFT model of SFT build 'sft0'" in capsys.readouterr().err and not (tmp_path / "out").exists()
