"""The shared prefix of a group (paravt_core/rl/shared_prefix.py): where it is cut, without a model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from paravt_core.agent.engine import VisionInputs
from paravt_core.config import load_config
from paravt_core.rl.policy import Trajectory
from paravt_core.rl.shared_prefix import PackedRow, dense_mask, media_of, prefix_groups, shared_length

REPO = Path(__file__).resolve().parents[2]
IDS = {"pad": 0, "image": 9, "video": 8}
MERGE = 2  # 4 patches per placeholder token


def _traj(tokens: list[int], pixels: list[float] = (), prompt_length: int = 2) -> Trajectory:
    """Token ids with one 1x2x4 image (two placeholders) per value of `pixels`, filled with that value."""
    grids = torch.tensor([[1, 2, 4]] * len(pixels)) if pixels else None
    values = torch.cat([torch.full((8, 3), value) for value in pixels]) if pixels else None
    ids = torch.tensor(tokens)
    return Trajectory(ids, torch.ones_like(ids), torch.zeros(len(tokens)), VisionInputs(pixel_values=values,
                      image_grid_thw=grids), 0, False, prompt_length=prompt_length)


def _cut(*trajs: Trajectory) -> int:
    return shared_length(trajs, [media_of(t, IDS, MERGE) for t in trajs])


def test_identical_rows_keep_one_token_each():
    assert _cut(_traj([1, 2, 3, 4]), _traj([1, 2, 3, 4])) == 3
    assert _cut(_traj([1, 2, 3, 4]), _traj([1, 2, 3])) == 2  # the shorter one keeps its last token
    assert _cut(_traj([1, 2, 3, 4]), _traj([1, 2, 5, 4])) == 2


def test_the_prefix_never_splits_an_image_nor_shares_different_pixels():
    tokens = [1, 2, 9, 9, 3, 4, 5]
    assert _cut(_traj(tokens, [0.5]), _traj(tokens, [0.5])) == 6  # the image is shared
    assert _cut(_traj(tokens, [0.5]), _traj(tokens, [0.25])) == 2  # same placeholders, other pixels
    assert _cut(_traj([1, 2, 9, 9, 3], [0.5]), _traj([1, 2, 9, 9, 4], [0.5])) == 4
    # One token short of the shortest row falls inside the image: cut before it.
    assert _cut(_traj([1, 2, 9, 9], [0.5]), _traj([1, 2, 9, 9, 7], [0.5])) == 2


def test_groups_by_prompt_and_singletons_when_nothing_is_shared():
    trajs = [_traj([1, 2, 3, 4]), _traj([5, 6, 7]), _traj([1, 2, 3, 8]), _traj([1, 2, 6], prompt_length=0)]
    media = [media_of(t, IDS, MERGE) for t in trajs]
    rows = prefix_groups(trajs, media)
    # The last one's prompt key is its first token only: it groups with nothing else starting [1].
    assert [(r.members, r.prefix) for r in rows] == [([0, 2], 3), ([1], 2), ([3], 2)]


def test_dense_mask_suffixes_see_the_prefix_and_themselves_only():
    rows = [PackedRow([0, 1], 2, [(2, 4), (4, 5)])]
    mask = dense_mask(rows, 6)[0, 0].int()
    assert mask.tolist() == [[1, 0, 0, 0, 0, 0],
                             [1, 1, 0, 0, 0, 0],
                             [1, 1, 1, 0, 0, 0],
                             [1, 1, 1, 1, 0, 0],
                             [1, 1, 0, 0, 1, 0],
                             [0, 0, 0, 0, 0, 1]]  # the last column is padding: it sees only itself


def test_flash_attention_is_refused_at_load():
    base = REPO / "conf/pipeline/tiny.yaml"
    load_config(base, ["rl.shared_prefix=true"])  # sdpa, the default
    with pytest.raises(Exception, match="rl.shared_prefix packs"):
        load_config(base, ["rl.shared_prefix=true", "model.attn_implementation=flash_attention_2",
                           "model.dtype=bfloat16"])
