"""Seeded sampling on the `hf` engine gives the same tokens when another sampled `generate`
runs at the same time in the process (the fan-out evaluates rows on threads of one process,
and transformers samples from torch's one process-wide generator)."""

from __future__ import annotations

import threading

from paravt_core.agent.engine import GenerationRequest, SamplingParams
from paravt_core.agent.hf_engine import HFEngine
from paravt_core.model.loading import load_model


def _engine(tiny_model_dir, tiny_processor) -> HFEngine:
    return HFEngine(load_model(tiny_model_dir), tiny_processor)


def _requests(tiny_processor) -> list[GenerationRequest]:
    ids = tiny_processor.tokenizer("Which colour is the ball at the end?")["input_ids"]
    return [GenerationRequest(list(ids)) for _ in range(4)]


def test_a_seeded_sample_does_not_depend_on_a_sampler_in_another_thread(tiny_model_dir, tiny_processor):
    mine, other = _engine(tiny_model_dir, tiny_processor), _engine(tiny_model_dir, tiny_processor)
    requests = _requests(tiny_processor)
    params = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=1.0, seed=7)
    alone = [g.token_ids for g in mine.generate(requests, params)]

    stop = threading.Event()
    other_calls = []

    def keep_sampling() -> None:
        seed = 0
        while not stop.is_set():
            other.generate(requests, SamplingParams(max_new_tokens=24, temperature=1.0, seed=seed))
            other_calls.append(seed)
            seed += 1

    thread = threading.Thread(target=keep_sampling, daemon=True)
    thread.start()
    try:
        beside = [[g.token_ids for g in mine.generate(requests, params)] for _ in range(4)]
    finally:
        stop.set()
        thread.join(timeout=120)
    assert other_calls, "the other thread never sampled: the test proved nothing"
    assert all(tokens == alone for tokens in beside)
