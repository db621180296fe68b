"""Reused read buffers for byte ranges of local files.

Every fresh multi-megabyte buffer costs its page faults on first touch: reading a local shard
into new ``bytes`` cost ~11 µs of CPU per 23 KB sample, into a reused buffer ~3 µs (2-core Xeon,
docs/benchmarks.md, "Host path (issue 28)"). :class:`BufferPool` hands out views of buffers it
keeps, and takes a buffer back by itself once nothing else holds a view of it: a view keeps its
buffer referenced (numpy ``base``, a ``memoryview``'s export), so a buffer referenced only by the
pool is free. Bytes the pool hands out are therefore never overwritten while anything can still
see them; a caller that keeps a block keeps its buffer out of the pool.
"""
from __future__ import annotations

import sys
import threading

import numpy as np

__all__ = ["BufferPool", "read_into"]


class BufferPool:
    """Up to ``keep`` buffers of ``size`` bytes, reused once unreferenced; larger or further
    requests get a buffer of their own. :meth:`shared` gives one pool per process and size,
    so that each pass over the data (a new ``Fetcher``) finds the buffers of the last."""

    _shared: dict[int, BufferPool] = {}
    _shared_lock = threading.Lock()

    def __init__(self, size: int, keep: int):
        self.size, self.keep = size, keep
        self._buffers: list[np.ndarray] = []
        self._lock = threading.Lock()

    @classmethod
    def shared(cls, size: int, keep: int) -> BufferPool:
        """This process's pool of ``size``-byte buffers (keeping the most asked for)."""
        with cls._shared_lock:
            pool = cls._shared.setdefault(size, cls(size, keep))
            pool.keep = max(pool.keep, keep)
            return pool

    @classmethod
    def take_sized(cls, n: int, keep: int, least: int = 1) -> np.ndarray:
        """``n`` bytes from this process's pool of the power-of-two size class that holds them (at
        least ``least`` bytes a buffer), keeping ``keep`` buffers there: buffers of any size
        reused without a pool per size."""
        return cls.shared(max(least, 1 << (n - 1).bit_length()), keep).take(n)

    def take(self, n: int) -> np.ndarray:
        """A uint8 array of ``n`` bytes (contents undefined)."""
        if n > self.size:
            return np.empty(n, dtype=np.uint8)
        with self._lock:
            for i in range(len(self._buffers)):
                if sys.getrefcount(self._buffers[i]) == _FREE:  # held by the list alone: no view alive
                    return self._buffers[i][:n]
            if len(self._buffers) < self.keep:
                self._buffers.append(np.empty(self.size, dtype=np.uint8))
                return self._buffers[-1][:n]
        return np.empty(n, dtype=np.uint8)


def _free_count() -> int:
    """What ``sys.getrefcount(buffers[i])`` reads for a buffer the list alone holds, measured on
    this interpreter the way :meth:`BufferPool.take` asks (counts differ between versions)."""
    probe = [np.empty(1, dtype=np.uint8)]
    return sys.getrefcount(probe[0])


_FREE = _free_count()


def read_into(path: str, start: int, stop: int, pool: BufferPool) -> np.ndarray:
    """Bytes ``[start, stop)`` of the local file ``path`` in a buffer from ``pool``; fewer at
    the end of the file (the caller checks the length)."""
    out = pool.take(stop - start)
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        got = 0
        while got < len(out):
            n = f.readinto(out[got:].data)
            if not n:
                break
            got += n
    return out[:got]
