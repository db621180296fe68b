"""Whether a PNG is a *plain* one: the kind a native decoder may get (issue 28).

:func:`plain` walks every chunk of a PNG whose signature and IHDR :func:`gpupipe.formats.imageheader.probe`
already checked, and says why it is not plain ("" when it is):

* 8-bit grayscale, RGB, gray + alpha or RGBA (colour types 0, 2, 4, 6), not interlaced;
* every chunk where the previous one's length says, its CRC right (ISA-L's CRC-32 where
  installed: a few µs for a 100 KB file), the IDAT chunks consecutive, IEND last, nothing after it;
* besides IHDR, IDAT and IEND only ancillary chunks that leave the decoded pixels alone for
  Pillow and for DALI alike (text, time, physical size, colour-space hints that neither applies).

Everything else -- palette, 1/2/4/16-bit, Adam7, transparency (``tRNS``), an Exif orientation
(``eXIf``), APNG frames, unknown chunks, a damaged chunk -- goes to Pillow, which decodes it
as before. Why so strict: DALI's CPU PNG decoder gives Pillow's pixels for these (checked by
tests/decode/test_png_native.py) and decodes with ~20 % less CPU than Pillow, plus torch's resize
instead of Pillow's (docs/benchmarks.md, issue 28); for the rest there is no such check, and a
native decoder that is fed a damaged file may take the process down with it (issue 23's lesson).
"""
from __future__ import annotations

import struct

from gpupipe.core.checksum import crc32

__all__ = ["plain", "MAX_CHUNKS"]

MAX_CHUNKS = 4096  # chunks walked; a PNG with more goes to Pillow
_HEAD = 8 + 25  # signature + IHDR chunk
_PLAIN_COLOUR = {0: "grayscale", 2: "RGB", 4: "gray + alpha", 6: "RGBA"}
_SAFE_ANCILLARY = frozenset({b"gAMA", b"cHRM", b"sRGB", b"iCCP", b"sBIT", b"pHYs", b"tIME", b"tEXt", b"zTXt",
                             b"iTXt", b"bKGD"})


def plain(view: memoryview) -> str:
    """Why the PNG ``view`` is not plain (see the module docstring); "" when it is."""
    depth, colour, interlace = view[24], view[25], view[28]
    if colour not in _PLAIN_COLOUR:
        return f"colour type {colour}"
    if depth != 8:
        return f"{depth}-bit"
    if interlace:
        return "interlaced (Adam7)"
    pos, end, seen_idat, idat_done = _HEAD, len(view), False, False
    if crc32(view[12:29]) != struct.unpack_from(">I", view, 29)[0]:
        return "IHDR CRC mismatch"
    for _ in range(MAX_CHUNKS):
        if pos + 12 > end:
            return f"a chunk header cut off at byte {pos}"
        length, kind = struct.unpack_from(">I4s", view, pos)
        stop = pos + 12 + length
        if stop > end:
            return f"chunk {bytes(kind)!r} at byte {pos} runs past the end"
        if crc32(view[pos + 4:stop - 4]) != struct.unpack_from(">I", view, stop - 4)[0]:
            return f"CRC mismatch in chunk {bytes(kind)!r} at byte {pos}"
        if kind == b"IEND":
            return "" if seen_idat and stop == end and length == 0 else "IEND misplaced, or data after it"
        if kind == b"IDAT":
            if idat_done:
                return "IDAT chunks not consecutive"
            seen_idat = True
        elif kind not in _SAFE_ANCILLARY:
            return f"chunk {bytes(kind)!r}"
        else:
            idat_done = seen_idat
        pos = stop
    return f"more than {MAX_CHUNKS} chunks"
