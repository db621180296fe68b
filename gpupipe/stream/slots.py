"""Shared-memory batch buffers that a worker reuses once the training process has let go.

A batch crosses from a DataLoader worker to the training process in one shared-memory storage.
A fresh one costs its pages: the kernel zeroes and maps each on first touch, ~16 ms of a
worker's CPU per 25 MB batch (256 ImageNet-sized JPEGs) on a 2-core VM, against ~1.4 ms to copy
the same bytes into a buffer used before (docs/benchmarks.md, "Reused shared batches") — the
largest cost per byte of the host path. So each worker keeps a few storages (slots) and writes
the next batch into one the training process no longer holds.

Who holds what is one flag per (worker, slot) in shared memory, made before the workers fork
(:class:`SlotBoard`): the worker sets it (to the number of the pass) when it sends a batch in that
slot; the training process clears it once nothing there references the batch's storage any more — torch's own count of the
storage's references (every tensor, view, numpy array or DLPack capsule made from the batch
holds one), read each time a batch arrives (:meth:`SlotBoard.release`). A batch still referenced
anywhere is never written over; when no slot is free the worker makes a fresh storage, as
before. The board lives as long as its workers: across passes, a pass broken off leaves batches
torch drops unseen; their slots, flagged by an earlier pass and not held, are taken back when the
next pass starts (:meth:`SlotBoard.reclaim`).

A slot's storage crosses to the training process once. torch hands a storage over with a file
descriptor through a connection to the worker — an authentication round trip, ~0.8 ms of the
training process's CPU and ~0.7 ms of the worker's per batch on the 2-core VM, the largest
per-batch cost of the hand-over (docs/benchmarks.md, "A slot's storage crosses once") — so the training process keeps
each slot's storage once it has it (:meth:`SlotBoard.receive`) and says so in shared memory
(``mapped``: the generation of each slot's storage it holds). A batch in a slot whose storage is
already there travels as a :class:`SlotBatch`: the batch with each of its tensors replaced by
where it lies in the slot (:class:`_View`), rebuilt on arrival as views of the kept storage. A
new storage (a slot's first use, or one grown) travels with its batch, once.
"""
from __future__ import annotations

import itertools
import os
import weakref
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any

import numpy as np
import torch

from gpupipe.core.errors import GpupipeError

__all__ = ["SlotBoard", "SlotTaker", "SlotBatch", "shared_bytes", "MAX_SLOTS"]

MAX_SLOTS = 32  # per worker: past this many batches out at once, a worker makes fresh storages
_GROW = 1.25  # a new slot holds this much more than the batch that made it: the next may be larger


def shared_bytes(n: int) -> torch.Tensor:
    """``n`` uint8 in a new shared-memory storage. ``share_memory_()`` on a fresh tensor first
    allocates private memory and then copies it into the shared segment: ~30 us of CPU per
    23 KB sample against ~4 us for a storage made shared (docs/benchmarks.md, "Host path
    (issue 28)"). ``UntypedStorage._new_shared`` is how torch's own multiprocessing makes one;
    on a torch without it, the copy it is."""
    try:
        storage = torch.UntypedStorage._new_shared(n)
    except (AttributeError, TypeError, RuntimeError):
        return torch.empty(n, dtype=torch.uint8).share_memory_()
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def _references(storage: torch.UntypedStorage) -> int:
    """How many references torch counts on ``storage``'s memory (this Python object's included)."""
    return int(torch._C._storage_Use_Count(storage._cdata))


def _free_references() -> int:
    """What :func:`_references` reads for a storage referenced by its Python object alone,
    measured the way :meth:`SlotBoard.release` asks (the count is torch's, not Python's)."""
    storage = torch.empty(8, dtype=torch.uint8).untyped_storage()
    return _references(storage)


_FREE = _free_references() if hasattr(torch._C, "_storage_Use_Count") else -1  # -1: never released


_BOARDS: weakref.WeakValueDictionary[int, SlotBoard] = weakref.WeakValueDictionary()  # training process: by id
_IDS = itertools.count(1)


class SlotBoard:
    """The flags of ``workers`` × ``slots`` reusable batch buffers, in shared memory; made in
    the training process before the workers fork. A flag is non-zero while the training process may
    hold the batch sent in that slot; ``mapped`` is the generation of the slot's storage the
    training process keeps (0: none yet)."""

    def __init__(self, workers: int, slots: int):
        self.slots = slots = max(1, min(slots, MAX_SLOTS))
        self.flags = torch.zeros(max(1, workers) * slots, dtype=torch.int32).share_memory_()
        self.mapped = torch.zeros(max(1, workers) * slots, dtype=torch.int64).share_memory_()
        self.id = (os.getpid() << 20) | next(_IDS)
        self._held: list[tuple[torch.UntypedStorage, int]] = []  # training process: batches out, by slot
        self._storages: dict[int, tuple[int, torch.UntypedStorage]] = {}  # training process: slot → (generation, storage)
        _BOARDS[self.id] = self

    def taker(self, worker_id: int) -> SlotTaker:
        """The worker side, for worker ``worker_id``."""
        return SlotTaker(self, worker_id)

    # -- the training process ------------------------------------------------------------
    def hold(self, data: torch.Tensor, slot: int) -> None:
        """A batch arrived in ``slot`` (-1: a storage of its own); ``data`` is any of its tensors."""
        if slot >= 0:
            self._held.append((data.untyped_storage(), slot))

    def receive(self, item: Any) -> Any:
        """What a worker sent, with a :class:`SlotBatch` made a batch again: its storage kept when
        it came with it, its tensors views of the slot's kept storage."""
        if not isinstance(item, SlotBatch):
            return item
        if item.storage is not None:
            self._storages[item.slot] = (item.generation, item.storage.untyped_storage())
            self.mapped[item.slot] = item.generation
        generation, storage = self._storages.get(item.slot, (0, None))
        if storage is None or generation != item.generation:
            raise GpupipeError(f"a batch arrived in slot {item.slot} (storage {item.generation}) whose storage never "
                               f"did (kept: {generation}): a gpupipe bug, please report it")
        return _attached(item.batch, storage, item.where)

    def reclaim(self, pass_id: int) -> int:
        """At the start of pass ``pass_id``, after torch has dropped what the last pass left in
        flight: free the slots an earlier pass flagged whose batches never arrived here."""
        held = {slot for _, slot in self._held}
        stale = [i for i in torch.nonzero((self.flags > 0) & (self.flags < pass_id)).flatten().tolist()
                 if i not in held]
        if stale:
            self.flags[stale] = 0
        return len(stale)

    def release(self) -> int:
        """Clear the flag of each held batch nothing references any more; the number cleared."""
        kept, freed = [], 0
        for storage, slot in self._held:
            if _references(storage) == _FREE:
                self.flags[slot] = 0
                freed += 1
            else:
                kept.append((storage, slot))
        self._held = kept
        return freed


