"""`make replay-falls` and `make rl-budget` (#62): profiles of RL variants trained from the default's cache."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from paravt_core.config import ConfigError, load_config, rl_row_file
from paravt_core.miniature.reproduce import row_variants

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "conf/pipeline/reproduce.yaml"
# The RL settings the default had when the replay and the budget profile ran; they keep them.
EARLIER = ["rl.learning_rate=1.0e-4", "rl.max_steps=12", "rl.shared_prefix=false"]


def differing(cfg, other) -> dict:
    """The `rl` fields in which `cfg` differs from `other` (the row's label aside), as `cfg` has them."""
    mine, theirs = cfg.rl.model_dump(), other.rl.model_dump()
    return {k: v for k, v in mine.items() if v != theirs[k] and k != "row"}


def replay_falls_sets(seeds: str = "[1,3]", target: str = "replay-falls", seeds_name: str = "REPLAY_SEEDS",
                      *more: str) -> list[str]:
    """The `--set` overrides a profile's make target passes to `paravt reproduce`, read from the
    Makefile (`more`: other make variables, NAME=value)."""
    shown = subprocess.run(["make", "-n", target, f"{seeds_name}={seeds}", *more, "STAMP=/dev/null"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout
    words = shlex.split(shown.replace("\\\n", " "))
    start = next(i for i, word in enumerate(words) if word.endswith("/paravt"))
    assert words[start + 1:start + 4] == ["reproduce", "--config", "conf/pipeline/reproduce.yaml"]
    return [words[i + 1] for i in range(start, len(words) - 1) if words[i] == "--set"]


def test_each_row_runs_as_it_is_or_once_per_variant_under_its_own_label():
    assert row_variants("paragrpo", {}) == [("paragrpo", [])]
    assert row_variants("paragrpo", {"unchanged": (), "lr_half": ("rl.learning_rate=5e-5",)}) == [
        ("paragrpo.unchanged", ["rl.row=paragrpo.unchanged"]),
        ("paragrpo.lr_half", ["rl.row=paragrpo.lr_half", "rl.learning_rate=5e-5"])]


@pytest.mark.parametrize("variant", ["x: [sft.max_steps=3]", "x: [rl.learning_rate]", "x: [rl.row=other]",
                                     "'a b': []"])
def test_a_variant_that_is_not_rl_knobs_is_refused_at_load(variant):
    with pytest.raises(ConfigError, match="reproduce.variants"):
        load_config(CONFIG, [f"reproduce.variants={{{variant}}}"])


def test_the_replay_keeps_every_key_before_rl_and_gives_each_variant_a_run_of_its_own():
    from paravt_core.rl import stage as rl_stage
    from tests.unit.test_cache_identity import _ref, stage_keys

    sets = replay_falls_sets()
    default, replay = load_config(CONFIG), load_config(CONFIG, sets)
    assert (replay.reproduce.rows, replay.reproduce.seeds) == (("paragrpo",), (1, 3))
    assert (replay.reproduce.report_dir, replay.mlflow.experiment) == ("report-replay-falls", "paravt-replay-falls")
    assert default.reproduce.report_dir == "report"
    # world, base model, pretraining, SFT, its grammar check and the SFT model's evaluations: the same keys
    before_rl = {k: v for k, v in stage_keys(replay, False).items() if k not in ("all", "rl,video,run", "rl_run_dir")}
    assert before_rl == {k: v for k, v in stage_keys(default, False).items() if k in before_rl}
    assert set(before_rl) >= {"model", "video", "eval", "sft_run_dir", "grammar", "eval_results", "pretrain"}
    # the default's paragrpo run at seed 1, then each variant as the flow builds it (flows/reproduce.py)
    row = rl_row_file(CONFIG, "paragrpo")
    fell = load_config(CONFIG, [*EARLIER, "run.seed=1"], row)
    # the profile pins the default's RL settings as they were when it ran, and only those
    assert set(EARLIER) <= set(sets)
    assert differing(fell, load_config(CONFIG, ["run.seed=1"], row)) == {
        "learning_rate": 1e-4, "max_steps": 12, "shared_prefix": False}
    runs = {label: load_config(CONFIG, [*sets, "run.seed=1", *extra], row)
            for label, extra in row_variants("paragrpo", replay.reproduce.variants)}
    switched = {label: differing(cfg, fell) for label, cfg in runs.items()}
    assert switched == {"paragrpo.unchanged": {}, "paragrpo.lr_half": {"learning_rate": 5e-5},
                        "paragrpo.subagents_untrained": {"train_subagents": False},
                        "paragrpo.draw_key_1": {"gating": {**fell.rl.gating.model_dump(), "draw_key": 1}},
                        "paragrpo.kl_in_loss": {"kl_mode": "loss"}}
    assert fell.rl.learning_rate == 1e-4 and fell.rl.kl_mode == "token_reward" and fell.rl.train_subagents
    # one switch each and everything else the run's own: the same seed and threads, a run folder of its own
    assert all(cfg.run == fell.run and cfg.video == fell.video for cfg in runs.values())
    folders = {rl_stage.run_dir(cfg, _ref("init"), _ref("rl")).name for cfg in [fell, *runs.values()]}
    assert len(folders) == 6 and rl_stage.run_dir(runs["paragrpo.unchanged"], _ref("init"), _ref("rl")).name.startswith(
        "paragrpo.unchanged-")
    assert replay.run.fanout.threads_per_run == 1  # as the default's runs: a run's weights depend on its threads


def test_the_budget_profile_switches_vanilla_grpo_learning_rate_and_steps_only_and_keeps_the_cache():
    """`make rl-budget` (#62 item 3): the default's budget listed first (the rule keeps it on a tie),
    then each learning rate x step count; every stage before RL keeps its key."""
    from tests.unit.test_cache_identity import stage_keys

    sets = replay_falls_sets("[0,1,2,3]", "rl-budget", "BUDGET_SEEDS")
    default, profile = load_config(CONFIG, []), load_config(CONFIG, sets)
    assert (profile.reproduce.rows, profile.reproduce.seeds) == (("vanilla_grpo",), (0, 1, 2, 3))
    assert (profile.reproduce.report_dir, profile.mlflow.experiment) == ("report-rl-budget", "paravt-rl-budget")
    assert profile.reproduce.rl_validation
    before_rl = {k: v for k, v in stage_keys(profile, False).items() if k not in ("all", "rl,video,run", "rl_run_dir")}
    assert before_rl == {k: v for k, v in stage_keys(default, False).items() if k in before_rl}
    row = rl_row_file(CONFIG, "vanilla_grpo")
    base = load_config(CONFIG, EARLIER, row)
    budgets = {label: (cfg.rl.learning_rate, cfg.rl.max_steps, set(differing(cfg, base)))
               for label, extra in row_variants("vanilla_grpo", profile.reproduce.variants)
               for cfg in [load_config(CONFIG, [*sets, *extra], row)]}
    assert list(budgets) == ["vanilla_grpo.lr1e4_s12", "vanilla_grpo.lr5e5_s12", "vanilla_grpo.lr1e4_s24",
                             "vanilla_grpo.lr5e5_s24"]
    # the first is the budget the default had when the profile ran; the default now has the chosen one
    assert set(EARLIER) <= set(sets) and (base.rl.learning_rate, base.rl.max_steps) == (1e-4, 12)
    now = load_config(CONFIG, [], row)
    assert (now.rl.learning_rate, now.rl.max_steps, now.rl.shared_prefix) == (5e-5, 24, True)
    assert differing(base, now) == {"learning_rate": 1e-4, "max_steps": 12, "shared_prefix": False}
    assert budgets == {"vanilla_grpo.lr1e4_s12": (1e-4, 12, set()),
                       "vanilla_grpo.lr5e5_s12": (5e-5, 12, {"learning_rate"}),
                       "vanilla_grpo.lr1e4_s24": (1e-4, 24, {"max_steps"}),
                       "vanilla_grpo.lr5e5_s24": (5e-5, 24, {"learning_rate", "max_steps"})}


# The default's run spreads (points of held-out accuracy, SD over its 4 runs a row), measured by
# `make reproduce` from a fresh clone of 3451871 (docs/miniature.md, "Current results"): PARA-GRPO
# against vanilla GRPO (the pooled SD of the two rows) and PARA-GRPO's runs against their SFT model.
PILOT_SD_ROWS, PILOT_SD_AGAINST_SFT = 6.7, 6.5


def test_the_conclusive_profile_is_the_default_over_builds_sized_from_the_default_s_spreads():
    """`make reproduce-conclusive` (#62 item 4): the default's rows and seeds from each SFT build; the
    builds needed for each of its comparisons when a build's difference has only its runs' spread."""
    import math

    from paravt_core.miniature.inference import units_needed
    from paravt_core.miniature.verdicts import MIN_ACCURACY
    from tests.unit.test_cache_identity import stage_keys

    sets = replay_falls_sets("[0,1,2,3,4,5,6,7,8,9,10,11,12]", "reproduce-conclusive", "CONCLUSIVE_BUILDS")
    default, profile = load_config(CONFIG, []), load_config(CONFIG, sets)
    assert (profile.reproduce.rows, profile.reproduce.seeds) == (default.reproduce.rows, default.reproduce.seeds)
    assert (profile.reproduce.report_dir, profile.mlflow.experiment) == ("report-conclusive",
                                                                          "paravt-reproduce-conclusive")
    assert profile.rl == default.rl and profile.run.output_dir == default.run.output_dir
    before_sft = {k: v for k, v in stage_keys(profile, False).items() if k in ("model", "video", "pretrain")}
    assert before_sft and before_sft == {k: v for k, v in stage_keys(default, False).items() if k in before_sft}
    runs = len(profile.reproduce.seeds)
    # a build's difference of two rows' means of `runs` runs each; of a row's mean against its SFT model
    builds = max(units_needed(PILOT_SD_ROWS * math.sqrt(2 / runs), MIN_ACCURACY * 100, 3, paired=True),
                 units_needed(PILOT_SD_AGAINST_SFT / math.sqrt(runs), MIN_ACCURACY * 100, 1, paired=True))
    assert len(profile.reproduce.sft_seeds) == builds == 13


def test_a_part_of_the_conclusive_profile_merges_with_the_others():
    """The conclusive profile in parts (`CONCLUSIVE_BUILDS`, `CONCLUSIVE_REPORT`): each part its own
    report folder and clock, the whole's profile key, so `paravt miniature report` merges them."""
    from paravt_core.miniature.reproduce import Profile, clock_dir

    whole = load_config(CONFIG, replay_falls_sets("[0,1,2,3,4,5,6,7,8,9,10,11,12]", "reproduce-conclusive",
                                                  "CONCLUSIVE_BUILDS"))
    parts = [load_config(CONFIG, replay_falls_sets(seeds, "reproduce-conclusive", "CONCLUSIVE_BUILDS",
                                                   f"CONCLUSIVE_REPORT=report-conclusive-{name}", *more))
             for seeds, name, more in (("[0,1,2]", "0-2", ()), ("[3,4]", "3-4", ("CONCLUSIVE_SWEEP=false",)))]
    assert [part.reproduce.report_dir for part in parts] == ["report-conclusive-0-2", "report-conclusive-3-4"]
    # a later part without the budget sweep is still a part of the same profile
    assert [cfg.reproduce.budget_sweep for cfg in (whole, *parts)] == [True, True, False]
    assert {Profile.of(part).key for part in parts} == {Profile.of(whole).key}
    assert [Profile.of(part).sft_seeds for part in parts] == [(0, 1, 2), (3, 4)]
    assert len({clock_dir(cfg) for cfg in (whole, *parts)}) == 3


def test_a_part_without_the_budget_sweep_measures_its_builds_alone():
    """`reproduce.budget_sweep` off: each build's own held-out measurements, no sweep point at any K
    (so no world is read for them)."""
    from flows.reproduce import budget_ks, build_configs, sft_jobs

    cfg = load_config(CONFIG, ["reproduce.sft_seeds=[3,4]", "reproduce.budget_sweep=false"])
    assert budget_ks(cfg) == [] and len(budget_ks(load_config(CONFIG, []))) > 1
    labels = [label for index, (_, build) in enumerate(build_configs(cfg))
              for label, _ in sft_jobs(build, None, None, None, sweep=index == 0)]
    assert labels == ["sft (sft3)", "sft (sft4)"]
