"""Loading a Qwen3-VL model and its processor: the tiny model or a real checkpoint alike."""

from __future__ import annotations

from pathlib import Path

DTYPES = {"float32": "float32", "bfloat16": "bfloat16"}


def load_processor(model_dir: str | Path):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(model_dir))


def load_model(model_dir: str | Path, dtype: str = "float32", device: str = "cpu"):
    """Load a `Qwen3VLForConditionalGeneration` (or any image-text-to-text model) for training or generation."""
    import torch
    from transformers import AutoModelForImageTextToText

    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=getattr(torch, DTYPES[dtype]))
    return model.to(device)
