"""A cheap pre-decode check of encoded image bytes: format, size, channels, EXIF orientation.

:func:`probe` reads only the header of a JPEG, PNG, GIF, BMP or WebP image (stdlib only,
no copy of the buffer) and raises :class:`~gpupipe.core.errors.DecodeError` for anything a
decoder should not be given: empty data, unknown magic bytes (an HTML/XML error page saved
as ``.jpg`` is named as such), headers cut off or malformed, zero or absurd sizes, and
images whose declared size exceeds ``max_pixels`` (decompression bombs). "Truncated"
means only what the header walk can see: a JPEG is walked marker by marker up to its first
SOS and must have scan data after it, a PNG chunk by chunk up to its first IDAT; entropy
coded data is never scanned. Whatever the input, ``probe`` returns or raises
``DecodeError`` -- nothing else -- and every loop is bounded. A JPEG header that libjpeg
reads but that is not strictly well-formed (stray bytes between segments, a length a few
bytes off, tables that do not fit) is accepted and marked ``irregular``: it goes to Pillow,
never to a native decoder (:mod:`gpupipe.formats.jpeg`, :mod:`gpupipe.decode.gate`).

:func:`check_complete` is the second, equally cheap check: it looks at the *end* of the data
for what a complete file ends with (a JPEG EOI, a PNG IEND chunk, the GIF trailer, all the
BMP pixel rows, the whole WebP RIFF), so a file cut short in transfer or storage is refused
before a decoder turns it into a half-grey image.

Which formats there are is one registry (:class:`ImageFormat`, :func:`register_image_format`):
the built-in ones are registered below; a plugin registers its own (its magic bytes, the
extensions its files and sample fields carry, its header parser) and every reader, the gate and
the decoders' header checks take it from there — image folders list its files, tar samples find
it as their image member. A registered parser is held to :func:`probe`'s contract: return an
:class:`ImageHeader` or raise (any exception becomes a ``DecodeError`` naming the image).
"""
from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from gpupipe.core.errors import DecodeError
from gpupipe.formats import jpeg, png
from gpupipe.formats.exif import exif_orientation

__all__ = ["ImageHeader", "probe", "check_complete", "sniff", "field_name", "MAX_SIDE", "MAX_TRAILER", "MAX_PIXELS",
           "ImageFormat", "register_image_format", "image_formats", "image_extensions"]

MAX_SIDE = 1 << 20  # a side longer than this is a corrupt header, not an image
MAX_PIXELS = 178_956_970  # the default max_pixels: Pillow's decompression-bomb limit
_MAX_SEGMENTS = 4096  # PNG and WebP chunks walked
MAX_TRAILER = 4096  # bytes tolerated after a JPEG EOI / GIF trailer (camera and tool appendices)
_INTERNAL = "malformed header (internal error"  # the safety net's message; tests look for it

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_IEND = b"\0\0\0\0IEND\xaeB`\x82"  # length 0, type, CRC: the whole 12-byte chunk
# PNG colour type -> (channels as stored, allowed bit depths); palette images count as 3
_PNG_COLOUR = {0: (1, (1, 2, 4, 8, 16)), 2: (3, (8, 16)), 3: (3, (1, 2, 4, 8)),
               4: (2, (8, 16)), 6: (4, (8, 16))}
