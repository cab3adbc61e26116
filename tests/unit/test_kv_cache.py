"""The hf engine's preallocated key/value cache: same generations as transformers' DynamicCache, no per-step copy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.cache_utils import DynamicCache

from paravt_core.agent import hf_engine
from paravt_core.agent.engine import GenerationRequest, SamplingParams, VisionInputs
from paravt_core.agent.kv_cache import PreallocatedCache


def _image_requests(processor) -> list[GenerationRequest]:
    """Three prompts of different lengths, two with frames: a left-padded batch with media."""
    rng = np.random.default_rng(0)
    requests = []
    for frames, words in ((2, 3), (0, 9), (1, 1)):
        content = [{"type": "image"} for _ in range(frames)] + [{"type": "text", "text": " colour" * words}]
        text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                             tokenize=False)
        images = [rng.integers(0, 255, (64, 96, 3), dtype=np.uint8) for _ in range(frames)] or None
        encoded = processor(text=[text], images=images, return_tensors="pt")
        vision = VisionInputs(pixel_values=encoded.get("pixel_values"), image_grid_thw=encoded.get("image_grid_thw"))
        requests.append(GenerationRequest(encoded["input_ids"][0].tolist(), vision))
    return requests


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_generations_equal_the_dynamic_cache_ones(tiny_model, tiny_processor, monkeypatch, temperature):
    engine = hf_engine.HFEngine(tiny_model, tiny_processor)
    requests = _image_requests(tiny_processor)
    params = SamplingParams(max_new_tokens=12, temperature=temperature, seed=5, stop_token_ids=(-1,))
    preallocated = engine.generate(requests, params)
    monkeypatch.setattr(hf_engine, "PreallocatedCache", lambda layers, capacity: DynamicCache())
    dynamic = engine.generate(requests, params)
    assert [g.token_ids for g in preallocated] == [g.token_ids for g in dynamic]
    assert [g.logprobs for g in preallocated] == [g.logprobs for g in dynamic]  # bit for bit, not approximately
    assert all(len(g.token_ids) == 12 for g in preallocated)


def test_the_engine_decodes_into_one_buffer_per_layer(tiny_model, tiny_processor, monkeypatch):
    """The cache handed to `generate` is allocated once for prompt + max_new_tokens and every
    step writes into it: no step copies the cache (transformers' DynamicCache concatenates)."""
    engine = hf_engine.HFEngine(tiny_model, tiny_processor)
    caches = []
    generate = tiny_model.generate

    def spying(*args, **kwargs):
        caches.append(kwargs.get("past_key_values"))
        return generate(*args, **kwargs)

    monkeypatch.setattr(tiny_model, "generate", spying)
    requests = _image_requests(tiny_processor)
    engine.generate(requests, SamplingParams(max_new_tokens=7, stop_token_ids=(-1,)))
    (cache,) = caches
    assert isinstance(cache, PreallocatedCache), "generate was not given the preallocated cache"
    prompt = max(len(r.prompt_ids) for r in requests)
    for layer in cache.layers:
        assert layer._key_buffer.shape[-2] == prompt + 7
        # 7 generated tokens: the last one is never fed back, so prompt + 6 positions were written
        assert layer.keys.shape[-2] == prompt + 6
        assert layer.keys.data_ptr() == layer._key_buffer.data_ptr()
        assert layer.values.data_ptr() == layer._value_buffer.data_ptr()


def test_a_cache_grows_past_its_capacity_instead_of_failing():
    cache = PreallocatedCache(num_layers=1, capacity=2)
    first = torch.arange(8.0).reshape(1, 1, 2, 4)
    cache.update(first, -first, 0)
    keys, values = cache.update(torch.full((1, 1, 1, 4), 9.0), torch.full((1, 1, 1, 4), -9.0), 0)
    assert keys.shape == (1, 1, 3, 4) and cache.get_seq_length() == 3
    torch.testing.assert_close(keys[:, :, :2], first)
    torch.testing.assert_close(values[:, :, 2], torch.full((1, 1, 4), -9.0))


def test_a_cache_needs_a_layer_and_a_position():
    with pytest.raises(ValueError, match="at least one layer"):
        PreallocatedCache(num_layers=0, capacity=4)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_repeated_prompt_is_prefilled_once_with_the_same_generations(tiny_model, tiny_processor, monkeypatch,
                                                                         temperature):
    """Issue #64 item 3: with `share_prompts` a prompt that several requests repeat (a GRPO
    group) runs through the model once, its cache copied to each of them, and the generations
    are those of computing every prompt: the same tokens, log-probs to rounding. Uneven
    prompt lengths, media in two of the three prompts, repeats not next to each other."""
    first, second, third = _image_requests(tiny_processor)
    requests = [first, second, first, third, second, first]
    params = SamplingParams(max_new_tokens=10, temperature=temperature, seed=5, stop_token_ids=(-1,))
    plain = hf_engine.HFEngine(tiny_model, tiny_processor).generate(requests, params)
    patches = []
    visual = tiny_model.model.visual
    forward = visual.forward

    def counting(pixels, *args, **kwargs):  # the vision tower sees every pixel a prompt pass computes
        patches.append(pixels.shape[0])
        return forward(pixels, *args, **kwargs)

    monkeypatch.setattr(visual, "forward", counting)
    shared = hf_engine.HFEngine(tiny_model, tiny_processor, share_prompts=True).generate(requests, params)
    distinct = sum(r.vision.pixel_values.shape[0] for r in (first, second, third) if r.vision.pixel_values is not None)
    assert patches == [distinct], f"the vision tower saw {patches} patches, not the distinct prompts' {distinct} once"
    assert [g.token_ids for g in shared] == [g.token_ids for g in plain]
    for a, b in zip(shared, plain):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
    assert shared[0].token_ids == shared[2].token_ids == shared[5].token_ids or temperature > 0


def test_requests_are_grouped_by_a_shared_start_that_holds_their_media():
    media = VisionInputs(pixel_values=torch.ones(4, 2), image_grid_thw=torch.tensor([[1, 2, 2]]))
    same_values = VisionInputs(pixel_values=torch.ones(4, 2), image_grid_thw=torch.tensor([[1, 2, 2]]))
    other_pixels = VisionInputs(pixel_values=torch.zeros(4, 2), image_grid_thw=torch.tensor([[1, 2, 2]]))
    crop = VisionInputs(pixel_values=torch.full((4, 2), 3.0), image_grid_thw=torch.tensor([[1, 2, 2]]))
    other_crop = VisionInputs(pixel_values=torch.full((4, 2), 4.0), image_grid_thw=torch.tensor([[1, 2, 2]]))
    requests = [GenerationRequest([1, 2, 3, 4], media),
                GenerationRequest([1, 2, 3, 9], same_values),  # equal media, 3 tokens shared
                GenerationRequest([1, 2, 3, 4], other_pixels),  # the same ids, other pixels: alone
                GenerationRequest([1, 2, 7]), GenerationRequest([1, 2, 8]),  # text only, 2 shared
                GenerationRequest([1, 99, 5, 6], crop), GenerationRequest([1, 99, 7], crop),  # 99 held in 2 shared
                GenerationRequest([1, 98, 99, 3], crop),  # shares 1 token, short of its media token: alone
                GenerationRequest([1, 99, 3], other_crop)]
    firsts, groups, shared = hf_engine.shared_prefixes(requests, media_token_ids=(99,))
    assert firsts == [0, 2, 3, 5, 7, 8]
    assert groups == [0, 0, 1, 2, 2, 3, 3, 4, 5]
    assert shared == [3, 3, 2, 2, 3, 2]  # a request alone shares all but its last token with itself
    # a repeat shares all but its last token; a later request narrows its group to what they share
    # while that is half of every member's prompt, and starts its own group below that
    repeats = [GenerationRequest([5, 6, 7, 8]), GenerationRequest([5, 6, 7, 8]), GenerationRequest([5, 6, 9, 9]),
               GenerationRequest([5, 8, 9, 9])]
    assert hf_engine.shared_prefixes(repeats) == ([0, 3], [0, 0, 0, 1], [2, 3])


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_shared_start_with_different_rests_is_prefilled_once(tiny_model, tiny_processor, monkeypatch,
                                                               temperature):
    """Issue #64 item 3 at a later turn: a group's requests share their prompt, media included,
    then each has its own rest (a rollout's first turn and tool responses) of its own length. The
    shared part runs once (the vision tower sees each distinct image once), the rests after it
    with padding between, and the generations are those of computing every prompt."""
    first, second, third = _image_requests(tiny_processor)
    tokens = tiny_processor.tokenizer
    turn = lambda text: tokens(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    one, two, three = turn(" red"), turn(" a blue block then green"), turn(" yellow at the end")
    requests = [GenerationRequest(first.prompt_ids + one, first.vision),
                GenerationRequest(first.prompt_ids + two, first.vision), third,
                GenerationRequest(first.prompt_ids + three, first.vision),
                GenerationRequest(second.prompt_ids + two), GenerationRequest(second.prompt_ids + one)]
    params = SamplingParams(max_new_tokens=8, temperature=temperature, seed=3, stop_token_ids=(-1,))
    plain = hf_engine.HFEngine(tiny_model, tiny_processor).generate(requests, params)
    patches, prefilled = [], []
    visual, language = tiny_model.model.visual, tiny_model.model.language_model
    forward = visual.forward

    def counting(pixels, *args, **kwargs):
        patches.append(pixels.shape[0])
        return forward(pixels, *args, **kwargs)

    monkeypatch.setattr(visual, "forward", counting)
    hook = language.register_forward_pre_hook(
        lambda module, args, kwargs: prefilled.append(tuple(kwargs["inputs_embeds"].shape[:2])), with_kwargs=True)
    try:
        shared = hf_engine.HFEngine(tiny_model, tiny_processor, share_prompts=True).generate(requests, params)
    finally:
        hook.remove()
    distinct = sum(r.vision.pixel_values.shape[0] for r in (first, third))
    assert patches == [distinct]
    # the shared parts (first's prompt, third alone, second's prompt), then the six rests, then decoding
    assert prefilled[0][0] == 3 and prefilled[1][0] == 6 and all(shape == (6, 1) for shape in prefilled[2:])
    assert prefilled[0][1] == len(first.prompt_ids)
    assert [g.token_ids for g in shared] == [g.token_ids for g in plain]
    for a, b in zip(shared, plain):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_text_only_requests_share_their_start_too(tiny_model, tiny_processor, temperature):
    """No media in the whole batch: the positions are the attended tokens counted from 0, as
    `generate` counts them (this path once needed media to set M-RoPE's offsets and failed)."""
    tokens = tiny_processor.tokenizer
    system = tokens("You answer questions about videos. Call crop_video to look closer.",
                    add_special_tokens=False)["input_ids"]
    requests = [GenerationRequest(system + tokens(text, add_special_tokens=False)["input_ids"])
                for text in (" red", " red", " blue then green", " yellow")]
    params = SamplingParams(max_new_tokens=6, temperature=temperature, seed=2, stop_token_ids=(-1,))
    plain = hf_engine.HFEngine(tiny_model, tiny_processor).generate(requests, params)
    shared = hf_engine.HFEngine(tiny_model, tiny_processor, share_prompts=True).generate(requests, params)
    assert [g.token_ids for g in shared] == [g.token_ids for g in plain]
    for a, b in zip(shared, plain):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)


@pytest.mark.gpu
def test_a_shared_start_with_media_is_prefilled_on_the_card(tiny_model_dir, tiny_processor):
    """The shared prefill hands the model its media on the model's device, as `generate` does (on a
    CUDA model it once passed the CPU pixels: "Input type (CPUBFloat16Type) and weight type
    (CUDABFloat16Type) should be the same", bench/rl_gpu.py with rl.shared_prefix). Greedy tokens equal
    the plain path's on the card, in float32; log-probs within the card's rounding (TF32 convolutions)."""
    from paravt_core.model.loading import load_model

    model = load_model(tiny_model_dir, device="cuda")
    first, _, third = _image_requests(tiny_processor)
    tokens = tiny_processor.tokenizer
    rests = [tokens(text, add_special_tokens=False)["input_ids"] for text in (" red", " a blue block", " green")]
    requests = [GenerationRequest(first.prompt_ids + rest, first.vision) for rest in rests] + [third]
    params = SamplingParams(max_new_tokens=8, stop_token_ids=(-1,))
    plain = hf_engine.HFEngine(model, tiny_processor).generate(requests, params)
    shared = hf_engine.HFEngine(model, tiny_processor, share_prompts=True).generate(requests, params)
    assert [g.token_ids for g in shared] == [g.token_ids for g in plain]
    for a, b in zip(shared, plain):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-2, rtol=0)
