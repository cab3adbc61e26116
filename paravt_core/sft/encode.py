"""Turning one SFT conversation into model inputs and masked labels.

Messages follow the ParaVT-Parquet layout (SPEC §8): chat turns whose content is a string
or a list of items `{"type": "text"|"video_url"|"image_url", ...}`. The conversation is
rendered with the processor's chat template; each video item becomes frames from
`paravt_core.video` (SFT: `sft_fps`, at most `sft_max_frames`, pixel bounds from config;
SPEC §1) shown as timestamped image items, exactly as the rollout shows frames
(`paravt_core.agent.media`), each image item an image. A video item with `video_start` and
`video_end` (seconds) shows only that window, sampled as a crop is for a sub-agent
(`crop_fps`, `crop_min_frames`..`crop_max_frames`, SPEC §3): a sub-agent SFT row. Labels are -100 everywhere except the tokens of
assistant turns (their `<|im_end|>` included, so the model learns to stop): system, user
and tool-response turns are masked, while the tool-call JSON and the answer are trained.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import torch

from paravt_core.agent.media import frame_items
from paravt_core.model.positions import HostPositions, RopeIndex

IGNORE_INDEX = -100
MEDIA_TYPES = {"video_url": "video", "video": "video", "image_url": "image", "image": "image"}


class ConversationError(ValueError):
    """A conversation that cannot be trained on; the message says which part and why."""


@dataclass
class EncodedSample:
    input_ids: torch.Tensor  # [L] int64
    labels: torch.Tensor  # [L] int64, IGNORE_INDEX outside assistant turns
    mm_token_type_ids: torch.Tensor  # [L] int64
    pixel_values_videos: torch.Tensor | None  # [N_patches, D]
    video_grid_thw: torch.Tensor | None  # [n_videos, 3]
    pixel_values: torch.Tensor | None  # [N_patches, D]
    image_grid_thw: torch.Tensor | None  # [n_images, 3]

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def num_trained_tokens(self) -> int:
        return int((self.labels != IGNORE_INDEX).sum())


def media_path(item: Mapping[str, Any]) -> Path:
    """The local file a `video_url` / `image_url` item points at (`file://` URL or plain path)."""
    url = item.get("url") or item.get("video") or item.get("image") or item.get("video_url") or item.get("image_url")
    if isinstance(url, Mapping):
        url = url.get("url")
    if not isinstance(url, str) or not url:
        raise ConversationError(f"media item {dict(item)} has no url")
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path) if parsed.scheme == "file" else url)
    raise ConversationError(f"media url {url!r} is not a local file; run the materialize step first")


Window = tuple[float, float]
Media = tuple[str, Path, Window | None]  # (kind, file, window of a cropped video item or None)


def media_window(item: Mapping[str, Any], turn: int) -> Window | None:
    """The (start, end) seconds of a video item showing one window, None for a whole video."""
    start, end = item.get("video_start"), item.get("video_end")
    if start is None and end is None:
        return None
    if not isinstance(start, int | float) or not isinstance(end, int | float) or not 0 <= start < end:
        raise ConversationError(f"message {turn}: video window video_start={start!r} video_end={end!r} "
                                f"must be two numbers with 0 <= start < end")
    return float(start), float(end)


def split_media(messages: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[Media]]:
    """Chat-template messages (media items as bare placeholders) and the media in order."""
    rendered, media = [], []
    for turn, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, str):
            rendered.append({"role": message["role"], "content": content})
            continue
        if content is None or isinstance(content, (bytes, Mapping)):
            raise ConversationError(f"message {turn} ({message.get('role')}) has no usable content")
        items = []
        for item in content:
            kind = item.get("type")
            if kind == "text":
                items.append({"type": "text", "text": item.get("text") or ""})
            elif kind in MEDIA_TYPES:
                window = media_window(item, turn) if MEDIA_TYPES[kind] == "video" else None
                media.append((MEDIA_TYPES[kind], media_path(item), window))
                items.append({"type": MEDIA_TYPES[kind]})
            else:
                raise ConversationError(f"message {turn} has a content item of unknown type {kind!r}")
        rendered.append({"role": message["role"], "content": items})
    return rendered, media


def assistant_label_mask(input_ids: torch.Tensor, im_start: int, im_end: int, assistant_header: Sequence[int]) -> torch.Tensor:
    """True on the tokens of assistant turns: after `<|im_start|>assistant\\n`, through `<|im_end|>`."""
    ids = input_ids.tolist()
    mask = torch.zeros(len(ids), dtype=torch.bool)
    header = list(assistant_header)
    i = 0
    while i < len(ids):
        if ids[i] == im_start and ids[i + 1 : i + 1 + len(header)] == header:
            start = i + 1 + len(header)
            end = start
            while end < len(ids) and ids[end] != im_end:
                end += 1
            mask[start : min(end + 1, len(ids))] = True
            i = end + 1
        else:
            i += 1
    return mask


# (path, window or None) -> (frames [T,H,W,3], VideoMetadata)
FrameLoader = Callable[[Path, Window | None], tuple[np.ndarray, Any]]
ImageLoader = Callable[[Path], Any]


def with_media(rendered: Sequence[Mapping[str, Any]], media: Sequence[Media], load_video: FrameLoader,
               load_image: ImageLoader) -> tuple[list[dict[str, Any]], list[Any]]:
    """The messages with each video placeholder as timestamped image items (SPEC §1: the
    same rendering as the rollout, `agent/media.py`) and the images in item order."""
    pending = list(media)
    images: list[Any] = []
    out = []
    for message in rendered:
        content = message["content"]
        if isinstance(content, list):
            items: list[dict[str, Any]] = []
            for item in content:
                if item["type"] == "video":
                    _, path, window = pending.pop(0)
                    frames, meta = load_video(path, window)
                    items += frame_items([index / meta.fps for index in meta.frames_indices], list(frames))
                    images += list(frames)
                elif item["type"] == "image":
                    images.append(load_image(pending.pop(0)[1]))
                    items.append({"type": "image"})
                else:
                    items.append(item)
            content = items
        out.append({"role": message["role"], "content": content})
    return out, images


def encode_conversation(
    messages: Sequence[Mapping[str, Any]],
    processor,
    load_video: FrameLoader,
    load_image: ImageLoader,
    tools: Sequence[Mapping[str, Any]] | None = None,
    pixel_bounds: tuple[int, int] | None = None,
) -> EncodedSample:
    """Render, tokenize and mask one conversation (SPEC §8 messages).

    Args:
        pixel_bounds: (min, max) pixels per image for the image processor (SPEC §1/§3), as
            in `ChatRenderer`: Qwen3-VL's own bounds would upscale every frame below 65536
            pixels; row images are resized into these bounds.
    """
    rendered, media = split_media(messages)
    if not any(m["role"] == "assistant" for m in rendered):
        raise ConversationError("conversation has no assistant turn to train on")
    rendered, images = with_media(rendered, media, load_video, load_image)
    text = processor.apply_chat_template(rendered, tools=tools, tokenize=False, add_generation_prompt=False)
    kwargs: dict[str, Any] = {"images": images} if images else {}
    if images and pixel_bounds is not None:
        kwargs["size"] = {"shortest_edge": pixel_bounds[0], "longest_edge": pixel_bounds[1]}
    batch = processor(text=[text], return_tensors="pt", **kwargs)
    tok = processor.tokenizer
    input_ids = batch["input_ids"][0]
    mask = assistant_label_mask(
        input_ids,
        tok.convert_tokens_to_ids("<|im_start|>"),
        tok.convert_tokens_to_ids("<|im_end|>"),
        tok("assistant\n", add_special_tokens=False)["input_ids"],
    )
    labels = torch.where(mask, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    return EncodedSample(
        input_ids=input_ids,
        labels=labels,
        mm_token_type_ids=batch["mm_token_type_ids"][0],
        pixel_values_videos=batch.get("pixel_values_videos"),
        video_grid_thw=batch.get("video_grid_thw"),
        pixel_values=batch.get("pixel_values"),
        image_grid_thw=batch.get("image_grid_thw"),
    )


def collate(samples: Sequence[EncodedSample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a micro-batch; vision patches of all samples are concatenated in order."""
    length = max(s.num_tokens for s in samples)

    def pad(values: torch.Tensor, fill: int) -> torch.Tensor:
        return torch.nn.functional.pad(values, (0, length - values.numel()), value=fill)

    batch = {
        "input_ids": torch.stack([pad(s.input_ids, pad_id) for s in samples]),  # [B, L]
        "labels": torch.stack([pad(s.labels, IGNORE_INDEX) for s in samples]),  # [B, L]
        "attention_mask": torch.stack([pad(torch.ones_like(s.input_ids), 0) for s in samples]),  # [B, L]
        "mm_token_type_ids": torch.stack([pad(s.mm_token_type_ids, 0) for s in samples]),  # [B, L]
    }
    for key in ("pixel_values_videos", "video_grid_thw", "pixel_values", "image_grid_thw"):
        parts = [getattr(s, key) for s in samples if getattr(s, key) is not None]
        if parts:
            batch[key] = torch.cat(parts)
    return batch




