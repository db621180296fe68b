"""The JPEG header, walked once: what it declares, and whether it is strictly well-formed.

:func:`walk` reads markers from SOI to the first SOS. It is *lenient* where libjpeg is
(fill bytes and a few stray bytes before a marker are skipped), so every JPEG that Pillow
can open still gets a header. Beside that it checks the header *strictly*, and says in
``irregular`` why the header is not one a native decoder should get:

* SOI at byte 0 and every segment starting exactly where the previous one's length says:
  no stray bytes, no fill bytes, no ``FF 00``, no standalone marker (RSTn, TEM) and no
  marker that has no business before a scan (DAC, DNL, EXP, JPGn, reserved codes);
* exactly one SOF, with 1, 3 or 4 unique components, sampling factors of 1, 2 or 4 that
  divide the largest, defined quantisation table ids, at most 10 blocks per MCU;
* DQT, DHT and DRI segments whose bodies are exactly their tables (valid ids and classes,
  Huffman counts that fit their code lengths as libjpeg requires, DC symbols <= 15);
* an SOS whose components are the frame's (unique), whose Huffman tables are defined,
  whose spectral selection fits the coding (0..63 with no approximation for sequential
  frames; a DC scan first for progressive ones), and whose length is exactly its fields;
  the quantisation tables of every component of the frame defined before it.

Stricter than the standard in two places, on purpose (such files go to Pillow, which is
slower but safe): tables defined between scans, and more than 10 blocks per MCU in a frame
whose scans are not interleaved (libjpeg checks that limit per interleaved scan).

Why: the JPEG parser under DALI (nvImageCodec, on the CPU and the GPU alike) crashes the
process on headers libjpeg recovers from (stray bytes, ``FF 00`` for a marker, a length a
few bytes off), instead of raising (issue 23). Such files go to Pillow, which decodes them
or refuses them with an exception. Only the header is read; scan data is never scanned.
"""
from __future__ import annotations

import operator
import struct
from typing import NamedTuple

from gpupipe.core.errors import DecodeError
from gpupipe.formats.exif import exif_orientation

__all__ = ["JpegHeader", "walk", "SOF_MARKERS", "HUFFMAN_SOF", "MAX_SEGMENTS"]

MAX_SEGMENTS = 4096  # markers walked before SOS
_MAX_SKIP = 4096  # fill bytes or stray bytes tolerated before one marker (the lenient walk)
SOF_MARKERS = frozenset((0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF))
_PROGRESSIVE = frozenset((0xC2, 0xC6, 0xCA, 0xCE))
HUFFMAN_SOF = frozenset((0xC0, 0xC1, 0xC2))  # baseline, extended, progressive: what the strict checks understand
_STANDALONE = frozenset((0x01, 0xD0, 0xD1, 0xD2, 0xD3, 0xD4, 0xD5, 0xD6, 0xD7))
_SOI, _EOI, _SOS, _DQT, _DHT, _DRI, _APP1, _COM = 0xD8, 0xD9, 0xDA, 0xDB, 0xC4, 0xDD, 0xE1, 0xFE
_SAMPLING = (1, 2, 4)
_KRAFT = tuple(1 << (16 - length) for length in range(1, 17))  # what one code of each length takes of 2^16
# Verdicts cached by what they depend on: most files share their encoder's tables and layout.
_HUFF_CACHE: dict[bytes, tuple[int, int] | str] = {}  # DHT body -> (DC ids, AC ids) bit masks, or why not
_LAYOUT_CACHE: dict[tuple, str] = {}  # (SOF marker, components, SOS body, table masks) -> why not, or ""
_CACHE_SIZE = 512
# Whole walks remembered by the header's bytes (SOI to the end of the first SOS segment), a few
# header lengths at a time: images from one encoder and one source share them byte for byte.
_WALKED: dict[int, dict[bytes, JpegHeader]] = {}
_WALKED_LENGTHS = 4


