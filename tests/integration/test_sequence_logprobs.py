"""`sequence_logprobs` on the tiny Qwen3-VL without [B, L, V] logits: the full-vocabulary values and gradients."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from paravt_core.agent.engine import Generation, GenerationRequest
from paravt_core.agent.hf_engine import pad_requests
from paravt_core.config import load_config
from paravt_core.model.logprobs import LOGPROB_CHUNK
from paravt_core.rl.policy import left_pad, sequence_logprobs, trajectories

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
TEMPERATURE = 0.7
ANSWERS = ["the square is red</think>\n<answer>A</answer><|im_end|>",
           "a red square moves right, then it stops</think>\n<answer>B</answer><|im_end|>"]


class _Answers:
    """A rollout engine writing ANSWERS[i] for the batch's request i (a test double for generation)."""

    def __init__(self, processor):
        self.tok = processor.tokenizer

    def generate(self, requests, params):
        ids = [self.tok(ANSWERS[i], add_special_tokens=False)["input_ids"] for i in range(len(requests))]
        return [Generation(list(row), [-1.0] * len(row), "stop") for row in ids]


@pytest.fixture()
def batch(tiny_model, tiny_processor, short_video):
    """(two trajectories of different lengths with overview frames as images, token ids of the model)."""
    from paravt_core.agent.prompts import question_prompt
    from paravt_core.agent.rollout import run_episodes

    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", ["video.nframes=2", "video.max_pixels=3072",
                                                         "rl.rollout.max_turns=0"])
    prompts = [question_prompt("a", short_video, "What colour is the square?"),
               question_prompt("b", short_video, "Where does the square go, and when does it stop?")]
    episodes = run_episodes(_Answers(tiny_processor), tiny_processor, prompts, cfg.rl.rollout, cfg.video)
    trajs = trajectories(episodes, train_subagents=False)
    assert trajs[0].token_ids.numel() != trajs[1].token_ids.numel()
    assert all(t.vision.pixel_values is not None for t in trajs)
    ids = {"pad": tiny_processor.tokenizer.pad_token_id, "image": tiny_model.config.image_token_id,
           "video": tiny_model.config.video_token_id}
    return trajs, ids


def _model_inputs(trajs, ids) -> dict[str, torch.Tensor]:
    padded = pad_requests([GenerationRequest(t.token_ids.tolist(), t.vision) for t in trajs], ids["pad"],
                          ids["image"], ids["video"])
    return padded.model_inputs(torch.device("cpu"))


def _full_vocabulary_logprobs(model, inputs) -> torch.Tensor:
    """The computation `sequence_logprobs` replaced: [B, L, V] float32 logits, log_softmax, gather."""
    logits = model(**inputs).logits.float() / TEMPERATURE  # [B, L, V]
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, inputs["input_ids"][:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(logp, (1, 0))


def _values_and_grads(model, compute, weights) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logp = compute()
    (logp * weights).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), grads


@pytest.mark.parametrize("chunk", [LOGPROB_CHUNK, 13])
@pytest.mark.parametrize("select", ["every position", "loss-mask positions"])
def test_values_and_gradients_equal_the_full_vocabulary_computation(tiny_model, batch, select, chunk):
    trajs, ids = batch
    length = max(t.token_ids.numel() for t in trajs)
    needed = left_pad([t.loss_mask for t in trajs], length, torch.bool) if select == "loss-mask positions" else None
    keep = torch.ones(len(trajs), length) if needed is None else needed.float()  # [B, L]
    weights = torch.randn(len(trajs), length, generator=torch.Generator().manual_seed(0)) * keep  # [B, L]

    def ours() -> torch.Tensor:
        logp, valid = sequence_logprobs(tiny_model, trajs, ids["pad"], ids["image"], ids["video"], TEMPERATURE,
                                        "cpu", needed=needed, chunk=chunk)
        assert torch.equal(valid, left_pad([torch.ones_like(t.token_ids) for t in trajs], length, torch.long))
        return logp

    values, grads = _values_and_grads(tiny_model, ours, weights)
    inputs = _model_inputs(trajs, ids)
    expected, expected_grads = _values_and_grads(tiny_model, lambda: _full_vocabulary_logprobs(tiny_model, inputs),
                                                 weights)
    assert values.shape == (len(trajs), length) and values.dtype == torch.float32
    torch.testing.assert_close(values, expected * keep, atol=1e-5, rtol=1e-5)
    assert (values[:, 0] == 0).all() and (values[keep == 0] == 0).all()
    assert grads.keys() == expected_grads.keys() and "lm_head.weight" in grads
    # float32 sums in another order (chunks, and the thread count: one per pytest-xdist worker)
    # move an embedding gradient by up to 2e-5 here (measured at one thread); a wrong chunk or
    # index moves it by orders of magnitude more.
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], atol=5e-5, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")

    with torch.no_grad():  # the reference pass's path: no checkpointing
        logp, _ = sequence_logprobs(tiny_model, trajs, ids["pad"], ids["image"], ids["video"], TEMPERATURE, "cpu",
                                    needed=needed, chunk=chunk)
    torch.testing.assert_close(logp, values, atol=1e-6, rtol=0)


