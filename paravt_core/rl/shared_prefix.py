"""Teacher-forced log-probs that run a group's shared prefix once (`rl.shared_prefix`, issue #64).

GRPO samples every prompt G times (SPEC §5), and the G trajectories share the whole prompt: the
system turn, the overview frames and the question; sub-agents given the same crop share theirs.
The per-row path (`policy.sequence_logprobs`) runs that prompt G times. Here a micro-batch's
trajectories are grouped by their prompt, and each group becomes ONE packed row of the model's
batch: the group's longest common prefix (tokens and the media it covers) once, then each
member's suffix:

    row = [prefix | suffix_1 | suffix_2 | ... | right padding]

A suffix's tokens attend to the prefix and causally to themselves, never to another suffix;
its M-RoPE positions are the ones the per-row path gives the same tokens (the model's own
`get_rope_index` on the unpadded trajectory, sliced after the prefix), so vision tokens keep
their 3-D positions and later text continues after them with the same rope deltas. In exact
arithmetic every log-prob is the per-row path's, and so is every gradient: the prefix's
activations feed all G suffixes, so autograd sums their G contributions into it (the prefix is
never detached). In float32 the sums run in another order: tests/integration/test_shared_prefix.py
states the tolerance and plants the faults it must catch.

The prefix is cut so that every image or video lies wholly on one side of it and every medium
it covers is the same (grid and pixels, `torch.equal`) in all members: the members' tokens
agree up to the cut, but a crop's placeholder tokens do not say which pixels fill them. It is
also cut one token short of the shortest member, so every member keeps a suffix.

Attention: the packed rows carry an explicit [R, 1, N, N] mask of that structure, which any
attention implementation honours (it is the reference the tests hold the faster path to). With
sdpa or eager attention, `segmented_attention` computes it piecewise instead: the prefix
causally, then each suffix against the prefix's keys and its own, so masked blocks (one suffix
against another) are never computed. Under activation checkpointing the backward pass recomputes
each layer after the forward has returned; checkpointing enabled by `enable_checkpointing`
(what `rl.gradient_checkpointing` turns on) hands torch a `context_fn` that re-arms the piecewise
attention for each layer's recompute, so the recompute runs the forward's arithmetic (torch
refuses a recompute that saves other tensors than its forward). Under checkpointing enabled any
other way the dense mask runs in both. Each micro-batch is one forward of the model, as in the
per-row path, so ZeRO-3's parameter gathers stay in step across ranks (two CPU ranks with uneven
work, with and without checkpointing: tests/integration/test_rl_multirank.py).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch
import torch.nn.functional as F
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface
from transformers.models.qwen3_vl.modeling_qwen3_vl import eager_attention_forward

from paravt_core.agent.engine import GenerationRequest, VisionInputs
from paravt_core.agent.hf_engine import pad_requests
from paravt_core.config import SHARED_PREFIX_ATTENTION
from paravt_core.model.logprobs import (
    LOGPROB_CHUNK,
    final_hidden_states,
    output_layers,
    selected_token_logprobs,
    unwrapped,
)


class Trajectory(Protocol):
    """What this module reads of a `policy.Trajectory` (that module imports this one)."""

    token_ids: torch.Tensor  # [L]
    vision: VisionInputs
    prompt_length: int


# Faults the equality test plants (tests only, never a setting): a suffix that also sees the
# previous suffix's keys, suffix positions shifted by one, the prefix's gradient taken from
# the first suffix only.
Plant = Literal["leak", "shift", "once"] | None

ATTENTION_KEY = "paravt_shared_prefix"
# (image-or-video pixels field, grid field, token id key of `ids`)
MEDIA = (("pixel_values", "image_grid_thw", "image"), ("pixel_values_videos", "video_grid_thw", "video"))


def group_key(t: Trajectory) -> tuple[int, ...]:
    """The prompt a trajectory shares with its group (main agents of one prompt; sub-agents of one crop)."""
    return tuple(t.token_ids[: max(t.prompt_length, 1)].tolist())


def group_order(trajs: Sequence[Trajectory]) -> list[int]:
    """Indices of `trajs` with each group's members together, groups in order of first appearance
    (stable within a group)."""
    first: dict[tuple[int, ...], int] = {}
    keys = [first.setdefault(group_key(t), len(first)) for t in trajs]
    return sorted(range(len(trajs)), key=lambda i: keys[i])


@dataclass(frozen=True)
class Medium:
    """One image or video of a trajectory: where its placeholder tokens lie and what fills them."""

    kind: int  # index into MEDIA
    start: int  # first placeholder token
    end: int  # one past the last placeholder token
    pixels: torch.Tensor  # [patches, D]
    grid: torch.Tensor  # [3]


def media_of(t: Trajectory, ids: dict[str, int], merge: int) -> list[Medium]:
    """The trajectory's media in token order. A video's frames are separate placeholder blocks
    (timestamps between them): its span runs from its first frame's tokens to its last's."""
    out = []
    for kind, (pixels_name, grid_name, token) in enumerate(MEDIA):
        grids = getattr(t.vision, grid_name)
        if grids is None:
            continue
        where = (t.token_ids == ids[token]).nonzero().flatten().tolist()
        patches = grids.prod(-1).tolist()
        tokens = [p // merge**2 for p in patches]
        if sum(tokens) != len(where):
            raise ValueError(f"a trajectory holds {len(where)} {token} placeholder tokens but its {grid_name} "
                             f"accounts for {sum(tokens)}: its media do not match its tokens")
        chunks = getattr(t.vision, pixels_name).split(patches)
        seen = 0
        for grid, n, chunk in zip(grids, tokens, chunks):
            out.append(Medium(kind, where[seen], where[seen + n - 1] + 1, chunk, grid))
            seen += n
    return sorted(out, key=lambda m: m.start)


def shared_length(members: Sequence[Trajectory], media: Sequence[list[Medium]]) -> int:
    """The longest prefix the members share: equal tokens, one token short of the shortest member,
    and cut before the first medium it would split or that differs between members."""
    rows = [t.token_ids for t in members]
    shortest = min(r.numel() for r in rows)
    length = shortest - 1
    for r in rows[1:]:
        differ = (r[:length] != rows[0][:length]).nonzero()
        if differ.numel():
            length = int(differ[0])
    for k, medium in enumerate(media[0]):
        if medium.start >= length:
            break
        same = all(len(m) > k and m[k].kind == medium.kind and torch.equal(m[k].grid, medium.grid)
                   and torch.equal(m[k].pixels, medium.pixels) for m in media[1:])
        if medium.end > length or not same:
            return medium.start
    return length


@dataclass
class PackedRow:
    """One group: its members (indices into the micro-batch), the prefix length and each suffix's columns."""

    members: list[int]
    prefix: int
    spans: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each member's suffix


