"""Teacher forcing, the scoring core of the miniature's probes.

A probe feeds a whole row to the model once (every token predicted from the true text before
it) and scores each part of the answer by whether the model's argmax reproduces all of its
tokens (`score_row`, a pure function of the tokens' correctness and character offsets). The
reading, caption and agent probes share this; each draws its own held-out rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

# lazy: sft.encode loads torch (2.3 s); the probes import this module at their top and stay
# without torch until a model runs (see miniature/caption_probe.py).


class ProbeScores:
    """Base of a probe's report (a frozen dataclass): `COUNTS` name its count fields, every
    other field is a score, logged as `<PREFIX>_<field>` by `as_metrics`."""

    COUNTS: tuple[str, ...] = ("rows",)
    PREFIX = ""

    def as_metrics(self, prefix: str | None = None) -> dict[str, float]:
        return {f"{prefix or self.PREFIX}_{f.name}": float(getattr(self, f.name))
                for f in fields(self) if f.name not in self.COUNTS}


def spaced(text: str, start: int, end: int) -> tuple[int, int]:
    # the space before a word belongs to it: a tokenizer that splits " yes" into " ", "y", "es"
    # decides yes or no at the bare space, which must count
    return (start - 1, end) if start > 0 and text[start - 1] == " " else (start, end)


def score_row(correct: Sequence[bool], offsets: Sequence[tuple[int, int]],
              spans: dict[str, list[tuple[int, int]]]) -> dict[str, bool]:
    """Whether every token of each part was predicted right.

    Args:
        correct: per token of the scored text, whether the model's argmax at the token before
            it was this token (`teacher_forced`).
        offsets: per token, its (start, end) characters in that text.
        spans: the parts' character spans in that text (`answer_spans` of the answer, which
            the scored text starts with).
    """
    out = {}
    for part, ranges in spans.items():
        hit = [ok for ok, (a, b) in zip(correct, offsets, strict=True)
               if b > a and any(a < e and b > s for s, e in ranges)]
        if not hit:
            raise ValueError(f"no token covers the {part!r} span {ranges}")
        out[part] = all(hit)
    return out


def token_offsets(tokenizer, ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """The text of `ids` decoded one token at a time, and each token's (start, end) in it."""
    text, offsets = "", []
    for token in ids:
        piece = tokenizer.decode([token])
        offsets.append((len(text), len(text) + len(piece)))
        text += piece
    return text, offsets


def teacher_forced(model, tokenizer, sample, positions: list[int]) -> tuple[str, list[tuple[int, int]], list[bool]]:
    """Feed one encoded sample whole; for `positions` (token indices, each > 0): their text
    decoded token by token, each token's offsets in it, and whether the model's argmax at the
    position before predicted it."""
    import torch

    inputs = {"input_ids": sample.input_ids[None], "mm_token_type_ids": sample.mm_token_type_ids[None],
              "attention_mask": torch.ones_like(sample.input_ids)[None]}
    for key in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw"):
        if getattr(sample, key) is not None:
            inputs[key] = getattr(sample, key)
    with torch.no_grad():
        predicted = model(**inputs).logits[0].argmax(-1)
    ids = sample.input_ids
    text, offsets = token_offsets(tokenizer, ids[positions].tolist())
    return text, offsets, [bool(predicted[i - 1] == ids[i]) for i in positions]


def _no_media(*args):
    raise ValueError("a text-only row asked for a frame or an image")


def text_row_forced(model, processor, messages: list[dict]) -> tuple[str, list[tuple[int, int]], list[bool]]:
    """`teacher_forced` on a text-only row of one assistant turn, encoded as SFT encodes it
    (`encode_conversation`): the answer's decoded text (its `<|im_end|>` after it), offsets and
    correctness, the answer at offset 0.

    Raises:
        ValueError: the row's trained tokens do not decode to its answer text.
    """
    from paravt_core.sft.encode import IGNORE_INDEX, encode_conversation

    answer = messages[-1]["content"][0]["text"]
    sample = encode_conversation(messages, processor, _no_media, _no_media)
    positions = (sample.labels != IGNORE_INDEX).nonzero().flatten().tolist()
    text, offsets, correct = teacher_forced(model, processor.tokenizer, sample, positions)
    if not text.startswith(answer):
        raise ValueError(f"the answer tokens decode to {text[:80]!r}, not the answer {answer[:80]!r}")
    return text, offsets, correct
