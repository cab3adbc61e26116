"""Multi-turn token ids built by appending deltas (SPEC §3).

The release re-renders the whole conversation with the chat template after each tool
round and slices the new ids at the old length; that corrupts the context when a turn has
two or more calls or a forced prefix. Here the ids only ever grow:

- the prompt is rendered and tokenized once (overview frames as timestamped image items,
  `agent/media.py`, each image expanded by the processor);
- each generation is appended as the exact token ids the engine returned;
- each tool round appends the token ids of the text the chat template adds for it:
  `ChatRenderer.turn_text` renders the message history with and without the round's tool
  messages, in TEXT form, and takes the string suffix (checked to be a suffix: a template
  that rewrites earlier turns fails loudly instead of corrupting ids); only that suffix is
  tokenized, with the processor when it holds crop frames (`frames` tool mode).

Every boundary between deltas has an added token on at least one side (`<|im_end|>`
before a tool turn, `<think>` starting the think prefix). Tokenizers split added tokens
out before BPE, so no merge crosses a boundary and tokenizing a delta alone gives the ids
a full render would; `tests/integration/test_rollout.py` checks delta-built ids against a
full render + processor call with 1, 2 and 5 parallel calls, in both tool modes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from paravt_core.agent.engine import VisionInputs
from paravt_core.agent.media import clip_images
from paravt_core.rewards import TranscriptSegment
from paravt_core.video import Frames

THINK_PREFIX = "<think>\n"
TURN_END_TOKEN = "<|im_end|>"
_PROBE = "PARAVT-TEMPLATE-PROBE"

Messages = Sequence[Mapping[str, Any]]


class TemplateNotPrefixStable(ValueError):
    """The chat template rewrites earlier turns when a turn is added; deltas would be wrong."""


@dataclass
class Encoded:
    """Token ids of a piece of text with the processed pixels of the videos it holds."""

    token_ids: list[int]
    vision: VisionInputs


class ChatRenderer:
    """Renders chat turns with the processor's template and tokenizes them (SPEC §3).

    Args:
        processor: a Qwen3-VL processor whose chat template renders image items as
            `<|vision_start|><|image_pad|><|vision_end|>` (ours,
            `paravt_core/model/chat_template.jinja`, and Qwen3-VL's).
        think_prefix: end every main-agent generation prompt with `<think>\\n` (SPEC §3).
        pixel_bounds: (min, max) pixels per frame (SPEC §3), handed to the image processor.
            Without them Qwen3-VL's own image processor (shortest_edge 65536) upscales every
            frame below 65536 pixels, so a 50176-pixel frame would cost a third more tokens
            than SPEC §3 allows; our frames are already resized within these bounds and
            pass through unchanged. None keeps the processor's own bounds.
    """

    def __init__(self, processor: Any, think_prefix: bool, pixel_bounds: tuple[int, int] | None = None):
        self.processor = processor
        self.image_size = None if pixel_bounds is None else {"shortest_edge": pixel_bounds[0],
                                                             "longest_edge": pixel_bounds[1]}
        self.tokenizer = processor.tokenizer
        self.generation_prefix = THINK_PREFIX if think_prefix else ""
        self.turn_end_id: int = self.tokenizer.convert_tokens_to_ids(TURN_END_TOKEN)
        self.after_turn_end = self._text_after_turn_end()
        self._special_texts = [token.content for token in self.tokenizer.added_tokens_decoder.values()
                               if token.special]

    def render(self, messages: Messages, tools: Sequence[Mapping[str, Any]] | None,
               add_generation_prompt: bool) -> str:
        return self.processor.apply_chat_template(
            list(messages), tools=list(tools) if tools else None, tokenize=False,
            add_generation_prompt=add_generation_prompt)

    def prompt_text(self, messages: Messages, tools: Sequence[Mapping[str, Any]] | None) -> str:
        """The first generation prompt, without the think prefix (appended as a forced delta)."""
        return self.render(messages, tools, add_generation_prompt=True)

    def turn_text(self, history: Messages, new_messages: Messages,
                  tools: Sequence[Mapping[str, Any]] | None) -> str:
        """The text the template adds for `new_messages` after `history`, up to the next
        generation prompt and its think prefix.

        `history` ends with an assistant message; its closing (`<|im_end|>\\n`) is part of
        the render of `history` and therefore not of the returned text.
        """
        before = self.render(history, tools, add_generation_prompt=False)
        after = self.render([*history, *new_messages], tools, add_generation_prompt=True)
        if not after.startswith(before):
            raise TemplateNotPrefixStable(
                "the chat template renders earlier turns differently once a tool turn is added; "
                "use a prefix-stable template such as paravt_core/model/chat_template.jinja")
        return after[len(before):] + self.generation_prefix

    def _text_after_turn_end(self) -> str:
        """What the template writes after the `<|im_end|>` that ends an assistant turn ("\\n")."""
        rendered = self.render([{"role": "user", "content": "q"}, {"role": "assistant", "content": _PROBE}],
                               None, add_generation_prompt=False)
        closing = rendered.split(_PROBE, 1)[1]
        if not closing.startswith(TURN_END_TOKEN):
            raise TemplateNotPrefixStable(f"the chat template does not end assistant turns with {TURN_END_TOKEN}")
        return closing[len(TURN_END_TOKEN):]

    def encode(self, text: str, clips: Sequence[Frames] = (), *, continuation: bool = True) -> Encoded:
        """Token ids of `text`, whose image items (`media.with_frames`) hold `clips`' frames in order.

        Args:
            continuation: True for a delta appended to a context (no BOS-like special
                tokens are added), False for the start of a sequence.
        """
        if not clips:
            ids = self.tokenizer(text, add_special_tokens=not continuation)["input_ids"]
            return Encoded(list(ids), VisionInputs())
        size = {"size": self.image_size} if self.image_size else {}
        images = clip_images(clips)
        batch = self.processor(text=[text], images=images, add_special_tokens=not continuation,
                               return_tensors="pt", **size)
        vision = VisionInputs(pixel_values=batch["pixel_values"], image_grid_thw=batch["image_grid_thw"],
                              frames=tuple(images))
        return Encoded(batch["input_ids"][0].tolist(), vision)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Exact text of generated ids, special tokens kept (rewards look for `<|im_start|>`)."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False)

    def plain_text(self, token_ids: Sequence[int]) -> str:
        """Text of a sub-agent generation for a tool response: special tokens dropped, stripped."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True).strip()

    def without_control_tokens(self, text: str) -> str:
        """`text` with every special token's string removed.

        Tool-response text is re-tokenized into the main agent's context; a summary that
        spelled `<|video_pad|>` or `<|im_start|>` out of byte tokens would otherwise become
        a real control token there.
        """
        for special in self._special_texts:
            text = text.replace(special, "")
        return text

    def tool_response_text(self, text: str, max_tokens: int) -> str:
        """A tool response as the main agent gets it: control tokens removed, then truncated."""
        return self.truncate(self.without_control_tokens(text), max_tokens)

    def truncate(self, text: str, max_tokens: int) -> str:
        """At most `max_tokens` tokens of `text`, then " [truncated]" if cut (SPEC §3)."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) <= max_tokens:
            return text
        return self.tokenizer.decode(ids[:max_tokens], skip_special_tokens=False) + " [truncated]"


@dataclass
class TokenContext:
    """The main agent's growing context: ids, loss mask, old logprobs, media, transcript.

    Built only by appending. `loss_mask` is 1 on tokens the policy generated and 0 on the
    prompt, forced prefixes and tool responses (SPEC §3); `logprobs` holds the engine's
    log-probability of each generated token and 0.0 elsewhere.
    """

    token_ids: list[int]
    vision: VisionInputs
    prompt_length: int
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    transcript: list[TranscriptSegment] = field(default_factory=list)

    @classmethod
    def from_prompt(cls, prompt: Encoded) -> TokenContext:
        ids = list(prompt.token_ids)
        return cls(ids, prompt.vision, len(ids), [0] * len(ids), [0.0] * len(ids))

    def append_forced(self, delta: Encoded, text: str, scored: str | None = None) -> None:
        """Tokens the policy did not choose: a think prefix or a tool-response turn.

        Args:
            scored: what the transcript reward scope scores instead of `text` (a tool
                turn's empty markers, SPEC §4.5); None scores `text`.
        """
        self.token_ids.extend(delta.token_ids)
        self.loss_mask.extend([0] * len(delta.token_ids))
        self.logprobs.extend([0.0] * len(delta.token_ids))
        if delta.vision.as_kwargs():  # keep the group-shared overview object when nothing is added
            self.vision = self.vision.merged_with(delta.vision)
        self.transcript.append(TranscriptSegment(text, generated=False, scored=scored, tokens=len(delta.token_ids)))

    def append_generated(self, token_ids: Sequence[int], logprobs: Sequence[float], text: str) -> None:
        if len(token_ids) != len(logprobs):
            raise ValueError(f"{len(token_ids)} generated tokens but {len(logprobs)} logprobs")
        self.token_ids.extend(token_ids)
        self.loss_mask.extend([1] * len(token_ids))
        self.logprobs.extend(logprobs)
        self.transcript.append(TranscriptSegment(text, generated=True, tokens=len(token_ids)))

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(token ids [L] int64, loss mask [L] int64, old logprobs [L] float32)."""
        return (torch.tensor(self.token_ids, dtype=torch.long), torch.tensor(self.loss_mask, dtype=torch.long),
                torch.tensor(self.logprobs, dtype=torch.float32))
