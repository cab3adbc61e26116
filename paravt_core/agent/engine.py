"""The rollout engine interface: token ids and images in, tokens and logprobs out.

Backends: `hf` (transformers `generate`, batched; the embedded default, see
`paravt_core.agent.hf_engine`) and `sglang` (a client of a running SGLang server, GPU
only). The agentic rollout (SPEC §3) and the evaluator (SPEC §7) talk only to this
interface, so the same protocol code runs on a laptop CPU and on GPUs.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch


@dataclass
class VisionInputs:
    """Processed pixels of one prompt's images/videos, as Qwen3VLProcessor returns them.

    Computed once per prompt and shared by every rollout of its group (SPEC §3).
    """

    pixel_values_videos: torch.Tensor | None = None  # [N_patches, D]
    video_grid_thw: torch.Tensor | None = None  # [n_videos, 3]
    pixel_values: torch.Tensor | None = None  # [N_patches, D]
    image_grid_thw: torch.Tensor | None = None  # [n_images, 3]
    # The uint8 RGB frames behind `pixel_values`, in order (references, not copies), for an
    # engine that takes images and processes them itself (`vllm`); not a model input.
    frames: tuple[Any, ...] = ()

    TENSORS = ("pixel_values_videos", "video_grid_thw", "pixel_values", "image_grid_thw")

    def merged_with(self, other: VisionInputs) -> VisionInputs:
        """The media of `self` followed by those of `other` (a later turn adds crops)."""
        return VisionInputs.concatenated([self, other])

    @staticmethod
    def concatenated(parts: Sequence[VisionInputs]) -> VisionInputs:
        """The media of every part, in order, each tensor concatenated once: merging a batch's
        requests one by one copied the growing pixels again for every request (issue #45)."""

        def cat(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
            present = [t for t in tensors if t is not None]
            if len(present) <= 1:
                return present[0] if present else None
            return torch.cat(present)

        return VisionInputs(*(cat([getattr(part, name) for part in parts]) for name in VisionInputs.TENSORS),
                            frames=tuple(frame for part in parts for frame in part.frames))

    def as_kwargs(self) -> dict[str, torch.Tensor]:
        """The model's media keywords (the processed tensors that are set)."""
        return {name: getattr(self, name) for name in self.TENSORS if getattr(self, name) is not None}


@dataclass
class GenerationRequest:
    """One sequence to continue: the full context so far and the media it references."""

    prompt_ids: list[int]
    vision: VisionInputs = field(default_factory=VisionInputs)


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]  # log-probability of each generated token under the sampling policy
    finish_reason: str  # "stop" | "length"


def weight_label(version: int) -> str:
    """The tag a served engine gives the weights it is pushed (vLLM's `/update_weight_version`,
    SGLang's `weight_version`): W(version), the policy after `version` optimizer steps."""
    return f"w{version}"


class ServedVersions:
    """{weight label: tokens} a server said it sampled with, over the replies since `take`.

    vLLM (each choice's `weight_versions`) and SGLang (`meta_info.weight_versions`) answer with
    the same spans, [{"version", "start", "end"}] over a reply's output tokens; both engines
    send requests from several threads, hence the lock.
    """

    def __init__(self) -> None:
        self._tokens: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, spans: Sequence[dict[str, Any]] | None) -> None:
        with self._lock:
            for span in spans or ():
                self._tokens[str(span["version"])] += int(span["end"]) - int(span["start"])

    def take(self) -> dict[str, int]:
        with self._lock:
            served, self._tokens = dict(self._tokens), Counter()
        return served


class RolloutEngine(Protocol):
    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
        """Continue every request in one batched call; results in request order."""
        ...

    def update_weights(self, state_dict: dict[str, Any]) -> None:
        """Load the policy's new weights (after an optimizer step)."""
        ...
