"""A tiny random-weight Qwen3-VL built locally: the embedded default's model.

With no model hub reachable, the pipeline's CPU default needs a real
`Qwen3VLForConditionalGeneration` that the same loading, training and generation code
handles as it would the 8B checkpoint. This module writes one as a Hugging Face model
directory: config and safetensors weights, a byte-level BPE tokenizer trained here on a
small domain corpus (Qwen's special tokens, and the SPEC §2 tags split as Qwen3-VL splits
them: six single added tokens, `<answer>`/`<tool_code>` and their closers plain text), the
image and video processors with Qwen3-VL's patch geometry and its shipped resize bounds,
and our chat template.

Everything is a pure function of `TinyModelSpec`, so the same spec and seed give the same
bytes (the Prefect task that builds it is cached on the spec).
"""

from __future__ import annotations

import json
import random
from importlib import resources
from pathlib import Path

from paravt_core.config import TinyModelSpec

# Qwen's control tokens; names as in the Qwen2/Qwen3 tokenizers.
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# The response grammar's tags as the real Qwen3-VL tokenizer has them (SPEC §2): these six
# are single added tokens (not "special": decoding keeps them) ...
SINGLE_TOKEN_TAGS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
# ... while these are ordinary text of several tokens, so code that looks for them in token
# ids must match a token sequence (`paravt_core.agent.tags`), on the tiny kit as on Qwen.
TEXT_TAGS = ("<answer>", "</answer>", "<tool_code>", "</tool_code>")
GRAMMAR_TAGS = SINGLE_TOKEN_TAGS + TEXT_TAGS

# The pre-tokenizer split of the Qwen2/Qwen3 tokenizers (contractions, letter runs with
# one leading non-letter, single digits, punctuation runs, newlines, other whitespace).
QWEN_PRE_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The words of the generated world (data.synth.world: colours, shapes, corners, digits,
# directions) and of its answers: Qwen3-VL's 151k-token vocabulary holds each of them as ONE
# token with its leading space, lower case and capitalised (" purple", " Purple", " Top",
# " yes"). The tiny tokenizer learns its merges from `_corpus` alone: when the corpus had the
# colours in lower case only, an option reading "Purple" became " ", "P", "ur", "ple" and
# " yes" became " ", "y", "es", so telling two options apart, or yes from no, hung on
# sub-word pieces and a bare space the real model never sees (measured: a held-out "no" was
# predicted as the space that starts " yes" in 50 of 300 option checks,
# docs/miniature.md). tests/unit/test_tiny_tokenizer.py keeps this list in step with the world.
WORLD_WORDS = (
    "red green blue yellow purple orange cyan white black "
    "square circle triangle diamond star "
    "top bottom left right centre corner "
    "zero one two three four five six seven eight nine digit "
    "to in a moving from yes no option options checking notes say answer vs same different"
).split()


def _corpus(seed: int, n_lines: int = 6000) -> list[str]:
    """Domain text for the BPE merges: questions, timestamps, tool calls, answers, option checks."""
    rng = random.Random(seed)
    colours = ["red", "green", "blue", "yellow", "purple", "orange", "white", "black", "cyan"]
    shapes = ["square", "circle", "triangle", "diamond", "star", "ball", "box", "digit", "object"]
    digits = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    verbs = ["appears", "moves", "is shown", "happens", "crosses", "disappears", "stays"]
    words = (
        "what when which where how the a an of in at to from video frame seconds window "
        "question answer option letter only first then after before during left right top "
        "bottom corner centre background nothing notable summary event time start end "
        "crop call tool response reasoning look closer evidence therefore so I need check"
    ).split()
    lines = []
    for _ in range(n_lines):
        kind = rng.randrange(7)
        s, e = sorted(rng.sample(range(0, 300), 2))
        if kind == 0:
            lines.append(
                f"What colour was the {rng.choice(shapes)} that {rng.choice(verbs)}? "
                f"A. {rng.choice(colours)} B. {rng.choice(colours)} C. {rng.choice(colours)} "
                f"D. {rng.choice(colours)} Answer with the option letter only."
            )
        elif kind == 1:
            args = {"video_path": "v.mp4", "start_time": s, "end_time": e}
            lines.append(json.dumps({"name": "crop_video", "arguments": args}))
        elif kind == 2:
            lines.append(
                f"<{s:.1f} seconds> From {s // 60:02d}:{s % 60:02d} to {e // 60:02d}:{e % 60:02d} "
                f"a {rng.choice(colours)} {rng.choice(shapes)} {rng.choice(verbs)}."
            )
        elif kind == 3:
            lines.append(f"The event happens in the {s:.1f} - {e:.1f} seconds. [{s}, {e}]")
            # the text tags, so their pieces merge as Qwen's do ("<", "answer", ">")
            lines.append(f"<answer>{rng.choice('ABCD')}</answer> <tool_code>crop_video(\"v.mp4\", {s}, {e})</tool_code>")
        elif kind == 4:
            lines.append(" ".join(rng.choice(words + digits + colours) for _ in range(12)) + ".")
        elif kind == 5:
            # options as benchmarks write them (capitalised) and the check of each
            picks = [rng.choice(WORLD_WORDS) for _ in range(4)]
            value = rng.choice(WORLD_WORDS).capitalize()
            checks = " ".join(f"{letter}. {word.capitalize()} vs {value}: {rng.choice(('same', 'different'))}."
                              for letter, word in zip("ABCD", picks, strict=True))
            lines.append(f"Checking the options: {checks} So the answer is option {rng.choice('ABCD')}.")
        else:
            text = " ".join(rng.choice(WORLD_WORDS) for _ in range(10))
            lines.append(f"The notes say: {text}. So the answer is {rng.choice(WORLD_WORDS).capitalize()} "
                         f"{rng.choice(WORLD_WORDS)}. Yes or No?")
    return lines


def build_tokenizer(spec: TinyModelSpec):
    """A byte-level BPE tokenizer with Qwen's control tokens and the grammar tags."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    # Qwen's pre-split: words, single digits, punctuation runs, whitespace; then bytes. Digits
    # stay one token each, as in Qwen3-VL, so numbers (crop windows, timestamps) are spelled out.
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRE_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    reserved = len(QWEN_SPECIAL_TOKENS) + len(SINGLE_TOKEN_TAGS)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size - reserved,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_corpus(spec.seed), trainer=trainer)
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIAL_TOKENS])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in SINGLE_TOKEN_TAGS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=32768,
        padding_side="left",
        extra_special_tokens={
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "vision_start_token": "<|vision_start|>",
            "vision_end_token": "<|vision_end|>",
        },
    )


def chat_template() -> str:
    return resources.files("paravt_core.model").joinpath("chat_template.jinja").read_text()


# The resize bounds Qwen3-VL-8B-Instruct ships in its preprocessor_config.json and
# video_preprocessor_config.json. The kit keeps them, not the pipeline's bounds, so that it
# is never friendlier than the real model: code that forgets to hand the processor SPEC §3's
# bounds (or to export them, `model.loading.pixel_bounded`) sees upscaled frames here too.
QWEN3_VL_IMAGE_SIZE = {"shortest_edge": 65536, "longest_edge": 16777216}
QWEN3_VL_VIDEO_SIZE = {"shortest_edge": 4096, "longest_edge": 25165824}


def build_processor(spec: TinyModelSpec, tokenizer):
    """Qwen3-VL's processors with the real checkpoint's settings and the spec's patch geometry."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    geometry = dict(
        patch_size=spec.patch_size,
        temporal_patch_size=spec.temporal_patch_size,
        merge_size=spec.spatial_merge_size,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    image_processor = Qwen2VLImageProcessor(size=dict(QWEN3_VL_IMAGE_SIZE), **geometry)
    # Frame sampling (fps 2, 4 to 768 frames) as the checkpoint's video processor has it.
    video_processor = Qwen3VLVideoProcessor(size=dict(QWEN3_VL_VIDEO_SIZE), **geometry)
    return Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=chat_template(),
    )


