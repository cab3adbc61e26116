"""Loading a Qwen3-VL model and its processor: the tiny model or a real checkpoint alike.

Two ways to build the weights:
- whole: every parameter on this process, in `dtype`, then moved to `device` (generation,
  evaluation, ZeRO 0-2 training, the export);
- ZeRO-3 partitioned (`zero3_config`): the model is constructed inside `deepspeed.zero.Init`,
  so each rank allocates only its 1/N slice of every parameter as the module is built, and
  transformers loads the checkpoint one module at a time (rank 0 reads, each rank keeps
  its slice). No rank ever holds the whole model: ~35 GB fp32 per rank for the 8B model
  before this.

Every stage builds the model it runs with `build_model` (`model.*` applied whole; issue #63),
the export the model it writes with `load_export_model`; nothing else calls `load_model`
(tests/unit/test_one_road.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paravt_core.atomic import atomic_dir
from paravt_core.model.fast_paths import apply_fast_paths
from paravt_core.model.integrity import verify_model_dir
from paravt_core.model.vision_attention import apply_vision_attention

if TYPE_CHECKING:
    from paravt_core.config import ModelConfig, VideoConfig

DTYPES = {"float32": "float32", "bfloat16": "bfloat16"}
ATTENTION_IMPLEMENTATIONS = ("sdpa", "flash_attention_2", "eager")

# One load at a time per process. transformers 5 imports its classes on first use, and two
# threads' first loads at once (the reproduction's fan-out ends two RL runs in the same second
# and starts both runs' sampled probes) can see a module the other is still importing:
# "ImportError: cannot import name 'AutoProcessor' from 'transformers'" (measured: 2 of 4 fresh
# processes whose two threads loaded a processor at once). It also keeps `_zero3_construction`'s
# process-wide DeepSpeed registration from reaching another thread's load. Reentrant: a load may load.
_LOADING = threading.RLock()


def load_processor(model_dir: str | Path):
    with _LOADING:
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(str(model_dir))


def pixel_bounded(processor: Any, video: VideoConfig) -> Any:
    """`processor` with the pipeline's per-frame pixel bounds (SPEC §1, §3) as its own; returns it.

    A checkpoint folder's processor config is what a server renders frames with (vLLM and
    SGLang read it; `paravt eval serve` passes no resize options). Qwen3-VL's own config
    (image shortest_edge 65536) upscales every frame below 65536 pixels, so a folder that
    kept it would be served other pixels and more image tokens than the trainer used: a
    160x288 frame renders as 66 tokens there, 45 in training. So every export writes the
    trainer's bounds into the folder (`paravt_core.dist.weights.export_hf_model`).

    Frames always reach the model as image items (`paravt_core.agent.media`); the video
    processor gets the same per-frame budget over the most frames one clip holds, so a
    clip sent as a video is not upscaled either.
    """
    most_frames = max(video.nframes, video.sft_max_frames, video.crop_max_frames)
    processor.image_processor.size = {"shortest_edge": video.min_pixels, "longest_edge": video.max_pixels}
    processor.video_processor.size = {"shortest_edge": video.min_pixels,
                                      "longest_edge": video.max_pixels * most_frames}
    return processor


def has_pixel_bounds(processor: Any, video: VideoConfig) -> bool:
    """Does the processor's own image size equal `video`'s per-frame bounds?"""
    size = processor.image_processor.size
    return (size.get("shortest_edge"), size.get("longest_edge")) == (video.min_pixels, video.max_pixels)


def pixel_bounded_folder(model_dir: str | Path, video: VideoConfig, out_dir: str | Path) -> Path:
    """A folder to serve `model_dir` from with `video`'s pixel bounds; `model_dir` itself when it has them.

    For a rollout server launched on a folder the pipeline did not export (a base model): its
    processor config would resize frames otherwise than the trainer, and the server's prompt
    ids would part from ours. `out_dir` gets the bounded processor (`pixel_bounded`) and links
    to every other file of `model_dir`; it is rebuilt whole (atomically) each time.
    """
    model_dir = Path(model_dir)
    processor = load_processor(model_dir)
    if has_pixel_bounds(processor, video):
        return model_dir
    with atomic_dir(Path(out_dir)) as tmp:
        # the processor first: save_pretrained would write through a link into model_dir
        pixel_bounded(processor, video).save_pretrained(tmp)
        for f in model_dir.iterdir():
            if f.is_file() and not (tmp / f.name).exists() and f.name not in PROCESSOR_FILES:
                (tmp / f.name).symlink_to(f.resolve())
    return Path(out_dir)


# Processor configs a folder may hold (transformers 5 writes the first; hub checkpoints the others).
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json")


def load_model(model_dir: str | Path, dtype: str = "float32", device: str = "cpu", attn_implementation: str = "sdpa",
               zero3_config: dict[str, Any] | None = None, vision_attention: str = "per_item",
               vision_dedupe: str = "no_grad", patch_embed: str = "conv", prefill_attention: str = "masked",
               checksums: bool = True):
    """Load a `Qwen3VLForConditionalGeneration` (or any image-text-to-text model) for training or generation.

    Args:
        dtype: "float32" or "bfloat16", the weights' dtype as loaded.
        device: where a whole model goes; ignored with `zero3_config` (DeepSpeed places the slices).
        attn_implementation: one of `ATTENTION_IMPLEMENTATIONS`; flash_attention_2 needs the
            `flash-attn` package and a CUDA GPU.
        zero3_config: the DeepSpeed config of the ZeRO-3 engine the model is built for; the model
            is then constructed partitioned over the ranks of the initialized process group.
        vision_attention: `model.vision_attention` (`model/vision_attention.py`), set here so every
            stage that loads a model (SFT, RL policy, reference and hf rollout engine, the hf
            evaluator) runs the vision tower the same way.
        vision_dedupe, patch_embed, prefill_attention: `model.*` of the same names
            (`model/fast_paths.py`), applied the same way.
        checksums: False skips the sha256 of every weight file (sizes are still compared), for a
            caller whose model reference was content-hashed already.
    """
    import torch

    verify_model_dir(model_dir, checksums)  # whole weights before anything is built (ModelFolderError names the file)
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    if attn_implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"attn_implementation {attn_implementation!r} is not one of {ATTENTION_IMPLEMENTATIONS}")

    kwargs = {"dtype": getattr(torch, DTYPES[dtype]), "attn_implementation": attn_implementation}
    with _LOADING:  # the classes' first imports, and the forwards the switches below import and rebind
        from transformers import AutoModelForImageTextToText

        if zero3_config is not None:
            with _zero3_construction(zero3_config):
                model = AutoModelForImageTextToText.from_pretrained(str(model_dir), **kwargs)
        else:
            model = AutoModelForImageTextToText.from_pretrained(str(model_dir), **kwargs).to(device)
        apply_vision_attention(model, vision_attention)
        return apply_fast_paths(model, vision_dedupe, patch_embed, prefill_attention)


# `model.*` knobs of how a loaded model runs (not which weights): `load_model`'s keywords of the same names.
SPEED_OPTIONS = ("vision_attention", "vision_dedupe", "patch_embed", "prefill_attention")


def model_speed_options(model_cfg: Any) -> dict[str, str]:
    """`load_model`'s keywords for how the model runs, from a `ModelConfig` (`model.*`)."""
    return {name: getattr(model_cfg, name) for name in SPEED_OPTIONS}


