"""Finding the response grammar's tags in token ids (SPEC §2, §5).

In the real Qwen3-VL tokenizer `<think>`, `</think>`, `<tool_call>`, `</tool_call>`,
`<tool_response>` and `</tool_response>` are single added tokens, while `<answer>`,
`</answer>`, `<tool_code>` and `</tool_code>` are ordinary text: several tokens, whose
first and last pieces may merge with neighbouring characters ("\\n<", ">\\n"). So a tag is
never looked up as one id. `TagLocator` decodes the ids to the bytes each token stands
for, finds every tag in the decoded bytes, and marks each token whose bytes overlap a
tag's: all tokens of a multi-token tag, including a piece it shares with the text around
it.

Byte spans come from the byte-level BPE alphabet (Qwen's tokenizers and the tiny kit's);
a tokenizer without one falls back to decoding growing prefixes (quadratic, but exact).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

import torch

# SPEC §5: the structural tokens of token-level anchoring, plus the end-of-turn token.
STRUCTURAL_TAGS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<answer>", "</answer>")
END_OF_TURN = "<|im_end|>"


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet: the printable character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(code): b for b, code in chars.items()}


class TagLocator:
    """Marks the tokens that spell given tags, for one tokenizer.

    Args:
        tokenizer: a Hugging Face tokenizer (fast or slow).
        tags: the tag strings to find.
        whole_tokens: token strings that are always marked when they occur as one added
            token (the end-of-turn token).
    """

    def __init__(self, tokenizer: Any, tags: Iterable[str] = STRUCTURAL_TAGS,
                 whole_tokens: Iterable[str] = (END_OF_TURN,)):
        self.tokenizer = tokenizer
        self.tags = tuple(tag.encode() for tag in tags)
        self.whole_ids = frozenset(int(tokenizer.convert_tokens_to_ids(t)) for t in whole_tokens)
        self._added = {int(i): tok.content.encode() for i, tok in tokenizer.added_tokens_decoder.items()}
        self._byte_level = self._is_byte_level()

    def _is_byte_level(self) -> bool:
        alphabet = _byte_alphabet()
        probe = self.tokenizer("a b\n", add_special_tokens=False)["input_ids"]
        pieces = self.tokenizer.convert_ids_to_tokens(probe)
        return all(ch in alphabet for piece in pieces for ch in piece) and self._decoded(probe) == b"a b\n"

    def _decoded(self, ids: Sequence[int]) -> bytes:
        alphabet = _byte_alphabet()
        out = bytearray()
        for token_id, piece in zip(ids, self.tokenizer.convert_ids_to_tokens(list(ids))):
            if token_id in self._added:
                out += self._added[token_id]
            else:
                out += bytes(alphabet[ch] for ch in piece)
        return bytes(out)

    def token_byte_ends(self, ids: Sequence[int]) -> list[int]:
        """The end offset of each token in the bytes of the decoded ids."""
        ends, position = [], 0
        if self._byte_level:
            alphabet = _byte_alphabet()
            for token_id, piece in zip(ids, self.tokenizer.convert_ids_to_tokens(list(ids))):
                position += len(self._added[token_id]) if token_id in self._added else sum(
                    1 for ch in piece if ch in alphabet)
                ends.append(position)
            return ends
        for count in range(1, len(ids) + 1):
            ends.append(len(self.tokenizer.decode(list(ids[:count]), skip_special_tokens=False).encode()))
        return ends

    def mask(self, token_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """[L] bool: True on every token that overlaps a tag, and on the whole-token ids."""
        ids = token_ids.tolist() if isinstance(token_ids, torch.Tensor) else list(token_ids)
        out = torch.zeros(len(ids), dtype=torch.bool)
        if not ids:
            return out
        ends = self.token_byte_ends(ids)
        text = self._decoded(ids) if self._byte_level else self.tokenizer.decode(ids, skip_special_tokens=False).encode()
        spans = []
        for tag in self.tags:
            start = text.find(tag)
            while start >= 0:
                spans.append((start, start + len(tag)))
                start = text.find(tag, start + 1)
        spans.sort()
        begin, span_index = 0, 0
        for index, (token_id, end) in enumerate(zip(ids, ends)):
            while span_index < len(spans) and spans[span_index][1] <= begin:
                span_index += 1
            overlaps = span_index < len(spans) and spans[span_index][0] < end and end > begin
            out[index] = overlaps or token_id in self.whole_ids
            begin = end
        return out
