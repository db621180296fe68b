"""A worker's unit of work: a few batches of one chunk, not the whole shuffle window.

A chunk (:mod:`gpupipe.plan`) is the shuffle window: its samples are delivered in the order of
a permutation keyed by (seed, epoch, chunk start). A *unit* is ``unit_batches`` consecutive
batches of that delivery order, cut from the chunk's first undelivered batch on (a chunk
resumed mid-way starts its first unit there; its last unit may be shorter). Its samples are
the chunk's positions ``chunk_order(...)[a * batch_size:b * batch_size]``, and a worker reads
only them: the positions sorted, cut into runs of one shard's consecutive samples — a
:class:`~gpupipe.plan.Span` per run, a byte range of a tar shard — then put back in the
chunk's order (:func:`unit_spans`). So the batches and their order are the chunk's, whatever
the unit size and the worker count; only what a worker reads at once changes.

Units go round-robin to the workers in plan order (chunk, then batch) and the loader
delivers them in that order. Progress stays counted per chunk in whole batches
(:class:`~gpupipe.plan.Progress`), so resuming works as before and the unit size, like the
worker count, may change on resume. Pure functions, like the plan: imports only the plan.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from gpupipe.core.errors import PlanError
from gpupipe.plan import Chunk, PlanSpec, Progress, Runs, Span, chunk_order, chunk_runs, rank_chunks

__all__ = ["Unit", "cut_units", "rank_units", "worker_units", "unit_spans", "unit_runs", "unit_sample_ids"]


@dataclass(frozen=True)
class Unit:
    """Batches ``[first_batch, first_batch + num_batches)`` of ``chunk``'s delivery order
    (counted from the chunk's batch 0)."""

    chunk: Chunk
    first_batch: int
    num_batches: int

    @property
    def key(self) -> tuple[int, int]:
        """(chunk index, first batch): the unit's place in the plan's order."""
        return self.chunk.index, self.first_batch


def cut_units(chunks: Sequence[Chunk], unit_batches: int, first_batches: int | None = None) -> list[Unit]:
    """Each chunk's undelivered batches (from ``chunk.first_batch``) cut into units of
    ``unit_batches``, the last of a chunk shorter when they do not divide; a ``unit_batches``
    larger than a chunk gives the chunk whole. The first chunk (of a pass: the first with
    batches left) is cut into units of ``first_batches`` when given: a pass's first batch then
    waits for its own samples only, and the rest is read in larger units, which read longer
    byte ranges (fewer and cheaper). In plan order."""
    first_batches = unit_batches if first_batches is None else first_batches
    if min(unit_batches, first_batches) < 1:
        raise PlanError(f"unit_batches must be >= 1, got {min(unit_batches, first_batches)}")
    out = []
    for n, c in enumerate(chunks):
        size = first_batches if n == 0 else unit_batches
        out += [Unit(c, first, min(size, c.num_batches - first)) for first in range(c.first_batch, c.num_batches, size)]
    return out


def rank_units(spec: PlanSpec, rank: int, progress: Progress | None = None, unit_batches: int = 1,
               first_batches: int | None = None) -> list[Unit]:
    """The units of ``rank`` that still have batches to deliver, in plan order (:func:`cut_units`)."""
    return cut_units(rank_chunks(spec, rank, progress), unit_batches, first_batches)


T = TypeVar("T")


def worker_units(units: Sequence[T], worker_id: int, num_workers: int) -> list[T]:
    """Round-robin share of ``units`` for one DataLoader worker."""
    return list(units[worker_id::num_workers])


def unit_spans(spec: PlanSpec, epoch: int, unit: Unit) -> tuple[list[Span], np.ndarray]:
    """The shard spans holding the unit's samples, in sequence order (one per run of
    consecutive samples of one shard, padding apart), and the delivery order: indices into
    the spans' samples taken one after another."""
    runs, order = unit_runs(spec, epoch, unit)
    return runs.spans(), order


def unit_runs(spec: PlanSpec, epoch: int, unit: Unit) -> tuple[Runs, np.ndarray]:
    """:func:`unit_spans` with the spans as columns."""
    b = spec.batch_size
    window = chunk_order(spec, epoch, unit.chunk)[unit.first_batch * b:(unit.first_batch + unit.num_batches) * b]
    within = np.sort(window)
    return chunk_runs(spec, epoch, unit.chunk, within), np.searchsorted(within, window)


def unit_sample_ids(spec: PlanSpec, epoch: int, unit: Unit) -> tuple[np.ndarray, np.ndarray]:
    """Global sample ids and valid flags of the unit's samples, in delivery order: what the
    readers produce from :func:`unit_spans`; tests check the plan with it."""
    spans, order = unit_spans(spec, epoch, unit)
    ids = np.concatenate([np.arange(s.start, s.stop) + spec.first_ids(s.shard) for s in spans] or [np.zeros(0, np.int64)])
    valid = np.concatenate([np.full(len(s), s.valid) for s in spans] or [np.zeros(0, bool)])
    return ids[order], valid[order]
