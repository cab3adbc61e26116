"""SFT micro-batches in a fixed order, encoded in the training process or ahead of it in workers.

The order is a pure function of (seed, step, micro-batch, rank): a resumed run sees the same
samples as an uninterrupted one (worker.py's departures). Encoding a sample (frames through
the cache, the processor's patching, the chat template) is CPU work: 0.17-0.36 s per 64-frame
sample of the 2B-shape benchmark on one of this project's CPU machines (4 encodes measured;
the GPU machine's CPU was not timed), against a 0.35-0.48 s forward+backward on an H100
(docs/gpu_check.md): done in line, the GPU waits for it every micro-batch.
With `sft.data_workers` > 0, worker processes (a `torch.utils.data.DataLoader`, forked, two
micro-batches ahead each) encode and collate the next micro-batches while the GPU trains on
this one: padding or packing, and the position tensors of `sft.host_positions`
(model/positions.py; the model's rope index reads only its config, so a forked worker calls it on
CPU tensors and never touches the GPU). The samples and their order are the same either way
(tests/integration/test_sft.py).

The dataset's counters (over-long skips, undecodable videos, frame-cache hits) live in
whichever process encoded: each item carries its process's running totals, and
`EncodingStats.total` adds the last totals of every process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def sample_order(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(num_samples)


def sample_index(position: int, num_samples: int, seed: int, cache: dict[int, np.ndarray]) -> int:
    """The dataset index at a global position of the (endless, reshuffled per epoch) stream."""
    epoch, offset = divmod(position, num_samples)
    if epoch not in cache:
        cache[epoch] = sample_order(num_samples, seed, epoch)
    return int(cache[epoch][offset])


def micro_batch(dataset, step: int, micro: int, rank: int, world: int, accum_index: int, accum: int,
                seed: int, orders: dict[int, np.ndarray]):
    """The samples of one rank's micro-batch; a skipped (over-long) sample is replaced by the next one."""
    per_step = micro * accum * world
    first = step * per_step + (accum_index * world + rank) * micro
    samples = []
    for k in range(micro):
        position = first + k
        for attempt in range(len(dataset)):
            sample = dataset.encode(sample_index(position + attempt * per_step, len(dataset), seed, orders))
            if sample is not None:
                samples.append(sample)
                break
        else:
            raise RuntimeError(f"every SFT sample is skipped ({len(dataset.media_errors)} with undecodable videos, "
                               "the others over max_seq_len); check the videos or raise sft.max_seq_len")
    return samples


@dataclass
class EncodingStats:
    """One encoding process's running totals of the dataset's counters."""

    overlong_skipped: int = 0
    overlong_truncated: int = 0
    media_errors: dict[str, str] = field(default_factory=dict)  # row source -> why its video did not decode
    cache_hits: int = 0
    cache_misses: int = 0

    @classmethod
    def of(cls, dataset) -> EncodingStats:
        return cls(dataset.overlong.skipped, dataset.overlong.truncated, dict(dataset.media_errors),
                   dataset.cache.hits, dataset.cache.misses)

    @staticmethod
    def total(per_process: dict[int, EncodingStats]) -> EncodingStats:
        out = EncodingStats()
        for stats in per_process.values():
            out.overlong_skipped += stats.overlong_skipped
            out.overlong_truncated += stats.overlong_truncated
            out.media_errors.update(stats.media_errors)
            out.cache_hits += stats.cache_hits
            out.cache_misses += stats.cache_misses
        return out


@dataclass
class MicroBatch:
    batch: dict[str, Any]  # the model inputs (CPU tensors), collated where the samples were encoded
    tokens: int
    count: int
    process: int  # -1: the training process; else the DataLoader worker's id
    stats: EncodingStats

    def pin_memory(self) -> MicroBatch:
        """The same micro-batch with its tensors in page-locked memory (`sft.pin_memory`). The
        DataLoader's pin thread calls this by name: an object without it is passed on unpinned."""
        pinned = {k: v.pin_memory() if hasattr(v, "pin_memory") else v for k, v in self.batch.items()}
        return MicroBatch(pinned, self.tokens, self.count, self.process, self.stats)


class MicroBatchPlan:
    """Item i: micro-batch i of this rank's steps [start, max_steps), step-major (map-style dataset)."""

    def __init__(self, dataset, *, start: int, max_steps: int, micro: int, accum: int, rank: int, world: int,
                 seed: int, collate: Callable[[list], dict[str, Any]]):
        self.dataset, self.start, self.max_steps = dataset, start, max_steps
        self.micro, self.accum, self.rank, self.world, self.seed = micro, accum, rank, world, seed
        self.collate = collate
        self._orders: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return max(0, self.max_steps - self.start) * self.accum

    def __getitem__(self, i: int) -> MicroBatch:
        import torch.utils.data

        step, a = divmod(i, self.accum)
        samples = micro_batch(self.dataset, self.start + step, self.micro, self.rank, self.world, a, self.accum,
                              self.seed, self._orders)
        info = torch.utils.data.get_worker_info()
        return MicroBatch(self.collate(samples), sum(s.num_tokens for s in samples), len(samples),
                          -1 if info is None else info.id, EncodingStats.of(self.dataset))


def _as_is(item: MicroBatch) -> MicroBatch:
    return item


PREFETCH_FACTOR = 2  # micro-batches each worker keeps ready (the pre-flight counts their /dev/shm)


def micro_batches(plan: MicroBatchPlan, workers: int, pin_memory: bool = False) -> Iterator[MicroBatch]:
    """The plan's micro-batches in order: encoded here (`workers` 0) or by forked worker processes,
    each keeping two micro-batches ready; in page-locked memory when `pin_memory` (a CUDA run's
    `sft.pin_memory`: with workers, the DataLoader's pin thread does it while the GPU trains)."""
    if workers == 0:
        for i in range(len(plan)):
            yield plan[i].pin_memory() if pin_memory else plan[i]
        return
    from torch.utils.data import DataLoader

    loader = DataLoader(plan, batch_size=None, shuffle=False, num_workers=workers, collate_fn=_as_is,
                        prefetch_factor=PREFETCH_FACTOR, multiprocessing_context="fork", pin_memory=pin_memory)
    yield from loader
