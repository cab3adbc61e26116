"""SFT speed switches keep the loss: packing (`encode.pack`) and the loss without full logits (`sft/loss.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from paravt_core.sft.dataset import FrameCache, FrameSampling
from paravt_core.sft.encode import IGNORE_INDEX, collate, encode_conversation, pack
from paravt_core.sft.loss import micro_batch_loss

from test_sft import _losses, conversation, sft_setup  # noqa: F401  (sft_setup is a fixture)

pytestmark = pytest.mark.integration


def _second_conversation(video: Path) -> list[dict]:
    return [
        {"role": "user", "content": [
            {"type": "video_url", "url": f"file://{video}"},
            {"type": "text", "text": "How many squares appear? A. one B. two"},
        ]},
        {"role": "assistant", "content": "<think>I count one square in the overview.</think><answer>A</answer>"},
    ]


@pytest.fixture()
def samples(tiny_processor, short_video: Path, tmp_path: Path):
    """Two samples of different lengths and frame counts (4 and 2 frames)."""
    four = FrameCache(tmp_path / "a", FrameSampling(fps=1.0, max_frames=4, min_pixels=784, max_pixels=6144))
    two = FrameCache(tmp_path / "b", FrameSampling(fps=1.0, max_frames=2, min_pixels=784, max_pixels=3072))
    first = encode_conversation(conversation(short_video), tiny_processor, four.load, None)
    second = encode_conversation(_second_conversation(short_video), tiny_processor, two.load, None)
    assert first.num_tokens != second.num_tokens and first.image_grid_thw.shape[0] == 4
    return [first, second]


def _token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[L] cross-entropy of each position's next-token label (0 where the label is masked)."""
    targets = labels[1:]
    ce = torch.nn.functional.cross_entropy(logits[:-1].float(), targets.clamp(min=0), reduction="none")
    return torch.cat([torch.where(targets != IGNORE_INDEX, ce, 0.0), ce.new_zeros(1)])


def test_packed_samples_have_the_losses_they_have_alone(tiny_model, tiny_processor, samples):
    tiny_model.eval()
    pad = tiny_processor.tokenizer.pad_token_id
    alone = []
    with torch.no_grad():
        for s in samples:
            out = tiny_model(**{k: v for k, v in collate([s], pad).items() if k != "labels"}, use_cache=False)
            alone.append(_token_losses(out.logits[0], s.labels).sum() / (s.labels[1:] != IGNORE_INDEX).sum())
        batch = pack(samples, tiny_model.model.get_rope_index)
        assert batch["input_ids"].shape == (1, sum(s.num_tokens for s in samples))
        assert batch["position_ids"].shape == (4, 1, batch["input_ids"].shape[1]) and "attention_mask" not in batch
        out = tiny_model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False)
    per_token = _token_losses(out.logits[0], batch["labels"][0])
    start = 0
    for s, expected in zip(samples, alone):
        end = start + s.num_tokens
        got = per_token[start:end].sum() / (s.labels[1:] != IGNORE_INDEX).sum()
        assert float(got) == pytest.approx(float(expected), abs=1e-4)
        start = end


def test_packing_is_what_makes_the_losses_equal(tiny_model, samples):
    """The control: the same row with plain positions (attention across samples) gives other losses."""
    tiny_model.eval()
    batch = pack(samples, tiny_model.model.get_rope_index)
    plain = {k: v for k, v in batch.items() if k not in ("labels", "position_ids")}
    with torch.no_grad():
        packed = tiny_model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits[0]
        crossed = tiny_model(**plain, use_cache=False).logits[0]
    second = slice(samples[0].num_tokens, None)
    assert (packed[second] - crossed[second]).abs().max() > 1e-3