class JpegHeader(NamedTuple):
    """What :func:`walk` found. ``scan``: the byte offset where the first scan's entropy
    coded data starts; ``irregular``: why the header is not strictly well-formed, "" if it is."""

    width: int
    height: int
    channels: int
    progressive: bool
    precision: int
    sof: int
    orientation: int
    exif_conflict: bool
    scan: int
    irregular: str


class _Frame(NamedTuple):
    width: int
    height: int
    precision: int
    marker: int
    components: tuple[tuple[int, int, int, int], ...]  # (id, h, v, quant table) each


def walk(view: memoryview) -> JpegHeader:
    """Walk ``view`` (starting FF D8) to its first SOS; raise :class:`DecodeError` if the
    header is cut off or unreadable even leniently.

    What the walk finds depends only on the header's bytes (up to ``scan``, the end of the SOS
    segment) and on the data going on past them, so a header seen before byte for byte is
    answered from memory (~0.5 us instead of ~30 us of Python a marker at a time)."""
    size = len(view)
    for length, known in list(_WALKED.items()):  # (another thread may add a length meanwhile)
        if length < size:
            hit = known.get(bytes(view[:length]))
            if hit is not None:
                return hit
    header = _walk(view)
    table = _WALKED.get(header.scan)
    if table is None:
        if len(_WALKED) >= _WALKED_LENGTHS:
            _WALKED.pop(next(iter(_WALKED)), None)  # the length seen first
        table = _WALKED[header.scan] = {}
    _remember(table, bytes(view[:header.scan]), header)
    return header


def _walk(view: memoryview) -> JpegHeader:
    pos, frame, orientation, conflict, irregular = 2, None, None, False, ""
    tables = [0, 0, 0]  # bit masks of the defined quantisation, DC and AC table ids
    size = len(view)
    for _ in range(MAX_SEGMENTS):
        wanted = "SOF" if frame is None else "SOS"
        cut = f"truncated JPEG: no {wanted} marker before end of data"
        if pos + 1 < size and view[pos] == 0xFF and view[pos + 1] not in (0x00, 0xFF):
            marker, start = view[pos + 1], pos + 2  # the usual case: the marker right where it belongs
        else:
            found = _next_marker(view, pos)
            if found is None:
                raise DecodeError(f"{cut} ({size} bytes)")
            marker, start = found
            irregular = irregular or f"{start - 2 - pos} stray or fill bytes before the marker at byte {start - 2}"
        pos = start
        if marker in _STANDALONE:
            irregular = irregular or f"standalone marker 0xFF{marker:02X} at byte {pos - 2} in the header"
            continue
        if marker in (_SOI, _EOI):
            raise DecodeError(f"JPEG: marker 0xFF{marker:02X} at byte {pos - 2} before {wanted}")
        if pos + 2 > size:
            raise DecodeError(f"{cut} ({size} bytes)")
        end = pos + (view[pos] << 8 | view[pos + 1])
        if end < pos + 2:
            raise DecodeError(f"JPEG: marker 0xFF{marker:02X} at byte {pos - 2} has a length below 2")
        if end > size:
            raise DecodeError(f"{cut} (segment 0xFF{marker:02X} at byte {pos - 2} runs to byte {end}, "
                              f"data has {size})")
        body = view[pos + 2:end]
        if marker == _SOS:
            if frame is None:
                raise DecodeError(f"JPEG: SOS marker at byte {pos - 2} before any SOF")
            if end >= size:
                raise DecodeError("truncated JPEG: data ends right after the header (no scan data)")
            irregular = irregular or _check_layout(body, frame, tables)
            return JpegHeader(frame.width, frame.height, len(frame.components), frame.marker in _PROGRESSIVE,
                              frame.precision, frame.marker, orientation or 1, conflict, end,
                              f"{irregular} (SOS at byte {pos - 2})" if irregular.startswith("SOS") else irregular)
        if marker in SOF_MARKERS:
            if frame is not None:
                raise DecodeError(f"JPEG: second SOF marker at byte {pos - 2}")
            frame = _frame(marker, body)
        elif marker == _DQT:
            irregular = irregular or _quant_tables(body, tables)
        elif marker == _DHT:
            irregular = irregular or _huffman_tables(body, tables)
        elif marker == _DRI:
            irregular = irregular or ("" if len(body) == 2 else f"DRI segment of {len(body)} bytes, not 2")
        elif marker == _APP1 and bytes(body[:5]) == b"Exif\x00":
            this = exif_orientation(body[6:])
            conflict = conflict or (orientation is not None and this != orientation)
            orientation = this if orientation is None else orientation
        elif not (0xE0 <= marker <= 0xEF or marker == _COM):
            irregular = irregular or f"unexpected marker 0xFF{marker:02X} at byte {pos - 2} in the header"
        pos = end
    raise DecodeError(f"JPEG: more than {MAX_SEGMENTS} markers before SOS")