def prefix_groups(trajs: Sequence[Trajectory], media: Sequence[list[Medium]]) -> list[PackedRow]:
    """The micro-batch's groups (by `group_key`) with their shared prefixes; a group whose members
    share no token runs as singletons."""
    by_key: dict[tuple[int, ...], list[int]] = {}
    for i, t in enumerate(trajs):
        by_key.setdefault(group_key(t), []).append(i)
    rows = []
    for members in by_key.values():
        length = shared_length([trajs[i] for i in members], [media[i] for i in members])
        if length >= 1:
            rows.append(PackedRow(members, length))
            continue
        for i in members:
            alone = shared_length([trajs[i]], [media[i]])
            if alone < 1:
                raise ValueError(f"trajectory {i} of the micro-batch starts with an image or video token or has "
                                 "under two tokens: it has no prefix to share; run it with rl.shared_prefix: false")
            rows.append(PackedRow([i], alone))
    return rows


@dataclass
class PackedBatch:
    """The model's inputs for the packed rows, and where each trajectory's positions landed."""

    inputs: dict[str, torch.Tensor]
    rows: list[PackedRow]
    source: list[torch.Tensor]  # per trajectory [L]: flat index (row * N + column) of each of its positions


def _row_positions(trajs: Sequence[Trajectory], ids: dict[str, int], rope_index) -> list[torch.Tensor]:
    """Each trajectory's [3, L] M-RoPE positions, as the model computes them on the unpadded sequence."""
    grids = [VisionInputs(image_grid_thw=t.vision.image_grid_thw, video_grid_thw=t.vision.video_grid_thw)
             for t in trajs]
    padded = pad_requests([GenerationRequest(t.token_ids.tolist(), g) for t, g in zip(trajs, grids)], ids["pad"],
                          ids["image"], ids["video"])  # grids only: the positions need no pixels
    vision = padded.vision
    positions, _ = rope_index(padded.input_ids, padded.mm_token_type_ids, image_grid_thw=vision.image_grid_thw,
                              video_grid_thw=vision.video_grid_thw, attention_mask=padded.attention_mask)
    width = padded.input_ids.shape[1]
    return [positions[:, i, width - t.token_ids.numel():] for i, t in enumerate(trajs)]


