"""The `hf` rollout backend: batched transformers `generate` on a Qwen3-VL model.

One `generate` call continues several requests of different lengths and different media
together: prompts are left-padded to one length, `mm_token_type_ids` marks each request's
image (1) and video (2) placeholder tokens (M-RoPE positions need them), and the pixel
values of all requests are concatenated in request order, which is the order in which
the model scatters them into the placeholder tokens of the padded batch. With a token
budget (`max_batch_tokens`) the requests are cut, in order, into several such calls.

Log-probabilities are recorded step by step while decoding (one [B, V] buffer, not a
[steps, B, V] stack, so long generations fit). They are the policy's log_softmax(logits / T)
over the full vocabulary, exactly what the trainer recomputes from a teacher-forced pass at
the same temperature (`paravt_core.rl.policy.sequence_logprobs`); greedy decoding (T = 0)
records log_softmax(logits), the model's distribution at T = 1. Two things narrow what is
actually sampled without being renormalized into that value, since the trainer does not
apply them either:
- `top_p` < 1;
- media placeholders (`<|image_pad|>`, `<|video_pad|>`, `<|vision_start|>`,
  `<|vision_end|>`) are never generated: a generated placeholder would leave the context
  with more vision tokens than pixels and break the next turn's prefill. They are masked
  after their log-probabilities are recorded; their mass is what the policy loses.

With `share_prompts` (issue #64 item 3), requests that share the start of their prompt (a
GRPO group's G rollouts of one question: the same token ids and media; at a later turn the same
system turn, video and question before each rollout's own first turn and tool responses) have
that shared part prefilled once (`shared_prefixes`). The distinct shared parts run through the
model into the key/value cache, each row of which is copied to every request of its group, with
M-RoPE's per-row position offset (`rope_deltas`); then every request's own rest but its last token
runs in one more pass, and `generate` continues from that cache, computing only the last prompt
token of each row. The cache's columns are [shared part, left-padded | rest, left-padded]: the
padding between a row's shared part and its rest is masked, and positions count the attended
tokens only (transformers' `cumsum(attention_mask) - 1 + rope_deltas`), so every token keeps its
position. A shared part holds all of its requests' media: the rest is text. The tokens and
log-probabilities are those of the plain path to rounding (`tests/unit/test_kv_cache.py`: greedy
and seeded tokens equal, log-probs within 1e-5).

A fresh `GenerationConfig` is built per call with every sampling knob set explicitly, so
no default from a checkpoint's `generation_config.json` (top_k, repetition penalty, ...)
leaks into the rollout.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from paravt_core.agent.engine import Generation, GenerationRequest, SamplingParams, VisionInputs
from paravt_core.agent.kv_cache import PreallocatedCache

TEXT_TOKEN_TYPE = 0
IMAGE_TOKEN_TYPE = 1
VIDEO_TOKEN_TYPE = 2


@dataclass
class PaddedBatch:
    """Left-padded token ids of a batch of requests with their merged media."""

    input_ids: torch.Tensor  # [B, L] int64, left-padded
    attention_mask: torch.Tensor  # [B, L] int64, 0 on padding
    mm_token_type_ids: torch.Tensor  # [B, L] int64: 0 text, 1 image, 2 video
    vision: VisionInputs  # media of all requests, concatenated in request order

    def model_inputs(self, device: torch.device) -> dict[str, torch.Tensor]:
        tensors = {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "mm_token_type_ids": self.mm_token_type_ids,
            **self.vision.as_kwargs(),
        }
        return {name: value.to(device) for name, value in tensors.items()}


def pad_requests(requests: Sequence[GenerationRequest], pad_id: int, image_token_id: int,
                 video_token_id: int) -> PaddedBatch:
    """Left-pad the prompts of `requests` and merge their media in request order."""
    length = max(len(request.prompt_ids) for request in requests)
    input_ids = torch.full((len(requests), length), pad_id, dtype=torch.long)  # [B, L]
    attention_mask = torch.zeros((len(requests), length), dtype=torch.long)  # [B, L]
    for row, request in enumerate(requests):
        if not request.prompt_ids:
            raise ValueError(f"request {row} has no prompt tokens")
        ids = torch.tensor(request.prompt_ids, dtype=torch.long)
        input_ids[row, length - ids.numel():] = ids
        attention_mask[row, length - ids.numel():] = 1
    vision = VisionInputs.concatenated([request.vision for request in requests])
    token_types = torch.zeros_like(input_ids)  # [B, L]
    token_types[input_ids == image_token_id] = IMAGE_TOKEN_TYPE
    token_types[input_ids == video_token_id] = VIDEO_TOKEN_TYPE
    return PaddedBatch(input_ids, attention_mask, token_types, vision)


def token_budget_batches(lengths: Sequence[int], max_tokens: int | None) -> list[range]:
    """Consecutive index ranges of requests whose left-padded prefill (rows x longest prompt)
    stays within `max_tokens`; a prompt longer than the budget goes alone. None: one range."""
    if max_tokens is None or not lengths:
        return [range(len(lengths))]
    batches, start, longest = [], 0, 0
    for index, length in enumerate(lengths):
        longest_with = max(longest, length)
        if index > start and (index - start + 1) * longest_with > max_tokens:
            batches.append(range(start, index))
            start, longest_with = index, length
        longest = longest_with
    batches.append(range(start, len(lengths)))
    return batches


def shared_prefixes(requests: Sequence[GenerationRequest], media_token_ids: Sequence[int] = ()
                    ) -> tuple[list[int], list[int], list[int]]:
    """Group requests by a shared start of their prompt: (each group's first request, each request's
    group, each group's shared length in tokens).

    A request joins the earlier group with which it shares the most tokens, counted against the
    group's first request and capped by what the group already shares, when the requests' media
    are the same (one `VisionInputs` shared by a group, SPEC §3, or equal tensors), the shared part
    covers every media token (`media_token_ids`) of both, leaves each request at least its last
    token and is at least half of every member's prompt: a shorter one would widen the rests that
    every row of the batch computes by more than it saves (two questions on the same frames share
    the system turn and the video, while each question's rollouts share their first turn too). A
    request that joins no group starts its own, sharing all but its last token with itself.
    """
    firsts: list[int] = []
    groups: list[int] = []
    shared: list[int] = []
    covers: list[int] = []  # per group: the tokens its shared part must hold (through its last media token)
    longest: list[int] = []  # per group: its longest prompt
    media = set(media_token_ids)
    for index, request in enumerate(requests):
        ids = request.prompt_ids
        need = media_end(ids, media)
        best, best_length = None, 0
        for group, first in enumerate(firsts):
            length = min(shared[group], _common_length(requests[first].prompt_ids, ids), len(ids) - 1)
            if length >= max(need, covers[group], 1) and 2 * length >= max(len(ids), longest[group]) \
                    and length > best_length and _same_media(
                    requests[first].vision, request.vision):
                best, best_length = group, length
        if best is None:
            groups.append(len(firsts))
            firsts.append(index)
            shared.append(max(len(ids) - 1, 0))
            covers.append(need)
            longest.append(len(ids))
        else:
            groups.append(best)
            shared[best] = best_length
            covers[best] = max(covers[best], need)
            longest[best] = max(longest[best], len(ids))
    return firsts, groups, shared


def media_end(ids: Sequence[int], media_token_ids) -> int:
    """How many leading tokens of `ids` hold all of its media tokens (0 without any)."""
    return max((position + 1 for position, token in enumerate(ids) if token in media_token_ids), default=0)


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    length = 0
    for x, y in zip(a, b):
        if x != y:
            break
        length += 1
    return length


def _same_media(a: VisionInputs, b: VisionInputs) -> bool:
    if a is b:
        return True
    for name in VisionInputs.TENSORS:
        x, y = getattr(a, name), getattr(b, name)
        if (x is None) != (y is None) or (x is not None and (x.shape != y.shape or not torch.equal(x, y))):
            return False
    return True


def cut_at_stop(token_ids: list[int], stop_ids: set[int]) -> tuple[list[int], bool]:
    """The tokens up to and including the first stop token, and whether one was found."""
    for position, token in enumerate(token_ids):
        if token in stop_ids:
            return token_ids[: position + 1], True
    return token_ids, False


class StepLogprobRecorder:
    """A logits processor that records log p(chosen token) of each decoding step, then
    masks the tokens that must never be generated.

    `generate` calls it with the scores of step t before it picks token t; the chosen
    token becomes visible as the last input id at step t + 1, so each call first scores
    the previous step and keeps only the current step's [B, V] log-probabilities.
    `finish` scores the last step once the final sequences are known.
    """

    def __init__(self, temperature: float, masked_token_ids: Sequence[int] = ()):
        self.temperature = temperature if temperature > 0 else 1.0
        self.masked_token_ids = list(masked_token_ids)
        self._pending: torch.Tensor | None = None  # [B, V] log-probs of the last step
        self._steps: list[torch.Tensor] = []  # each [B]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._pending is not None:
            self._score_pending(input_ids[:, -1])
        self._pending = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        if not self.masked_token_ids:
            return scores
        masked = scores.clone()
        masked[:, self.masked_token_ids] = float("-inf")
        return masked

    def _score_pending(self, chosen: torch.Tensor) -> None:
        self._steps.append(self._pending.gather(1, chosen[:, None].to(self._pending.device))[:, 0])
        self._pending = None

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """Log-probs of every generated token: [B, steps]."""
        if self._pending is not None:
            self._score_pending(last_tokens)
        if not self._steps:
            return torch.zeros((last_tokens.shape[0], 0))
        return torch.stack(self._steps, dim=1).cpu()  # [B, steps]


@contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


# transformers' sampling draws from torch's default generator, which is one per process (per
# device), not per thread. Two sampled `generate` calls at once in one process (the fan-out runs
# rows' and the SFT model's evaluations on threads of the flow process) would take turns drawing
# from it, and a seeded sample would then depend on how the threads happened to interleave. One
# sampled call at a time in a process keeps each seeded sample what it is when run alone; greedy
# calls draw nothing and run side by side.
_SAMPLING = threading.Lock()


@contextmanager
def _seeded(seed: int | None, device: torch.device, sampling: bool = True) -> Iterator[None]:
    """Run a `generate` call alone on the process's random generator when it samples, from
    `seed` when one is given (the caller's generator state is restored afterwards)."""
    if not sampling:
        yield
        return
    with _SAMPLING:
        if seed is None:
            yield
            return
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            yield


@contextmanager
def _without_cudnn_attention(device: torch.device) -> Iterator[None]:
    """Keep PyTorch's SDPA off its cuDNN backend while generating on CUDA.

    Measured on one H100 (../shared/GPU.md): in bf16 with cuDNN SDPA, 16 tiny-model episodes
    did not finish in 110 s; with it off they took 9.3 s (fp32, which never picks cuDNN: 9.1 s).
    SDPA then takes its flash or memory-efficient kernel. Training passes are left alone.
    """
    if device.type != "cuda":
        yield
        return
    was_enabled = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was_enabled)


class HFEngine:
    """`RolloutEngine` on a transformers Qwen3-VL model (the embedded CPU default).

    Args:
        model: a `Qwen3VLForConditionalGeneration` (the policy itself, or a copy of it).
        processor: its `Qwen3VLProcessor`; the tokenizer gives the pad and stop tokens.
        max_batch_tokens: left-padded prompt tokens per `generate` (`token_budget_batches`), so
            a turn's prefill and KV cache fit one card (`eval.hf_batch_tokens`); None: one batch.
            Greedy outputs are the same tokens either way; with sampling each sub-batch draws its
            own random numbers, so a seeded sample differs from the one-batch one.
        share_prompts: prefill a prompt that several requests of one call repeat once (module
            docstring); off, every request's prompt is computed, bit for bit the earlier engine.
    """

    def __init__(self, model: Any, processor: Any, max_batch_tokens: int | None = None,
                 share_prompts: bool = False):
        self.model = model
        self.max_batch_tokens = max_batch_tokens
        self.share_prompts = share_prompts
        tokenizer = processor.tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.default_stop_ids = (tokenizer.eos_token_id,)
        self.image_token_id = model.config.image_token_id
        self.video_token_id = model.config.video_token_id
        self.num_layers = model.config.get_text_config().num_hidden_layers
        # Media placeholders are the processor's to place (module docstring): never generated.
        self.media_token_ids = [model.config.image_token_id, model.config.video_token_id,
                                model.config.vision_start_token_id, model.config.vision_end_token_id]

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
        """Continue every request, in batched `generate` calls of at most `max_batch_tokens`
        prefill tokens (one call when None); results in request order."""
        if not requests:
            return []
        generations: list[Generation] = []
        for rows in token_budget_batches([len(request.prompt_ids) for request in requests], self.max_batch_tokens):
            generations += self._generate_batch(requests[rows.start:rows.stop], params)
        return generations

    def _generate_batch(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
        stop_ids = params.stop_token_ids or self.default_stop_ids
        recorder = StepLogprobRecorder(params.temperature, self.media_token_ids)
        device = self.model.device
        with torch.no_grad(), _eval_mode(self.model), _seeded(params.seed, device, params.temperature > 0), \
                _without_cudnn_attention(device):
            prefilled = self._prefill_shared(requests, params) if self.share_prompts else None
            if prefilled is None:  # every prompt whole, with every request's media
                batch = pad_requests(requests, self.pad_id, self.image_token_id, self.video_token_id)
                inputs = batch.model_inputs(device)
                cache = PreallocatedCache(self.num_layers, batch.input_ids.shape[1] + params.max_new_tokens)
            else:
                inputs, cache = prefilled
            sequences = self.model.generate(
                **inputs,
                generation_config=self._generation_config(params, stop_ids),
                logits_processor=[recorder],
                past_key_values=cache,
            )  # [B, L + steps]
        new_tokens = sequences[:, inputs["input_ids"].shape[1]:].cpu()  # [B, steps]
        logprobs = recorder.finish(sequences[:, -1])  # [B, steps]
        return [self._row_generation(new_tokens[row], logprobs[row], set(stop_ids)) for row in range(len(requests))]

    def _prefill_shared(self, requests: Sequence[GenerationRequest], params: SamplingParams
                        ) -> tuple[dict[str, torch.Tensor], PreallocatedCache] | None:
        """Fill a cache with every row's prompt but its last token, computing each group's shared
        part once (module docstring), and return what `generate` then takes (the rows in the cache's
        layout, no media: they are in the cache) with that cache; None when no two requests share."""
        media = (self.image_token_id, self.video_token_id)
        if any(len(request.prompt_ids) < 2 or request.prompt_ids[-1] in media for request in requests):
            return None  # a row needs a shared part and a last token that is text
        firsts, groups, shared = shared_prefixes(requests, media)
        if len(firsts) == len(requests):
            return None
        rests = [len(request.prompt_ids) - shared[group] for request, group in zip(requests, groups)]
        # A request alone shares with nobody: it puts as much of its prompt into its rest as the
        # widest rest allows, so that it does not widen the shared columns.
        alone = [groups.count(group) == 1 for group in groups]
        widest = max(rest for rest, single in zip(rests, alone) if not single)
        for group, first in enumerate(firsts):
            if alone[first]:
                ids = requests[first].prompt_ids
                shared[group] = max(media_end(ids, media), len(ids) - widest, 1)
                rests[first] = len(ids) - shared[group]
        device = self.model.device
        heads = pad_requests([GenerationRequest(requests[first].prompt_ids[:shared[group]], requests[first].vision)
                              for group, first in enumerate(firsts)], self.pad_id, self.image_token_id,
                             self.video_token_id)
        width, rest_width = heads.input_ids.shape[1], max(rests)
        cache = PreallocatedCache(self.num_layers, width + rest_width + params.max_new_tokens)
        inputs = heads.model_inputs(device)
        positions, deltas = self._positions(heads)
        self.model(**inputs, position_ids=positions.to(device), past_key_values=cache, use_cache=True,
                   logits_to_keep=1)  # `inputs`: tokens and media on the model's device
        index = torch.tensor(groups, device=device)
        cache.select_rows(index)
        deltas = deltas.to(device).index_select(0, index)  # [B, 1]
        self.model.model.rope_deltas = deltas
        # Every row in the cache's layout: its group's shared part, left-padded; its rest, left-padded.
        rows = len(requests)
        input_ids = torch.full((rows, width + rest_width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        input_ids[:, :width] = heads.input_ids[groups]
        attention_mask[:, :width] = heads.attention_mask[groups]
        for row, (request, group) in enumerate(zip(requests, groups)):
            rest = torch.tensor(request.prompt_ids[shared[group]:], dtype=torch.long)
            input_ids[row, input_ids.shape[1] - rest.numel():] = rest
            attention_mask[row, input_ids.shape[1] - rest.numel():] = 1
        token_types = torch.zeros_like(input_ids)
        token_types[input_ids == self.image_token_id] = IMAGE_TOKEN_TYPE
        token_types[input_ids == self.video_token_id] = VIDEO_TOKEN_TYPE
        if rest_width > 1:  # the rests but their last tokens, text only, at positions continuing each row's
            text = (attention_mask[:, :-1].cumsum(-1) - 1).clamp(min=0)[:, width:].to(device) + deltas  # [B, R-1]
            self.model(input_ids=input_ids[:, width:-1].to(device), attention_mask=attention_mask[:, :-1].to(device),
                       mm_token_type_ids=token_types[:, width:-1].to(device),
                       position_ids=text[None].expand(3, -1, -1), past_key_values=cache, use_cache=True,
                       logits_to_keep=1)
        return {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device),
                "mm_token_type_ids": token_types.to(device)}, cache

    def _positions(self, batch: PaddedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """M-RoPE positions [3, B, L] of a left-padded prefill and each row's offset for the tokens
        after it, [B, 1], as `generate` computes them: the model's `get_rope_index` over the
        attended tokens when the batch has media, else the attended tokens counted from 0."""
        grids = {name: getattr(batch.vision, name) for name in ("image_grid_thw", "video_grid_thw")}
        if any(grid is not None for grid in grids.values()):
            return self.model.model.get_rope_index(batch.input_ids, **grids, attention_mask=batch.attention_mask,
                                                   mm_token_type_ids=batch.mm_token_type_ids)
        text = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B, L]
        return text[None].expand(3, -1, -1), torch.zeros((text.shape[0], 1), dtype=torch.long)

    def _generation_config(self, params: SamplingParams, stop_ids: Sequence[int]):
        from transformers import GenerationConfig

        sampling = params.temperature > 0
        return GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=sampling,
            temperature=params.temperature if sampling else 1.0,
            top_p=params.top_p if sampling else 1.0,
            top_k=0 if sampling else None,  # 0 disables top-k; greedy takes no sampling flags
            min_new_tokens=0,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            eos_token_id=list(stop_ids),
            pad_token_id=self.pad_id,
            num_beams=1,
            use_cache=True,
        )

    @staticmethod
    def _row_generation(tokens: torch.Tensor, logprobs: torch.Tensor, stop_ids: set[int]) -> Generation:
        token_ids, stopped = cut_at_stop(tokens.tolist(), stop_ids)
        return Generation(
            token_ids=token_ids,
            logprobs=logprobs[: len(token_ids)].tolist(),
            finish_reason="stop" if stopped else "length",
        )

    def update_weights(self, state_dict: dict[str, Any]) -> None:
        """Copy the policy's new weights into the engine's model.

        Every key of the model's `state_dict()` must be present, except a tied weight whose
        twin is (Qwen3-VL-2B ties `lm_head.weight` to the embeddings, and a ZeRO-3 gather
        names the shared tensor once). Extra keys are allowed only for the model's
        non-persistent buffers (rotary `inv_freq`, which a gather of `named_buffers()`
        includes): they are derived constants and are left as they are.

        Raises:
            KeyError: a weight is missing, or a key names nothing in the model.
        """
        expected = set(self.model.state_dict())
        buffers = {name for name, _ in self.model.named_buffers()}
        state_dict = dict(state_dict)
        tied: dict[int, list[str]] = {}
        for name, param in self.model.named_parameters(remove_duplicate=False):
            tied.setdefault(id(param), []).append(name)
        for names in tied.values():
            present = [n for n in names if n in state_dict]
            for name in names:
                if name not in state_dict and present:
                    state_dict[name] = state_dict[present[0]]
        missing = sorted(expected - set(state_dict))
        unknown = sorted(set(state_dict) - expected - buffers)
        if missing or unknown:
            raise KeyError(f"update_weights: missing {missing[:5]} ({len(missing)} in all), "
                           f"unknown {unknown[:5]} ({len(unknown)} in all)")
        with torch.no_grad():
            self.model.load_state_dict({name: state_dict[name] for name in expected}, strict=True)
