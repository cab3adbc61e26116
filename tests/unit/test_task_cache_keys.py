"""Stage cache keys (`tasks/_cache.py`): a cached result is reused only for the output it points at."""

from __future__ import annotations

import shutil
from pathlib import Path

from tasks._cache import stage_key


def test_the_key_holds_while_the_output_stays_and_changes_when_it_is_deleted(tmp_path: Path):
    out = tmp_path / "run" / "model"
    out.mkdir(parents=True)
    first = stage_key("sft", "abc", output=out)
    assert stage_key("sft", "abc", output=out) == first
    shutil.rmtree(out)
    assert stage_key("sft", "abc", output=out) != first


def test_a_moved_output_folder_is_a_new_key(tmp_path: Path):
    """Issue #33 item 5: the moved folder's epoch stamp moved with it, so the cached result (old
    absolute paths) came back and every row failed the media-root check."""
    out = tmp_path / "outputs" / "data" / "materialized" / "sft"
    out.mkdir(parents=True)
    before = stage_key("data-materialize", "abc", output=out)
    shutil.move(tmp_path / "outputs", tmp_path / "moved")
    after = stage_key("data-materialize", "abc", output=tmp_path / "moved" / "data" / "materialized" / "sft")
    assert after != before


def test_a_model_output_that_lost_a_weight_file_is_a_new_key(tmp_path: Path, tiny_model_dir: Path):
    """Issue #33 item 2: a cached SFT/RL result is reused only while its model folder is whole."""
    from tasks._cache import model_intact

    out = tmp_path / "run" / "model"
    shutil.copytree(tiny_model_dir, out)
    first = stage_key("sft", "a", output=out, intact=model_intact)
    assert stage_key("sft", "a", output=out, intact=model_intact) == first
    assert stage_key("sft", "a", output=out) == first  # the same epoch stamp without the check
    (out / "model.safetensors").unlink()
    assert stage_key("sft", "a", output=out) == first  # control: the folder is still there
    assert stage_key("sft", "a", output=out, intact=model_intact) != first