@pytest.mark.parametrize("impl", ["logits", "chunked"])
def test_micro_batch_loss_and_gradients_agree_packed_or_padded(tiny_model_dir: Path, tiny_processor, samples,
                                                               impl: str):
    from paravt_core.model.loading import load_model

    pad = tiny_processor.tokenizer.pad_token_id
    results = []
    for make in (lambda m: collate(samples, pad), lambda m: pack(samples, m.model.get_rope_index)):
        model = load_model(tiny_model_dir)
        model.train()
        loss = micro_batch_loss(model, make(model), impl, chunk_size=7)
        loss.backward()
        results.append((float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    reference = load_model(tiny_model_dir)
    expected = float(reference(**collate(samples, pad)).loss)
    (padded, padded_grads), (packed, packed_grads) = results
    assert padded == pytest.approx(expected, abs=1e-5) and packed == pytest.approx(expected, abs=1e-5)
    assert set(padded_grads) == set(packed_grads)
    for name, grad in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-3, atol=1e-5, msg=name)


def test_liger_loss_refuses_a_cpu_tensor_and_zero3(tiny_model, tiny_processor, samples):
    from paravt_core.config import PipelineConfig

    batch = collate(samples, tiny_processor.tokenizer.pad_token_id)
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        micro_batch_loss(tiny_model, batch, "liger")
    with pytest.raises(ValueError, match="ZeRO-3"):
        PipelineConfig.model_validate({"sft": {"loss_impl": "liger", "zero_stage": 3}})


@pytest.mark.parametrize("impl", ["liger", "chunked"])
def test_a_micro_batch_with_no_trained_token_gives_every_parameter_a_zero_gradient(tiny_model, tiny_processor,
                                                                                   samples, impl):
    """A rank whose micro-batch trains nothing must still hand ZeRO-1/2 a gradient for every
    parameter, the output head included (with untied heads, as the 8B model has, it had none)."""
    batch = collate(samples, tiny_processor.tokenizer.pad_token_id)
    batch["labels"] = torch.full_like(batch["labels"], IGNORE_INDEX)
    loss = micro_batch_loss(tiny_model, batch, impl)  # liger: no kernel runs without a trained row
    loss.backward()
    assert float(loss.detach()) == 0.0
    head = tiny_model.get_output_embeddings().weight
    assert head.grad is not None and not head.grad.any()


def test_sft_job_packed_with_chunked_loss_logs_the_padded_runs_losses(sft_setup):
    """The worker's wiring: micro-batches of 2, packed + chunked vs padded + logits, same losses per step."""
    from paravt_core.sft import stage

    config, base, sft_data = sft_setup
    runs = {}
    for name, switches in {"padded": (), "packed": ("sft.packing=true", "sft.loss_impl=chunked")}.items():
        cfg = config("sft.max_steps=3", "sft.zero_stage=0", "sft.micro_batch_size=2", "sft.checkpoint_every=10",
                     f"run.name={name}", *switches)
        stage.run(cfg, base, sft_data, log_line=lambda line: None)
        run_dir = stage.run_dir(cfg, base, sft_data)
        runs[name] = _losses(run_dir)
        rows = [json.loads(line) for line in (run_dir / "losses.jsonl").read_text().splitlines()]
        assert all(r["tokens_per_s"] > 0 for r in rows)
    assert sorted(runs["packed"]) == [1, 2, 3]
    for step, loss in runs["padded"].items():
        assert runs["packed"][step] == pytest.approx(loss, rel=1e-4), step


@pytest.mark.gpu
@pytest.mark.parametrize("liger_kernels", [False, True])
def test_liger_fused_loss_and_gradients_match_the_logits_loss_on_gpu(tiny_model_dir: Path, tiny_processor, samples,
                                                                     liger_kernels: bool):
    """Liger's fused linear cross-entropy (and its RMSNorm / RoPE) against the model's own loss, fp32 on CUDA."""
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    from paravt_core.model.loading import load_model
    from paravt_core.sft.worker import apply_liger_kernels

    # Liger patches transformers' module functions for the whole process: put them back afterwards.
    patched = ("apply_rotary_pos_emb", "apply_rotary_pos_emb_vision", "Qwen3VLTextRMSNorm")
    saved = {name: getattr(modeling_qwen3_vl, name) for name in patched}
    try:
        _liger_against_logits(tiny_model_dir, samples, liger_kernels, load_model, apply_liger_kernels)
    finally:
        for name, value in saved.items():
            setattr(modeling_qwen3_vl, name, value)


def _liger_against_logits(tiny_model_dir, samples, liger_kernels, load_model, apply_liger_kernels) -> None:
    batch = {k: v.cuda() for k, v in pack(samples, load_model(tiny_model_dir).model.get_rope_index).items()}
    results = []
    for impl, kernels in (("logits", False), ("liger", liger_kernels)):
        model = load_model(tiny_model_dir, device="cuda")
        if kernels:
            apply_liger_kernels(model, on_gpu=True)
        model.train()
        loss = micro_batch_loss(model, batch, impl)
        loss.backward()
        results.append((float(loss.detach()), {n: p.grad.float().cpu() for n, p in model.named_parameters()
                                      if p.grad is not None}))
    (expected, expected_grads), (got, got_grads) = results
    assert got == pytest.approx(expected, abs=1e-4)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-2, atol=1e-4, msg=name)
