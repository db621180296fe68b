"""The pre-decode header check and the completeness check: real images made by Pillow,
crafted bad ones, and fuzzing."""
from __future__ import annotations

import functools
import io
import random
import struct
import time
import tracemalloc
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupipe.core.errors import DecodeError
from gpupipe.formats.imageheader import MAX_TRAILER, ImageHeader, check_complete, probe

Image = pytest.importorskip("PIL.Image")
features = pytest.importorskip("PIL.features")

W, H = 31, 17
HAS_WEBP = features.check("webp")
needs_webp = pytest.mark.skipif(not HAS_WEBP, reason="Pillow built without WebP")
INTERNAL = "internal error"  # the module's safety-net message: seeing it means a parser bug


def encode(mode: str, fmt: str, **save) -> bytes:
    """A small W x H image in ``mode`` with some structure, encoded by Pillow."""
    im = Image.linear_gradient("L").resize((W, H)).convert(mode)
    if mode in ("RGBA", "LA"):
        im.putalpha(Image.linear_gradient("L").resize((W, H)))  # real transparency
    out = io.BytesIO()
    im.save(out, fmt, **save)
    return out.getvalue()


def with_orientation(fmt: str, value: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = value
    return encode("RGB", fmt, exif=exif)


def jpeg_offsets(data: bytes) -> tuple[int, int]:
    """(end of the SOF segment, end of the first SOS segment) of a Pillow JPEG."""
    def segment_end(marker: bytes) -> int:
        at = data.index(marker)
        return at + 2 + struct.unpack_from(">H", data, at + 2)[0]
    sof = next(m for m in (b"\xff\xc0", b"\xff\xc2") if m in data)
    return segment_end(sof), segment_end(b"\xff\xda")


def patch_jpeg_size(data: bytes, width: int, height: int) -> bytes:
    at = data.index(b"\xff\xc0") + 5  # marker(2) length(2) precision(1)
    return data[:at] + struct.pack(">HH", height, width) + data[at + 4:]


def patch_png_size(data: bytes, width: int, height: int) -> bytes:
    ihdr = b"IHDR" + struct.pack(">II", width, height) + data[24:29]
    return data[:12] + ihdr + struct.pack(">I", zlib.crc32(ihdr)) + data[33:]


def insert_app1(jpeg: bytes, payload: bytes) -> bytes:
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + jpeg[2:]


def tiff_ifd0(order: str, entries: list[tuple[int, int, int, bytes]]) -> bytes:
    """A TIFF header and IFD0 with (tag, type, count, 4-byte value field) entries."""
    e = "<" if order == "II" else ">"
    body = order.encode() + struct.pack(e + "HIH", 42, 8, len(entries))
    for tag, kind, count, value in entries:
        body += struct.pack(e + "HHI", tag, kind, count) + value
    return body + b"\0\0\0\0"


def short(order: str, value: int) -> bytes:
    return struct.pack(("<" if order == "II" else ">") + "HH", value, 0)


# -- valid images ---------------------------------------------------------------------------

VALID = [  # (mode, format, save options, format, channels, progressive, bit depth)
    ("RGB", "JPEG", {}, "jpeg", 3, False, 8),
    ("RGB", "JPEG", {"progressive": True}, "jpeg", 3, True, 8),
    ("L", "JPEG", {}, "jpeg", 1, False, 8),
    ("CMYK", "JPEG", {}, "jpeg", 4, False, 8),
    ("RGB", "PNG", {}, "png", 3, False, 8),
    ("RGBA", "PNG", {}, "png", 4, False, 8),
    ("P", "PNG", {}, "png", 3, False, 8),
    ("L", "PNG", {}, "png", 1, False, 8),
    ("LA", "PNG", {}, "png", 2, False, 8),
    ("1", "PNG", {}, "png", 1, False, 1),
    ("I;16", "PNG", {}, "png", 1, False, 16),
    ("RGB", "GIF", {}, "gif", 3, False, 8),
    ("RGB", "BMP", {}, "bmp", 3, False, 8),
    ("RGBA", "BMP", {}, "bmp", 4, False, 8),
    ("L", "BMP", {}, "bmp", 3, False, 8),  # palette-indexed, counted as colour
    pytest.param("RGB", "WEBP", {}, "webp", 3, False, 8, marks=needs_webp),
    pytest.param("RGB", "WEBP", {"lossless": True}, "webp", 3, False, 8, marks=needs_webp),
    pytest.param("RGBA", "WEBP", {}, "webp", 4, False, 8, marks=needs_webp),
    pytest.param("RGBA", "WEBP", {"lossless": True}, "webp", 4, False, 8, marks=needs_webp),
]


@pytest.mark.parametrize("mode, fmt, save, name, channels, progressive, depth", VALID)
def test_valid_images(mode, fmt, save, name, channels, progressive, depth):
    data = encode(mode, fmt, **save)
    assert probe(data) == ImageHeader(name, W, H, channels, 1, progressive, depth)
    assert probe(memoryview(data)) == probe(bytearray(data)) == probe(data, max_pixels=W * H)


@pytest.mark.parametrize("option", ["restart_marker_blocks", "restart_marker_rows"])
def test_jpeg_with_restart_markers(option):
    data = encode("RGB", "JPEG", **{option: 1})
    if b"\xff\xdd" not in data:
        pytest.skip(f"this Pillow ignores {option}")
    assert probe(data) == ImageHeader("jpeg", W, H, 3)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", pytest.param("WEBP", marks=needs_webp)])
@pytest.mark.parametrize("value", range(1, 9))
def test_exif_orientation(fmt, value):
    header = probe(with_orientation(fmt, value))
    assert (header.format, header.width, header.height, header.orientation) == (fmt.lower(), W, H, value)


@pytest.mark.parametrize("order", ["II", "MM"])
def test_exif_orientation_either_byte_order(order):
    tiff = tiff_ifd0(order, [(0x010F, 2, 4, b"abc\0"), (0x0112, 3, 1, short(order, 8))])
    assert probe(insert_app1(encode("RGB", "JPEG"), b"Exif\0\0" + tiff)).orientation == 8


@pytest.mark.parametrize("later, conflict", [(None, False), (6, False), (1, True), (3, True), ("no tag", True)])
def test_a_later_exif_segment_with_another_orientation_is_flagged(later, conflict):
    """The first Exif segment's orientation counts; a later one that says otherwise (or has no
    orientation, which reads as 1) is flagged, since DALI would read the later one."""
    data = with_orientation("JPEG", 6)
    if later is not None:
        entries = [(0x0112, 3, 1, short("II", later))] if later != "no tag" else [(0x010F, 2, 4, b"abc\0")]
        second = insert_app1(b"\xff\xd8", b"Exif\0\0" + tiff_ifd0("II", entries))[2:]  # the segment alone
        at = data.index(b"\xff\xdb")  # after the first Exif segment: the quantisation tables
        data = data[:at] + second + data[at:]
    header = probe(data)
    assert header.orientation == 6 and header.exif_conflict is conflict


@pytest.mark.parametrize("tiff", [
    b"", b"II", b"XX*\0\x08\0\0\0", b"II*\0\xff\xff\xff\xff", b"II+\0\x08\0\0\0",
    b"II*\0\x08\0\0\0\xff\xff" + b"\0" * 10,  # 65535 entries declared, none there
    tiff_ifd0("II", [(0x0112, 3, 1, short("II", 9))]),  # out of range
    tiff_ifd0("II", [(0x0112, 3, 1, short("II", 0))]),
    tiff_ifd0("MM", [(0x0112, 2, 1, short("MM", 6))]),  # wrong type
    tiff_ifd0("MM", [(0x0112, 3, 7, short("MM", 6))]),  # wrong count
    tiff_ifd0("II", [(0x0112, 3, 1, short("II", 6))])[:20],  # cut inside the entry
])
def test_malformed_exif_is_ignored(tiff):
    data = insert_app1(encode("RGB", "JPEG"), b"Exif\0\0" + tiff)
    assert probe(data) == ImageHeader("jpeg", W, H, 3, orientation=1)


def test_jpeg_fill_bytes_and_stray_bytes_are_tolerated():
    data = encode("RGB", "JPEG")
    sof = data.index(b"\xff\xc0")
    assert probe(data[:sof] + b"\xff\xff\xff" + data[sof:]).width == W
    assert probe(data[:sof] + b"\x00junk" + data[sof:]).height == H
    assert probe(data[:2] + b"\xff\xd0\xff\x01" + data[2:]).channels == 3  # standalone RST0, TEM


# -- bad inputs -----------------------------------------------------------------------------

@pytest.mark.parametrize("data, message", [
    (b"", "empty data"),
    (b"<html><body>404 Not Found</body></html>", "HTML/XML page"),
    (b'\n  <?xml version="1.0"?><Error><Code>NoSuchKey</Code></Error>', "HTML/XML page"),
    (b"Access Denied", "not an image: text"),
    (b"II*\0\x08\0\0\0" + b"\0" * 40, "unsupported image format TIFF"),
    (b"\0\0\0\x1cftypavif" + b"\0" * 40, "HEIF/AVIF"),
    (b"RIFF\x10\0\0\0WAVEfmt ", "not an image: starts with b'RIFF"),
    (bytes(range(200, 256)), "not an image: starts with b'\\xc8"),
])
def test_not_an_image(data, message):
    with pytest.raises(DecodeError, match="not an image|unsupported|empty") as info:
        probe(data, name="shard-0/000042.jpg")
    assert message in str(info.value)
    assert str(info.value).startswith("shard-0/000042.jpg: ")


def test_random_bytes_are_rejected():
    rng = random.Random(0)
    for _ in range(200):
        with pytest.raises(DecodeError):
            probe(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))))


