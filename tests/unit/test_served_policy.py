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
