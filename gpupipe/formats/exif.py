"""The one Exif field gpupipe reads: the orientation tag of IFD0 (JPEG APP1, PNG eXIf, WebP EXIF)."""
from __future__ import annotations

import struct

__all__ = ["exif_orientation"]


def exif_orientation(tiff: memoryview) -> int:
    """EXIF tag 0x0112 of IFD0 in a TIFF-structured block (either byte order); 1 if absent or malformed."""
    if bytes(tiff[:6]) == b"Exif\x00\x00":  # PNG eXIf and WebP EXIF payloads sometimes keep the prefix
        tiff = tiff[6:]
    mark = bytes(tiff[:2])
    if len(tiff) < 8 or mark not in (b"II", b"MM"):
        return 1
    order = "<" if mark == b"II" else ">"
    magic, ifd = struct.unpack_from(order + "HI", tiff, 2)
    if magic != 42 or not 8 <= ifd <= len(tiff) - 2:
        return 1
    (count,) = struct.unpack_from(order + "H", tiff, ifd)
    for entry in range(ifd + 2, ifd + 2 + 12 * min(count, (len(tiff) - ifd - 2) // 12), 12):
        tag, kind, n = struct.unpack_from(order + "HHI", tiff, entry)
        if tag == 0x0112:
            if kind not in (3, 4) or n != 1:  # SHORT (or, from some writers, LONG)
                return 1
            (value,) = struct.unpack_from(order + ("H" if kind == 3 else "I"), tiff, entry + 8)
            return value if 1 <= value <= 8 else 1
    return 1