def test_non_buffer_input_is_a_decode_error():
    with pytest.raises(DecodeError, match="expected bytes"):
        probe("a str")  # type: ignore[arg-type]


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
def test_jpeg_truncated_before_sof(fraction):
    data = encode("RGB", "JPEG")
    sof_end, _ = jpeg_offsets(data)
    with pytest.raises(DecodeError, match="truncated JPEG: no SOF marker before end of data"):
        probe(data[:int(sof_end * fraction)], name="x.jpg")


@pytest.mark.parametrize("save", [{}, {"progressive": True}])
def test_every_jpeg_prefix_up_to_the_scan_is_rejected(save):
    data = with_orientation("JPEG", 3) if not save else encode("RGB", "JPEG", **save)
    _, sos_end = jpeg_offsets(data)
    for cut in range(sos_end + 1):
        with pytest.raises(DecodeError, match="truncated JPEG|not an image|empty"):
            probe(data[:cut])
    assert probe(data[:sos_end + 1]).width == W  # scan data is not scanned


@pytest.mark.parametrize("fmt, cuts, message", [
    ("PNG", (0.5, 40, 30, 20, 12), "truncated PNG"),  # 0.5: inside the IDAT chunk
    ("GIF", (40, 12, 8), "truncated GIF"),  # 40: inside the global colour table
    ("BMP", (50, 30, 20, 12), "truncated BMP"),
    pytest.param("WEBP", (0.5, 29, 20, 12, 8), "truncated WebP", marks=needs_webp),  # 0.5: RIFF size
])
def test_truncated_headers(fmt, cuts, message):
    data = encode("RGB", fmt)
    for cut in cuts:
        with pytest.raises(DecodeError, match=message):
            probe(data[:int(cut * len(data)) if cut < 1 else cut])


