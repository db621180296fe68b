"""The epoch plan: pure functions from (seed, epoch, unit sizes, world) to work.

The plan sees only *units*: things with a number of samples that a reader can
read a run of. A tar shard is a unit (a run of samples is a byte range, from the
manifest's offsets), so is a Parquet row group (rows), and so is one object of an
image folder (one sample). The plan never asks which kind it has; ``counts`` are
the samples per unit, and a :class:`Span` is samples ``[start, stop)`` of a unit.
Below, "shard" means any unit.

The epoch's global sample sequence is made of *blocks*: each shard cut into runs of
``block`` consecutive samples (the last of a shard shorter), the blocks of all shards in
one seeded order, each block's samples in file order (so that a block is a byte range).
A shuffle window therefore holds blocks of many shards, wherever they sit: on shards
written in class order (a sorted ImageFolder packed without shuffling) a window of 1,024
samples in blocks of 8 draws from 128 places of the data set, and its batches mix classes
about as a uniform shuffle does (docs/tuning.md). ``block`` 0 keeps shards whole: the
sequence is the shards in a seeded order, the layout of plans before blocks (and the one
for units that cannot be read in part, such as Parquet row groups).

**Units of one sample** (an image folder read in place: a unit per image) are *placed*: the
sequence's position ``p`` holds unit ``σ(p)``, ``σ`` a keyed bijection of the units evaluated per
position (:func:`bijection`), so a window's units are computed without an array of all of them —
100M objects plan as cheaply as 1,000 (:attr:`PlanSpec.placed`; ``keyed`` False is the layout of
states before version 4, a permutation of all units, which their epoch keeps on resume).

**Several sources** (``draws``: per source, its number of units — consecutive in ``counts`` —
and the samples it gives an epoch) mix in the same sequence: each source's draw of an epoch is
a cyclic run of its samples in a seeded order fixed across epochs (by blocks), the epoch's run
following the previous epoch's, so a source drawn below its size sees other samples each epoch
and all of them over epochs, and one drawn above it repeats them as evenly; the blocks of all
draws then take one seeded order as a single source's do. Every
rank takes ``steps`` batches, ``steps * batch_size`` positions of the sequence
from its own start. With ``drop_last`` the ranks' spans are contiguous and the
tail that does not fill a step on every rank is left out. Without it, one process
(``world_size`` 1) takes every sample once and its last batch is short — the
``N % batch_size`` samples left, as torch's DataLoader gives — since no other rank
needs equal steps. Several ranks cut the sequence into ``world_size`` contiguous
parts of ``N // world_size`` or one more real samples, and each rank's positions
past its part are padding: they repeat the samples that follow (wrapping around
at the end) and are marked invalid (a padded sample keeps batch shapes and step
counts equal on every rank, and the mask tells the loss to ignore it). So the
padding is spread: no rank has more than one real sample more than another.

A rank's positions are cut into *chunks* of ``chunk_batches`` whole batches. A
chunk is the shuffle window: its samples are permuted by a generator keyed by
(seed, epoch, chunk start), so the order inside it does not depend on the rank or
worker count. With blocks the permutation *spreads* each block over the window: the
samples of a block are ranked at random, and the window delivers every block's first
sample, then every block's second, ... (each rank in a random order), so a batch takes at
most one or two samples of a block and holds as many places of the data set as it can (a
window of 1,024 in blocks of 4: every batch of 256 one sample from each of 256 blocks). A DataLoader worker's unit of work is smaller: a few consecutive
batches of a chunk's delivery order (:mod:`gpupipe.plan_units`), reading only the
samples they hold. Units go round-robin to workers and are delivered in their
order, so the order of the batches depends neither on the worker count nor on the
unit size. Progress is counted per chunk in whole batches, which makes resuming
exact and lets the worker count change on resume.

**Elastic resume.** A mid-epoch position saved under other settings (world size,
batch size, shuffle window, ``drop_last``) cannot continue the same plan. Instead
the saved settings and progress become an :class:`Earlier` part of the epoch,
and the plan (``PlanSpec.before``) is laid out over the *rest*: the positions of
the epoch not delivered by any rank before (every rank is where rank 0 is: ranks
take their steps in lockstep), in sequence order, cut among the new ranks and
chunks exactly as a whole epoch is. The samples stay the same, each once; their
order does not.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, TypeVar, cast

import numpy as np

from gpupipe.core.counts import UnitCounts
from gpupipe.core.errors import PlanError

__all__ = [
    "PlanSpec",
    "Earlier",
    "Span",
    "Chunk",
    "Progress",
    "permutation",
    "bijection",
    "spread",
    "shard_order",
    "blocks",
    "block_order",
    "steps_per_rank",
    "epoch_steps",
    "rank_bounds",
    "rank_chunks",
    "worker_chunks",
    "chunk_spans",
    "chunk_runs",
    "Runs",
    "chunk_size",
    "chunk_order",
    "chunk_sample_ids",
    "shuffle_buffer",
    "check_resumable",
    "plan_identity",
    "resume_plan",
]

_TAG_SHARDS, _TAG_WINDOW, _TAG_BLOCKS, _TAG_DRAW, _TAG_BATCHES = 1, 2, 3, 4, 5


@dataclass(frozen=True)
class Earlier:
    """A part of the current epoch delivered before a resume under other settings.

    ``batch_size``, ``world_size``, ``drop_last`` and ``chunk_batches`` are the settings it ran
    with; ``done_below`` and ``partial`` its progress (:class:`Progress`), which is every rank's:
    ranks take their steps in lockstep and deliver their chunks in order. ``spread`` is False
    for a state of version 1, whose padding sat at the end of the sequence (the last ranks)
    rather than spread over the ranks. ``short_tail`` is False for a state of version 1 or 2,
    which padded the last batch of one process too (:func:`_short_tail`). Plain, hashable data.
    """

    epoch: int
    batch_size: int
    world_size: int
    drop_last: bool
    chunk_batches: int
    done_below: int = 0
    partial: tuple[tuple[int, int], ...] = ()  # (chunk, batches delivered), sorted
    spread: bool = True
    short_tail: bool = True

    @property
    def batches_done(self) -> int:
        """Batches every rank took in this part (the chunks below ``done_below`` are whole)."""
        return self.done_below * self.chunk_batches + sum(d for _, d in self.partial)

    def to_dict(self) -> dict:
        return {"batch_size": self.batch_size, "world_size": self.world_size, "drop_last": self.drop_last,
                "chunk_batches": self.chunk_batches, "spread": self.spread, "short_tail": self.short_tail,
                "progress": {"done_below": self.done_below, "partial": {str(c): d for c, d in self.partial}}}

    @classmethod
    def from_dict(cls, epoch: int, state: Mapping) -> Earlier:
        progress = state["progress"]
        return cls(epoch=epoch, batch_size=int(state["batch_size"]), world_size=int(state["world_size"]),
                   drop_last=bool(state["drop_last"]), chunk_batches=int(state["chunk_batches"]),
                   done_below=int(progress["done_below"]),
                   partial=tuple(sorted((int(c), int(d)) for c, d in progress["partial"].items())),
                   spread=bool(state.get("spread", True)),
                   short_tail=bool(state.get("short_tail", False)))  # absent: saved by version 2, which padded


@dataclass(frozen=True)
class PlanSpec:
    """Everything the plan depends on. Plain data: safe to pickle to workers.

    ``before`` is empty for a whole epoch. After a resume under other settings it holds the
    parts of the epoch delivered before, and the plan covers the rest of that epoch only.
    """

    counts: Sequence[int]  # samples per shard, in manifest order (held as a UnitCounts)
    batch_size: int
    world_size: int = 1
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = True
    chunk_batches: int = 4
    before: tuple[Earlier, ...] = ()
    block: int = 0  # samples per contiguous run of a shard in the sequence; 0: shards whole
    draws: tuple[tuple[int, int], ...] = ()  # per source: (units, samples an epoch); (): one source, each sample once
    per_source: bool = False  # with draws: every batch of one source (each draw whole batches)
    keyed: bool = True  # one-sample units placed per position (:func:`bijection`); False: a state before v4

    def __post_init__(self) -> None:
        object.__setattr__(self, "counts", UnitCounts.of(self.counts))
        if self.per_source:
            if not self.draws or any(n % self.batch_size for _, n in self.draws):
                raise PlanError(f"per-source batches need sources drawn in whole batches of {self.batch_size}, "
                                f"got draws {self.draws}")
            if not self.drop_last and self.world_size > 1:
                raise PlanError("per-source batches on several ranks need drop_last (padding would mix sources)")
            if self.before:
                raise PlanError("per-source batches resume only under the settings they were saved with "
                                "(world size, batch size, shuffle window, drop_last)")
        if self.draws and (sum(u for u, _ in self.draws) != len(self.counts)
                           or any(u < 0 or n < 0 for u, n in self.draws)):
            raise PlanError(f"draws {self.draws} do not cover the {len(self.counts)} units (units >= 0, samples >= 0)")
        if any(n > 0 and self.units.sum_of(a, a + u) == 0 for (u, n), a in zip(self.draws, self._draw_starts)):
            raise PlanError("a source with no samples cannot be drawn from")
        if self.block < 0:
            raise PlanError(f"block must be >= 0 (0: shards whole), got {self.block}")
        if self.batch_size < 1:
            raise PlanError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.world_size < 1:
            raise PlanError(f"world_size must be >= 1, got {self.world_size}")
        if self.chunk_batches < 1:
            raise PlanError(f"chunk_batches must be >= 1, got {self.chunk_batches}")
        if self.units.smallest < 0:
            raise PlanError("shard sample counts must be >= 0")
        if len({e.epoch for e in self.before}) > 1:
            raise PlanError("the earlier parts of an epoch must all be of that epoch")

    @property
    def units(self) -> UnitCounts:
        """``counts``, compact: one number when every unit holds as many samples."""
        return cast(UnitCounts, self.counts)

    @cached_property
    def _draw_starts(self) -> list[int]:
        return list(np.cumsum([0] + [u for u, _ in self.draws])[:-1]) if self.draws else []

    @cached_property
    def num_samples(self) -> int:
        """Samples of an epoch: all units' once, or with ``draws`` the sources' draws."""
        return int(sum(n for _, n in self.draws)) if self.draws else self.units.total

    @cached_property
    def length(self) -> int:
        """Samples in the plan's sequence: the epoch's, or after a resume under other settings,
        those of the epoch not delivered before."""
        return len(_sequence(self)) if self.before else self.num_samples

    def first_ids(self, units: Any) -> Any:
        """Global id of the first sample of each of ``units`` (manifest indices: an int, or an
        int64 array): the samples of the units before it."""
        return self.units.first_ids(units)

    @cached_property
    def counts_crc32(self) -> int:
        """CRC-32 of the unit sizes (int64, little-endian): which data the plan cuts, in 4 bytes."""
        return self.units.crc32()

    @cached_property
    def placed(self) -> bool:
        """Whether the epoch's sequence is computed per position: every unit one sample (an
        image folder or one-row groups read in place), one source, and ``keyed``. A keyed
        bijection of the units then places them (:func:`bijection`); no array of all units is
        made, so planning a window of 100M objects costs what a window of 1,000 does."""
        return self.keyed and self.units.value == 1 and not self.draws


@dataclass(frozen=True)
class Span:
    """Samples ``[start, stop)`` of shard ``shard`` (manifest index); ``valid`` is False for padding."""

    shard: int
    start: int
    stop: int
    valid: bool = True

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, eq=False)
class Runs:
    """Spans as columns (int64 ``shard``, ``start``, ``stop``; bool ``valid``): what a reader
    that works on whole units takes, with no Python object per span (a shuffled unit is
    hundreds of them)."""

    shard: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    valid: np.ndarray

    def __len__(self) -> int:
        return len(self.shard)

    def spans(self) -> list[Span]:
        return [Span(u, a, b, v) for u, a, b, v in zip(self.shard.tolist(), self.start.tolist(), self.stop.tolist(),
                                                      self.valid.tolist())]

    @classmethod
    def of(cls, spans: Sequence[Span]) -> Runs:
        return cls(np.array([s.shard for s in spans], np.int64), np.array([s.start for s in spans], np.int64),
                   np.array([s.stop for s in spans], np.int64), np.array([s.valid for s in spans], bool))


@dataclass(frozen=True)
class Chunk:
    """Batches ``[first_batch, num_batches)`` of chunk ``index`` of a rank's positions.

    Positions from ``valid_stop`` on are padding (``None``: those past the end of the sequence).
    ``size``: the chunk's positions; ``None`` for ``num_batches`` whole batches. Fewer in the last
    chunk of one process without ``drop_last``: its last batch is short (:func:`_short_tail`)."""

    index: int
    start: int  # first position in the plan's (virtual) sequence
    num_batches: int
    first_batch: int = 0
    valid_stop: int | None = None
    size: int | None = None


def permutation(n: int, key: Sequence[int]) -> np.ndarray:
    """A permutation of ``range(n)`` that depends only on ``key``.

    Built from the raw output of PCG64 (a stream NumPy keeps stable across
    versions) by sorting random keys, so it is the same on every machine.
    """
    raw = np.random.PCG64(np.random.SeedSequence(list(key))).random_raw(n)
    return np.argsort(raw, kind="stable")


_ROUNDS = 6  # Feistel rounds of :func:`bijection` (4 make a strong pseudo-random permutation)


def bijection(n: int, key: Sequence[int], positions: np.ndarray) -> np.ndarray:
    """Where a permutation of ``range(n)`` keyed by ``key`` sends each of ``positions`` (int64):
    a permutation evaluated per position, with no array of ``n`` — what places 100M units.

    A balanced Feistel network on the smallest even number of bits that holds ``n - 1``, its
    round function the SplitMix64 finaliser of the half and the round's key (the keys drawn
    from ``SeedSequence(key)``, stable across NumPy versions); a value that lands at ``n`` or
    above is walked on through the network until it lands below (the walk from a value below
    ``n`` returns below ``n``, so this is a bijection of ``range(n)``; the domain is under
    ``4 n``, so a walk is short)."""
    x = np.asarray(positions, dtype=np.uint64).copy()
    if n <= 1 or not len(x):
        return x.astype(np.int64)
    half = np.uint64(max(1, ((n - 1).bit_length() + 1) // 2))
    mask = np.uint64((1 << int(half)) - 1)
    keys = np.random.SeedSequence(list(key)).generate_state(_ROUNDS, np.uint64)
    todo = np.arange(len(x))
    while len(todo):
        left, right = x[todo] >> half, x[todo] & mask
        for k in keys:
            left, right = right, left ^ (_mix(right ^ k) & mask)
        x[todo] = (left << half) | right
        todo = todo[x[todo] >= n]
    return x.astype(np.int64)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: every bit of ``z`` moves every bit of the result (uint64, wrapping)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


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
    """Manifest indices of the shards in this epoch's order (the order of whole shards: ``block`` 0)."""
    n = len(spec.counts)
    return permutation(n, (spec.seed, epoch, _TAG_SHARDS)) if spec.shuffle else np.arange(n)


