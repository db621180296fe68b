"""Frozen value types that cross stage boundaries.

Everything here is plain data: cheap to copy, safe to pickle into a DataLoader
worker, and free of torch/CUDA state (``EncodedBatch`` lives in
:mod:`gpupipe.stream.batch` because it holds tensors).
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import overload

from gpupipe.core.launch import from_environment

__all__ = ["World", "ByteRange", "TarMember", "Sample", "ErrorPolicy", "StringTable"]


class ErrorPolicy(str, Enum):
    """What a stage does with bad input: ``raise`` a clear error, or ``skip`` it —
    replace, count and log it, keeping batch shapes and step counts unchanged."""

    RAISE = "raise"
    SKIP = "skip"


@dataclass(frozen=True)
class World:
    """Where this process sits: rank among ranks, worker among DataLoader workers.

    Only :meth:`detect` and :meth:`for_current_worker` read the environment;
    everything else receives a ``World``.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    worker_id: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in [0, world_size={self.world_size})")
        if self.num_workers < 1 or not 0 <= self.worker_id < self.num_workers:
            raise ValueError(
                f"worker_id {self.worker_id} is not in [0, num_workers={self.num_workers})"
            )

    @classmethod
    def detect(cls, rank: int | None = None, world_size: int | None = None) -> World:
        """Read rank and world size once: explicit arguments, else torch.distributed, else the
        launcher's variables, else a single process. The launcher's variables
        (:func:`gpupipe.core.launch.from_environment`): ``RANK``/``WORLD_SIZE`` (torchrun),
        else ``OMPI_COMM_WORLD_RANK``/``_SIZE`` (Open MPI), ``PMI_RANK``/``PMI_SIZE`` (MPICH,
        Intel MPI), ``SLURM_PROCID``/``SLURM_NTASKS`` (srun); the local rank from ``LOCAL_RANK``,
        else that launcher's own (``OMPI_COMM_WORLD_LOCAL_RANK``, ``MPI_LOCALRANKID``,
        ``PMI_LOCAL_RANK``, ``SLURM_LOCALID``)."""
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank and world_size, or neither")
        launch = from_environment(os.environ)
        local_rank = launch.local_rank
        if rank is not None and world_size is not None:
            return cls(rank=rank, world_size=world_size, local_rank=local_rank)
        dist = _initialised_torch_distributed()
        if dist is not None:
            return cls(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank)
        if launch.rank is not None and launch.world_size is not None:
            return cls(rank=launch.rank, world_size=launch.world_size, local_rank=local_rank)
        return cls(local_rank=local_rank)

    def for_current_worker(self) -> World:
        """This world, with the worker id and count of the DataLoader worker we run in
        (unchanged in the main process)."""
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
        if info is None:
            return self
        return replace(self, worker_id=info.id, num_workers=info.num_workers)


def _initialised_torch_distributed():
    import sys

    if "torch" not in sys.modules:  # never import torch just to ask
        return None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist
    return None


@dataclass(frozen=True)
class ByteRange:
    """Bytes ``[start, stop)`` of ``url``; ``stop=None`` means to the end of the object."""

    url: str
    start: int = 0
    stop: int | None = None

    @property
    def length(self) -> int | None:
        return None if self.stop is None else self.stop - self.start


@dataclass(frozen=True)
class TarMember:
    """One regular-file member of a tar stream.

    ``offset`` is the byte offset (in the shard) of the member's first header
    block, counting any pax / GNU long-name headers that precede it; ``end`` is
    the offset just past its padded data.
    """

    name: str
    data: bytes
    offset: int
    end: int = 0


@dataclass(frozen=True)
class Sample:
    """One sample: the members that share a key, by lower-case extension.

    ``sample_id`` is the sample's global id in the manifest order (shard
    offset + index in shard), or -1 when streaming without a manifest;
    ``label`` is the parsed class label once the stream has checked the sample
    (-1 when it has none).
    """

    key: str
    fields: Mapping[str, bytes] = field(repr=False)
    shard: str = ""
    offset: int = 0
    sample_id: int = -1
    label: int = -1


class StringTable(Sequence[str]):
    """A read-only sequence of strings made on demand (names in one blob, URLs from a root):
    subclasses give ``__len__`` and ``_at(i)`` for ``0 <= i < len``; indexing from the end and
    slices (a list) come from here."""

    def __len__(self) -> int:
        raise NotImplementedError

    def _at(self, i: int) -> str:
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self._at(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        j = int(i) + n if i < 0 else int(i)
        if not 0 <= j < n:
            raise IndexError(f"index {i} out of range for {n} strings")
        return self._at(j)