def test_png_ending_before_idat_is_truncated():
    data = with_orientation("PNG", 5)
    with pytest.raises(DecodeError, match="truncated PNG: no IDAT"):
        probe(data[:data.index(b"IDAT") - 4])


@pytest.mark.parametrize("patch, data", [
    (patch_jpeg_size, lambda: encode("RGB", "JPEG")),
    (patch_png_size, lambda: encode("RGB", "PNG")),
])
def test_decompression_bomb_is_rejected_from_the_header(patch, data):
    bomb = patch(data(), 65500, 65500)
    assert probe(bomb).width == 65500  # without a limit the header itself is fine
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError, match=r"declared size 65500x65500 .* exceeds max_pixels=100000000"):
            probe(bomb, max_pixels=100_000_000, name="bomb")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024


@pytest.mark.parametrize("bad", [
    lambda: patch_jpeg_size(encode("RGB", "JPEG"), W, 0),
    lambda: patch_jpeg_size(encode("RGB", "JPEG"), 0, H),
    lambda: patch_png_size(encode("RGB", "PNG"), 0, H),
    lambda: patch_png_size(encode("RGB", "PNG"), 2**31, H),
    lambda: patch_png_size(encode("RGB", "PNG"), 3_000_000, 1),
])
def test_zero_or_absurd_sizes(bad):
    with pytest.raises(DecodeError, match="no pixels|absurd"):
        probe(bad())


def test_png_corrupt_ihdr_is_rejected():
    data = bytearray(encode("RGB", "PNG"))
    data[17] ^= 0x40  # inside the width, CRC not updated
    with pytest.raises(DecodeError, match="CRC"):
        probe(bytes(data))


@pytest.mark.parametrize("make", [
    lambda: b"\xff\xd8" + b"\xff\xd0" * 2_000_000,  # endless standalone markers
    lambda: b"\xff\xd8" + b"\0" * 4_000_000,  # no marker at all
    lambda: b"\xff\xd8" + b"\xff" * 4_000_000,  # endless fill bytes
    lambda: b"\xff\xd8" + b"\xff\xfe\x00\x02" * 1_000_000,  # endless empty comments
    lambda: encode("RGB", "PNG")[:33] + b"\0\0\0\0tEXt\0\0\0\0" * 1_000_000,  # endless empty chunks
], ids=["rst", "zeros", "fill", "comments", "png-chunks"])
def test_pathological_inputs_fail_fast(make):
    data = make()
    start = time.perf_counter()
    with pytest.raises(DecodeError):
        probe(data)
    assert time.perf_counter() - start < 0.5


