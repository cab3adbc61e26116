"""Issue #44: the pixel bounds the trainer renders frames with travel with the model.

A server renders frames with the checkpoint folder's own processor config. The tiny kit
keeps Qwen3-VL's shipped bounds (image shortest_edge 65536), which upscale a 160x288 frame
from 45 to 66 image tokens; every exported checkpoint must carry the trainer's bounds
instead, so that what is served is what was trained.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.integration

FRAME = (160, 288)  # within SPEC §3's 784..50176 pixels and on the 32-pixel grid: the trainer keeps it
TRAINER_TOKENS = (160 // 32) * (288 // 32)  # 45 merged patches
QWEN_TOKENS = 12 * 22 // 4  # upscaled to >= 65536 pixels: 384x704 -> 66


def _frame_messages():
    return [{"role": "user", "content": [{"type": "text", "text": "<0.0 seconds>"}, {"type": "image"},
                                         {"type": "text", "text": "What happens?"}]}]


def _prompt_ids(renderer, frame: np.ndarray) -> list[int]:
    from paravt_core.video.frames import Frames

    text = renderer.prompt_text(_frame_messages(), None)
    clip = Frames(array=frame[None], timestamps=[0.0], indices=[0], fps=1.0, duration=1.0, total_frames=1)
    return renderer.encode(text, [clip], continuation=False).token_ids


def _image_pads(processor, ids: list[int]) -> int:
    return ids.count(processor.tokenizer.convert_tokens_to_ids("<|image_pad|>"))


def test_the_tiny_processor_keeps_qwen3_vls_shipped_bounds(tiny_model_dir, tiny_processor):
    config = json.loads((tiny_model_dir / "processor_config.json").read_text())
    assert config["image_processor"]["size"] == {"shortest_edge": 65536, "longest_edge": 16777216}
    assert config["video_processor"]["size"] == {"shortest_edge": 4096, "longest_edge": 25165824}
    frame = np.zeros((*FRAME, 3), np.uint8)
    grid = tiny_processor.image_processor(images=[frame], return_tensors="pt")["image_grid_thw"]
    assert int(grid.prod()) // 4 == QWEN_TOKENS  # as strict as the real model: unbounded frames grow


def test_an_exported_checkpoint_renders_frames_as_the_trainer_does(tiny_model, tiny_model_dir, tiny_processor,
                                                                    tmp_path):
    from paravt_core.agent.context import ChatRenderer
    from paravt_core.config import VideoConfig
    from paravt_core.dist.weights import export_hf_model
    from paravt_core.model.integrity import verify_model_dir
    from paravt_core.model.loading import load_processor

    video = VideoConfig()
    out = export_hf_model(tiny_model.state_dict(), tiny_model_dir, tmp_path / "model", "float32", {"stage": "test"},
                          video)
    verify_model_dir(out)  # the weights manifest still holds
    frame = np.random.default_rng(0).integers(0, 256, (*FRAME, 3), dtype=np.uint8)
    trainer = ChatRenderer(tiny_processor, think_prefix=False, pixel_bounds=(video.min_pixels, video.max_pixels))
    # a server passes no resize options: the folder's own processor config decides
    served = ChatRenderer(load_processor(out), think_prefix=False)
    trained_ids = _prompt_ids(trainer, frame)
    assert _image_pads(tiny_processor, trained_ids) == TRAINER_TOKENS
    assert _prompt_ids(served, frame) == trained_ids
    base = ChatRenderer(load_processor(tiny_model_dir), think_prefix=False)
    assert _image_pads(tiny_processor, _prompt_ids(base, frame)) == QWEN_TOKENS  # what the export prevents


def test_a_rollout_server_on_a_base_model_serves_it_with_the_trainers_bounds(tiny_model_dir, tiny_processor,
                                                                            tmp_path):
    """RL launches its rollout server on the init model; a base model's folder keeps Qwen3-VL's
    bounds, so the server is given a linked copy whose processor carries the trainer's."""
    from paravt_core.agent.context import ChatRenderer
    from paravt_core.config import VideoConfig
    from paravt_core.model.integrity import verify_model_dir
    from paravt_core.model.loading import load_processor, pixel_bounded_folder

    video = VideoConfig(max_pixels=12288)
    before = (tiny_model_dir / "processor_config.json").read_bytes()
    served = pixel_bounded_folder(tiny_model_dir, video, tmp_path / "served")
    assert served == tmp_path / "served" and (served / "model.safetensors").is_symlink()
    verify_model_dir(served)
    assert (tiny_model_dir / "processor_config.json").read_bytes() == before  # the base is never written
    frame = np.random.default_rng(1).integers(0, 256, (64, 96, 3), dtype=np.uint8)
    trainer = ChatRenderer(tiny_processor, think_prefix=False, pixel_bounds=(video.min_pixels, video.max_pixels))
    assert _prompt_ids(ChatRenderer(load_processor(served), think_prefix=False), frame) == _prompt_ids(trainer, frame)
    # a folder that already carries the bounds (an export, or this copy) is served as it is
    assert pixel_bounded_folder(served, video, tmp_path / "again") == served and not (tmp_path / "again").exists()