class SlotTaker:
    """One worker's slots: :meth:`take` gives the buffer for its next batch."""

    def __init__(self, board: SlotBoard, worker_id: int):
        self.flags = board.flags[worker_id * board.slots:(worker_id + 1) * board.slots]
        self.first = worker_id * board.slots
        self.storages: list[torch.UntypedStorage | None] = [None] * board.slots
        self.fresh = 0  # storages made (a slot's first use or growth, or none free)
        self.pass_id = 1  # what a slot taken now is flagged with (the pass under way)
        self.mapped = board.mapped
        self.board = board.id
        self.generations = [0] * board.slots  # of each slot's storage: counted per slot, from 1

    def take(self, n: int) -> tuple[torch.Tensor, int]:
        """``n`` uint8 of shared memory and the slot they are in (-1: none free, a new storage
        of its own). The slot is marked held: write the batch, then send it."""
        free = np.flatnonzero(self.flags.numpy() == 0)  # (numpy: a few us, torch's nonzero ~20)
        if not len(free):
            self.fresh += 1
            return shared_bytes(n), -1
        i = int(free[0])
        storage = self.storages[i]
        if storage is None or storage.nbytes() < n:
            self.fresh += 1
            storage = shared_bytes(int(n * _GROW)).untyped_storage()
            self.storages[i] = storage
            self.generations[i] += 1
        self.flags[i] = self.pass_id
        return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (n,), (1,)), self.first + i

    def crossing(self, batch: Any) -> Any:
        """What to send for ``batch`` (a dataclass whose ``slot`` says where it was packed): a
        :class:`SlotBatch`, its storage with it only when the training process does not keep it yet;
        a batch in a storage of its own as it is."""
        slot = getattr(batch, "slot", -1)
        if slot < 0:
            return batch
        i = slot - self.first
        storage = self.storages[i]
        assert storage is not None, "a batch in a slot was packed in its storage"
        generation = self.generations[i]
        ship = None if int(self.mapped[slot]) == generation else torch.empty(0, dtype=torch.uint8).set_(storage)
        return SlotBatch(self.board, slot, generation, ship, *_detached(batch, storage.data_ptr()))


@dataclass(frozen=True)
class _View:
    """Where a tensor lies in its slot's storage (offset and strides in elements of ``dtype``)."""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(frozen=True)
class SlotBatch:
    """A batch on its way from a worker: in slot ``slot`` of board ``board``, whose storage
    (generation ``generation``) comes along as ``storage`` the first time, else is kept by the
    training process already; ``batch`` is the batch with its tensors in the slot as :class:`_View`,
    at ``where`` (:func:`_detached`)."""

    board: int
    slot: int
    generation: int
    storage: torch.Tensor | None
    batch: Any
    where: tuple = ()

    def pin_memory(self) -> Any:
        """torch's pinning thread, in the training process: the batch again, pinned."""
        board = _BOARDS.get(self.board)
        if board is None:
            raise GpupipeError("a batch arrived for a loader that is gone: a gpupipe bug, please report it")
        return board.receive(self).pin_memory()


def _detached(obj: Any, base: int) -> tuple[Any, tuple]:
    """``obj`` (a dataclass) with every tensor in the storage at ``base``, its own fields' too,
    replaced by its :class:`_View`; and where they were: ``(field name, where inside it or None)``
    for each field changed (:func:`_attached` visits those only)."""
    changes: dict[str, Any] = {}
    where: list[tuple[str, tuple | None]] = []
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() == base:
            changes[f.name] = _View(int(value.storage_offset()), value.dtype, tuple(value.shape), tuple(value.stride()))
            where.append((f.name, None))
        elif is_dataclass(value) and not isinstance(value, type):
            inner, inside = _detached(value, base)
            if inside:
                changes[f.name] = inner
                where.append((f.name, inside))
    return (replace(obj, **changes) if changes else obj), tuple(where)


def _attached(obj: Any, storage: torch.UntypedStorage, where: tuple) -> Any:
    """``obj`` with each :class:`_View` that :func:`_detached` put at ``where`` made a tensor of
    ``storage`` again."""
    changes: dict[str, Any] = {}
    for name, inside in where:
        value = getattr(obj, name)
        if inside is None:
            changes[name] = torch.empty(0, dtype=value.dtype).set_(storage, value.offset, value.shape, value.stride)
        else:
            changes[name] = _attached(value, storage, inside)
    return replace(obj, **changes) if changes else obj