_BMP_INFO_SIZES = (40, 52, 56, 64, 108, 124)
_OTHER_FORMATS = ((b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"), (b"\x00\x00\x00\x0cjP  ", "JPEG 2000"),
                  (b"\xffO\xffQ", "JPEG 2000"), (b"\xff\x0a", "JPEG XL"), (b"\x00\x00\x00\x0cJXL ", "JPEG XL"))


@dataclass(frozen=True)
class ImageHeader:
    """What an image's header declares.

    ``channels`` is as stored: 1 gray, 2 gray+alpha, 3 colour (palette images too),
    4 CMYK/YCCK (JPEG) or with alpha (PNG, WebP, 32-bit BMP). ``orientation`` is the EXIF
    orientation 1..8 (JPEG APP1, PNG eXIf, WebP EXIF), 1 when absent or invalid.
    ``progressive`` is set for progressive JPEG frames (SOF2/6/10/14); ``sof`` is the JPEG
    frame marker (0xC0 baseline, 0xC1 extended, 0xC2 progressive, 0xC3 lossless, 0xC9..0xCF
    arithmetic-coded or hierarchical), 0 for other formats. ``exif_conflict``: a JPEG whose
    later APP1 Exif segment declares another orientation than the first (the one that counts,
    as for Pillow and exiftool); DALI reads the later one, so such images go to Pillow.
    ``irregular``: why a JPEG header is not strictly well-formed ("" when it is; see
    :mod:`gpupipe.formats.jpeg`), or why a PNG is not a plain one (:mod:`gpupipe.formats.png`):
    such images never reach a native decoder.
    """

    format: str
    width: int
    height: int
    channels: int
    orientation: int = 1
    progressive: bool = False
    bit_depth: int = 8
    sof: int = field(default=0, compare=False)  # which decoders can take it, not what it declares
    exif_conflict: bool = field(default=False, compare=False)  # likewise
    scan: int = field(default=0, compare=False)  # JPEG: where the first scan's data starts (0: not known)
    irregular: str = field(default="", compare=False)  # why not strictly well-formed (JPEG) or plain (PNG)


def probe(data: bytes | memoryview, *, max_pixels: int | None = None, name: str = "") -> ImageHeader:
    """Check the header of encoded image ``data`` and return what it declares.

    Raises :class:`DecodeError` (prefixed with ``name`` when given) for empty data, unknown or
    unsupported magic bytes, truncated or malformed headers, a zero side or one over
    :data:`MAX_SIDE`, and ``width * height > max_pixels``.
    """
    try:
        header = _check_size(_parse(_as_bytes_view(data)), max_pixels)
    except DecodeError as e:
        raise DecodeError(f"{name}: {e}" if name else str(e)) from None
    except (struct.error, IndexError, ValueError, TypeError, OverflowError) as e:
        # every parser checks its bounds; this net keeps the contract if one misses a case
        message = f"{_INTERNAL}: {type(e).__name__}: {e})"
        raise DecodeError(f"{name}: {message}" if name else message) from None
    return header


def check_complete(data: bytes | memoryview, header: ImageHeader, *, name: str = "") -> None:
    """Raise :class:`DecodeError` when ``data`` (whose :func:`probe` gave ``header``) is visibly cut short.

    Only the end of the data is read (and a JPEG's header, to know where its scan starts):

    * JPEG: an EOI marker (FF D9) after the start of the scan, in the last
      :data:`MAX_TRAILER` + 2 bytes -- up to 4 KiB of camera or tool appendices may follow it.
      (Entropy-coded data never contains FF D9, so a truncated scan cannot pass by chance.)
    * PNG: the 12-byte IEND chunk within the last :data:`MAX_TRAILER` + 12 bytes.
    * GIF: ends with a block terminator 0x00 and the trailer 0x3B, then at most
      :data:`MAX_TRAILER` NUL bytes of padding. Stricter than JPEG because LZW data is not
      byte-stuffed: ``00 3B`` occurs by chance in about one 4 KiB window of data in 16.
    * BMP: the pixel rows (offset + padded stride * height) fit, for uncompressed bitmaps and
      RLE ones that declare their data size.
    * WebP: the RIFF size fits the data (the same check :func:`probe` makes).
    """
    try:
        fmt = _FORMATS.get(header.format)
        if fmt is not None:
            _held(fmt, fmt.complete, _as_bytes_view(data), header)
    except DecodeError as e:
        raise DecodeError(f"{name}: {e}" if name else str(e)) from None
    except (struct.error, IndexError, ValueError, TypeError, OverflowError) as e:
        message = f"{_INTERNAL}: {type(e).__name__}: {e})"
        raise DecodeError(f"{name}: {message}" if name else message) from None


def _jpeg_complete(view: memoryview, header: ImageHeader) -> None:
    scan = header.scan if 0 < header.scan < len(view) else jpeg.walk(view).scan  # a header cut off raises here
    if len(view) - 2 >= scan and view[-2] == 0xFF and view[-1] == 0xD9:  # the usual end: no copy of the tail
        return
    start = max(scan, len(view) - MAX_TRAILER - 2)
    if bytes(view[start:]).rfind(b"\xff\xd9") < 0:
        raise DecodeError(f"truncated JPEG: no EOI marker (FF D9) in the last {len(view) - start} bytes "
                          f"of {len(view)}")


def _png_complete(view: memoryview, header: ImageHeader) -> None:
    if _PNG_IEND not in bytes(view[-(MAX_TRAILER + len(_PNG_IEND)):]):
        raise DecodeError(f"truncated PNG: no IEND chunk at the end of its {len(view)} bytes")


def _gif_complete(view: memoryview, header: ImageHeader) -> None:
    if not bytes(view[-(MAX_TRAILER + 2):]).rstrip(b"\0").endswith(b"\x00\x3b"):
        raise DecodeError(f"truncated GIF: no trailer (0x3B) at the end of its {len(view)} bytes")


def _bmp_complete(view: memoryview, header: ImageHeader) -> None:
    info_size = struct.unpack_from("<I", view, 14)[0] if len(view) >= 18 else 0
    if len(view) < (26 if info_size == 12 else 38):
        raise DecodeError(f"truncated BMP: header cut off at {len(view)} bytes")
    offset = struct.unpack_from("<I", view, 10)[0]
    if info_size == 12:
        width, height, _planes, bits = struct.unpack_from("<HHHH", view, 18)
        compression, data_size = 0, 0
    else:
        width, height, _planes, bits, compression, data_size = struct.unpack_from("<iiHHII", view, 18)
    if compression in (0, 3, 6):  # BI_RGB, BI_BITFIELDS, BI_ALPHABITFIELDS: rows of fixed size
        data_size = (abs(width) * bits + 31) // 32 * 4 * abs(height)
    elif compression not in (1, 2):  # embedded JPEG/PNG and others: nothing to compare
        data_size = 0
    if offset + data_size > len(view):
        raise DecodeError(f"truncated BMP: pixel data needs bytes {offset}..{offset + data_size}, "
                          f"data has {len(view)}")


def _webp_complete(view: memoryview, header: ImageHeader) -> None:
    riff_size = struct.unpack_from("<I", view, 4)[0] if len(view) >= 8 else len(view)
    if riff_size + 8 > len(view):
        raise DecodeError(f"truncated WebP: RIFF declares {riff_size + 8} bytes, data has {len(view)}")


def _no_check(view: memoryview, header: ImageHeader) -> None:
    """Formats without a cheap completeness check."""




def _as_bytes_view(data: object) -> memoryview:
    """A flat unsigned-byte view of ``data`` (no copy)."""
    try:
        view = memoryview(data)  # type: ignore[arg-type]
        return view if view.format == "B" and view.ndim == 1 else view.cast("B")
    except (TypeError, ValueError) as e:
        raise DecodeError(f"expected bytes or a contiguous buffer, got {type(data).__name__}: {e}") from None


def sniff(data: bytes | memoryview) -> str | None:
    """The format that the first bytes of ``data`` declare -- ``jpeg``, ``png``, ``gif``,
    ``bmp``, ``webp`` or a registered one's name -- or ``None``; nothing more is checked
    (that is :func:`probe`)."""
    head = bytes(data[:_HEAD])
    for fmt in _FORMATS.values():
        if fmt.magic(head):
            return fmt.name
    return None


def field_name(data: bytes | memoryview, default: str) -> str:
    """The sample field an image goes under: its format by its bytes (``jpg``, ``png``, ``gif``,
    ``bmp``, ``webp``, a registered format's first extension), else ``default`` (a file's
    extension): decoders look at the bytes, and a PNG saved as ``.jpg`` is stored as what it is."""
    fmt = _FORMATS.get(sniff(data) or "")
    return fmt.extensions[0] if fmt is not None and fmt.parse is not None else default


def _parse(view: memoryview) -> ImageHeader:
    """Dispatch on the magic bytes."""
    if not len(view):
        raise DecodeError("empty data (0 bytes)")
    fmt = _FORMATS.get(sniff(view) or "")
    if fmt is None or fmt.parse is None:
        raise DecodeError(_not_an_image(bytes(view[:64])))
    return _held(fmt, fmt.parse, view)


def _held(fmt: ImageFormat, step: Callable, *args):
    """A registered format's parser or check, held to the contract: whatever a plugin's raises is a
    ``DecodeError`` naming its format (the built-in ones are held by :func:`probe` itself)."""
    if fmt.name in _BUILT_IN:
        return step(*args)
    try:
        return step(*args)
    except DecodeError:
        raise
    except Exception as e:  # noqa: BLE001 — a plugin's parser on untrusted bytes
        raise DecodeError(f"{fmt.name}: malformed ({type(e).__name__}: {e})") from None


def _not_an_image(head: bytes) -> str:
    """Say what unrecognised data looks like: a known other format, an HTML/XML page, text."""
    shown = f"starts with {head[:16]!r}"
    for magic, kind in _OTHER_FORMATS:
        if head.startswith(magic):
            return f"unsupported image format {kind} ({shown}); convert it to JPEG, PNG or WebP"
    if head[4:8] == b"ftyp":
        return f"unsupported image format HEIF/AVIF (brand {head[8:12]!r}; {shown})"
    if head.lstrip(b" \t\r\n\xef\xbb\xbf").startswith(b"<"):
        return f"not an image: an HTML/XML page, e.g. a saved error response ({shown})"
    if all(32 <= c < 127 or c in b"\t\r\n" for c in head):
        return f"not an image: text ({shown})"
    return f"not an image: {shown}"


def _check_size(header: ImageHeader, max_pixels: int | None) -> ImageHeader:
    """Reject zero, negative or absurd sides and more than ``max_pixels`` pixels."""
    w, h, fmt = header.width, header.height, header.format.upper()
    if w <= 0 or h <= 0:
        raise DecodeError(f"{fmt}: declared size {w}x{h} has no pixels")
    if w > MAX_SIDE or h > MAX_SIDE:
        raise DecodeError(f"{fmt}: declared size {w}x{h} is absurd (a side over {MAX_SIDE}); corrupt header")
    if max_pixels is not None and w * h > max_pixels:
        raise DecodeError(f"{fmt}: declared size {w}x{h} ({w * h} pixels) exceeds "
                          f"max_pixels={max_pixels}; raise max_pixels to accept it")
    return header


def _jpeg(view: memoryview) -> ImageHeader:
    """Walk JPEG markers from SOI to the first SOS (:func:`gpupipe.formats.jpeg.walk`); one
    header object per distinct walk (a batch of one encoder's images shares a few)."""
    j = jpeg.walk(view)
    made = _JPEG_HEADERS.get(j)
    if made is None:
        if len(_JPEG_HEADERS) >= 512:
            _JPEG_HEADERS.clear()
        made = _JPEG_HEADERS[j] = _jpeg_header(j)
    return made


_JPEG_HEADERS: dict[jpeg.JpegHeader, ImageHeader] = {}


def _jpeg_header(j: jpeg.JpegHeader) -> ImageHeader:
    return ImageHeader("jpeg", j.width, j.height, j.channels, j.orientation, j.progressive, j.precision, j.sof,
                       j.exif_conflict, j.scan, j.irregular)


def _png(view: memoryview) -> ImageHeader:
    """Check the signature and IHDR (length, CRC, colour type and depth); walk chunks to IDAT."""
    if len(view) < 33:
        raise DecodeError(f"truncated PNG: IHDR needs 33 bytes, data has {len(view)}")
    length, kind, width, height, depth, colour, compression, filtering, interlace = \
        struct.unpack_from(">I4sIIBBBBB", view, 8)
    if length != 13 or kind != b"IHDR":
        raise DecodeError(f"PNG: first chunk is {kind!r} of {length} bytes, not a 13-byte IHDR")
    if zlib.crc32(view[12:29]) != struct.unpack_from(">I", view, 29)[0]:
        raise DecodeError("PNG: IHDR CRC mismatch (corrupt header)")
    channels, depths = _PNG_COLOUR.get(colour, (0, ()))
    if depth not in depths:
        raise DecodeError(f"PNG: invalid colour type {colour} with bit depth {depth}")
    if compression or filtering or interlace > 1:
        raise DecodeError(f"PNG: invalid IHDR methods (compression {compression}, "
                          f"filter {filtering}, interlace {interlace})")
    orientation = _png_chunks(view)
    return ImageHeader("png", width, height, channels, orientation, bit_depth=depth, irregular=png.plain(view))


def _png_chunks(view: memoryview) -> int:
    """Walk chunks after IHDR to the first IDAT (which must be complete); eXIf orientation or 1."""
    pos, orientation = 33, 1
    for _ in range(_MAX_SEGMENTS):
        if pos + 8 > len(view):
            raise DecodeError(f"truncated PNG: no IDAT chunk before end of data ({len(view)} bytes)")
        length, kind = struct.unpack_from(">I4s", view, pos)
        if kind == b"IDAT":
            if pos + 12 + length > len(view):
                raise DecodeError(f"truncated PNG: IDAT chunk at byte {pos} runs to byte "
                                  f"{pos + 12 + length}, data has {len(view)}")
            return orientation
        if kind == b"IEND":
            raise DecodeError(f"PNG: IEND at byte {pos} before any IDAT chunk")
        if kind == b"eXIf":
            orientation = exif_orientation(view[pos + 8:pos + 8 + length])
        pos += 12 + length
    raise DecodeError(f"PNG: more than {_MAX_SEGMENTS} chunks before IDAT")


def _gif(view: memoryview) -> ImageHeader:
    """Logical screen size from the GIF87a/89a header; some data must follow the colour table."""
    if len(view) < 13:
        raise DecodeError(f"truncated GIF: logical screen descriptor needs 13 bytes, data has {len(view)}")
    width, height, packed = struct.unpack_from("<HHB", view, 6)
    table = 3 << ((packed & 7) + 1) if packed & 0x80 else 0
    if len(view) <= 13 + table:
        raise DecodeError("truncated GIF: data ends right after the header (no image data)")
    return ImageHeader("gif", width, height, 3)


def _bmp(view: memoryview) -> ImageHeader:
    """Width and |height| from a BITMAPCOREHEADER or BITMAPINFOHEADER (and later versions)."""
    if len(view) < 26:
        raise DecodeError(f"truncated BMP: header needs at least 26 bytes, data has {len(view)}")
    offset, info_size = struct.unpack_from("<II", view, 10)
    if info_size != 12 and info_size not in _BMP_INFO_SIZES:
        raise DecodeError(f"BMP: unsupported info header size {info_size}")
    if len(view) < 14 + info_size:
        raise DecodeError(f"truncated BMP: {info_size}-byte info header cut off at {len(view)} bytes")
    layout = "<HHHH" if info_size == 12 else "<iiHH"
    width, height, _planes, bits = struct.unpack_from(layout, view, 18)
    if bits not in (1, 2, 4, 8, 16, 24, 32):
        raise DecodeError(f"BMP: invalid bits per pixel {bits}")
    if offset >= len(view):
        raise DecodeError(f"truncated BMP: pixel data at byte {offset}, data has {len(view)}")
    return ImageHeader("bmp", width, abs(height), 4 if bits == 32 else 3)


def _webp(view: memoryview) -> ImageHeader:
    """Size from the first chunk (VP8, VP8L or VP8X) of a RIFF WEBP container."""
    if len(view) < 30:
        raise DecodeError(f"truncated WebP: header needs 30 bytes, data has {len(view)}")
    riff_size, kind = struct.unpack_from("<I4x4s", view, 4)
    if riff_size + 8 > len(view):
        raise DecodeError(f"truncated WebP: RIFF declares {riff_size + 8} bytes, data has {len(view)}")
    if kind == b"VP8 ":
        if bytes(view[23:26]) != b"\x9d\x01\x2a" or view[20] & 1:
            raise DecodeError("WebP: VP8 chunk does not start with a key frame")
        width, height = struct.unpack_from("<HH", view, 26)
        return ImageHeader("webp", width & 0x3FFF, height & 0x3FFF, 3)
    if kind == b"VP8L":
        (bits,) = struct.unpack_from("<I", view, 21)
        if view[20] != 0x2F or bits >> 29:
            raise DecodeError("WebP: VP8L chunk has a bad signature or version")
        return ImageHeader("webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1, 3 + (bits >> 28 & 1))
    if kind == b"VP8X":
        flags = view[20]
        width = 1 + int.from_bytes(view[24:27], "little")
        height = 1 + int.from_bytes(view[27:30], "little")
        orientation = _webp_orientation(view) if flags & 0x08 else 1
        return ImageHeader("webp", width, height, 4 if flags & 0x10 else 3, orientation)
    raise DecodeError(f"WebP: unknown first chunk {kind!r}")


def _webp_orientation(view: memoryview) -> int:
    """Walk RIFF chunks (by their sizes, skipping the data) to an EXIF chunk; its orientation or 1."""
    pos = 12
    for _ in range(_MAX_SEGMENTS):
        if pos + 8 > len(view):
            return 1
        kind, size = struct.unpack_from("<4sI", view, pos)
        if kind == b"EXIF":
            return exif_orientation(view[pos + 8:pos + 8 + size])
        pos += 8 + size + (size & 1)
    return 1


# -- the registry ----------------------------------------------------------------------------

_HEAD = 16  # bytes a format's magic test sees


@dataclass(frozen=True)
class ImageFormat:
    """One image format: its ``name`` (``ImageHeader.format``), the ``extensions`` its files and
    sample fields carry (the first is the field it is stored under), ``magic`` (whether the first
    16 bytes declare it), its header parser (``None``: known, but no decoder takes it — probe
    then says to convert it) and its completeness check (:func:`check_complete`)."""

    name: str
    extensions: tuple[str, ...]
    magic: Callable[[bytes], bool]
    parse: Callable[[memoryview], ImageHeader] | None
    complete: Callable[[memoryview, ImageHeader], None] = _no_check


_FORMATS: dict[str, ImageFormat] = {}
_EXTENSIONS: list[tuple[str, ...]] = [(), ()]  # every format's extensions; those with a parser


def register_image_format(fmt: ImageFormat) -> None:
    """Make ``fmt`` an image format everywhere (a name already taken is replaced). Register before
    the loader starts its workers (at import of the plugin's module): they are forks of it."""
    if not fmt.extensions or any(not e or "." in e or e != e.lower() for e in fmt.extensions):
        raise ValueError(f"image format {fmt.name!r}: extensions must be lower-case names without dots, "
                         f"got {fmt.extensions!r}")
    _FORMATS[fmt.name] = fmt
    _EXTENSIONS[0] = tuple(e for f in _FORMATS.values() for e in f.extensions)
    _EXTENSIONS[1] = tuple(e for f in _FORMATS.values() if f.parse is not None for e in f.extensions)


def image_formats() -> tuple[ImageFormat, ...]:
    """The registered formats, in the order they are tried (built-in first)."""
    return tuple(_FORMATS.values())


def image_extensions(*, readable: bool = False) -> tuple[str, ...]:
    """Every registered format's extensions in order of preference (a sample's image member is the
    first of them it has); ``readable``: only those of formats with a parser (an image folder lists
    these files; a ``.tif`` among tar members is still the image, refused by name)."""
    return _EXTENSIONS[1] if readable else _EXTENSIONS[0]


_BUILT_IN = frozenset({"jpeg", "png", "webp", "bmp", "gif", "ppm", "tiff"})
for _fmt in (
    ImageFormat("jpeg", ("jpg", "jpeg"), lambda h: h.startswith(b"\xff\xd8"), _jpeg, _jpeg_complete),
    ImageFormat("png", ("png",), lambda h: h.startswith(_PNG_SIGNATURE), _png, _png_complete),
    ImageFormat("webp", ("webp",), lambda h: h.startswith(b"RIFF") and b"WEBP".startswith(h[8:12]), _webp,
                _webp_complete),
    ImageFormat("bmp", ("bmp",), lambda h: h.startswith(b"BM"), _bmp, _bmp_complete),
    ImageFormat("gif", ("gif",), lambda h: h.startswith((b"GIF87a", b"GIF89a")), _gif, _gif_complete),
    ImageFormat("ppm", ("ppm",), lambda h: False, None),  # named as images, refused with the reason
    ImageFormat("tiff", ("tif", "tiff"), lambda h: False, None),
):
    register_image_format(_fmt)
