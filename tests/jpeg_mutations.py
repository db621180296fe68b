"""Mutated JPEGs for the native-decoder fuzz test (tests/decode/test_decoder_fuzz.py).

``base_jpegs()`` encodes small photo-like images the ways real encoders do (baseline 4:2:0,
4:4:4 and 4:2:2, progressive, optimised tables, grayscale, CMYK, restart markers, an Exif
orientation, an ICC profile, a comment). ``mutate(data, rng)`` applies one mutation, chosen
from :data:`MUTATIONS`, and returns ``(kind, bytes)``. The kinds cover what real files do
wrong and what a hostile one can try:

* between header segments: stray bytes, ``FF 00`` where a marker should be, fill bytes,
  a segment length off by a few bytes, a segment duplicated, dropped or moved (SOF after
  SOS, tables after SOS), a restart or other standalone marker in the header;
* inside segments: the SOF's component count, ids, sampling factors (0, 3, 5, 15...),
  precision (12-bit, 16-bit) and dimensions (huge, zero); the SOS's component count,
  selectors, table ids and spectral selection; DQT/DHT table ids, counts and sizes; DRI;
  the marker swapped for arithmetic, lossless or hierarchical coding; garbage in APP1 Exif
  (bad IFD offsets, huge counts) and APP2 ICC;
* the scan: random bytes flipped, a range zeroed or duplicated, a marker (EOI, RST, DHT,
  SOS, SOI) written into it, restart markers out of order;
* truncations anywhere, with or without an EOI stuck on the end.

This module parses JPEGs with its own few lines (not gpupipe's header walk), so that the
code under test is not what decides where the segments are.
"""
from __future__ import annotations

import io
import struct
from collections.abc import Callable

import numpy as np
from PIL import Image, ImageCms

from gpupipe.tools.synth import synthetic_jpeg

__all__ = ["base_jpegs", "mutate", "MUTATIONS", "segments", "join"]

Segment = tuple[int, bytes]  # (marker code, the whole segment with its FF xx and length)


def _image(rng: np.random.Generator, size: tuple[int, int]) -> Image.Image:
    return Image.open(io.BytesIO(synthetic_jpeg(rng, size, quality=95))).convert("RGB")


