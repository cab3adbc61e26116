"""Splitting an RL run's episode log by what the overview shows (paravt_core.miniature.advantage_split)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paravt_core.miniature.advantage_split import (
    BACKGROUND,
    NOT_SHOWN,
    SHOWN,
    episode_kind,
    group_push,
    render,
    split_rows,
    train_videos_by_name,
)

REPO = Path(__file__).resolve().parents[2]
# 20 frames; K=6 takes frames 0, 4, 8, 11, 15, 19 (visibility's overview indices): "a" shows its event at K=6
MANIFEST = {"train": [
    {"sentinel": "longvt_source/synthworld/a.mp4", "video": {"n_frames": 20, "events": [{"start_frame": 8, "end_frame": 9}]}},
    {"sentinel": "longvt_source/synthworld/b.mp4", "video": {"n_frames": 20, "events": [{"start_frame": 1, "end_frame": 3}]}},
]}


def _ep(step, prompt, video, calls, total, adv, question="What colour was the star?"):
    return {"step": step, "rank": 0, "prompt_id": prompt, "video": f"paravt/longvt_source/synthworld/{video}.mp4",
            "question": question, "nframes": 6, "tool_calls": calls, "total": total, "first_token_advantages": [adv, adv]}


def test_episodes_are_classed_by_the_worlds_ground_truth():
    from paravt_core.miniature.visibility import event_visible

    videos = train_videos_by_name(MANIFEST)
    assert event_visible(videos["a.mp4"], 6) and not event_visible(videos["b.mp4"], 6)
    assert episode_kind(_ep(1, "p", "a", 0, 1.0, 0.0), videos) == SHOWN
    assert episode_kind(_ep(1, "p", "b", 0, 1.0, 0.0), videos) == NOT_SHOWN
    assert episode_kind(_ep(1, "p", "b", 0, 1.0, 0.0, "What colour tint does the background have?"), videos) == BACKGROUND
    with pytest.raises(ValueError, match="not a training video"):
        episode_kind(_ep(1, "p", "zzz", 0, 1.0, 0.0), videos)


def test_the_push_counts_only_groups_that_hold_both_decisions():
    # two croppers at +1, two skippers at -1: π̂ 0.5, push 2 x 1 x 0.5 - 2 x (-1) x 0.5 = +2
    group = [_ep(1, "p", "a", 2, 1.6, 1.0), _ep(1, "p", "a", 1, 1.6, 1.0), _ep(1, "p", "a", 0, 1.0, -1.0),
             _ep(1, "p", "a", 0, 1.0, -1.0)]
    assert group_push(group) == pytest.approx(2.0)
    assert group_push(group[2:]) is None and group_push(group[:2]) is None
    # one cropper among four, below the skippers: the push is negative
    assert group_push([_ep(1, "q", "a", 1, 0.1, -1.5)] + [_ep(1, "q", "a", 0, 1.0, 0.5)] * 3) == pytest.approx(-1.5)


def test_rows_per_block_k_and_kind_and_the_command(tmp_path, capsys):
    import argparse

    from paravt_core.miniature import cli
    from paravt_core.rl.episode_log import write_episode_log

    videos = train_videos_by_name(MANIFEST)
    log = [_ep(1, "p", "a", 1, 1.6, 1.0), _ep(1, "p", "a", 0, 1.0, -1.0),  # shown, push +1
           _ep(1, "q", "b", 3, 1.6, 0.0), _ep(1, "q", "b", 3, 1.6, 0.0),  # not shown, all crop: no push
           _ep(2, "p", "a", 0, 1.0, 0.0), _ep(2, "p", "a", 0, 1.0, 0.0)]
    (first, second), = [split_rows(log, videos)[:2]]
    assert (first.kind, first.episodes, first.crop_share, first.mixed_groups, first.push_per_step) == (SHOWN, 4, 0.25, 1, 0.5)
    assert (first.reward_crop, first.reward_skip, first.steps) == (1.6, 1.0, (1, 2))
    assert (second.kind, second.calls_when_cropping, second.reward_skip, second.push) == (NOT_SHOWN, 3.0, None, 0.0)
    blocks = split_rows(log, videos, step_blocks=2)
    assert [(r.steps, r.kind) for r in blocks] == [((1, 1), SHOWN), ((1, 1), NOT_SHOWN), ((2, 2), SHOWN)]
    # the groups the push leaves out are counted: one all-crop (q), one all-skip (p at step 2), whose rewards
    # are equal too; q's rewards are equal as logged, p's at step 1 differ
    assert (first.all_crop_groups, first.all_skip_groups, first.equal_reward_groups) == (0, 1, 1)
    assert (second.all_crop_groups, second.all_skip_groups, second.equal_reward_groups) == (1, 0, 1)
    assert ("| 1-2 | 6 | shown | 4 | 25.0 | 1.00 | 1.600 | 1.000 | 1 | +0.50 | 0 | 1 | 1 |"
            in render(split_rows(log, videos)))
    # rewards that differ only beyond the clip (the log's `shaped`) are equal to group normalization
    clipped = [dict(r, total=2.3 + 0.1 * i, shaped=20.0) for i, r in enumerate(log[2:4])]
    assert split_rows(log[:2] + clipped, videos)[1].equal_reward_groups == 1
    assert split_rows(log[:2] + [dict(r, total=2.3 + 0.1 * i) for i, r in enumerate(log[2:4])],
                      videos)[1].equal_reward_groups == 0

    run = tmp_path / "rl"
    write_episode_log(run, 1, 0, log)
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["miniature", "advantage-split", "--config", str(REPO / "conf/pipeline/tiny.yaml"),
                              "--set", f"run.output_dir={tmp_path / 'out'}", "--run", str(run)])
    assert args.func(args) == 2 and "no generated world's manifest" in capsys.readouterr().err
    from paravt_core.config import load_config
    from paravt_core.data.mirror import world_dir

    world = world_dir(load_config(REPO / "conf/pipeline/tiny.yaml", [f"run.output_dir={tmp_path / 'out'}"]))
    world.mkdir(parents=True)
    (world / "manifest.json").write_text(json.dumps(MANIFEST))
    assert args.func(args) == 0 and "| 1-2 | 6 | shown | 4 |" in capsys.readouterr().out
    args = parser.parse_args(["miniature", "advantage-split", "--config", str(REPO / "conf/pipeline/tiny.yaml"),
                              "--set", f"run.output_dir={tmp_path / 'out'}", "--run", str(tmp_path / "none")])
    assert args.func(args) == 2 and "no episode log" in capsys.readouterr().err
