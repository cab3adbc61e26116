"""Loading knobs: attention implementation from config, cuDNN SDPA off while generating on CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from paravt_core.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_attention_implementation_reaches_the_model(tiny_model_dir: Path, implementation: str):
    from paravt_core.model.loading import load_model

    model = load_model(tiny_model_dir, attn_implementation=implementation)
    assert model.config._attn_implementation == implementation
    assert model.config.text_config._attn_implementation == implementation


def test_unknown_attention_or_dtype_is_refused(tiny_model_dir: Path):
    from paravt_core.model.loading import load_model

    with pytest.raises(ValueError, match="attn_implementation 'flash' is not one of"):
        load_model(tiny_model_dir, attn_implementation="flash")
    with pytest.raises(ValueError, match="dtype 'float16'"):
        load_model(tiny_model_dir, dtype="float16")


def test_flash_attention_needs_bf16_in_config():
    with pytest.raises(ConfigError, match="flash_attention_2 runs in bf16 only"):
        load_config(REPO / "conf/pipeline/tiny.yaml", ["model.attn_implementation=flash_attention_2"])
    cfg = load_config(REPO / "conf/pipeline/paravt_8b.yaml", ["model.attn_implementation=flash_attention_2"])
    assert cfg.model.attn_implementation == "flash_attention_2"


def test_cudnn_attention_is_off_only_while_generating_on_cuda():
    from paravt_core.agent.hf_engine import _without_cudnn_attention

    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        with _without_cudnn_attention(torch.device("cuda", 0)):
            assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.cudnn_sdp_enabled()
        with _without_cudnn_attention(torch.device("cpu")):
            assert torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


@pytest.mark.parametrize("shape, billions", [("2b", 2.13), ("8b", 8.77)])
def test_real_shapes_have_the_real_parameter_counts(tiny_model_dir: Path, shape: str, billions: float):
    from paravt_core.model.shapes import parameter_count

    assert parameter_count(shape, tiny_model_dir) / 1e9 == pytest.approx(billions, abs=0.01)


def test_a_tied_shape_counts_its_embedding_once_even_when_the_constructor_leaves_it_untied(
        tiny_model_dir: Path, monkeypatch):
    from transformers import Qwen3VLForConditionalGeneration

    from paravt_core.model.shapes import parameter_count

    tied = parameter_count("2b", tiny_model_dir)
    # what one xdist worker saw: the constructor's tying skipped, the head a parameter of its own
    monkeypatch.setattr(Qwen3VLForConditionalGeneration, "tie_weights", lambda self, *a, **k: None)
    assert parameter_count("2b", tiny_model_dir) == tied
    assert parameter_count("8b", tiny_model_dir) / 1e9 == pytest.approx(8.77, abs=0.01)  # untied shape: unchanged
