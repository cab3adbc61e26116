"""`video.sft_frame_choices`: SFT rows see the overview frame budgets RL's gating asks for."""

from __future__ import annotations

from collections import Counter

import pytest

from paravt_core.config import VideoConfig
from paravt_core.sft.dataset import FrameCache, FrameSampling, overview_budget
from paravt_core.video.sampling import overview_frame_indices
from tests.conftest import write_test_video


def test_a_row_keeps_its_budget_and_rows_spread_over_every_choice():
    choices = (2, 3, 4, 6)
    sources = [f"paravt_sft_selftrace.parquet:{i}" for i in range(2000)]
    budgets = [overview_budget(s, choices) for s in sources]
    assert budgets == [overview_budget(s, choices) for s in sources]  # stable: epochs, ranks, resumes agree
    counts = Counter(budgets)
    assert set(counts) == set(choices)
    assert all(380 <= n <= 620 for n in counts.values()), counts  # about a quarter each
    assert overview_budget("a.parquet:0", (5,)) == 5
    # the draw the measured reproduce SFT model was trained with (docs/miniature.md): a change here retrains it silently
    assert [overview_budget(f"paravt_sft_selftrace.parquet:{i}", choices) for i in range(12)] == [
        3, 6, 6, 6, 4, 4, 3, 3, 6, 2, 6, 4]


def test_the_budget_caps_the_overview_and_leaves_crops_alone(tmp_path):
    video = write_test_video(tmp_path / "v.mp4", seconds=12.0, fps=2.0)
    cache = FrameCache(tmp_path / "cache", FrameSampling(fps=1.0, max_frames=6, min_pixels=784, max_pixels=6144))
    full, full_meta = cache.load(video)
    capped, meta = cache.load(video, None, max_frames=2)
    assert len(full) == 6 and len(capped) == 2
    # the very frames a rollout's overview shows at that budget (SPEC §3): first and last included
    assert list(meta.frames_indices) == overview_frame_indices(24, 2) == [0, 23]
    assert list(full_meta.frames_indices) == overview_frame_indices(24, 6)
    above, _ = cache.load(video, None, max_frames=10)  # never above the sampling's own cap
    assert len(above) == 6
    crop, _ = cache.load(video, (0.0, 8.0))
    crop_budget, _ = cache.load(video, (0.0, 8.0), max_frames=2)
    assert len(crop) == len(crop_budget) == 8
    # each budget is its own cache entry: a second read of every one hits
    misses = cache.misses
    cache.load(video, None, max_frames=2)
    cache.load(video)
    assert cache.misses == misses


def test_the_config_rejects_budgets_past_the_sft_cap():
    assert VideoConfig().sft_frame_choices is None
    assert VideoConfig(sft_max_frames=6, sft_frame_choices=[2, 6]).sft_frame_choices == (2, 6)
    with pytest.raises(ValueError, match="sft_frame_choices"):
        VideoConfig(sft_max_frames=6, sft_frame_choices=[2, 8])
    with pytest.raises(ValueError):
        VideoConfig(sft_frame_choices=[0])
    with pytest.raises(ValueError):
        VideoConfig(sft_frame_choices=[])


def test_the_knob_enters_the_cache_keys_only_when_set():
    import hashlib
    import json

    from paravt_core.config import PipelineConfig
    from paravt_core.miniature.pretrain import training_config

    unset = PipelineConfig()
    dumped = unset.model_dump(mode="json")
    del dumped["video"]["sft_frame_choices"]  # the video section as hashed before the knob existed
    before = hashlib.sha256(json.dumps({"video": dumped["video"]}, sort_keys=True).encode()).hexdigest()[:16]
    assert unset.section_hash("video") == before
    budgets = PipelineConfig(video={"sft_max_frames": 6, "sft_frame_choices": [2, 6]})
    assert budgets.section_hash("video") != PipelineConfig(video={"sft_max_frames": 6}).section_hash("video")
    # pretraining shows crops and text only: its runs keep the keys of a config without budgets
    assert (training_config(budgets).section_hash("sft", "video", "run")
            == training_config(PipelineConfig(video={"sft_max_frames": 6})).section_hash("sft", "video", "run"))
