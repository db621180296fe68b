"""Samples per unit, compact: what a manifest gives the planner.

A folder of 100M images read in place is 100M units of one sample each. As a tuple of Python
ints that list alone is 800 MB in every process that plans (and pickles to every worker);
:class:`UnitCounts` holds it as one number when every unit has the same count, and as one int64
array otherwise. It is a read-only ``Sequence[int]`` and equals any sequence of the same ints.
"""
from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from functools import cached_property
from typing import Any, overload

import numpy as np

__all__ = ["UnitCounts"]

_CRC_PIECE = 1 << 17  # units per piece of a uniform count's CRC (1 MiB of int64)


class UnitCounts(Sequence[int]):
    """Samples per unit, in manifest order: ``uniform(value, n)`` or ``of(counts)``."""

    def __init__(self, n: int, value: int | None, array: np.ndarray | None) -> None:
        self._n, self._value, self._array = n, value, array

    @classmethod
    def uniform(cls, value: int, n: int) -> UnitCounts:
        """``n`` units of ``value`` samples each, held as two numbers."""
        if n < 0:
            raise ValueError(f"a number of units must be >= 0, got {n}")
        return cls(int(n), int(value), None)

    @classmethod
    def of(cls, counts: Sequence[int] | np.ndarray) -> UnitCounts:
        """``counts`` as they are (an ``UnitCounts`` is returned unchanged); one value repeated
        is kept as :meth:`uniform`."""
        if isinstance(counts, UnitCounts):
            return counts
        array = np.array(counts, dtype=np.int64).reshape(-1)
        if len(array) and (array == array[0]).all():
            return cls.uniform(int(array[0]), len(array))
        array.flags.writeable = False
        return cls(len(array), None, array)

    @property
    def value(self) -> int | None:
        """The count of every unit when they are all the same (and there is one); else ``None``."""
        return self._value if self._n else None

    @cached_property
    def array(self) -> np.ndarray:
        """The counts as a read-only int64 array (made, for a uniform count, when first asked)."""
        if self._array is not None:
            return self._array
        out = np.full(self._n, self._value or 0, dtype=np.int64)
        out.flags.writeable = False
        return out

    @cached_property
    def total(self) -> int:
        """Samples in all units."""
        return self._n * (self._value or 0) if self._array is None else int(self._array.sum())

    @cached_property
    def smallest(self) -> int:
        if self._array is None:
            return self._value or 0
        return int(self._array.min()) if self._n else 0

    @cached_property
    def _starts(self) -> np.ndarray:
        starts = np.zeros(self._n, dtype=np.int64)
        np.cumsum(self.array[:-1], out=starts[1:])
        return starts

    def first_ids(self, units: Any) -> Any:
        """The global id of each of ``units``' first sample (an int or an int64 array): the
        samples of the units before it. A uniform count computes them; others keep a cumsum."""
        if self._array is None:
            return np.asarray(units, dtype=np.int64) * (self._value or 0) if isinstance(units, np.ndarray) \
                else int(units) * (self._value or 0)
        return self._starts[units]

    def sum_of(self, start: int, stop: int) -> int:
        """Samples in units ``[start, stop)``."""
        start, stop = max(0, start), min(self._n, stop)
        if stop <= start:
            return 0
        return (stop - start) * (self._value or 0) if self._array is None else int(self._array[start:stop].sum())

    def crc32(self) -> int:
        """CRC-32 of the counts as int64, little-endian: the bytes of ``array``, without making it."""
        if self._array is not None:
            return zlib.crc32(self._array.astype("<i8", copy=False).tobytes())
        piece = np.full(min(self._n, _CRC_PIECE), self._value or 0, dtype="<i8").tobytes()
        crc, left = 0, self._n
        while left >= _CRC_PIECE:
            crc, left = zlib.crc32(piece, crc), left - _CRC_PIECE
        return zlib.crc32(piece[: left * 8], crc)

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> UnitCounts: ...

    def __getitem__(self, index: int | slice) -> int | UnitCounts:
        if isinstance(index, slice):
            if self._array is None:
                return UnitCounts.uniform(self._value or 0, len(range(*index.indices(self._n))))
            return UnitCounts.of(self._array[index])
        if not -self._n <= index < self._n:
            raise IndexError(f"unit {index} of {self._n}")
        return int(self._value if self._array is None else self._array[index])  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[int]:
        if self._array is None:
            return iter([self._value or 0] * self._n)
        return iter(self._array.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, UnitCounts):
            if self._n != other._n:
                return False
            if self._array is None and other._array is None:
                return self._n == 0 or self._value == other._value
            return bool(np.array_equal(self.array, other.array))
        if isinstance(other, (Sequence, np.ndarray)) and not isinstance(other, (str, bytes)):
            return len(other) == self._n and bool(np.array_equal(self.array, np.asarray(other)))
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self._n, self.total))

    def __repr__(self) -> str:
        if self._array is None:
            return f"UnitCounts.uniform({self._value}, {self._n})"
        shown = ", ".join(map(str, self._array[:8].tolist())) + (", ..." if self._n > 8 else "")
        return f"UnitCounts.of([{shown}])  # {self._n} units"

    def __reduce__(self) -> tuple:
        return UnitCounts, (self._n, self._value, self._array)
