"""The epoch plan: pure functions from (seed, epoch, unit sizes, world) to work.

The plan sees only *units*: things with a number of samples that a reader can
read a run of. A tar shard is a unit (a run of samples is a byte range, from the
manifest's offsets), so is a Parquet row group (rows), and so is one object of an
image folder (one sample). The plan never asks which kind it has; ``counts`` are
the samples per unit, and a :class:`Span` is samples ``[start, stop)`` of a unit.
Below, "shard" means any unit.

The epoch's global sample sequence is the shards in a seeded order, each
shard's samples in file order (so that runs of samples are byte ranges). It is
cut into ``world_size`` contiguous rank spans of exactly ``steps * batch_size``
positions each, so every rank takes the same number of steps. With
``drop_last`` the tail that does not fill a step on every rank is left out;
otherwise positions past the end wrap around and are marked invalid (a padded
sample keeps batch shapes and step counts equal, and the mask tells the loss to
ignore it).

A rank span is cut into *chunks* of ``chunk_batches`` whole batches. A chunk is
the unit of work of one DataLoader worker, and the shuffle window: its samples
are permuted by a generator keyed by (seed, epoch, chunk start), so the order
inside it does not depend on the rank or worker count. Chunks go round-robin to
workers. Progress is counted per chunk in whole batches, which makes resuming
exact and lets the worker count change on resume.
"""
from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TypeVar

import numpy as np

from gpupipe.core.errors import PlanError

__all__ = [
    "PlanSpec",
    "Span",
    "Chunk",
    "Progress",
    "permutation",
    "shard_order",
    "steps_per_rank",
    "rank_chunks",
    "worker_chunks",
    "chunk_spans",
    "chunk_order",
    "chunk_sample_ids",
    "shuffle_buffer",
]

_TAG_SHARDS, _TAG_WINDOW = 1, 2


@dataclass(frozen=True)
class PlanSpec:
    """Everything the plan depends on. Plain data: safe to pickle to workers."""

    counts: tuple[int, ...]  # samples per shard, in manifest order
    batch_size: int
    world_size: int = 1
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = True
    chunk_batches: int = 4

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise PlanError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.world_size < 1:
            raise PlanError(f"world_size must be >= 1, got {self.world_size}")
        if self.chunk_batches < 1:
            raise PlanError(f"chunk_batches must be >= 1, got {self.chunk_batches}")
        if any(c < 0 for c in self.counts):
            raise PlanError("shard sample counts must be >= 0")

    @cached_property
    def num_samples(self) -> int:
        return int(sum(self.counts))

    @cached_property
    def first_ids(self) -> np.ndarray:
        """Global id of each shard's first sample (manifest order), int64, read-only."""
        ids = np.concatenate([[0], np.cumsum(self.counts, dtype=np.int64)[:-1]]).astype(np.int64) \
            if self.counts else np.zeros(0, np.int64)
        ids.flags.writeable = False
        return ids

    @cached_property
    def counts_crc32(self) -> int:
        """CRC-32 of the unit sizes (int64, little-endian): which data the plan cuts, in 4 bytes."""
        return zlib.crc32(np.asarray(self.counts, dtype="<i8").tobytes())


@dataclass(frozen=True)
class Span:
    """Samples ``[start, stop)`` of shard ``shard`` (manifest index); ``valid`` is False for padding."""

    shard: int
    start: int
    stop: int
    valid: bool = True

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Chunk:
    """Batches ``[first_batch, num_batches)`` of chunk ``index`` of a rank's span."""

    index: int
    start: int  # first position in the epoch's (virtual) global sequence
    num_batches: int
    first_batch: int = 0


def permutation(n: int, key: Sequence[int]) -> np.ndarray:
    """A permutation of ``range(n)`` that depends only on ``key``.

    Built from the raw output of PCG64 (a stream NumPy keeps stable across
    versions) by sorting random keys, so it is the same on every machine.
    """
    raw = np.random.PCG64(np.random.SeedSequence(list(key))).random_raw(n)
    return np.argsort(raw, kind="stable")


T = TypeVar("T")


