"""CRC-32 (zlib's polynomial, the value ``zlib.crc32`` gives) at the speed of the CPU's carry-less
multiply: ISA-L's ``crc32`` (the ``isal`` package) where it is installed, else ``zlib.crc32``.

Both give the same value, so manifests written with either are read by the other. Measured on a
2-core Xeon (AVX-512, 2025): zlib 1.2.13's ``crc32`` 1.7–3.4 GB/s, ISA-L's 22–24 GB/s; for a 23 KB
JPEG that is 6–13 µs against ~2.7 µs, the largest single cost of the host path once the tar
parsing is vectorized (docs/benchmarks.md, "Host path (issue 28)").
"""
from __future__ import annotations

import zlib
from collections.abc import Callable

__all__ = ["crc32", "CRC32_IMPLEMENTATION"]

crc32: Callable[..., int]
try:
    from isal.isal_zlib import crc32 as _isal_crc32
except ImportError:  # not installed (a platform without its wheel): the same values, slower
    crc32, CRC32_IMPLEMENTATION = zlib.crc32, "zlib"
else:
    crc32, CRC32_IMPLEMENTATION = _isal_crc32, "isal"
