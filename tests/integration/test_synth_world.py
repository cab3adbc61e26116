"""The synthetic world at full default size and at the edges of its config (slower)."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

from paravt_core.data.synth import SynthConfig, generate_world
from paravt_core.data.synth.benchmarks import EVAL_SPLITS
from paravt_core.data.synth.paravt import RL_FILE
from paravt_core.data.synth.world import COLOURS

pytestmark = pytest.mark.integration


def test_default_world_generates_in_well_under_a_minute(tmp_path):
    cfg = SynthConfig()
    world = generate_world(cfg, tmp_path, progress=False)
    assert world.seconds < 60
    assert world.counts[RL_FILE] == cfg.train_videos * cfg.rl_prompts_per_video
    sft_rows = sum(n for name, n in world.counts.items() if name.startswith("sft/"))
    assert sft_rows == cfg.train_videos * cfg.sft_traces_per_video
    assert all(world.counts[split] == cfg.eval_rows_per_split for split in EVAL_SPLITS)
    assert world.size_bytes < 20_000_000


def _shows(frame: np.ndarray, colour: str) -> bool:
    distance = np.abs(frame.astype(np.int16) - np.array(COLOURS[colour], dtype=np.int16)).max(axis=-1)
    return int((distance < 60).sum()) >= 20


@pytest.mark.parametrize(
    "sizes",
    [
        dict(min_duration_s=300, max_duration_s=300, fps=4, width=128, height=128),
        dict(min_duration_s=30, max_duration_s=30, fps=1, width=64, height=64, min_events=3, max_events=3),
    ],
    ids=["largest", "smallest"],
)
def test_extreme_configs_give_readable_videos_whose_events_show(tmp_path, sizes):
    import decord

    cfg = SynthConfig(train_videos=4, eval_videos_per_split=1, eval_rows_per_split=1, **sizes)
    world = generate_world(cfg, tmp_path / "world", progress=False)
    manifest = json.loads(world.manifest.read_text())
    source = world.repos["ParaVT/ParaVT-Source"]
    for path in source.files:
        if path.endswith(".zip"):
            zipfile.ZipFile(source.folder / path).extractall(tmp_path / "media")
    for record in manifest["train"]:
        video = record["video"]
        reader = decord.VideoReader(str(tmp_path / "media" / record["sentinel"]))
        assert len(reader) == video["n_frames"] == round(sizes["min_duration_s"] * sizes["fps"])
        assert reader[0].shape == (sizes["height"], sizes["width"], 3)
        assert video["events"], "every video holds at least one event"
        for event in video["events"]:
            inside = reader.get_batch(list(range(event["start_frame"], event["end_frame"]))).asnumpy()
            assert all(_shows(frame, event["colour"]) for frame in inside)
            assert not _shows(reader[event["end_frame"]].asnumpy(), event["colour"])