def build_config(spec: TinyModelSpec, tokenizer):
    from transformers import Qwen3VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    half_head = spec.head_dim // 2
    # M-RoPE splits the rotary half-dimension over (t, h, w); sizes as in Qwen3-VL's 24/20/20 of 64.
    mrope = [half_head - 2 * (half_head * 5 // 16), half_head * 5 // 16, half_head * 5 // 16]
    text_config = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=32768,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 5_000_000.0,
            "mrope_section": mrope,
            "mrope_interleaved": True,
        },
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    vision_config = dict(
        depth=spec.vision_depth,
        hidden_size=spec.vision_hidden_size,
        intermediate_size=spec.vision_intermediate_size,
        num_heads=spec.vision_num_heads,
        patch_size=spec.patch_size,
        spatial_merge_size=spec.spatial_merge_size,
        temporal_patch_size=spec.temporal_patch_size,
        out_hidden_size=spec.hidden_size,
        num_position_embeddings=256,
        deepstack_visual_indexes=[spec.vision_depth - 1],
    )
    return Qwen3VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )


def build_tiny_model(spec: TinyModelSpec, out_dir: str | Path) -> Path:
    """Write the tiny model directory (weights, config, processor, tokenizer) to `out_dir`.

    The directory is written under a temporary name and renamed into place, so an
    interrupted build never leaves a half-written model behind.
    """
    import torch
    from transformers import GenerationConfig, Qwen3VLForConditionalGeneration

    from paravt_core.atomic import atomic_dir
    from paravt_core.model.integrity import write_manifest

    out_dir = Path(out_dir)
    tokenizer = build_tokenizer(spec)
    processor = build_processor(spec, tokenizer)
    config = build_config(spec, tokenizer)
    torch.manual_seed(spec.seed)
    model = Qwen3VLForConditionalGeneration(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(
        eos_token_id=config.text_config.eos_token_id,
        pad_token_id=config.text_config.pad_token_id,
        do_sample=False,
    )
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        write_manifest(tmp)
        (tmp / "paravt_tiny_spec.json").write_text(spec.model_dump_json(indent=2))
    return out_dir
