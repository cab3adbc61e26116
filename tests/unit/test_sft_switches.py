"""Issue #47's SFT speed switches train the same losses and gradients as the step without them.

Each is off by default until a GPU measures it faster (bench/sft_gpu.py); here, on the tiny
model on CPU, each is shown not to change what is trained:
- `sft.host_pixel_dtype: bfloat16`: bit-equal for a bf16 model (its patch embedding casts the
  pixels to bf16 itself), and refused for a float32 one, where it would round them (a control
  shows that rounding does change the loss, so the equality is not vacuous);
- `sft.pin_memory`: the micro-batches are the same tensors, page-locked (on a CPU machine
  page-locking is impossible, so it is counted on the CPU and checked for real on a GPU);
- `sft.compile_text_layers`: torch.compile (inductor, a C++ compiler on CPU) of every text
  decoder layer: loss and gradients within float32 reordering tolerance.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from paravt_core.model.loading import load_model
from paravt_core.sft.encode import encode_conversation, model_batch
from paravt_core.sft.loss import micro_batch_loss


def _conversation() -> list[dict]:
    return [
        {"role": "user", "content": [{"type": "video_url", "url": "file:///clip.mp4"},
                                     {"type": "text", "text": "What moves? A. a square B. a circle"}]},
        {"role": "assistant", "content": "<think>A square crosses the frame.</think><answer>A</answer>"},
    ]


@pytest.fixture(scope="module")
def sample(tiny_processor, two_frame_clip):
    return encode_conversation(_conversation(), tiny_processor, lambda path, window: two_frame_clip, None)


def _batch(model, sample, tiny_processor, pixel_dtype=None) -> dict[str, torch.Tensor]:
    return model_batch([sample], pad_id=tiny_processor.tokenizer.pad_token_id, rope_index=model.model.get_rope_index,
                       packing=False, positions=None, pixel_dtype=pixel_dtype)


def _loss_and_grads(model, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = micro_batch_loss(model, batch, "logits")
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.integration  # bf16 backward on CPU: ~15 s
def test_bf16_host_pixels_train_a_bf16_model_bit_for_bit(tiny_model_dir: Path, tiny_processor, sample):
    model = load_model(tiny_model_dir, dtype="bfloat16")
    model.train()
    host_fp32 = _batch(model, sample, tiny_processor)
    host_bf16 = _batch(model, sample, tiny_processor, torch.bfloat16)
    assert host_fp32["pixel_values"].dtype == torch.float32 and host_bf16["pixel_values"].dtype == torch.bfloat16
    assert host_bf16["pixel_values"].nbytes * 2 == host_fp32["pixel_values"].nbytes  # half the bytes to copy
    loss, grads = _loss_and_grads(model, host_fp32)
    loss_bf16, grads_bf16 = _loss_and_grads(model, host_bf16)
    assert torch.equal(loss, loss_bf16)
    assert grads.keys() == grads_bf16.keys() and any("visual" in name for name in grads)
    assert all(torch.equal(grads[name], grads_bf16[name]) for name in grads)


def test_bf16_host_pixels_would_change_a_float32_model_so_config_and_worker_refuse_it(tiny_model, tiny_processor,
                                                                                      sample):
    from paravt_core.config import PipelineConfig
    from paravt_core.sft.worker import host_pixel_dtype

    tiny_model.train()
    loss, _ = _loss_and_grads(tiny_model, _batch(tiny_model, sample, tiny_processor))
    rounded, _ = _loss_and_grads(tiny_model, _batch(tiny_model, sample, tiny_processor, torch.bfloat16))
    assert not torch.equal(loss, rounded)  # the control: the bf16 test above could see a difference
    with pytest.raises(ValueError, match="set model.dtype: bfloat16 or sft.host_pixel_dtype: float32"):
        PipelineConfig.model_validate({"sft": {"host_pixel_dtype": "bfloat16"}})
    PipelineConfig.model_validate({"sft": {"host_pixel_dtype": "bfloat16"}, "model": {"dtype": "bfloat16"}})
    # A CPU rank trains in float32 whatever model.dtype says: the worker refuses there too.
    with pytest.raises(ValueError, match="exact for a bfloat16 model only"):
        host_pixel_dtype("bfloat16", "float32")
    assert host_pixel_dtype("bfloat16", "bfloat16") is torch.bfloat16 and host_pixel_dtype("float32", "float32") is None


def _plan(sample, tiny_processor, accum: int = 2):
    from paravt_core.sft.loader import MicroBatchPlan

    from types import SimpleNamespace

    class OneSample:  # the dataset's interface: its counters and encode()
        overlong, cache = SimpleNamespace(skipped=0, truncated=0), SimpleNamespace(hits=0, misses=0)
        media_errors: dict = {}

        def __len__(self):
            return 3

        def encode(self, index):
            return sample

    return MicroBatchPlan(OneSample(), start=0, max_steps=2, micro=1, accum=accum, rank=0, world=1, seed=0,
                          collate=lambda samples: model_batch(samples, pad_id=tiny_processor.tokenizer.pad_token_id,
                                                              rope_index=None, packing=False, positions=None))


def test_pinned_micro_batches_are_the_same_tensors_each_pinned(monkeypatch, sample, tiny_processor):
    from paravt_core.sft.loader import micro_batches

    plain = list(micro_batches(_plan(sample, tiny_processor), 0))
    pinned_ids: set[int] = set()

    def pin(tensor):  # a CPU machine has no driver to page-lock with: count the calls instead
        copy = tensor.clone()
        pinned_ids.add(id(copy))
        return copy

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    pinned = list(micro_batches(_plan(sample, tiny_processor), 0, pin_memory=True))
    assert len(pinned) == len(plain) == 4
    for a, b in zip(plain, pinned):
        assert a.batch.keys() == b.batch.keys() and (a.tokens, a.count) == (b.tokens, b.count)
        assert all(torch.equal(a.batch[k], b.batch[k]) and id(b.batch[k]) in pinned_ids for k in a.batch)
    # The DataLoader's pin thread finds the method by name (torch.utils.data._utils.pin_memory):
    # without it a MicroBatch would pass through unpinned.
    from torch.utils.data._utils.pin_memory import pin_memory

    assert all(id(v) in pinned_ids for v in pin_memory(plain[0]).batch.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="page-locked memory needs a CUDA driver")
def test_data_workers_hand_over_page_locked_micro_batches(sample, tiny_processor):
    from paravt_core.sft.loader import micro_batches

    plain = list(micro_batches(_plan(sample, tiny_processor), 0))
    pinned = list(micro_batches(_plan(sample, tiny_processor), 1, pin_memory=True))
    assert all(v.is_pinned() for item in pinned for v in item.batch.values())
    assert all(torch.equal(a.batch[k], b.batch[k]) for a, b in zip(plain, pinned) for k in a.batch)


def _inductor_problem() -> str | None:
    """Why torch.compile's inductor cannot build on this machine, or None."""
    if shutil.which("g++") is None and shutil.which("c++") is None:
        return "inductor compiles C++ on CPU and no g++ / c++ is on PATH"
    return None