def test_a_wrapped_model_is_read_through_its_module(tiny_model, batch):
    """A DeepSpeedEngine (or DDP) holds the HF model as `.module` and is what gets called."""
    trajs, ids = batch

    class Engine(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module, self.calls = module, 0

        def forward(self, **inputs):
            self.calls += 1
            return self.module(**inputs)

    engine = Engine(tiny_model)
    with torch.no_grad():
        wrapped, _ = sequence_logprobs(engine, trajs, ids["pad"], ids["image"], ids["video"], TEMPERATURE, "cpu")
        bare, _ = sequence_logprobs(tiny_model, trajs, ids["pad"], ids["image"], ids["video"], TEMPERATURE, "cpu")
    assert engine.calls == 1 and torch.equal(wrapped, bare)


# --- ZeRO-3 on two CPU ranks: every head call all-gathers the head's weight, a collective ----------------

CHUNK = 7


def _uneven_batch(rank: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Rank r's text batch and wanted positions: 14 on rank 0, 99 on rank 1 (2 and 15 chunks of CHUNK)."""
    ids = torch.randint(0, 512, (1, 120), generator=torch.Generator().manual_seed(rank))  # below any tiny vocab
    needed = torch.zeros(1, 120, dtype=torch.bool)
    needed[0, 1 : 15 if rank == 0 else 100] = True
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, needed


def _zero3_rank(rank: int, model_dir: str, folder: str) -> None:
    """One of two ranks: a ZeRO-3 policy engine's log-probs and full gradients on `_uneven_batch(rank)`."""
    import datetime
    import os

    import deepspeed
    import torch.distributed as dist
    from deepspeed.utils import safe_get_full_grad

    from paravt_core.dist.ds_config import rl_deepspeed_config, zero_optimizer
    from paravt_core.model.loading import load_model
    from paravt_core.model.logprobs import teacher_forced_logprobs

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(1)
    # A rank left alone in a collective fails within a minute instead of gloo's 30.
    dist.init_process_group("gloo", store=dist.FileStore(f"{folder}/rendezvous", 2), rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", ["rl.zero_stage=3"])
    zero3 = rl_deepspeed_config(cfg, on_gpu=False)
    model = load_model(Path(model_dir), zero3_config=zero3)
    optimizer = zero_optimizer(model.parameters(), lr=1e-3, weight_decay=0.0, zero=cfg.rl.deepspeed)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=zero3)
    inputs, needed = _uneven_batch(rank)
    logp = teacher_forced_logprobs(engine, inputs, TEMPERATURE, needed, chunk_size=CHUNK)
    engine.backward(logp.sum())
    grads = {name: safe_get_full_grad(p) for name, p in engine.module.named_parameters()}
    with torch.no_grad():  # the ZeRO-3 reference engine's path
        again = teacher_forced_logprobs(engine, inputs, TEMPERATURE, needed, chunk_size=CHUNK)
    # SFT's chunked loss where rank 1 trains no token at all: it must still run rank 0's head gathers.
    from paravt_core.sft.loss import micro_batch_loss

    ids = inputs["input_ids"]
    labels = ids.clone() if rank == 0 else torch.full_like(ids, -100)
    sft_loss = micro_batch_loss(engine, {**inputs, "labels": labels}, "chunked", chunk_size=CHUNK)
    engine.backward(sft_loss)
    torch.save({"logp": logp.detach(), "no_grad": again, "grads": grads, "sft_loss": float(sft_loss.detach())},
               f"{folder}/rank{rank}.pt")
    dist.destroy_process_group()


def test_zero3_ranks_with_different_chunk_counts_stay_in_step(tmp_path, tiny_model_dir, tiny_model):
    import torch.multiprocessing as mp

    mp.spawn(_zero3_rank, args=(str(tiny_model_dir), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    assert ranks[1]["sft_loss"] == 0.0 and ranks[0]["sft_loss"] > 0  # no trained token: loss 0, no hang
    for rank, result in enumerate(ranks):
        inputs, needed = _uneven_batch(rank)
        expected = _full_vocabulary_logprobs(tiny_model, inputs) * needed  # [1, L]
        (expected.sum() / 2).backward()  # DeepSpeed averages the ranks' gradients
        torch.testing.assert_close(result["logp"], expected.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(result["no_grad"], expected.detach(), atol=1e-5, rtol=1e-5)
    for name, param in tiny_model.named_parameters():
        if param.grad is not None:
            torch.testing.assert_close(ranks[0]["grads"][name], param.grad, atol=1e-5, rtol=1e-5,
                                       msg=lambda m, n=name: f"{n}: {m}")