def _next_marker(view: memoryview, pos: int) -> tuple[int, int] | None:
    """The marker code at or after ``pos`` and the position after it; None at end of data.
    Skips fill bytes (0xFF 0xFF ...) and, like libjpeg, a few stray bytes before a marker."""
    window = bytes(view[pos:pos + _MAX_SKIP])
    i = window.find(b"\xff")
    while 0 <= i < len(window):
        while i < len(window) and window[i] == 0xFF:
            i += 1
        if i < len(window) and window[i] != 0x00:
            return window[i], pos + i + 1
        i = window.find(b"\xff", i)
    if pos + len(window) >= len(view):
        return None
    raise DecodeError(f"JPEG: no marker within {_MAX_SKIP} bytes after byte {pos}")


def _frame(marker: int, body: memoryview) -> _Frame:
    """An SOF segment's fields; :class:`DecodeError` when no decoder could read it."""
    if len(body) < 6:
        raise DecodeError(f"JPEG: SOF segment of {len(body)} bytes is too short")
    precision, height, width, count = struct.unpack_from(">BHHB", body, 0)
    if len(body) != 6 + 3 * count:
        raise DecodeError(f"JPEG: SOF segment of {len(body)} bytes does not fit its {count} components")
    if not 1 <= count <= 4:
        raise DecodeError(f"JPEG: unsupported number of components {count}")
    if not 2 <= precision <= 16:
        raise DecodeError(f"JPEG: invalid sample precision {precision}")
    components = tuple((body[i], body[i + 1] >> 4, body[i + 1] & 15, body[i + 2]) for i in range(6, 6 + 3 * count, 3))
    return _Frame(width, height, precision, marker, components)


def _check_frame(frame: _Frame) -> str:
    """Why a frame is not one the strict gate passes, or ""."""
    comps = frame.components
    if frame.marker not in HUFFMAN_SOF:
        return f"SOF 0xFF{frame.marker:02X} (lossless, arithmetic or hierarchical coding)"
    if len(comps) == 2:
        return "SOF with 2 components"
    if len({c[0] for c in comps}) != len(comps):
        return f"SOF with repeated component ids {[c[0] for c in comps]}"
    hmax, vmax = max(c[1] for c in comps), max(c[2] for c in comps)
    for ident, h, v, quant in comps:
        if h not in _SAMPLING or v not in _SAMPLING or hmax % h or vmax % v:
            return f"SOF component {ident} sampling {h}x{v} (of at most {hmax}x{vmax})"
        if quant > 3:
            return f"SOF component {ident} quantisation table {quant}"
    if len(comps) > 1 and sum(c[1] * c[2] for c in comps) > 10:
        return "SOF sampling factors give more than 10 blocks per MCU"
    return ""


def _quant_tables(body: memoryview, tables: list[int]) -> str:
    """Record a DQT segment's tables in ``tables[0]``; why it is malformed, or ""."""
    pos = 0
    while pos < len(body):
        precision, ident = body[pos] >> 4, body[pos] & 15
        if precision > 1 or ident > 3:
            return f"DQT table with precision {precision} and id {ident}"
        pos += 1 + 64 * (precision + 1)
        if pos > len(body):
            return "DQT segment shorter than its tables"
        tables[0] |= 1 << ident
    return "" if pos else "empty DQT segment"