@pytest.mark.integration  # inductor's first compile: 40-90 s on this project's 2-core CPU machines
@pytest.mark.skipif(_inductor_problem() is not None, reason=str(_inductor_problem()))
def test_compiled_text_layers_train_the_same_loss_and_gradients(tiny_model_dir: Path, tiny_processor, sample):
    from paravt_core.sft.worker import compile_text_layers

    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager, compiled = load_model(tiny_model_dir), load_model(tiny_model_dir)
    for model in (eager, compiled):
        model.train()
    assert compile_text_layers(compiled) == len(compiled.model.language_model.layers) > 0
    batch = _batch(eager, sample, tiny_processor)
    loss, grads = _loss_and_grads(eager, batch)
    loss_c, grads_c = _loss_and_grads(compiled, batch)
    # Inductor fuses and reorders float32 sums: equal to ~1e-6 relative, asserted at 1e-4.
    assert loss_c.item() == pytest.approx(loss.item(), rel=1e-4)
    assert grads.keys() == grads_c.keys()
    for name in grads:
        assert torch.allclose(grads_c[name], grads[name], rtol=1e-3, atol=1e-5), name
    # Every layer ran compiled, on one graph: were each layer its own, past dynamo's cache limit
    # (8) the 28 or 36 layers of a real model would fall back to eager without a word.
    assert counters["stats"]["unique_graphs"] == 1 and counters["stats"]["calls_captured"] > 0