# -- completeness (check_complete) ----------------------------------------------------------

def noisy(mode: str, fmt: str, size: tuple[int, int] = (120, 90), **save) -> bytes:
    """A noisy image (large, incompressible-ish data) so that 1% of it is well over any trailer."""
    rng = random.Random(7)
    w, h = size
    im = Image.frombytes("RGB", size, bytes(rng.randrange(256) for _ in range(w * h * 3))).convert(mode)
    out = io.BytesIO()
    im.save(out, fmt, **save)
    return out.getvalue()


COMPLETE = [  # (mode, format, save options) of every kind check_complete knows
    ("RGB", "JPEG", {}), ("RGB", "JPEG", {"progressive": True}), ("L", "JPEG", {}), ("CMYK", "JPEG", {}),
    ("RGB", "PNG", {}), ("RGBA", "PNG", {}), ("P", "PNG", {}), ("I;16", "PNG", {}), ("1", "PNG", {}),
    ("RGB", "GIF", {}), ("P", "GIF", {"interlace": True}),
    ("RGB", "BMP", {}), ("RGBA", "BMP", {}), ("L", "BMP", {}), ("1", "BMP", {}),
    pytest.param("RGB", "WEBP", {}, marks=needs_webp),
    pytest.param("RGBA", "WEBP", {"lossless": True}, marks=needs_webp),
]


@pytest.mark.parametrize("mode, fmt, save", COMPLETE)
def test_complete_images_pass(mode, fmt, save):
    for data in (encode(mode, fmt, **save), noisy(mode, fmt, **save)):
        check_complete(data, probe(data))
        check_complete(memoryview(data), probe(data))


@pytest.mark.parametrize("mode, fmt, save", COMPLETE)
@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9, 0.99])
def test_truncated_images_fail(mode, fmt, save, fraction):
    """Whether probe or check_complete notices, a cut image is refused, naming the sample."""
    for data in (encode(mode, fmt, **save), noisy(mode, fmt, **save)):
        cut = data[:int(len(data) * fraction)]
        with pytest.raises(DecodeError, match="^shard/7.x: truncated") as info:
            check_complete(cut, probe(cut, name="shard/7.x"), name="shard/7.x")
        assert INTERNAL not in str(info.value)
        with pytest.raises(DecodeError, match="truncated"):  # the full image's header does not help
            check_complete(cut, probe(data))


def test_cut_before_the_scan_is_a_header_error():
    data = encode("RGB", "JPEG")
    with pytest.raises(DecodeError, match="truncated JPEG: no SOS"):
        check_complete(data[:jpeg_offsets(data)[1] - 1], probe(data))


@pytest.mark.parametrize("fmt, end", [("JPEG", b"\xff\xd9"), ("PNG", b"IEND\xaeB`\x82"), ("GIF", b"\x00;")])
def test_trailing_bytes_up_to_max_trailer_are_allowed(fmt, end):
    data = encode("RGB", fmt)
    assert data.endswith(end)
    check_complete(data + b"\0" * MAX_TRAILER, probe(data))
    if fmt != "GIF":  # a GIF may be followed by NUL padding only: its LZW data is not byte-stuffed
        check_complete(data + b"\xff\xd8 second image appended" + data, probe(data))  # e.g. an MPF preview
    with pytest.raises(DecodeError, match=f"truncated {fmt}"):
        check_complete(data + b"\0" * (MAX_TRAILER + 1), probe(data))


def test_eoi_of_an_exif_thumbnail_does_not_count():
    """A thumbnail JPEG inside APP1 has its own FF D9; only one after the scan start counts."""
    thumbnail = encode("RGB", "JPEG")
    data = insert_app1(encode("RGB", "JPEG"), b"Exif\0\0" + tiff_ifd0("II", []) + thumbnail)
    check_complete(data, probe(data))
    cut = data[:-10]
    assert b"\xff\xd9" in cut[-MAX_TRAILER:]
    with pytest.raises(DecodeError, match="truncated JPEG: no EOI"):
        check_complete(cut, probe(cut))