def _huffman_tables(body: memoryview, tables: list[int]) -> str:
    """Record a DHT segment's tables in ``tables[1]`` (DC) and ``tables[2]`` (AC); why it is
    malformed, or "". Verdicts are cached by content: most files share their encoder's tables."""
    key = bytes(body)
    verdict = _HUFF_CACHE.get(key)
    if verdict is None:
        verdict = _parse_huffman(key)
        _remember(_HUFF_CACHE, key, verdict)
    if isinstance(verdict, str):
        return verdict
    tables[1] |= verdict[0]
    tables[2] |= verdict[1]
    return ""


def _parse_huffman(body: bytes) -> tuple[int, int] | str:
    masks, pos = [0, 0], 0
    while pos < len(body):
        kind, ident = body[pos] >> 4, body[pos] & 15
        if kind > 1 or ident > 3:
            return f"DHT table with class {kind} and id {ident}"
        counts = body[pos + 1:pos + 17]
        total = sum(counts)
        if len(counts) < 16 or total > 256 or pos + 17 + total > len(body):
            return "DHT segment shorter than its tables"
        # libjpeg: no code may be all ones. The codes of lengths <= l fill sum(count_k * 2^(l-k)) of the
        # 2^l codes of length l; the share only grows with l, so checking it at length 16 checks every l.
        if sum(map(operator.mul, counts, _KRAFT)) >= 1 << 16:
            return f"DHT table {kind}/{ident}: more codes than its code lengths hold"
        if kind == 0 and max(body[pos + 17:pos + 17 + total], default=0) > 15:
            return f"DHT DC table {ident} with a symbol above 15"
        masks[kind] |= 1 << ident
        pos += 17 + total
    return (masks[0], masks[1]) if pos else "empty DHT segment"


def _remember(cache: dict, key, verdict) -> None:
    if len(cache) >= _CACHE_SIZE:
        cache.clear()
    cache[key] = verdict


def _check_layout(sos: memoryview, frame: _Frame, tables: list[int]) -> str:
    """Why the frame, or the first SOS given the frame and the tables, is not well-formed, or ""."""
    key = (frame.marker, frame.components, bytes(sos), tables[0], tables[1], tables[2])
    verdict = _LAYOUT_CACHE.get(key)
    if verdict is None:
        verdict = _check_frame(frame) or _check_scan(sos, frame, tables)
        _remember(_LAYOUT_CACHE, key, verdict)
    return verdict


def _check_scan(body: memoryview, frame: _Frame, tables: list[int]) -> str:
    """Why the first SOS does not fit its frame and tables, or ""."""
    count = body[0] if len(body) else 0
    if not 1 <= count <= len(frame.components) or len(body) != 4 + 2 * count:
        return f"SOS with {count} components in {len(body)} bytes"
    by_id = {c[0]: c for c in frame.components}
    chosen = [body[1 + 2 * i] for i in range(count)]
    if len(set(chosen)) != count or any(c not in by_id for c in chosen):
        return f"SOS components {chosen} are not the frame's {sorted(by_id)}"
    if any(not tables[0] >> c[3] & 1 for c in frame.components):
        return "SOS before the quantisation tables of every component"
    start, end, approx = body[1 + 2 * count], body[2 + 2 * count], body[3 + 2 * count]
    progressive = frame.marker in _PROGRESSIVE
    if progressive and (start != 0 or end != 0 or approx >> 4 or (approx & 15) > 13):
        return f"SOS of a progressive frame is not a first DC scan (Ss {start}, Se {end}, Ah/Al {approx:#04x})"
    if not progressive and (start, end, approx) != (0, 63, 0):
        return f"SOS spectral selection {start}..{end}, approximation {approx:#04x} in a sequential frame"
    limit = 1 if frame.marker == 0xC0 else 3
    for i in range(count):
        dc, ac = body[2 + 2 * i] >> 4, body[2 + 2 * i] & 15
        if dc > limit or ac > limit or not tables[1] >> dc & 1 or (not progressive and not tables[2] >> ac & 1):
            return f"SOS component {chosen[i]} uses undefined Huffman tables {dc}/{ac}"
    return ""