def dense_mask(rows: Sequence[PackedRow], width: int, plant: Plant = None) -> torch.Tensor:
    """[R, 1, N, N] bool, True = may attend: the prefix causal, each suffix over the prefix and
    causally over itself; a padding query sees only itself (no key of a real token is padding)."""
    mask = torch.eye(width, dtype=torch.bool).repeat(len(rows), 1, 1)  # [R, N, N]
    for r, row in enumerate(rows):
        mask[r, : row.prefix, : row.prefix] = torch.ones(row.prefix, row.prefix, dtype=torch.bool).tril()
        for k, (start, end) in enumerate(row.spans):
            n = end - start
            mask[r, start:end, : row.prefix] = True
            mask[r, start:end, start:end] = torch.ones(n, n, dtype=torch.bool).tril()
            if plant == "leak" and k:
                before = row.spans[k - 1]
                mask[r, start:end, before[0]:before[1]] = True
    return mask[:, None]


class PackMemo:
    """The packed micro-batches of the latest passes, so a step's reference pass and policy pass
    pack each micro-batch once (`pack` is a twentieth of the tiny RL step's CPU, docs/speed.md).

    A micro-batch is recognized by the identity of its trajectory objects, in order (the two
    passes build the same micro-batches from the same step's trajectories, `policy.micro_batches`),
    and by what else `pack` reads: the token ids, the model's spatial merge and media token ids
    (its M-RoPE positions come from them), the planted fault. The memo holds the trajectories
    themselves, so an id is never reused while its entry lives. A hit returns the same
    `PackedBatch`, which nothing downstream mutates.

    Bounded by the bytes of the packed tensors it keeps (`max_bytes`), oldest out first: at 8B a
    packed micro-batch holds its frames' pixels and its [R, 1, N, N] bool mask, built for the
    piecewise and the dense path alike (N squared bytes a row: 0.9 GB at N = 30,000 tokens), and a
    step runs many micro-batches. An entry larger than the bound is not kept (that micro-batch is
    packed again, as without the memo).
    """

    def __init__(self, max_bytes: int = 256 * 2**20):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple, tuple[list, PackedBatch, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0

    @staticmethod
    def nbytes(packed: PackedBatch) -> int:
        return sum(t.nbytes for t in packed.inputs.values()) + sum(t.nbytes for t in packed.source)

    def get(self, key: tuple, trajs: Sequence[Trajectory]) -> PackedBatch | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or len(entry[0]) != len(trajs) or any(a is not b for a, b in zip(entry[0], trajs)):
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[1]

    def put(self, key: tuple, trajs: Sequence[Trajectory], packed: PackedBatch) -> None:
        size = self.nbytes(packed)
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            self._bytes += size - (old[2] if old else 0)
            self._entries[key] = (list(trajs), packed, size)
            while self._bytes > self.max_bytes:
                self._bytes -= self._entries.popitem(last=False)[1][2]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


PACKED = PackMemo()


def pack(trajs: Sequence[Trajectory], ids: dict[str, int], model, plant: Plant = None) -> PackedBatch:
    """The packed rows of a micro-batch (module docstring), on the CPU; the same micro-batch packed
    again for another model of the same architecture (the step's second pass) comes from `PACKED`."""
    inner = unwrapped(model)
    base = getattr(inner, "model", None)
    if not hasattr(base, "get_rope_index") or not hasattr(getattr(base, "visual", None), "spatial_merge_size"):
        raise TypeError(f"rl.shared_prefix needs a Qwen3-VL model (model.get_rope_index, model.visual); got "
                        f"{type(inner).__name__}: set rl.shared_prefix: false")
    merge = int(base.visual.spatial_merge_size)
    config = inner.config
    key = (tuple(id(t) for t in trajs), tuple(sorted(ids.items())), merge, plant,
           *(getattr(config, name, None) for name in ("image_token_id", "video_token_id", "vision_start_token_id")))
    packed = PACKED.get(key, trajs)
    if packed is None:
        packed = _pack(trajs, ids, base, merge, plant)
        PACKED.put(key, trajs, packed)
    return packed


def _pack(trajs: Sequence[Trajectory], ids: dict[str, int], base, merge: int, plant: Plant) -> PackedBatch:
    media = [media_of(t, ids, merge) for t in trajs]
    rows = prefix_groups(trajs, media)
    positions = _row_positions(trajs, ids, base.get_rope_index)
    widths = [row.prefix + sum(trajs[i].token_ids.numel() - row.prefix for i in row.members) for row in rows]
    width = max(widths)
    input_ids = torch.full((len(rows), width), ids["pad"], dtype=torch.long)  # [R, N]
    position_ids = torch.zeros(3, len(rows), width, dtype=torch.long)  # [3, R, N]
    source: list[torch.Tensor] = [torch.empty(0, dtype=torch.long)] * len(trajs)
    pieces: dict[int, list[Medium]] = {0: [], 1: []}
    for r, row in enumerate(rows):
        first, prefix = row.members[0], row.prefix
        input_ids[r, :prefix] = trajs[first].token_ids[:prefix]
        position_ids[:, r, :prefix] = positions[first][:, :prefix]
        for m in media[first]:
            if m.end <= prefix:
                pieces[m.kind].append(m)
        start = prefix
        for i in row.members:
            t = trajs[i]
            end = start + t.token_ids.numel() - prefix
            input_ids[r, start:end] = t.token_ids[prefix:]
            position_ids[:, r, start:end] = positions[i][:, prefix:] + (1 if plant == "shift" else 0)
            for m in media[i]:
                if m.start >= prefix:
                    pieces[m.kind].append(m)
            source[i] = r * width + torch.cat([torch.arange(prefix), torch.arange(start, end)])
            row.spans.append((start, end))
            start = end
    inputs = {"input_ids": input_ids, "position_ids": position_ids, "attention_mask": dense_mask(rows, width, plant)}
    for kind, (pixels_name, grid_name, _) in enumerate(MEDIA):
        if pieces[kind]:
            inputs[pixels_name] = torch.cat([m.pixels for m in pieces[kind]])
            inputs[grid_name] = torch.stack([m.grid for m in pieces[kind]])
    return PackedBatch(inputs, rows, source)


# --- attention without the masked blocks ---------------------------------------------------

# While a packed forward (or a layer's recompute) runs: its mask, rows, plant, base attention and text config.
_ACTIVE: dict[str, object] = {}


def _segmented(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
               **kwargs):
    """The attention function registered as ATTENTION_KEY: the packed rows' attention piecewise
    when `attention_mask` is the active packed mask, else the base implementation's."""
    if attention_mask is not _ACTIVE.get("mask"):
        base = ALL_ATTENTION_FUNCTIONS.get_interface(_ACTIVE.get("base", "sdpa"), eager_attention_forward)
        return base(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    rows: list[PackedRow] = _ACTIVE["rows"]
    plant = _ACTIVE["plant"]
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    width = query.shape[2]
    outputs = []
    for r, row in enumerate(rows):
        q, k, v = query[r:r + 1], key[r:r + 1], value[r:r + 1]  # [1, H, N, D]
        p = row.prefix
        pieces = [F.scaled_dot_product_attention(q[:, :, :p], k[:, :, :p], v[:, :, :p], is_causal=True,
                                                 dropout_p=dropout, scale=scaling)]
        for j, (start, end) in enumerate(row.spans):
            seen_k, seen_v = k[:, :, :p], v[:, :, :p]
            if plant == "once" and j:
                seen_k, seen_v = seen_k.detach(), seen_v.detach()
            keys, values = [seen_k], [seen_v]
            if plant == "leak" and j:
                keys.append(k[:, :, row.spans[j - 1][0]:row.spans[j - 1][1]])
                values.append(v[:, :, row.spans[j - 1][0]:row.spans[j - 1][1]])
            keys.append(k[:, :, start:end])
            values.append(v[:, :, start:end])
            n, seen = end - start, sum(part.shape[2] for part in keys[:-1])
            mask = torch.cat([torch.ones(n, seen, dtype=torch.bool, device=q.device),
                              torch.ones(n, n, dtype=torch.bool, device=q.device).tril()], dim=1)  # [n, seen + n]
            pieces.append(F.scaled_dot_product_attention(q[:, :, start:end], torch.cat(keys, dim=2),
                                                         torch.cat(values, dim=2), attn_mask=mask, dropout_p=dropout,
                                                         scale=scaling))
        filled = row.spans[-1][1]
        pieces.append(q.new_zeros((1, q.shape[1], width - filled, q.shape[3])))  # padding queries: never read
        outputs.append(torch.cat(pieces, dim=2))
    return torch.cat(outputs).transpose(1, 2).contiguous(), None  # [R, N, H, D]


class _Armed:
    """While entered, the text model attends through `_segmented` with `state` (a packed forward's
    mask, rows, plant, base attention and text config). Reusable: a packed forward enters it, and
    each of its checkpointed layers' recomputes enters a copy (a layer could be recomputed twice)."""

    def __init__(self, state: dict):
        self.state = state

    def __enter__(self) -> None:
        AttentionInterface.register(ATTENTION_KEY, _segmented)
        _ACTIVE.update(self.state)
        self.state["text_config"]._attn_implementation = ATTENTION_KEY

    def __exit__(self, *exc) -> None:
        self.state["text_config"]._attn_implementation = self.state["base"]
        _ACTIVE.clear()


def recompute_context() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """torch.utils.checkpoint's `context_fn`, called as each checkpointed layer's forward starts:
    (the forward's context, the recompute's). A layer checkpointed inside a piecewise packed
    forward gets a recompute context that re-arms that forward's state (the same mask object the
    layer is called with again, the same rows and plant), so its recompute in the backward, long
    after `segmented_attention` has exited, attends piecewise as its forward did. Anywhere else
    both are no-ops."""
    if not _ACTIVE:
        return contextlib.nullcontext(), contextlib.nullcontext()
    return contextlib.nullcontext(), _Armed(dict(_ACTIVE))


CHECKPOINT_KWARGS = {"use_reentrant": False, "context_fn": recompute_context}


def enable_checkpointing(model) -> None:
    """Activation checkpointing as `rl.gradient_checkpointing` turns it on: torch's non-reentrant
    checkpoint (transformers' default) with `recompute_context`, so a shared-prefix pass keeps its
    piecewise attention through the backward's recompute."""
    model.activation_checkpointing_enable(activation_checkpointing_kwargs=dict(CHECKPOINT_KWARGS))


def _checkpointing(model) -> Literal["none", "rearmed", "other"]:
    """How the training model checkpoints its layers: not at all, through `enable_checkpointing`
    (its recompute re-arms the piecewise attention), or some other way (the dense mask must run)."""
    layers = [m for m in unwrapped(model).modules() if getattr(m, "gradient_checkpointing", False) and m.training]
    if not layers:
        return "none"
    rearmed = all(getattr(getattr(m, "_gradient_checkpointing_func", None), "keywords", {}).get("context_fn")
                  is recompute_context for m in layers)
    return "rearmed" if rearmed else "other"


@contextlib.contextmanager
def segmented_attention(model, mask: torch.Tensor, rows: Sequence[PackedRow], plant: Plant = None) -> Iterator[bool]:
    """While the packed forward runs, the text model attends piecewise (module docstring); yields
    whether it does (not under checkpointing that `enable_checkpointing` did not turn on)."""
    text_config = unwrapped(model).config.get_text_config()
    if _checkpointing(model) == "other":
        yield False
        return
    state = dict(mask=mask, rows=list(rows), plant=plant, base=text_config._attn_implementation,
                 text_config=text_config)
    with _Armed(state):
        yield True


def shared_prefix_logprobs(model, trajs: Sequence[Trajectory], ids: dict[str, int], temperature: float, device: str,
                           needed: torch.Tensor | None = None, chunk: int = LOGPROB_CHUNK, segmented: bool = True,
                           plant: Plant = None) -> torch.Tensor:
    """`policy.sequence_logprobs`'s log-probs (same layout: [B, L] left-padded, 0 at position 0 and
    off `needed`), each group's prefix run once.

    Args:
        needed: [B, L] bool or 0/1, left-padded: the positions whose log-prob is wanted; None = all.
        segmented: False keeps the dense mask (the reference `segmented_attention` is held to).
        plant: a fault for the equality test to catch; never set outside tests.
    """
    lengths = [t.token_ids.numel() for t in trajs]
    width = max(lengths)
    want = torch.ones(len(trajs), width, dtype=torch.bool) if needed is None else needed.to("cpu", torch.bool).clone()
    want[:, 0] = False
    attention = unwrapped(model).config.get_text_config()._attn_implementation
    if attention not in SHARED_PREFIX_ATTENTION:
        raise ValueError(f"rl.shared_prefix needs an attention implementation that takes an explicit mask "
                         f"{SHARED_PREFIX_ATTENTION}; the model runs {attention!r}: set model.attn_implementation "
                         "or rl.shared_prefix: false")
    packed = pack(trajs, ids, model, plant)
    norm, head = output_layers(model)
    inputs = {name: value.to(device) for name, value in packed.inputs.items()}
    if attention == "eager":  # an additive mask there
        dtype = next(head.parameters()).dtype
        inputs["attention_mask"] = torch.zeros(inputs["attention_mask"].shape, dtype=dtype, device=device).masked_fill(
            ~inputs["attention_mask"], torch.finfo(dtype).min)
    with segmented_attention(model, inputs["attention_mask"], packed.rows, plant) if segmented \
            else contextlib.nullcontext():
        hidden = final_hidden_states(model, inputs, norm)  # [R, N, H]
    sources, targets, rows, cols = [], [], [], []
    for i, t in enumerate(trajs):
        pad = width - lengths[i]
        steps = want[i, pad:].nonzero().flatten()  # positions t of the trajectory; hidden at t - 1 predicts t
        sources.append(packed.source[i][steps - 1])
        targets.append(t.token_ids[steps])
        rows.append(torch.full_like(steps, i))
        cols.append(steps + pad)
    flat = hidden.reshape(-1, hidden.shape[-1])  # [R * N, H]
    on = flat.device
    picked = selected_token_logprobs(head, flat[torch.cat(sources).to(on)], torch.cat(targets).to(on), temperature,
                                     chunk)
    out = torch.zeros(len(trajs), width, dtype=torch.float32, device=on)
    return out.index_put((torch.cat(rows).to(on), torch.cat(cols).to(on)), picked)