def shuffle_buffer(items: Iterable[T], size: int, rng: np.random.Generator) -> Iterator[T]:
    """A shuffle buffer: hold ``size`` items, emit a random one as each new one arrives,
    then the rest in random order. Deterministic for a given ``rng`` state."""
    buf: list[T] = []
    for x in items:
        if len(buf) < size:
            buf.append(x)
            continue
        j = int(rng.integers(len(buf)))
        buf[j], x = x, buf[j]
        yield x
    yield from (buf[i] for i in rng.permutation(len(buf)))


def shard_order(spec: PlanSpec, epoch: int) -> np.ndarray:
    """Manifest indices of the shards in this epoch's order."""
    n = len(spec.counts)
    return permutation(n, (spec.seed, epoch, _TAG_SHARDS)) if spec.shuffle else np.arange(n)


def steps_per_rank(spec: PlanSpec) -> int:
    """Batches every rank takes in one epoch (the same on all ranks)."""
    per_step = spec.world_size * spec.batch_size
    if spec.drop_last:
        return spec.num_samples // per_step
    return math.ceil(spec.num_samples / per_step)


def rank_chunks(spec: PlanSpec, rank: int, progress: Progress | None = None) -> list[Chunk]:
    """The chunks of ``rank`` that still have batches to deliver, in order."""
    if not 0 <= rank < spec.world_size:
        raise PlanError(f"rank {rank} is not in [0, {spec.world_size})")
    steps = steps_per_rank(spec)
    base = rank * steps * spec.batch_size
    chunks = []
    for index, first in enumerate(range(0, steps, spec.chunk_batches)):
        nb = min(spec.chunk_batches, steps - first)
        done = progress.done(index) if progress is not None else 0
        if done < nb:
            chunks.append(Chunk(index=index, start=base + first * spec.batch_size, num_batches=nb, first_batch=done))
    return chunks


def worker_chunks(chunks: Sequence[Chunk], worker_id: int, num_workers: int) -> list[Chunk]:
    """Round-robin share of ``chunks`` for one DataLoader worker."""
    return list(chunks[worker_id::num_workers])


_LAST_LAYOUT: list = [None]  # ((spec, epoch), (order, counts, ends)) of the latest call