def blocks(counts: Sequence[int] | np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each shard cut into runs of ``block`` samples, in manifest order: (shard, first sample,
    samples) of every block, int64. ``block`` 0: one block per shard (empty shards included)."""
    sizes = np.asarray(counts, dtype=np.int64)
    if block == 0:
        return np.arange(len(sizes), dtype=np.int64), np.zeros(len(sizes), np.int64), sizes
    per = -(-sizes // block)
    shard = np.repeat(np.arange(len(sizes), dtype=np.int64), per)
    firsts = np.concatenate([[0], np.cumsum(per)[:-1]]) if len(per) else np.zeros(0, np.int64)
    first = (np.arange(len(shard), dtype=np.int64) - np.repeat(firsts, per)) * block
    return shard, first, np.minimum(block, sizes[shard] - first)


def draw_sizes(sizes: Sequence[int], *, weight: Sequence[float | None] | None = None,
               repeat: Sequence[float | None] | None = None, samples: Sequence[int | None] | None = None) -> tuple[int, ...]:
    """Samples an epoch takes from each source of ``sizes`` samples, each source given exactly one
    of ``weight`` (relative: the weighted sources share their total size in these proportions),
    ``repeat`` (its size times this) or ``samples`` (absolute); rounded so the weighted shares sum
    exactly (largest remainders). A pure function: every rank computes the same."""
    k = len(sizes)
    w: list[float | None] = list(weight) if weight is not None else [None] * k
    r: list[float | None] = list(repeat) if repeat is not None else [None] * k
    n: list[int | None] = list(samples) if samples is not None else [None] * k
    out = [0] * k
    for i in range(k):
        given = [x for x in (w[i], r[i], n[i]) if x is not None]
        if len(given) != 1 or given[0] < 0:
            raise PlanError(f"source {i}: give one of weight, repeat or samples (>= 0), got {given or 'none'}")
        ri, ni = r[i], n[i]
        if ri is not None:
            out[i] = int(round(ri * sizes[i]))
        elif ni is not None:
            out[i] = int(ni)
    weighted = [(i, wi) for i, wi in enumerate(w) if wi is not None]
    total = sum(wi for _, wi in weighted)
    if weighted and total <= 0:
        raise PlanError("the weights of the sources sum to 0")
    budget = sum(sizes[i] for i, _ in weighted)
    exact = [budget * wi / total for _, wi in weighted]
    floors = [int(np.floor(x)) for x in exact]
    for j in sorted(range(len(weighted)), key=lambda j: (floors[j] - exact[j], j))[: budget - sum(floors)]:
        floors[j] += 1
    for (i, _), f in zip(weighted, floors):
        out[i] = f
    return tuple(out)


def _draw(counts: np.ndarray, block: int, samples: int, epoch: int, key: tuple[int, ...], shuffle: bool
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One source's draw of ``samples`` for ``epoch``: (unit, first sample, samples) of its pieces,
    units counted within the source. Its blocks in a seeded order fixed across epochs (``key``),
    their samples end to end, and the epoch's run the cyclic ``[epoch * samples, (epoch + 1) *
    samples)`` of them, cut at block edges."""
    unit, first, count = blocks(counts, block)
    keep = count > 0
    unit, first, count = unit[keep], first[keep], count[keep]
    if shuffle:
        order = permutation(len(unit), key)
        unit, first, count = unit[order], first[order], count[order]
    size = int(count.sum())
    if samples == 0 or size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    start = epoch * samples % size
    laps = -(-(start + samples) // size)  # the base order, end to end, as often as the run needs it
    ends = np.cumsum(np.tile(count, laps))
    unit, first, count = np.tile(unit, laps), np.tile(first, laps), np.tile(count, laps)
    lo = int(np.searchsorted(ends, start, side="right"))
    hi = int(np.searchsorted(ends, start + samples, side="left"))
    unit, first, count, ends = unit[lo:hi + 1], first[lo:hi + 1].copy(), count[lo:hi + 1].copy(), ends[lo:hi + 1]
    cut_front = start - (ends[0] - count[0])
    first[0] += cut_front
    count[0] -= cut_front
    count[-1] -= ends[-1] - (start + samples)
    return unit, first, count


def _epoch_blocks(spec: PlanSpec, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The epoch's blocks before their order: (shard, first sample, samples), int64 — every unit's
    (:func:`blocks`), or with ``draws`` every source's draw (:func:`_draw`)."""
    if spec.per_source:
        return _source_batches(spec, epoch)
    if not spec.draws:
        return blocks(spec.units.array, spec.block)
    counts = spec.units.array
    parts = []
    for s, ((units, n), a) in enumerate(zip(spec.draws, spec._draw_starts)):
        unit, first, count = _draw(counts[a:a + units], spec.block, n, epoch, (spec.seed, _TAG_DRAW, s), spec.shuffle)
        parts.append((unit + a, first, count))
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))  # type: ignore[return-value]


def _source_batches(spec: PlanSpec, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``per_source``: the epoch's blocks already in sequence order. Each source's draw in a
    seeded order of its blocks, cut into batches (a block across a batch edge is cut in two);
    the batches of all sources in one seeded order — so the epoch is a sequence of one-source
    batches, a source's share of them its draw's."""
    counts = spec.units.array
    b = spec.batch_size
    pieces, batch_source = [], []
    for s, ((units, n), a) in enumerate(zip(spec.draws, spec._draw_starts)):
        unit, first, count = _draw(counts[a:a + units], spec.block, n, epoch, (spec.seed, _TAG_DRAW, s), spec.shuffle)
        if spec.shuffle:
            order = permutation(len(unit), (spec.seed, epoch, _TAG_BLOCKS, s))
            unit, first, count = unit[order], first[order], count[order]
        ends = np.cumsum(count)
        cuts = np.union1d(np.concatenate([[0], ends]), np.arange(0, n + 1, b))  # block ends and batch edges
        k = np.searchsorted(ends, cuts[:-1], side="right")  # the block each piece lies in
        piece_first = first[k] + cuts[:-1] - (ends[k] - count[k])
        pieces.append((unit[k] + a, piece_first, np.diff(cuts), cuts[:-1] // b))
        batch_source += [s] * (n // b)
    shard, first, count, batch = (np.concatenate([p[i] for p in pieces]) for i in range(4))
    offsets = np.cumsum([0] + [n // b for _, n in spec.draws])[:-1]
    batch = batch + np.repeat(offsets, [len(p[0]) for p in pieces])  # batch index over all sources
    order_of = permutation(len(batch_source), (spec.seed, epoch, _TAG_BATCHES)) if spec.shuffle \
        else np.arange(len(batch_source))
    rank = np.empty(len(order_of), dtype=np.int64)
    rank[order_of] = np.arange(len(order_of))  # the place of each batch in the epoch
    seq = np.lexsort((np.arange(len(batch)), rank[batch]))  # by batch place, pieces in order inside
    return shard[seq], first[seq], count[seq]


def batch_sources(spec: PlanSpec, epoch: int, positions: np.ndarray) -> np.ndarray:
    """``per_source``: the source of each of ``positions`` (of the epoch's sequence)."""
    starts = np.asarray(spec._draw_starts, dtype=np.int64)
    return np.searchsorted(starts, _locate(spec, epoch, positions)[0], side="right") - 1


def block_order(spec: PlanSpec, epoch: int, num_blocks: int) -> np.ndarray:
    """Indices of the epoch's blocks (:func:`blocks`) in this epoch's order."""
    if spec.per_source:
        return np.arange(num_blocks)  # _source_batches laid them out
    if spec.block == 0 and not spec.draws:
        return shard_order(spec, epoch)
    return permutation(num_blocks, (spec.seed, epoch, _TAG_BLOCKS)) if spec.shuffle else np.arange(num_blocks)


# -- the cut, on plain integers: a sequence of `length` samples, `world` ranks, batch `batch` ------------

def _steps(length: int, world: int, batch: int, drop_last: bool) -> int:
    per_step = world * batch
    return length // per_step if drop_last else -(-length // per_step)


def _bounds(length: int, world: int, batch: int, drop_last: bool, rank: int, spread: bool = True) -> tuple[int, int]:
    """(first position, first padding position) of ``rank``; it takes ``steps * batch`` positions."""
    size = _steps(length, world, batch, drop_last) * batch
    if drop_last or not spread:  # contiguous spans; without drop_last (version 1) the padding is at the end
        return rank * size, min(rank * size + size, length)
    q, r = divmod(length, world)
    start = rank * q + min(rank, r)
    return start, start + q + (rank < r)


def _short_tail(world: int, drop_last: bool) -> bool:
    """Whether the plan ends at the last sample rather than at a whole batch: for one process
    without ``drop_last``, whose last batch is then short, as torch's DataLoader gives. Padding
    is only for ranks, which must take equal steps (a DDP collective waits for every rank)."""
    return world == 1 and not drop_last


def _window(size: int, seed: int, epoch: int, start: int, depth: int, shuffle: bool,
            runs: np.ndarray | None = None) -> np.ndarray:
    """Delivery order of a chunk of ``size`` positions from ``start`` (plan ``depth``: resumes under
    other settings this epoch; 0 keeps the key of a whole epoch's plan): a keyed permutation, or
    with ``runs`` (the block of each position) one that spreads each block over the window
    (:func:`spread`)."""
    if not shuffle:
        return np.arange(size)
    key = (seed, epoch, _TAG_WINDOW, start) if depth == 0 else (seed, epoch, _TAG_WINDOW, start, depth)
    return permutation(size, key) if runs is None else spread(runs, key)


def spread(runs: np.ndarray, key: Sequence[int]) -> np.ndarray:
    """A permutation of ``range(len(runs))`` keyed by ``key`` that spreads each run (positions with
    one value of ``runs``, a block) over the whole: each run's positions ranked at random, then
    every run's rank-0 position, every run's rank-1 position, ..., each rank in a random order."""
    n = len(runs)
    raw = np.random.PCG64(np.random.SeedSequence(list(key))).random_raw(2 * n)
    grouped = np.lexsort((raw[:n], runs))  # by run, at random inside one
    g = runs[grouped]
    firsts = np.flatnonzero(np.concatenate([[True], g[1:] != g[:-1]]))
    rank = np.empty(n, dtype=np.int64)
    rank[grouped] = np.arange(n) - np.repeat(firsts, np.diff(np.append(firsts, n)))
    return np.lexsort((raw[n:], rank))


def _by_source(sources: np.ndarray, key: Sequence[int], runs: np.ndarray | None) -> np.ndarray:
    """``per_source``: a window's delivery order that fills each source's batches (its positions:
    whole batches) with that source's samples only, spread over them as :func:`_window` spreads
    a whole window (``runs``: the block of each position; ``None``, a keyed permutation)."""
    order = np.empty(len(sources), dtype=np.int64)
    for s in np.unique(sources).tolist():
        pos = np.flatnonzero(sources == s)
        mine = (*key, s)
        order[pos] = pos[permutation(len(pos), mine) if runs is None else spread(runs[pos], mine)]
    return order


def _undelivered(length: int, part: Earlier, seed: int, shuffle: bool, depth: int,
                 block_of: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """Indices (sorted) into a sequence of ``length`` samples of those of the epoch that ``part``,
    a plan over that sequence, did not deliver on any of its ranks; ``block_of`` gives the block
    of positions of that sequence (``None``: shards whole)."""
    world, batch, cb = part.world_size, part.batch_size, part.chunk_batches
    steps = _steps(length, world, batch, part.drop_last)
    num_chunks = -(-steps // cb)
    partial = dict(part.partial)
    bad = [c for c, d in partial.items() if not (part.done_below <= c < num_chunks and 0 <= d <= min(cb, steps - c * cb))]
    if not 0 <= part.done_below < num_chunks or bad:
        raise PlanError(f"resume state does not fit the plan it was saved under (chunks {(bad or [part.done_below])[:5]} "
                        f"out of range of {num_chunks})")
    left = np.zeros(length, dtype=bool)
    left[: world * steps * batch if part.drop_last else length] = True  # the epoch: with drop_last, not the tail
    for rank in range(world):
        start, valid_stop = _bounds(length, world, batch, part.drop_last, rank, part.spread)
        left[start:max(start, min(start + part.done_below * cb * batch, valid_stop))] = False
        for c, d in partial.items():
            first = start + c * cb * batch
            size = min(cb, steps - c * cb) * batch
            if part.short_tail and _short_tail(world, part.drop_last):
                size = min(size, valid_stop - first)
            runs = None if block_of is None else block_of(np.arange(first, first + size) % length)
            pos = first + _window(size, seed, part.epoch, first, depth, shuffle, runs)[: d * batch]
            left[pos[pos < valid_stop]] = False
    return np.flatnonzero(left)


_RESTS: dict = {}  # (num_samples, seed, shuffle, before, block, keyed, counts_crc32) → _sequence's array, the latest few


def _sequence(spec: PlanSpec) -> np.ndarray:
    """Positions in the epoch's sequence of the samples the plan still has to deliver, in
    sequence order (read-only int64). Only for a plan with ``before``."""
    key = (spec.num_samples, spec.seed, spec.shuffle, spec.before, spec.block, spec.keyed, spec.counts_crc32)
    if key not in _RESTS:
        if len(_RESTS) >= 8:
            del _RESTS[next(iter(_RESTS))]
        epoch = spec.before[0].epoch
        seq = np.arange(spec.num_samples, dtype=np.int64)
        for depth, part in enumerate(spec.before):
            block_of = None if not spec.block else (lambda p, seq=seq: _locate(spec, epoch, seq[p])[2])
            seq = seq[_undelivered(len(seq), part, spec.seed, spec.shuffle, depth, block_of)]
        seq.flags.writeable = False
        _RESTS[key] = seq
    return _RESTS[key]


# -- the plan ----------------------------------------------------------------------------------

def steps_per_rank(spec: PlanSpec) -> int:
    """Batches every rank takes under this plan (the same on all ranks)."""
    return _steps(spec.length, spec.world_size, spec.batch_size, spec.drop_last)


def epoch_steps(spec: PlanSpec) -> int:
    """Batches of the epoch on every rank: those of this plan, and after a resume under other
    settings also those every rank took before it."""
    return sum(part.batches_done for part in spec.before) + steps_per_rank(spec)


def rank_bounds(spec: PlanSpec, rank: int) -> tuple[int, int]:
    """(first position, first padding position) of ``rank`` in the plan's sequence; the rank
    takes ``steps_per_rank(spec) * batch_size`` positions from the first."""
    if not 0 <= rank < spec.world_size:
        raise PlanError(f"rank {rank} is not in [0, {spec.world_size})")
    return _bounds(spec.length, spec.world_size, spec.batch_size, spec.drop_last, rank)


def rank_chunks(spec: PlanSpec, rank: int, progress: Progress | None = None) -> list[Chunk]:
    """The chunks of ``rank`` that still have batches to deliver, in order. One process without
    ``drop_last`` stops at its last sample: its last chunk's ``size`` leaves out the padding."""
    start, valid_stop = rank_bounds(spec, rank)
    steps, b = steps_per_rank(spec), spec.batch_size
    end = valid_stop if _short_tail(spec.world_size, spec.drop_last) else start + steps * b
    chunks = []
    for index, first in enumerate(range(0, steps, spec.chunk_batches)):
        nb = min(spec.chunk_batches, steps - first)
        done = progress.done(index) if progress is not None else 0
        at = start + first * b
        if done < nb:
            chunks.append(Chunk(index=index, start=at, num_batches=nb, first_batch=done, valid_stop=valid_stop,
                                size=None if at + nb * b <= end else end - at))
    return chunks


def chunk_size(spec: PlanSpec, chunk: Chunk) -> int:
    """Positions in ``chunk``: its whole batches, or fewer where the plan ends with a short batch."""
    return chunk.num_batches * spec.batch_size if chunk.size is None else chunk.size


def worker_chunks(chunks: Sequence[Chunk], worker_id: int, num_workers: int) -> list[Chunk]:
    """Round-robin share of ``chunks`` for one DataLoader worker."""
    return list(chunks[worker_id::num_workers])


_LAST_LAYOUT: list = [None]  # ((spec, epoch), (shard, first, counts, ends)) of the latest call


def _layout(spec: PlanSpec, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The epoch's blocks in sequence order: their shard, first sample and sample count, and
    the running ends of the counts.

    Kept for the latest (spec, epoch), matched by identity: a folder source has one
    unit per image, and a worker asks for the spans of many chunks of one epoch — the
    permutation of a million units is then drawn once, not once per chunk.
    """
    hit = _LAST_LAYOUT[0]
    if hit is not None and hit[0][0] is spec and hit[0][1] == epoch:
        return hit[1]
    shard, first, counts = _epoch_blocks(spec, epoch)
    order = block_order(spec, epoch, len(shard))
    layout = (shard[order], first[order], counts[order], np.cumsum(counts[order]))
    _LAST_LAYOUT[0] = ((spec, epoch), layout)
    return layout


def _locate(spec: PlanSpec, epoch: int, p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions ``p`` of the epoch's sequence: the unit and the sample in it each holds, and
    the index of its block in sequence order. Per position when the plan is :attr:`PlanSpec.placed`
    (a block is a unit of one sample, the unit the units' keyed bijection at ``p``); else from
    the epoch's :func:`_layout`."""
    if spec.placed:
        unit = bijection(len(spec.counts), (spec.seed, epoch, _TAG_SHARDS), p) if spec.shuffle else p
        return unit, np.zeros(len(p), np.int64), p
    shard, first, counts, ends = _layout(spec, epoch)
    k = np.searchsorted(ends, p, side="right")
    return shard[k], first[k] + p - (ends[k] - counts[k]), k


def _check_epoch(spec: PlanSpec, epoch: int) -> None:
    if spec.before and spec.before[0].epoch != epoch:
        raise PlanError(f"this plan is the rest of epoch {spec.before[0].epoch}, not of epoch {epoch}")


def chunk_spans(spec: PlanSpec, epoch: int, chunk: Chunk, within: np.ndarray | None = None) -> list[Span]:
    """The shard spans holding all positions of ``chunk`` (from its first batch, not its
    first unconsumed one: the shuffle window is the whole chunk) — or only its positions
    ``within`` (indices into the chunk's positions, ascending), a span per run of them that
    is a run of samples of one shard."""
    return chunk_runs(spec, epoch, chunk, within).spans()


def chunk_runs(spec: PlanSpec, epoch: int, chunk: Chunk, within: np.ndarray | None = None) -> Runs:
    """:func:`chunk_spans` as columns."""
    _check_epoch(spec, epoch)
    length = spec.length
    if length == 0:
        empty = np.zeros(0, np.int64)
        return Runs(empty, empty, empty, np.zeros(0, bool))
    pos = np.arange(chunk.start, chunk.start + chunk_size(spec, chunk), dtype=np.int64)
    if within is not None:
        pos = pos[within]
    valid = pos < (length if chunk.valid_stop is None else chunk.valid_stop)
    p = pos % length  # padding past the end wraps around to the start
    if spec.before:
        p = _sequence(spec)[p]
    unit, offset, _ = _locate(spec, epoch, p)
    new = np.ones(len(p), dtype=bool)  # a span starts at a new shard, a gap, or where padding starts or ends
    new[1:] = (unit[1:] != unit[:-1]) | (offset[1:] != offset[:-1] + 1) | (valid[1:] != valid[:-1])
    firsts = np.flatnonzero(new)
    starts = offset[firsts]
    return Runs(unit[firsts].astype(np.int64, copy=False), starts, starts + np.diff(np.append(firsts, len(p))),
                valid[firsts])


_ORDERS: list = []  # ((spec, epoch, chunk start, size), order) of the latest chunks, matched by identity


def chunk_order(spec: PlanSpec, epoch: int, chunk: Chunk) -> np.ndarray:
    """Delivery order of the chunk's samples, as indices into its span order (read-only). Kept for
    the latest chunks: a worker asks for it once per unit, and a chunk has many units."""
    size = chunk_size(spec, chunk)
    for (s, e, start, n), order in _ORDERS:
        if s is spec and (e, start, n) == (epoch, chunk.start, size):
            return order
    runs = None
    if spec.block and spec.shuffle and spec.length:
        _check_epoch(spec, epoch)
        p = np.arange(chunk.start, chunk.start + size, dtype=np.int64) % spec.length
        runs = _locate(spec, epoch, _sequence(spec)[p] if spec.before else p)[2]
    if spec.per_source and spec.shuffle and spec.length:
        p = np.arange(chunk.start, chunk.start + size, dtype=np.int64) % spec.length
        order = _by_source(batch_sources(spec, epoch, p), (spec.seed, epoch, _TAG_WINDOW, chunk.start), runs)
    else:
        order = _window(size, spec.seed, epoch, chunk.start, len(spec.before), spec.shuffle, runs)
    order.flags.writeable = False
    _ORDERS[:] = [((spec, epoch, chunk.start, size), order)] + _ORDERS[:3]
    return order


def chunk_sample_ids(spec: PlanSpec, epoch: int, chunk: Chunk) -> tuple[np.ndarray, np.ndarray]:
    """Global sample ids and valid flags of the chunk's *remaining* samples, in delivery
    order. The readers produce exactly this; tests check the plan with it."""
    spans = chunk_spans(spec, epoch, chunk)
    ids = np.concatenate([np.arange(s.start, s.stop) + spec.first_ids(s.shard) for s in spans] or [np.zeros(0, np.int64)])
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
    def started(self) -> bool:
        return bool(self.done_below or self.partial)

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


# -- resume --------------------------------------------------------------------------------------

_DATA_KEYS = ("num_samples", "num_shards", "seed", "shuffle", "counts_crc32", "draws", "per_source")
_CUT_KEYS = ("batch_size", "world_size", "drop_last", "chunk_batches")


def check_resumable(saved: Mapping, spec: PlanSpec, *, mid_epoch: bool) -> None:
    """Raise ``PlanError`` naming what differs when a mid-epoch state cannot continue under
    ``spec``: other data (unit sizes), another seed or ``shuffle`` (they fix which sample is at
    which position of the epoch). The world size, batch size, shuffle window and ``drop_last``
    may change: :func:`resume_plan` plans the rest of the epoch under the new ones."""
    if not mid_epoch:
        return
    current = {k: v for k, v in plan_identity(spec).items() if k in _DATA_KEYS}
    if "counts_crc32" not in saved:  # a state saved before the unit sizes were recorded
        del current["counts_crc32"]
    before: dict[str, Any] = {"draws": [], "per_source": False}  # what a state saved before a key was recorded means
    diffs = [f"{k}: saved {saved.get(k, before.get(k))!r}, now {v!r}" for k, v in current.items()
             if saved.get(k, before.get(k)) != v]
    if diffs:
        raise PlanError(
            "cannot resume mid-epoch with other data or another sample order (" + "; ".join(diffs) + "). "
            "Resume with the saved data, seed and shuffle setting, or resume from an end-of-epoch checkpoint. "
            "(The world size, batch size, shuffle window, drop_last, number of workers and unit_batches may change.)"
        )


def plan_identity(spec: PlanSpec) -> dict:
    """The settings a plan was made with, as a saved state records them: the data and its order
    (which a mid-epoch resume must share with the saved run — the unit sizes too: units re-cut to
    the same totals put other samples at every position of the epoch) and the cut (which may change)."""
    return {"num_samples": spec.num_samples, "num_shards": len(spec.counts), "batch_size": spec.batch_size,
            "world_size": spec.world_size, "seed": spec.seed, "shuffle": spec.shuffle,
            "drop_last": spec.drop_last, "chunk_batches": spec.chunk_batches, "counts_crc32": spec.counts_crc32,
            "block": spec.block, "draws": [list(d) for d in spec.draws], "per_source": spec.per_source,
            "keyed": spec.keyed}


def resume_plan(spec: PlanSpec, epoch: int, saved: Mapping, progress: Mapping, before: Sequence[Earlier] = (),
                *, spread: bool = True, short_tail: bool = True) -> tuple[PlanSpec, Progress]:
    """The plan and progress that continue, under ``spec``'s settings, an epoch saved mid-way:
    ``saved`` is the :func:`plan_identity` it ran under, ``progress`` its :meth:`Progress.to_dict`,
    ``before`` its own earlier parts, ``spread`` False for a state of version 1, ``short_tail``
    False for a state of version 1 or 2 (one process's last batch padded, :attr:`Earlier.short_tail`).

    With the saved cut (world size, batch size, shuffle window, ``drop_last``) the saved plan
    continues, in its order. With another, the saved part becomes an :class:`Earlier` and the
    plan covers the samples of the epoch no rank has delivered, in a new order.

    The epoch keeps the saved ``block`` (a state without one: shards whole) and ``keyed`` (a
    state without it, saved before version 4, laid one-sample units out by a permutation of all
    of them), whatever ``spec`` says: they fix which sample is at which position of the epoch.
    The next epoch is laid out with ``spec``'s.
    """
    # a state without "keyed" (before v4) permuted all units; keyed matters to placed plans only
    spec = replace(spec, block=int(saved.get("block", 0)), keyed=bool(saved.get("keyed", not spec.placed)))
    check_resumable(saved, spec, mid_epoch=True)
    before = tuple(before)
    if any(part.epoch != epoch for part in before):
        raise PlanError(f"resume state of epoch {epoch} holds parts of another epoch")
    cut = {k: saved[k] for k in _CUT_KEYS}
    same = all(cut[k] == getattr(spec, k) for k in _CUT_KEYS)
    if same and not spread:  # version 1: its layout is this one's unless padding sat on the last ranks
        length = spec.num_samples
        same = all(_bounds(length, spec.world_size, spec.batch_size, spec.drop_last, r, False)
                   == _bounds(length, spec.world_size, spec.batch_size, spec.drop_last, r) for r in range(spec.world_size))
    if same and not short_tail:  # versions 1 and 2: their order differs in a last chunk that held padding
        same = not _padded_tail_started(replace(spec, before=before), progress)
    if same:
        plan = replace(spec, before=before)
        return plan, Progress.from_dict(plan, progress)
    part = Earlier(epoch=epoch, batch_size=int(cut["batch_size"]), world_size=int(cut["world_size"]),
                   drop_last=bool(cut["drop_last"]), chunk_batches=int(cut["chunk_batches"]),
                   done_below=int(progress["done_below"]),
                   partial=tuple(sorted((int(c), int(d)) for c, d in progress["partial"].items())), spread=spread,
                   short_tail=short_tail)
    plan = replace(spec, before=before + (part,))
    return plan, Progress.for_rank(plan)  # for_rank works out the rest: a state that does not fit raises here


def _padded_tail_started(plan: PlanSpec, progress: Mapping) -> bool:
    """Whether a state saved by a version that padded the last batch of one process (1 or 2) has
    delivered part of the last chunk, where that padding sat. That chunk's order under ``plan``,
    whose last batch is short, is not the one it was delivered in: the rest of it cannot continue
    the same plan (the other chunks, padding-free, can)."""
    if not _short_tail(plan.world_size, plan.drop_last) or plan.length % plan.batch_size == 0:
        return False
    last = (steps_per_rank(plan) - 1) // plan.chunk_batches
    return any(int(c) == last for c in progress["partial"])