def pack(samples: Sequence[EncodedSample], rope_index: RopeIndex) -> dict[str, torch.Tensor]:
    """A micro-batch as one row: the samples concatenated, no padding (`sft.packing`).

    Each sample keeps the positions it has alone: its 3-D M-RoPE positions (`rope_index`
    on the sample by itself) and a text position running from 0, as the 4-row `position_ids`
    Qwen3-VL's text model reads (row 0 text, rows 1-3 temporal/height/width). With no
    `attention_mask` and no KV cache (run the model with `use_cache=False`; with a cache
    transformers skips this), it reads a packed row from the text positions restarting at 0
    and keeps each token's attention inside its own sample. The first label of every sample
    is masked, so no sample is trained to predict the next one's first token (alone, that
    label is never predicted either). Vision patches are concatenated in sample order, as
    `collate` does.
    """
    if not samples:
        raise ValueError("pack needs at least one sample")
    positions, labels = [], []
    for s in samples:
        rope, _ = rope_index(s.input_ids[None], s.mm_token_type_ids[None], image_grid_thw=s.image_grid_thw,
                             video_grid_thw=s.video_grid_thw, attention_mask=None)  # [3, 1, L]
        text = torch.arange(s.num_tokens, dtype=rope.dtype).view(1, 1, -1)
        positions.append(torch.cat([text, rope.to(text.device)]))  # [4, 1, L]
        sample_labels = s.labels.clone()
        sample_labels[0] = IGNORE_INDEX
        labels.append(sample_labels)
    batch = {
        "input_ids": torch.cat([s.input_ids for s in samples])[None],  # [1, sum L]
        "labels": torch.cat(labels)[None],  # [1, sum L]
        "mm_token_type_ids": torch.cat([s.mm_token_type_ids for s in samples])[None],  # [1, sum L]
        "position_ids": torch.cat(positions, dim=2),  # [4, 1, sum L]
    }
    for key in ("pixel_values_videos", "video_grid_thw", "pixel_values", "image_grid_thw"):
        parts = [getattr(s, key) for s in samples if getattr(s, key) is not None]
        if parts:
            batch[key] = torch.cat(parts)
    return batch


PIXEL_KEYS = ("pixel_values", "pixel_values_videos")


def model_batch(samples: Sequence[EncodedSample], *, pad_id: int, rope_index: RopeIndex, packing: bool,
                positions: HostPositions | None, pixel_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """A micro-batch's model inputs on the host: packed (`sft.packing`) or right-padded, with its
    position tensors added when `positions` is given (`sft.host_positions`, model/positions.py),
    and its pixel values cast to `pixel_dtype` when given (`sft.host_pixel_dtype`).

    Qwen3-VL's patch embedding casts the pixel values to its weight's dtype before anything else
    reads them, so for a bf16 model the host cast gives bit-equal inputs (the same
    round-to-nearest-even) and halves the bytes copied to the GPU; for an fp32 model it would
    round them, which is why the worker allows it with a bf16 model only.
    """
    batch = pack(samples, rope_index) if packing else collate(samples, pad_id)
    if pixel_dtype is not None:
        batch.update({key: batch[key].to(pixel_dtype) for key in PIXEL_KEYS if key in batch})
    return positions.add_to(batch) if positions is not None else batch
