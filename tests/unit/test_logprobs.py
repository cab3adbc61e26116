"""Chunked log-probs of selected tokens (SPEC §5): the full log-softmax's values and gradients."""

from __future__ import annotations

import pytest
import torch

from paravt_core.model.logprobs import output_layers, selected_token_logprobs

HIDDEN, VOCAB, TEMPERATURE = 16, 50, 0.7


def _head() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(HIDDEN, VOCAB, bias=False)


def _rows(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hidden [n, H] requiring grad, targets [n], loss weights [n])."""
    gen = torch.Generator().manual_seed(n)
    hidden = torch.randn(n, HIDDEN, generator=gen).requires_grad_()
    return hidden, torch.randint(0, VOCAB, (n,), generator=gen), torch.randn(n, generator=gen)


def _values_and_grads(fn, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    head = _head()
    hidden, targets, weights = _rows(n)
    values = fn(head, hidden, targets)
    (values * weights).sum().backward()
    return values.detach(), hidden.grad, head.weight.grad


def _full_log_softmax(head, hidden, targets):
    return torch.log_softmax(head(hidden) / TEMPERATURE, dim=-1).gather(-1, targets[:, None]).squeeze(-1)


@pytest.mark.parametrize("n", [0, 13])
@pytest.mark.parametrize("chunk_size", [1, 4, 5, 13, 1024])
def test_values_and_gradients_equal_the_full_log_softmax(n, chunk_size):
    ours = _values_and_grads(lambda h, x, t: selected_token_logprobs(h, x, t, TEMPERATURE, chunk_size), n)
    reference = _values_and_grads(_full_log_softmax, n)
    assert ours[0].dtype == torch.float32 and ours[0].shape == (n,)
    for name, mine, expected in zip(("values", "d/d hidden", "d/d head weight"), ours, reference):
        torch.testing.assert_close(mine, expected, atol=1e-5, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_without_grad_the_values_are_the_same_and_carry_no_graph():
    head = _head()
    hidden, targets, _ = _rows(13)
    with torch.no_grad():
        values = selected_token_logprobs(head, hidden, targets, TEMPERATURE, chunk_size=4)
        expected = _full_log_softmax(head, hidden, targets)
    assert values.grad_fn is None
    torch.testing.assert_close(values, expected, atol=1e-5, rtol=1e-5)


def test_backward_recomputes_each_chunk_instead_of_keeping_its_logits():
    head = _head()
    calls = []
    head.register_forward_hook(lambda module, args, output: calls.append(output.shape[0]))
    hidden, targets, weights = _rows(13)
    values = selected_token_logprobs(head, hidden, targets, TEMPERATURE, chunk_size=5)
    assert calls == [5, 5, 3]  # one [chunk, V] block at a time
    (values * weights).sum().backward()
    assert sorted(calls[3:]) == [3, 5, 5]  # backward projected each chunk again (last first)
    with torch.no_grad():
        selected_token_logprobs(head, hidden, targets, TEMPERATURE, chunk_size=5)
    assert len(calls) == 9  # no recompute is set up without grad


def test_float32_log_probs_from_a_bfloat16_head():
    head = _head().to(torch.bfloat16)
    hidden, targets, _ = _rows(7)
    values = selected_token_logprobs(head, hidden.detach().to(torch.bfloat16), targets, TEMPERATURE, chunk_size=3)
    expected = torch.log_softmax(head(hidden.to(torch.bfloat16)).float() / TEMPERATURE, -1)
    assert values.dtype == torch.float32
    torch.testing.assert_close(values, expected.gather(-1, targets[:, None]).squeeze(-1), atol=1e-5, rtol=1e-5)


def test_mismatched_shapes_and_chunk_sizes_are_refused():
    head = _head()
    hidden, targets, _ = _rows(4)
    with pytest.raises(ValueError, match=r"hidden must be \[N, H\] with targets \[N\]"):
        selected_token_logprobs(head, hidden, targets[:3], TEMPERATURE)
    with pytest.raises(ValueError, match="chunk_size must be at least 1"):
        selected_token_logprobs(head, hidden, targets, TEMPERATURE, chunk_size=0)


def test_a_model_without_the_qwen3_vl_layout_is_named_in_the_error():
    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.module = torch.nn.Linear(2, 2)

    with pytest.raises(TypeError, match=r"Qwen3-VL-style causal LM .* got Wrapper holding Linear"):
        output_layers(Wrapper())