def _save(img: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", **kw)
    return buf.getvalue()


def base_jpegs(seed: int = 0, count: int = 24) -> list[bytes]:
    """``count`` clean JPEGs of 40..120 px a side, cycling through the encoder settings."""
    rng = np.random.default_rng([seed, 23])
    exif = Image.Exif()
    exif[0x0112] = 6
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    settings: list[Callable[[Image.Image], bytes]] = [
        lambda im: _save(im, quality=90),
        lambda im: _save(im, quality=85, subsampling=0),
        lambda im: _save(im, quality=75, subsampling=1),
        lambda im: _save(im, quality=90, progressive=True),
        lambda im: _save(im, quality=80, optimize=True),
        lambda im: _save(im.convert("L"), quality=90),
        lambda im: _save(im.convert("CMYK"), quality=90),
        lambda im: _save(im, quality=90, restart_marker_blocks=2),
        lambda im: _save(im, quality=90, exif=exif.tobytes()),
        lambda im: _save(im, quality=90, icc_profile=icc),
        lambda im: _save(im, quality=70, comment=b"made by jpeg_mutations"),
        lambda im: _save(im.convert("L"), quality=85, progressive=True),
    ]
    out = []
    for i in range(count):
        w, h = (int(v) for v in rng.integers(40, 121, 2))
        out.append(settings[i % len(settings)](_image(rng, (w, h))))
    return out


# -- parsing ------------------------------------------------------------------------------------

def segments(data: bytes) -> tuple[list[Segment], bytes]:
    """The header segments from SOI (excluded) to the first SOS (included), and everything
    after the first SOS (scan data, later tables and scans, EOI). For clean encoder output only."""
    assert data[:2] == b"\xff\xd8"
    pos, out = 2, []
    while True:
        marker = data[pos + 1]
        (length,) = struct.unpack_from(">H", data, pos + 2)
        out.append((marker, data[pos:pos + 2 + length]))
        pos += 2 + length
        if marker == 0xDA:
            return out, data[pos:]


def join(segs: list[Segment], rest: bytes) -> bytes:
    return b"\xff\xd8" + b"".join(s for _, s in segs) + rest


def _segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body


def _pick(rng: np.random.Generator, segs: list[Segment], markers: tuple[int, ...] | None = None) -> int | None:
    found = [i for i, (m, _) in enumerate(segs) if markers is None or m in markers]
    return int(rng.choice(found)) if found else None


def _byte(rng: np.random.Generator, low: int = 0, high: int = 256) -> int:
    return int(rng.integers(low, high))


def _junk(rng: np.random.Generator, n: int) -> bytes:
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def _patch(seg: bytes, offset: int, value: bytes) -> bytes:
    """``seg`` with the bytes at ``offset`` (from the segment's FF) replaced (clipped to the segment)."""
    offset = min(offset, len(seg) - 1)
    return seg[:offset] + value[:len(seg) - offset] + seg[offset + len(value):]


# -- header mutations: (segments, rest, rng) -> bytes ---------------------------------------------

def stray_bytes(segs, rest, rng):
    i = _pick(rng, segs)
    junk = _junk(rng, _byte(rng, 1, 24))
    if rng.random() < 0.5:  # ASCII-ish junk, as an editor leaves it
        junk = bytes(32 + b % 90 for b in junk)
    segs = segs[:i] + [(0, junk)] + segs[i:]
    return join(segs, rest)


def ff00_for_marker(segs, rest, rng):
    i = _pick(rng, segs)
    segs = segs[:i] + [(0, b"\xff\x00" + _junk(rng, _byte(rng, 0, 4)))] + segs[i:]
    return join(segs, rest)


def fill_bytes(segs, rest, rng):
    i = _pick(rng, segs)
    segs = segs[:i] + [(0, b"\xff" * _byte(rng, 1, 9))] + segs[i:]
    return join(segs, rest)


def length_off(segs, rest, rng):
    i = _pick(rng, segs)
    marker, seg = segs[i]
    (length,) = struct.unpack_from(">H", seg, 2)
    delta = int(rng.choice([-8, -4, -3, -2, -1, 1, 2, 3, 5, 16]))
    segs[i] = (marker, seg[:2] + struct.pack(">H", max(0, min(0xFFFF, length + delta))) + seg[4:])
    return join(segs, rest)


def length_tiny(segs, rest, rng):
    i = _pick(rng, segs)
    marker, seg = segs[i]
    segs[i] = (marker, seg[:2] + struct.pack(">H", _byte(rng, 0, 3)) + seg[4:])
    return join(segs, rest)


def duplicate_segment(segs, rest, rng):
    i = _pick(rng, segs)
    j = _byte(rng, 0, len(segs) + 1)
    return join(segs[:j] + [segs[i]] + segs[j:], rest)


def drop_segment(segs, rest, rng):
    i = _pick(rng, segs, (0xDB, 0xC4, 0xC0, 0xC1, 0xC2, 0xDD, 0xE0, 0xE1))
    if i is None:
        i = _pick(rng, segs)
    return join(segs[:i] + segs[i + 1:], rest)


def move_segment(segs, rest, rng):
    """A header segment moved elsewhere, possibly past the SOS (into the scan)."""
    i = _pick(rng, segs)
    moved = segs.pop(i)
    if rng.random() < 0.4:
        cut = _byte(rng, 0, max(1, len(rest) // 2))
        return join(segs, rest[:cut] + moved[1] + rest[cut:])
    j = _byte(rng, 0, len(segs) + 1)
    return join(segs[:j] + [moved] + segs[j:], rest)


def standalone_in_header(segs, rest, rng):
    i = _pick(rng, segs)
    marker = int(rng.choice([0x01, 0xD0, 0xD3, 0xD7, 0xD8, 0xD9]))
    return join(segs[:i] + [(marker, bytes([0xFF, marker]))] + segs[i:], rest)


def reserved_marker(segs, rest, rng):
    i = _pick(rng, segs)
    marker = int(rng.choice([0x02, 0x4F, 0xBF, 0xC8, 0xCC, 0xDC, 0xDE, 0xDF, 0xF0, 0xF7, 0xFD]))
    return join(segs[:i] + [(marker, _segment(marker, _junk(rng, _byte(rng, 0, 12))))] + segs[i:], rest)


def sof_marker(segs, rest, rng):
    i = _pick(rng, segs, (0xC0, 0xC1, 0xC2))
    marker = int(rng.choice([0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF]))
    segs[i] = (marker, bytes([0xFF, marker]) + segs[i][1][2:])
    return join(segs, rest)


def sof_field(segs, rest, rng):
    """One SOF field changed: precision, size, component count, id, sampling or table."""
    i = _pick(rng, segs, (0xC0, 0xC1, 0xC2))
    marker, seg = segs[i]
    n = seg[9]
    choice = _byte(rng, 0, 7)
    if choice == 0:
        seg = _patch(seg, 4, bytes([int(rng.choice([0, 1, 7, 9, 12, 16, 255]))]))
    elif choice == 1:  # height
        seg = _patch(seg, 5, struct.pack(">H", int(rng.choice([0, 1, 2, 4095, 16384, 65535]))))
    elif choice == 2:  # width
        seg = _patch(seg, 7, struct.pack(">H", int(rng.choice([0, 1, 3, 4096, 12000, 65535]))))
    elif choice == 3:
        seg = _patch(seg, 9, bytes([int(rng.choice([0, 1, 2, 3, 4, 5, 255]))]))
    else:
        c = _byte(rng, 0, n)
        at = 10 + 3 * c + (choice - 4)  # 4: id, 5: sampling, 6: quant table
        value = {4: lambda: _byte(rng), 5: lambda: int(rng.choice([0x00, 0x01, 0x10, 0x13, 0x31, 0x33, 0x22, 0x44,
                                                                   0x55, 0x41, 0x14, 0xF1, 0xFF])),
                 6: lambda: int(rng.choice([1, 2, 3, 4, 7, 255]))}[choice]()
        seg = _patch(seg, at, bytes([value]))
    segs[i] = (marker, seg)
    return join(segs, rest)


def huge_size(segs, rest, rng):
    i = _pick(rng, segs, (0xC0, 0xC1, 0xC2))
    marker, seg = segs[i]
    h, w = (int(v) for v in rng.choice([(2048, 2048), (1024, 4000), (65500, 65500), (30000, 8000), (16, 60000)]))
    segs[i] = (marker, seg[:5] + struct.pack(">HH", h, w) + seg[9:])
    return join(segs, rest)


def sos_field(segs, rest, rng):
    """The first SOS: component count, a selector, its table ids, or the spectral/approximation bytes."""
    i = len(segs) - 1
    marker, seg = segs[i]
    ns = seg[4]
    choice = _byte(rng, 0, 4)
    if choice == 0:
        seg = _patch(seg, 4, bytes([int(rng.choice([0, 2, 3, 4, 5, 255]))]))
    elif choice == 1:
        seg = _patch(seg, 5 + 2 * _byte(rng, 0, ns), bytes([_byte(rng)]))
    elif choice == 2:
        seg = _patch(seg, 6 + 2 * _byte(rng, 0, ns), bytes([int(rng.choice([0x01, 0x10, 0x11, 0x22, 0x44, 0xFF]))]))
    else:
        seg = _patch(seg, 5 + 2 * ns + _byte(rng, 0, 3), bytes([_byte(rng)]))
    segs[i] = (marker, seg)
    return join(segs, rest)


def table_field(segs, rest, rng):
    """A DQT or DHT: the class/id byte, a count, or a table value."""
    i = _pick(rng, segs, (0xDB, 0xC4))
    marker, seg = segs[i]
    choice = _byte(rng, 0, 3)
    if choice == 0:
        seg = _patch(seg, 4, bytes([int(rng.choice([0x04, 0x05, 0x14, 0x20, 0x11, 0x13, 0xFF]))]))
    elif choice == 1 and marker == 0xC4:
        seg = _patch(seg, 5 + _byte(rng, 0, 16), bytes([int(rng.choice([0, 3, 17, 100, 255]))]))
    else:
        seg = _patch(seg, _byte(rng, 5, len(seg)), bytes([int(rng.choice([0, 1, 15, 16, 200, 255]))]))
    segs[i] = (marker, seg)
    return join(segs, rest)


def dri_field(segs, rest, rng):
    body = struct.pack(">H", int(rng.choice([0, 1, 7, 65535])))
    if rng.random() < 0.3:
        body += _junk(rng, 2)
    dri = _segment(0xDD, body)
    at = [k for k, (m, _) in enumerate(segs) if m == 0xDD]
    if at:
        segs[at[0]] = (0xDD, dri)
    else:
        segs.insert(len(segs) - 1, (0xDD, dri))
    return join(segs, rest)


def exif_garbage(segs, rest, rng):
    """An APP1 Exif whose TIFF structure is broken: offsets past the end, huge counts, loops."""
    order = b"II" if rng.random() < 0.5 else b"MM"
    fmt = "<" if order == b"II" else ">"
    ifd = int(rng.choice([8, 0, 7, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFF0]))
    entries = []
    for _ in range(_byte(rng, 0, 6)):
        tag = int(rng.choice([0x0112, 0x8769, 0x8825, 0x0100, 0x927C, _byte(rng, 0, 65536)]))
        kind = int(rng.choice([1, 2, 3, 4, 5, 7, 13, 0, 255]))
        count = int(rng.choice([1, 2, 4, 1000, 0x7FFFFFFF, 0xFFFFFFFF]))
        value = int(rng.choice([0, 1, 6, 8, 9, 0xFFFF, 0x7FFFFFFF, 8]))
        entries.append(struct.pack(fmt + "HHII", tag, kind, count, value))
    count = len(entries) if rng.random() < 0.7 else int(rng.choice([0xFFFF, 500]))
    tiff = order + struct.pack(fmt + "HI", 42, ifd) + struct.pack(fmt + "H", count) + b"".join(entries)
    tiff += struct.pack(fmt + "I", int(rng.choice([0, 8, 0xFFFFFFFF])))
    app1 = _segment(0xE1, b"Exif\x00\x00" + tiff + _junk(rng, _byte(rng, 0, 16)))
    j = _byte(rng, 0, len(segs))
    return join(segs[:j] + [(0xE1, app1)] + segs[j:], rest)


def app_garbage(segs, rest, rng):
    """An APP segment with a known signature (JFIF, ICC, Adobe, XMP, MPF) and a random body."""
    marker, sig = [(0xE0, b"JFIF\x00"), (0xE2, b"ICC_PROFILE\x00"), (0xEE, b"Adobe"),
                   (0xE1, b"http://ns.adobe.com/xap/1.0/\x00"), (0xE2, b"MPF\x00"),
                   (0xE0, b"JFXX\x00")][_byte(rng, 0, 6)]
    seg = _segment(marker, sig + _junk(rng, _byte(rng, 0, 40)))
    j = _byte(rng, 0, len(segs))
    return join(segs[:j] + [(marker, seg)] + segs[j:], rest)


def header_bytes(segs, rest, rng):
    """A few random bytes of the header (markers, lengths and bodies alike) overwritten."""
    data = bytearray(join(segs, b""))
    for _ in range(_byte(rng, 1, 5)):
        data[_byte(rng, 2, len(data))] = _byte(rng)
    return bytes(data) + rest


# -- scan mutations ---------------------------------------------------------------------------

def scan_bytes(segs, rest, rng):
    data = bytearray(rest)
    for _ in range(_byte(rng, 1, 20)):
        data[_byte(rng, 0, max(1, len(data) - 2))] = _byte(rng)
    return join(segs, bytes(data))


def scan_zeroed(segs, rest, rng):
    a = _byte(rng, 0, max(1, len(rest) - 2))
    b = min(len(rest) - 2, a + _byte(rng, 1, 400))
    return join(segs, rest[:a] + bytes(max(0, b - a)) + rest[b:])


def scan_duplicated(segs, rest, rng):
    a = _byte(rng, 0, max(1, len(rest) - 2))
    b = min(len(rest) - 2, a + _byte(rng, 1, 300))
    return join(segs, rest[:b] + rest[a:b] + rest[b:])


def scan_marker(segs, rest, rng):
    marker = int(rng.choice([0xD9, 0xD0, 0xD5, 0xC4, 0xDA, 0xD8, 0xDB, 0xC0, 0xDD, 0xFE, 0xFF]))
    body = b""
    if marker in (0xC4, 0xDA, 0xDB, 0xC0, 0xDD, 0xFE):
        body = struct.pack(">H", _byte(rng, 0, 80)) + _junk(rng, _byte(rng, 0, 40))
    at = _byte(rng, 0, max(1, len(rest) - 2))
    return join(segs, rest[:at] + bytes([0xFF, marker]) + body + rest[at:])


def restart_disorder(segs, rest, rng):
    """Restart markers renumbered, removed or added in the scan."""
    data = bytearray(rest)
    rsts = [k for k in range(len(data) - 1) if data[k] == 0xFF and 0xD0 <= data[k + 1] <= 0xD7]
    if rsts and rng.random() < 0.7:
        for k in rng.choice(rsts, size=min(len(rsts), _byte(rng, 1, 4)), replace=False):
            data[int(k) + 1] = 0xD0 + _byte(rng, 0, 8)
        return join(segs, bytes(data))
    at = _byte(rng, 0, max(1, len(data) - 2))
    return join(segs, bytes(data[:at]) + bytes([0xFF, 0xD0 + _byte(rng, 0, 8)]) + bytes(data[at:]))


def truncate(segs, rest, rng):
    data = join(segs, rest)
    cut = _byte(rng, 2, len(data))
    tail = b"\xff\xd9" if rng.random() < 0.5 else b""
    return data[:cut] + tail


def trailing(segs, rest, rng):
    """Data after the EOI: another JPEG's start, junk, or a lot of it."""
    return join(segs, rest) + [b"\xff\xd8\xff\xe0", _junk(rng, 64), _junk(rng, 9000)][_byte(rng, 0, 3)]


MUTATIONS: dict[str, Callable] = {f.__name__: f for f in (
    stray_bytes, ff00_for_marker, fill_bytes, length_off, length_tiny, duplicate_segment, drop_segment,
    move_segment, standalone_in_header, reserved_marker, sof_marker, sof_field, huge_size, sos_field,
    table_field, dri_field, exif_garbage, app_garbage, header_bytes, scan_bytes, scan_zeroed,
    scan_duplicated, scan_marker, restart_disorder, truncate, trailing)}


def mutate(data: bytes, rng: np.random.Generator, kind: str | None = None) -> tuple[str, bytes]:
    """One mutation of the clean JPEG ``data`` (``kind`` or one drawn from :data:`MUTATIONS`)."""
    kind = kind or str(rng.choice(sorted(MUTATIONS)))
    segs, rest = segments(data)
    return kind, MUTATIONS[kind](list(segs), rest, rng)