def bmp_rle8(width: int, height: int) -> bytes:
    """An 8-bit RLE-compressed BMP (Pillow reads these but does not write them): gray rows."""
    rows = b"".join(bytes([width, 40 * y % 256, 0, 0]) for y in range(height)) + b"\0\1"  # run, EOL; EOB
    palette = bytes(v for c in range(256) for v in (c, c, c, 0))
    offset = 14 + 40 + len(palette)
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 8, 1, len(rows), 2835, 2835, 256, 0)
    return b"BM" + struct.pack("<IHHI", offset + len(rows), 0, 0, offset) + info + palette + rows


def test_bmp_rle_and_core_header():
    rle = bmp_rle8(5, 3)
    assert Image.open(io.BytesIO(rle)).convert("L").getpixel((0, 2)) == 0  # bottom-up: row 0 is the last
    check_complete(rle, probe(rle))
    with pytest.raises(DecodeError, match="truncated BMP"):
        check_complete(rle[:-1], probe(rle))
    core = bytearray(b"BM" + struct.pack("<IHHI", 26 + 3 * 4 * 2, 0, 0, 26) + struct.pack("<IHHHH", 12, 3, 2, 1, 24))
    core += b"\x10" * (12 * 2)  # two rows of 3 pixels padded to 12 bytes
    assert Image.open(io.BytesIO(bytes(core))).size == (3, 2)
    check_complete(bytes(core), probe(bytes(core)))
    with pytest.raises(DecodeError, match="truncated BMP"):
        check_complete(bytes(core[:-1]), probe(bytes(core)))


def test_check_complete_reads_only_the_tail():
    """A 32 MB JPEG is checked in well under a millisecond, without copying more than the tail."""
    data = encode("RGB", "JPEG")
    sos = jpeg_offsets(data)[1]
    big = data[:sos] + b"\x12" * (32 << 20) + data[sos:]
    header = probe(big)
    start = time.perf_counter()
    for _ in range(100):
        check_complete(big, header)
    assert (time.perf_counter() - start) / 100 < 1e-3
    cut = memoryview(big)[:-2]
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError):
            check_complete(cut, header)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024


@settings(max_examples=200, deadline=200)
@given(st.data())
def test_check_complete_on_mutated_images(draw):
    data = bytearray(draw.draw(st.sampled_from(corpus())))
    for _ in range(draw.draw(st.integers(0, 8))):
        data[draw.draw(st.integers(0, len(data) - 1))] = draw.draw(st.integers(0, 255))
    data = bytes(data[:draw.draw(st.integers(0, len(data)))])
    header = probe_or_decode_error(data)
    if header is not None:
        try:
            check_complete(data, header)
        except DecodeError as e:
            assert INTERNAL not in str(e), str(e)


# -- properties -----------------------------------------------------------------------------

@functools.cache
def corpus() -> tuple[bytes, ...]:
    """One valid image of each kind the fuzzer mutates."""
    images = [encode("RGB", "JPEG"), encode("CMYK", "JPEG", progressive=True),
              with_orientation("JPEG", 6), encode("RGBA", "PNG"), with_orientation("PNG", 3),
              encode("P", "GIF"), encode("RGB", "BMP")]
    if HAS_WEBP:
        images += [encode("RGB", "WEBP"), encode("RGBA", "WEBP", lossless=True), with_orientation("WEBP", 7)]
    return tuple(images)


def probe_or_decode_error(data: bytes) -> ImageHeader | None:
    try:
        header = probe(data, max_pixels=1 << 26)
    except DecodeError as e:
        assert INTERNAL not in str(e), str(e)
        return None
    assert isinstance(header, ImageHeader) and 1 <= header.orientation <= 8
    assert 0 < header.width * header.height <= 1 << 26
    return header


@settings(max_examples=300, deadline=200)
@given(st.binary(max_size=2048))
def test_arbitrary_bytes(data):
    probe_or_decode_error(data)


@settings(max_examples=300, deadline=200)
@given(st.sampled_from([b"\xff\xd8", b"\xff\xd8\xff\xe1\x00\x40Exif\0\0", b"\x89PNG\r\n\x1a\n",
                        b"GIF89a", b"BM", b"RIFF\xff\0\0\0WEBPVP8X"]), st.binary(max_size=512))
def test_valid_magic_with_random_tail(magic, tail):
    probe_or_decode_error(magic + tail)


@settings(max_examples=300, deadline=200)
@given(st.data())
def test_mutated_images(draw):
    data = bytearray(draw.draw(st.sampled_from(corpus())))
    for _ in range(draw.draw(st.integers(0, 8))):
        data[draw.draw(st.integers(0, len(data) - 1))] = draw.draw(st.integers(0, 255))
    probe_or_decode_error(bytes(data[:draw.draw(st.integers(0, len(data)))]))
