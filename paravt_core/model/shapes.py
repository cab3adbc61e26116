"""Real-sized Qwen3-VL shapes with random weights, for GPU benchmarks and the gpu test tier.

The tokenizer and processor are the tiny model's (same patch geometry as Qwen3-VL: 16 px
patches, 2x2 merge, 2-frame temporal patches), so no hub download is needed; only the
layer sizes are the real ones (../shared/GPU.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paravt_core.atomic import atomic_dir
from paravt_core.model.integrity import write_manifest

SHAPES: dict[str, dict[str, Any]] = {
    # 2.13 B parameters.
    "2b": {"text": dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                        intermediate_size=6144, head_dim=128),
           "vision": dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16),
           "deepstack": [5, 11, 17], "tie_word_embeddings": True},
    # About 8.8 B parameters.
    "8b": {"text": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                        intermediate_size=12288, head_dim=128),
           "vision": dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16),
           "deepstack": [8, 16, 24], "tie_word_embeddings": False},
}
QWEN3_VL_VOCAB = 151936


def shaped_config(shape: str, tiny_model_dir: str | Path):
    """The tiny model's `Qwen3VLConfig` with the layer sizes of `shape` ("2b" or "8b")."""
    from transformers import AutoConfig

    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r} is not one of {sorted(SHAPES)}")
    sizes = SHAPES[shape]
    config = AutoConfig.from_pretrained(str(tiny_model_dir))
    text = config.text_config
    for key, value in sizes["text"].items():
        setattr(text, key, value)
    text.vocab_size = QWEN3_VL_VOCAB
    half = text.head_dim // 2  # M-RoPE (t, h, w) split of the rotary half, Qwen3-VL's 24/20/20 of 64
    text.rope_parameters = {**text.rope_parameters, "mrope_section": [half - 2 * (half * 5 // 16), half * 5 // 16,
                                                                      half * 5 // 16]}
    vision = config.vision_config
    for key, value in sizes["vision"].items():
        setattr(vision, key, value)
    vision.out_hidden_size = text.hidden_size
    vision.num_position_embeddings = 2304
    vision.deepstack_visual_indexes = sizes["deepstack"]
    config.tie_word_embeddings = sizes["tie_word_embeddings"]
    text.tie_word_embeddings = sizes["tie_word_embeddings"]
    return config


def parameter_count(shape: str, tiny_model_dir: str | Path) -> int:
    """Parameters of `shape`, counted on the meta device (no memory allocated), a tied embedding once.

    Whether the constructor ties the output head to the input embedding has depended on state left
    by earlier work in the same process: once in the suite, the 2B shape counted 2.44 B instead of
    2.13 B in one xdist worker (its head untied; cause not pinned down). So a tied shape's head is
    subtracted here when the constructor left it a parameter of its own."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    config = shaped_config(shape, tiny_model_dir)
    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(config)
    total = sum(p.numel() for p in model.parameters())
    head, embedding = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    if config.tie_word_embeddings and head is not embedding:
        total -= head.numel()
    return total


def build_shaped_model(shape: str, tiny_model_dir: str | Path, out_dir: str | Path, device: str = "cuda") -> Path:
    """Write a random-weight bf16 model of `shape` with the tiny model's processor to `out_dir` (atomically)."""
    import torch
    from transformers import AutoProcessor, Qwen3VLForConditionalGeneration

    config = shaped_config(shape, tiny_model_dir)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3VLForConditionalGeneration(config).to(torch.bfloat16)
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    with atomic_dir(Path(out_dir)) as tmp:
        model.save_pretrained(tmp)
        AutoProcessor.from_pretrained(str(tiny_model_dir)).save_pretrained(tmp)
        write_manifest(tmp)
    return Path(out_dir)
