"""How frames reach the model: K timestamped image items, on every path (SPEC §1).

The paper shows the main agent its overview as K image items, each preceded by the text
timestamp `<12.0 seconds>`, and sub-agent crops the same way; never one Qwen3-VL video
item, whose processor fuses frames in pairs (half the timestamps, half the tokens). This
module is the ONE rendering of that layout, used by

- the embedded path (training rollouts, sub-agents, SFT rows, the `hf` evaluator): image
  items are bare `{"type": "image"}` placeholders and the frames go to the processor's
  `images=` in the same order (`embedded_image`);
- the server path (the `openai` evaluator): image items carry a base64 JPEG data URL
  (`jpeg_image`), which the server's processor decodes.

Both render through the same chat template, so the token layout (timestamps, vision
start/end tokens, image pads per frame) is the same; `tests/integration/test_rollout.py`
holds them equal.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from paravt_core.video import Frames

ImageItem = Callable[[np.ndarray], dict[str, Any]]
VIDEO_ITEM_TYPES = ("video", "video_url")


def timestamp_text(seconds: float) -> str:
    """The text before each frame: `<12.0 seconds>` (SPEC §1, Qwen3-VL's own timestamp form)."""
    return f"<{seconds:.1f} seconds>"


def embedded_image(frame: np.ndarray) -> dict[str, Any]:
    """An image placeholder; the frame itself goes to the processor in item order."""
    return {"type": "image"}


def _data_url(frame: np.ndarray, image_format: str, **save: Any) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(frame)).save(buffer, format=image_format, **save)
    return f"data:image/{image_format.lower()};base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def jpeg_data_url(frame: np.ndarray, quality: int = 95) -> str:
    """A uint8 [H, W, 3] RGB frame as a base64 JPEG data URL (the served evaluation)."""
    return _data_url(frame, "JPEG", quality=quality)


def png_data_url(frame: np.ndarray) -> str:
    """The frame as a lossless PNG data URL (served rollouts: the server's pixels are the trainer's)."""
    return _data_url(frame, "PNG", compress_level=1)


def collapse_pads(token_ids: Sequence[int], pad_id: int) -> tuple[list[int], int]:
    """(`token_ids` with every run of `pad_id` cut to one pad, the number of runs).

    What a server that expands each image's pads itself (vLLM, SGLang) must be sent: one
    pad per image, the image beside it, never our expanded run.
    """
    out: list[int] = []
    runs = 0
    for token in token_ids:
        if token == pad_id and out and out[-1] == pad_id:
            continue
        runs += token == pad_id
        out.append(int(token))
    return out, runs


def first_difference(ours: Sequence[int], theirs: Sequence[int]) -> str:
    """Where a server's prompt ids part from ours, for the mismatch error."""
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    return (f"ours {len(ours)} ids, the server's {len(theirs)}; first difference at position {first} "
            f"(ours {list(ours[first:first + 5])}, the server's {list(theirs[first:first + 5])})")


def jpeg_image(frame: np.ndarray) -> dict[str, Any]:
    """An OpenAI chat image item holding the frame (server path)."""
    return {"type": "image_url", "image_url": {"url": jpeg_data_url(frame)}}


def frame_items(timestamps: Sequence[float], images: Sequence[np.ndarray],
                image_item: ImageItem = embedded_image) -> list[dict[str, Any]]:
    """Content items of a clip: the timestamp text, then the image, frame by frame."""
    if len(timestamps) != len(images):
        raise ValueError(f"{len(images)} frames but {len(timestamps)} timestamps")
    items: list[dict[str, Any]] = []
    for seconds, frame in zip(timestamps, images):
        items.append({"type": "text", "text": timestamp_text(seconds)})
        items.append(image_item(frame))
    return items


def clip_items(frames: Frames, image_item: ImageItem = embedded_image) -> list[dict[str, Any]]:
    return frame_items(frames.timestamps, list(frames.array), image_item)


def with_frames(messages: Sequence[Mapping[str, Any]], clips: Sequence[Frames],
                image_item: ImageItem = embedded_image) -> list[dict[str, Any]]:
    """`messages` with their video items, in order, replaced by the clips' frame items."""
    pending = list(clips)
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list | tuple):
            items: list[dict[str, Any]] = []
            for item in content:
                if item.get("type") in VIDEO_ITEM_TYPES:
                    if not pending:
                        raise ValueError("the messages hold more video items than clips were given")
                    items += clip_items(pending.pop(0), image_item)
                else:
                    items.append(dict(item))
            content = items
        out.append({**message, "content": content})
    if pending:
        raise ValueError(f"{len(pending)} clip(s) left over: the messages hold fewer video items")
    return out


def clip_images(clips: Sequence[Frames]) -> list[np.ndarray]:
    """The frames of `clips` in order: what the processor's `images=` takes on the embedded path."""
    return [frame for clip in clips for frame in clip.array]