def runnable_attention(implementation: str, device: str, zero3_config: dict[str, Any] | None) -> str:
    """`model.attn_implementation` where the model will run: flash_attention_2 is a CUDA kernel
    (the flash-attn package), so a model built whole on the CPU (a probe, a replay) runs sdpa."""
    on_cpu = zero3_config is None and device == "cpu"
    return "sdpa" if implementation == "flash_attention_2" and on_cpu else implementation


def build_model(model: ModelConfig, model_dir: str | Path, *, dtype: str | None = None, device: str = "cpu",
                zero3_config: dict[str, Any] | None = None, checksums: bool = True):
    """The one way a stage builds a model it runs (training, rollouts, evaluation, probes): the
    weights of `model_dir` with every `model.*` setting of how it runs (`model.attn_implementation`
    by `runnable_attention`, `SPEED_OPTIONS`), so no stage can leave one out.

    Args:
        model: the `model` section.
        dtype: the weights' dtype; None: `model.dtype` (training passes `dist.training_dtype`'s).
        device, zero3_config, checksums: as `load_model`'s; a rank that trains on a GPU passes its
            own device, so its attention is the configured one.
    """
    return load_model(model_dir, model.dtype if dtype is None else dtype, device,
                      runnable_attention(model.attn_implementation, device, zero3_config), zero3_config,
                      checksums=checksums, **model_speed_options(model))


def load_export_model(model_dir: str | Path, dtype: str):
    """A model built only to be written out (`dist.export_hf_model`): never run, so none of
    `model.*`'s run settings apply (they rebind forwards, never the weights)."""
    return load_model(model_dir, dtype=dtype)


class _ZeroThreeLoading:
    """What transformers asks of the registered DeepSpeed config while loading: is it ZeRO-3, and the dict.

    transformers' own `HfDeepSpeedConfig` needs `accelerate`, which the project does not install.
    """

    def __init__(self, config: dict[str, Any]):
        self.config = config

    def is_zero3(self) -> bool:
        return True


@contextmanager
def _zero3_construction(ds_config: dict[str, Any]) -> Iterator[None]:
    """Make transformers build and load under `deepspeed.zero.Init` for the duration only.

    The registration is global in transformers; leaving it set would also partition the
    whole models loaded later in the process (rollout copy, export) and switch `generate`
    to its ZeRO-3 lock-step mode.
    """
    from transformers.integrations.deepspeed import set_hf_deepspeed_config, unset_hf_deepspeed_config

    stage = ds_config.get("zero_optimization", {}).get("stage")
    if stage != 3:
        raise ValueError(f"partitioned construction needs a ZeRO-3 DeepSpeed config, got stage {stage}")
    registered = _ZeroThreeLoading(ds_config)  # transformers keeps only a weak reference
    set_hf_deepspeed_config(registered)
    try:
        yield
    finally:
        unset_hf_deepspeed_config()
