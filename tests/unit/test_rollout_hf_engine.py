"""The hf engine's pure parts: left padding with media, stop cutting, step logprobs."""

from __future__ import annotations

import pytest
import torch

from paravt_core.agent.engine import GenerationRequest, VisionInputs
from paravt_core.agent.hf_engine import StepLogprobRecorder, cut_at_stop, pad_requests, token_budget_batches

PAD, IMAGE, VIDEO = 0, 8, 9


def _vision(rows: int, fill: float) -> VisionInputs:
    return VisionInputs(pixel_values_videos=torch.full((rows, 2), fill), video_grid_thw=torch.tensor([[1, rows, 1]]))


def test_pad_requests_left_pads_marks_media_and_concatenates_pixels_in_order():
    requests = [
        GenerationRequest([1, VIDEO, VIDEO, 2], _vision(2, 1.0)),
        GenerationRequest([3]),
        GenerationRequest([4, IMAGE, VIDEO, 5, 6, 7], _vision(1, 2.0)),
    ]
    batch = pad_requests(requests, PAD, IMAGE, VIDEO)
    assert batch.input_ids.tolist() == [[0, 0, 1, 9, 9, 2], [0, 0, 0, 0, 0, 3], [4, 8, 9, 5, 6, 7]]
    assert batch.attention_mask.tolist() == [[0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1], [1] * 6]
    assert batch.mm_token_type_ids.tolist() == [[0, 0, 0, 2, 2, 0], [0] * 6, [0, 1, 2, 0, 0, 0]]
    assert batch.vision.pixel_values_videos[:, 0].tolist() == [1.0, 1.0, 2.0]
    assert batch.vision.video_grid_thw.tolist() == [[1, 2, 1], [1, 1, 1]]
    assert batch.vision.pixel_values is None


def test_cut_at_stop_keeps_the_first_stop_token():
    assert cut_at_stop([5, 6, 2, 7, 2], {2}) == ([5, 6, 2], True)
    assert cut_at_stop([5, 6, 7], {2}) == ([5, 6, 7], False)
    assert cut_at_stop([3, 5], {2, 3}) == ([3], True)


def test_step_recorder_scores_each_chosen_token_at_the_temperature():
    scores = [torch.tensor([[0.0, 1.0, 2.0], [2.0, 0.0, 0.0]]), torch.tensor([[1.0, 1.0, 3.0], [0.0, 0.0, 5.0]])]
    chosen = [torch.tensor([2, 0]), torch.tensor([1, 2])]
    recorder = StepLogprobRecorder(temperature=0.5)
    prefix = torch.zeros((2, 4), dtype=torch.long)
    sequence = prefix
    for step_scores, step_tokens in zip(scores, chosen):
        assert recorder(sequence, step_scores) is step_scores  # scores pass through unchanged
        sequence = torch.cat([sequence, step_tokens[:, None]], dim=1)
    got = recorder.finish(sequence[:, -1])
    per_step = [torch.log_softmax(s / 0.5, -1).gather(1, c[:, None])[:, 0] for s, c in zip(scores, chosen)]
    expected = torch.stack(per_step, dim=1)
    assert got.shape == (2, 2)
    torch.testing.assert_close(got, expected)


def test_step_recorder_greedy_uses_the_plain_distribution():
    recorder = StepLogprobRecorder(temperature=0.0)
    scores = torch.tensor([[0.0, 2.0]])
    recorder(torch.zeros((1, 1), dtype=torch.long), scores)
    got = recorder.finish(torch.tensor([1]))
    torch.testing.assert_close(got, torch.log_softmax(scores, -1)[:, 1:])


def test_step_recorder_masks_tokens_after_recording_them():
    recorder = StepLogprobRecorder(temperature=1.0, masked_token_ids=[1])
    scores = torch.tensor([[0.0, 5.0, 1.0]])
    returned = recorder(torch.zeros((1, 1), dtype=torch.long), scores)
    assert returned[0, 1] == float("-inf") and returned[0, 2] == 1.0
    assert scores[0, 1] == 5.0  # the caller's tensor is untouched
    got = recorder.finish(torch.tensor([2]))
    torch.testing.assert_close(got, torch.log_softmax(scores, -1)[:, 2:])


class _TiedLM(torch.nn.Module):
    """An embedding and an output head sharing one weight, as Qwen3-VL-2B ties them."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.lm_head = torch.nn.Linear(3, 5, bias=False)
        self.lm_head.weight = self.embed.weight


def test_update_weights_accepts_a_tied_weight_named_once_and_still_refuses_a_missing_one():
    """A ZeRO-3 gather names a tied tensor once (found on the GPU at the 2B shape)."""
    from paravt_core.agent.hf_engine import HFEngine

    engine = HFEngine.__new__(HFEngine)
    engine.model = _TiedLM()
    new = torch.arange(15, dtype=torch.float32).view(5, 3)
    engine.update_weights({"embed.weight": new})
    assert torch.equal(engine.model.lm_head.weight, new) and torch.equal(engine.model.embed.weight, new)

    class Untied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(5, 3)
            self.lm_head = torch.nn.Linear(3, 5, bias=False)

    engine.model = Untied()
    with pytest.raises(KeyError, match="lm_head.weight"):
        engine.update_weights({"embed.weight": new})


@pytest.mark.parametrize("lengths, budget, expected", [
    ([5, 3, 4], None, [[0, 1, 2]]),
    ([5, 3, 4], 10, [[0, 1], [2]]),  # 2 x 5 fits; 3 x 5 does not
    ([5, 3, 4], 15, [[0, 1, 2]]),
    ([3, 9, 2, 2], 8, [[0], [1], [2, 3]]),  # 9 > 8 goes alone; 2 x 3 would not hold 9
    ([2, 2, 2, 2, 2], 4, [[0, 1], [2, 3], [4]]),
    ([], 4, [[]]),
])
def test_token_budget_batches_cut_in_order_by_padded_prompt_tokens(lengths, budget, expected):
    assert [list(r) for r in token_budget_batches(lengths, budget)] == expected


def test_pad_requests_copies_each_requests_pixels_once(monkeypatch):
    """Merging a batch's media request by request copied the growing pixel tensor again for every
    request (quadratic in the batch; 378 ms of a 16-row generate, docs/speed.md): one concatenation per tensor."""
    copied = []
    cat = torch.cat

    def counting_cat(tensors, *args, **kwargs):
        out = cat(tensors, *args, **kwargs)
        copied.append(out.numel())
        return out

    requests = [GenerationRequest([1, VIDEO, 2], _vision(1, float(i))) for i in range(6)]
    monkeypatch.setattr(torch, "cat", counting_cat)
    batch = pad_requests(requests, PAD, IMAGE, VIDEO)
    monkeypatch.undo()
    assert batch.vision.pixel_values_videos[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert batch.vision.video_grid_thw.tolist() == [[1, 1, 1]] * 6
    assert sorted(copied) == [6 * 2, 6 * 3]  # the pixels and the grids, each concatenated once


def test_merged_vision_keeps_the_order_and_the_frames():
    first = VisionInputs(pixel_values=torch.zeros(2, 3), image_grid_thw=torch.tensor([[1, 1, 2]]), frames=("a",))
    second = VisionInputs(pixel_values_videos=torch.ones(1, 3), video_grid_thw=torch.tensor([[1, 1, 1]]),
                          frames=("b",))
    merged = first.merged_with(second).merged_with(VisionInputs())
    assert merged.pixel_values is first.pixel_values and merged.pixel_values_videos is second.pixel_values_videos
    assert merged.frames == ("a", "b")
    assert VisionInputs.concatenated([]).as_kwargs() == {}