def _layout(spec: PlanSpec, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shard order, counts in that order and their running ends, for one epoch.

    Kept for the latest (spec, epoch), matched by identity: a folder source has one
    unit per image, and a worker asks for the spans of many chunks of one epoch — the
    permutation of a million units is then drawn once, not once per chunk.
    """
    hit = _LAST_LAYOUT[0]
    if hit is not None and hit[0][0] is spec and hit[0][1] == epoch:
        return hit[1]
    order = shard_order(spec, epoch)
    counts = np.asarray(spec.counts, dtype=np.int64)[order]
    layout = (order, counts, np.cumsum(counts))
    _LAST_LAYOUT[0] = ((spec, epoch), layout)
    return layout


def chunk_spans(spec: PlanSpec, epoch: int, chunk: Chunk) -> list[Span]:
    """The shard spans holding all positions of ``chunk`` (from its first batch, not its
    first unconsumed one: the shuffle window is the whole chunk)."""
    n = spec.num_samples
    if n == 0:
        return []
    order, counts, ends = _layout(spec, epoch)
    spans: list[Span] = []
    pos, stop = chunk.start, chunk.start + chunk.num_batches * spec.batch_size
    while pos < stop:
        lap, p = divmod(pos, n)
        k = int(np.searchsorted(ends, p, side="right"))
        shard_start = int(ends[k] - counts[k])
        take = min(stop - pos, int(ends[k]) - p)
        spans.append(Span(shard=int(order[k]), start=p - shard_start, stop=p - shard_start + take, valid=lap == 0))
        pos += take
    return spans


def chunk_order(spec: PlanSpec, epoch: int, chunk: Chunk) -> np.ndarray:
    """Delivery order of the chunk's samples, as indices into its span order."""
    size = chunk.num_batches * spec.batch_size
    if not spec.shuffle:
        return np.arange(size)
    return permutation(size, (spec.seed, epoch, _TAG_WINDOW, chunk.start))


def chunk_sample_ids(spec: PlanSpec, epoch: int, chunk: Chunk) -> tuple[np.ndarray, np.ndarray]:
    """Global sample ids and valid flags of the chunk's *remaining* samples, in delivery
    order. The readers produce exactly this; tests check the plan with it."""
    first, spans = spec.first_ids, chunk_spans(spec, epoch, chunk)
    ids = np.concatenate([np.arange(s.start, s.stop) + first[s.shard] for s in spans] or [np.zeros(0, np.int64)])
    valid = np.concatenate([np.full(len(s), s.valid) for s in spans] or [np.zeros(0, bool)])
    order = chunk_order(spec, epoch, chunk)[chunk.first_batch * spec.batch_size:]
    return ids[order], valid[order]


@dataclass
class Progress:
    """Batches delivered per chunk of one rank in one epoch (the loader's resume state).

    Chunks below ``done_below`` are complete; ``partial`` holds the others that
    have started. Plain data: ``to_dict`` / ``from_dict`` round-trip through JSON.
    """

    chunk_sizes: tuple[int, ...] = ()
    done_below: int = 0
    partial: dict[int, int] = field(default_factory=dict)

    @classmethod
    def for_rank(cls, spec: PlanSpec) -> Progress:
        steps = steps_per_rank(spec)
        sizes = tuple(min(spec.chunk_batches, steps - f) for f in range(0, steps, spec.chunk_batches))
        return cls(chunk_sizes=sizes)

    def done(self, chunk: int) -> int:
        if chunk < self.done_below:
            return self.chunk_sizes[chunk]
        return self.partial.get(chunk, 0)

    def advance(self, chunk: int, batch: int) -> None:
        """Record delivery of batch ``batch`` of ``chunk``; batches of a chunk arrive in order."""
        if batch != self.done(chunk):
            raise PlanError(f"chunk {chunk}: batch {batch} delivered out of order (expected {self.done(chunk)})")
        self.partial[chunk] = batch + 1
        while self.done_below < len(self.chunk_sizes) and self.partial.get(self.done_below) == self.chunk_sizes[self.done_below]:
            del self.partial[self.done_below]
            self.done_below += 1

    @property
    def complete(self) -> bool:
        """Every batch of the rank's epoch was delivered."""
        return self.done_below == len(self.chunk_sizes)

    @property
    def batches_done(self) -> int:
        return sum(self.chunk_sizes[: self.done_below]) + sum(self.partial.values())

    def to_dict(self) -> dict:
        return {"done_below": self.done_below, "partial": {str(k): v for k, v in sorted(self.partial.items())}}

    @classmethod
    def from_dict(cls, spec: PlanSpec, state: Mapping) -> Progress:
        progress = cls.for_rank(spec)
        progress.done_below = int(state["done_below"])
        progress.partial = {int(k): int(v) for k, v in state["partial"].items()}
        bad = [k for k, v in progress.partial.items() if not (0 <= k < len(progress.chunk_sizes) and 0 <= v <= progress.chunk_sizes[k])]
        if progress.done_below > len(progress.chunk_sizes) or bad:
            raise PlanError(f"resume state does not fit this plan (chunks {bad or progress.done_below} out of range)")
        return progress


def check_resumable(saved: Mapping, spec: PlanSpec, *, mid_epoch: bool) -> None:
    """Raise ``PlanError`` naming what differs when a mid-epoch state cannot continue under ``spec``."""
    if not mid_epoch:
        return
    current = plan_identity(spec)
    if "counts_crc32" not in saved:  # a state saved before the unit sizes were recorded
        del current["counts_crc32"]
    diffs = [f"{k}: saved {saved.get(k)!r}, now {v!r}" for k, v in current.items() if saved.get(k) != v]
    if diffs:
        raise PlanError(
            "cannot resume mid-epoch with a different data plan (" + "; ".join(diffs) + "). "
            "Resume with the saved settings, or resume from an end-of-epoch checkpoint. "
            "(The number of DataLoader workers may change; the world size may not, mid-epoch.)"
        )


def plan_identity(spec: PlanSpec) -> dict:
    """The settings a mid-epoch resume must share with the saved run — the unit sizes too: units
    re-cut to the same totals put other samples at every position of the epoch."""
    return {"num_samples": spec.num_samples, "num_shards": len(spec.counts), "batch_size": spec.batch_size,
            "world_size": spec.world_size, "seed": spec.seed, "shuffle": spec.shuffle,
            "drop_last": spec.drop_last, "chunk_batches": spec.chunk_batches, "counts_crc32": spec.counts_crc32}
