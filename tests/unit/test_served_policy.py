"""The served-policy probe (`rl/served_policy.py`, issue #48) with the tiny model: a server
holding the policy's weights passes, one holding another checkpoint's is stopped. The
"server" is an `HFEngine` (the embedded rollout engine) on its own copy of the weights;
the probe on a real vLLM is in tests/server/test_vllm_rollouts.py."""

from __future__ import annotations

import pytest


def test_the_probe_passes_the_policys_weights_and_stops_another_checkpoints(tiny_model_dir, tiny_processor,
                                                                           tmp_path):
    from paravt_core.agent.hf_engine import HFEngine
    from paravt_core.model.loading import load_model
    from paravt_core.model.tiny import TinyModelSpec, build_tiny_model
    from paravt_core.rl.served_policy import (
        PROBE_NEW_TOKENS,
        TOLERANCE,
        ServedPolicyMismatch,
        check_gap,
        draw_probe,
        logprob_gap,
        probe_tolerance,
        trainer_logprobs,
    )

    policy = load_model(tiny_model_dir).eval()
    tokenizer = tiny_processor.tokenizer
    same = HFEngine(load_model(tiny_model_dir).eval(), tiny_processor)
    probe = draw_probe(same, tokenizer, temperature=0.7, seed=3)
    assert 1 <= len(probe.token_ids) == len(probe.served_logprobs) <= PROBE_NEW_TOKENS
    gap = logprob_gap(probe, trainer_logprobs(policy, probe, 0.7, "cpu"))
    assert gap < 1e-5, gap
    check_gap(gap, probe_tolerance("float32", None), "http://127.0.0.1:1")

    other_dir = build_tiny_model(TinyModelSpec(seed=1), tmp_path / "other")  # same shapes, other weights
    other = HFEngine(load_model(other_dir).eval(), tiny_processor)
    probe = draw_probe(other, tokenizer, temperature=0.7, seed=3)
    wrong = logprob_gap(probe, trainer_logprobs(policy, probe, 0.7, "cpu"))
    assert wrong > 10 * TOLERANCE["float32"], wrong
    with pytest.raises(ServedPolicyMismatch, match=r"the rollout server at http://127.0.0.1:1 does not serve the "
                                                   r"policy: .* differ from the trainer's by [\d.e-]+ nats per token"):
        check_gap(wrong, probe_tolerance("float32", None), "http://127.0.0.1:1")
    assert probe_tolerance("bfloat16", None) == TOLERANCE["bfloat16"] and probe_tolerance("float32", 0.5) == 0.5


def test_a_server_that_does_not_answer_the_probe_is_named_before_the_collective_times_out(tmp_path):
    """#60 finding 7: rank 0's probe waited up to rl.rollout.vllm.request_timeout_s (3600 s) while
    the other ranks waited in the probe's broadcast, whose timeout (DeepSpeed's, 10 min) came
    first and named NCCL, not the server."""
    import threading
    import time

    from paravt_core.agent.vllm_engine import VLLMEngine, VLLMServerError
    from paravt_core.config import SGLangServerConfig, VLLMServerConfig
    from paravt_core.rl.served_policy import collective_timeout_s, draw_probe, probe_timeout_s
    from tests.http_stand_in import StandIn

    collective = collective_timeout_s()
    for server in (VLLMServerConfig(), SGLangServerConfig(placement="split", gpus=(7,))):
        assert server.request_timeout_s > collective > probe_timeout_s(server.request_timeout_s, collective)

    released = threading.Event()
    with StandIn(lambda path, body: released.wait(60) and {}) as stand_in:
        engine = VLLMEngine(stand_in.url, tmp_path, tmp_path, {"<|image_pad|>": 9}, timeout_s=3600.0)
        started = time.monotonic()
        try:
            with pytest.raises(VLLMServerError, match=f"vLLM server at {stand_in.url}/inference/v1/generate"):
                draw_probe(engine, lambda text, add_special_tokens: {"input_ids": [1, 2, 3]}, 0.7, 3,
                           collective_s=2.0)
        finally:
            released.set()
        assert time.monotonic() - started < 10 and engine.timeout_s == 3600.0  # the rollouts' timeout is back
