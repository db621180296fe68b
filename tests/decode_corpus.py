"""A small, deterministic, in-memory corpus of encoded images for the decoder contract suite.

``natural_jpegs(n, size)`` gives photo-like JPEGs (smooth colour fields, discs, mild noise:
:func:`gpupipe.tools.synth.synthetic_jpeg`). ``cases()`` gives named images with what a decoder
must make of each (:class:`Expect`):

* ``ok`` cases -- JPEG baseline / progressive / restart markers / grayscale / CMYK; PNG
  RGB / RGBA / palette / gray / 16-bit gray / 16-bit RGB; a 48x32 (w x h) four-colour pattern
  stored under each EXIF orientation 1..8 (JPEG), orientation 6 in a PNG eXIf chunk, and a
  JPEG with two Exif segments (6, then 1: the first counts); GIF, BMP, WebP (when Pillow has
  it). RGBA becomes RGB by dropping alpha (not compositing), 16-bit by keeping the high byte.
  ``size`` is the upright (h, w); ``truth`` the upright RGB pixels the file was made from.
* ``bad`` cases -- what the pre-decode checks must refuse: a JPEG truncated at 10/50/90%, a
  PNG at 90%, empty,
  random bytes, an HTML error page saved as ``.jpg``, a 65500x65500 SOF (decompression bomb).
* ``either`` -- ``garbage-entropy``: a valid header, scan data replaced by random bytes
  (byte-stuffed, so no marker appears) and an EOI. Nothing short of decoding can tell it
  from a real image, and libjpeg-turbo (Pillow, DALI CPU) decodes such data to noise with
  only a warning while nvJPEG may refuse it. The contract: a backend either decodes it to
  an image of the declared size or treats it as a bad image (``DecodeError`` under
  ``raise``, replaced and counted under ``skip``); it never crashes, never returns another
  shape, and never costs the other images of its batch.
"""
from __future__ import annotations

import functools
import io
import struct
import zlib
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from PIL import Image, features

from gpupipe.tools.synth import synthetic_jpeg

__all__ = ["Expect", "natural_jpegs", "cases", "orientation_pattern", "oriented_jpegs", "stored_as", "png_bytes",
           "SEED"]

SEED = 20240601
NATURAL = (80, 60)  # (width, height) of the natural-image cases
PATTERN = (48, 32)  # (width, height) of the upright orientation pattern
QUADRANTS = ((200, 30, 30), (30, 170, 40), (40, 60, 210), (235, 225, 80))  # TL, TR, BL, BR
# PIL transpose that undoes EXIF orientation o (what ImageOps.exif_transpose applies)
_UPRIGHT = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
            4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,
            6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE, 8: Image.Transpose.ROTATE_90}
_INVERSE = {2: 2, 3: 3, 4: 4, 5: 5, 6: 8, 7: 7, 8: 6}  # orientation whose transpose inverts o's


@dataclass(frozen=True)
class Expect:
    """What a decoder must make of one case.

    ``outcome``: ``ok`` decodes; ``bad`` is refused; ``either`` may go either way (see the
    module docstring). ``size``: upright (height, width) for ``ok`` and ``either``.
    ``truth``: upright (h, w, 3) uint8 RGB the file was encoded from, or None when unknown;
    exact for ``lossless`` files (PNG; 16-bit truth is the high byte, so allow 1 of rounding).
    """

    outcome: Literal["ok", "bad", "either"]
    size: tuple[int, int] | None = None
    truth: np.ndarray | None = field(default=None, compare=False, repr=False)
    lossless: bool = False

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def bad(self) -> bool:
        return self.outcome == "bad"


def natural_jpegs(n: int, size: tuple[int, int] = NATURAL, quality: int = 90, *, seed: int = SEED) -> list[bytes]:
    """``n`` photo-like JPEGs of ``size`` (width, height); the same list for the same arguments."""
    return [synthetic_jpeg(np.random.default_rng([seed, i]), size, quality) for i in range(n)]


def orientation_pattern() -> np.ndarray:
    """The upright 32x48 (h x w) pattern: four colours in 8-aligned quadrants plus a smooth
    ramp, so every one of the 8 flips/rotations is told apart and JPEG blocks stay clean."""
    w, h = PATTERN
    img = np.empty((h, w, 3), np.float32)
    for q, colour in enumerate(QUADRANTS):
        img[(q // 2) * h // 2:(q // 2 + 1) * h // 2, (q % 2) * w // 2:(q % 2 + 1) * w // 2] = colour
    img += np.linspace(-12, 12, w, dtype=np.float32)[None, :, None]
    return _readonly(np.clip(img, 0, 255).astype(np.uint8))


def png_bytes(pixels: np.ndarray, *, colour: int, exif: bytes = b"") -> bytes:
    """A minimal PNG (no filtering) of ``pixels`` (h, w[, c]) uint8 or uint16 in ``colour`` type.

    Pillow cannot write 16-bit RGB PNGs, hence this writer.
    """
    h, w = pixels.shape[:2]
    depth = 16 if pixels.dtype == np.uint16 else 8
    raw = pixels.astype(">u2" if depth == 16 else np.uint8).reshape(h, -1).tobytes()
    stride = len(raw) // h
    rows = b"".join(b"\0" + raw[y * stride:(y + 1) * stride] for y in range(h))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", w, h, depth, colour, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + (chunk(b"eXIf", exif) if exif else b"")
            + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b""))


def cases() -> dict[str, tuple[bytes, Expect]]:
    """Every case by name: (encoded bytes, expectation). Deterministic; built once per process."""
    return dict(_cases())


@functools.lru_cache(maxsize=1)
def _cases() -> tuple[tuple[str, tuple[bytes, Expect]], ...]:
    out: dict[str, tuple[bytes, Expect]] = {}
    out.update(_jpeg_cases())
    out.update(_png_cases())
    out.update(_other_format_cases())
    out.update(_orientation_cases())
    out.update(_bad_cases())
    return tuple(out.items())


def _jpeg_cases() -> dict[str, tuple[bytes, Expect]]:
    w, h = NATURAL
    rgb = _natural_pixels()
    gray = np.asarray(Image.fromarray(rgb).convert("L"))
    return {
        "jpeg-baseline": (_save(rgb, "JPEG", quality=90), Expect("ok", (h, w), _readonly(rgb))),
        "jpeg-progressive": (_save(rgb, "JPEG", quality=90, progressive=True), Expect("ok", (h, w), _readonly(rgb))),
        "jpeg-restart": (_save(rgb, "JPEG", quality=90, restart_marker_blocks=2), Expect("ok", (h, w), _readonly(rgb))),
        "jpeg-gray": (_save(gray, "JPEG", quality=90), Expect("ok", (h, w), _readonly(np.repeat(gray[..., None], 3, 2)))),
        "jpeg-cmyk": (_save(Image.fromarray(rgb).convert("CMYK"), "JPEG", quality=90), Expect("ok", (h, w), _readonly(rgb))),
    }


def _png_cases() -> dict[str, tuple[bytes, Expect]]:
    w, h = NATURAL
    rgb = _natural_pixels()
    rng = np.random.default_rng([SEED, 1])
    alpha = rng.integers(0, 256, (h, w), dtype=np.uint8)  # transparency must be dropped, not composited
    palette = Image.fromarray(rgb).quantize(64, dither=Image.Dither.NONE)
    gray = np.asarray(Image.fromarray(rgb).convert("L"))
    wide = rgb.astype(np.uint16) * 256 + rng.integers(0, 256, rgb.shape, dtype=np.uint16)  # high byte = rgb
    ok = functools.partial(Expect, "ok", (h, w), lossless=True)
    return {
        "png-rgb": (_save(rgb, "PNG"), ok(_readonly(rgb))),
        "png-rgba": (_save(np.dstack([rgb, alpha]), "PNG"), ok(_readonly(rgb))),
        "png-palette": (_save(palette, "PNG"), ok(_readonly(np.asarray(palette.convert("RGB"))))),
        "png-gray": (_save(gray, "PNG"), ok(_readonly(np.repeat(gray[..., None], 3, 2)))),
        "png-16bit-gray": (png_bytes(wide[..., 0], colour=0), ok(_readonly(np.repeat(rgb[..., :1], 3, 2)))),
        "png-16bit-rgb": (png_bytes(wide, colour=2), ok(_readonly(rgb))),
    }


def _other_format_cases() -> dict[str, tuple[bytes, Expect]]:
    """GIF, BMP and (when Pillow has it) WebP: formats the header check accepts."""
    w, h = NATURAL
    rgb = _natural_pixels()
    gif = _save(rgb, "GIF")
    out = {"gif": (gif, Expect("ok", (h, w), _readonly(np.asarray(Image.open(io.BytesIO(gif)).convert("RGB"))),
                               lossless=True)),
           "bmp": (_save(rgb, "BMP"), Expect("ok", (h, w), _readonly(rgb), lossless=True))}
    if features.check("webp"):
        out["webp"] = (_save(rgb, "WEBP", quality=90), Expect("ok", (h, w), _readonly(rgb)))
        out["webp-lossless"] = (_save(rgb, "WEBP", lossless=True), Expect("ok", (h, w), _readonly(rgb), lossless=True))
    return out


def stored_as(upright: np.ndarray, orientation: int, **jpeg) -> bytes:
    """A JPEG that shows ``upright`` (h, w, 3) once EXIF ``orientation`` is applied: the pixels
    stored transposed the other way, and the orientation in an Exif segment."""
    stored = Image.fromarray(upright)
    if orientation != 1:
        stored = stored.transpose(_UPRIGHT[_INVERSE[orientation]])
    exif = Image.Exif()
    exif[0x0112] = orientation
    return _save(stored, "JPEG", exif=exif.tobytes(), **jpeg)


def oriented_jpegs(size: tuple[int, int] = (203, 157), quality: int = 90) -> dict[int, bytes]:
    """One photo-like upright image of ``size`` (width, height) stored under each EXIF
    orientation 1..8. The default sides are odd, so neither the 8x8 blocks nor any DCT scale
    divides them: a box carried between the stored and upright frames without minding the
    rounded-up scaled size lands off by a pixel."""
    upright = np.asarray(Image.open(io.BytesIO(natural_jpegs(1, size, quality, seed=SEED + 2)[0])).convert("RGB"))
    return {o: stored_as(upright, o, quality=quality) for o in range(1, 9)}


def _orientation_cases() -> dict[str, tuple[bytes, Expect]]:
    upright = orientation_pattern()
    size = upright.shape[:2]
    out = {}
    for o in range(1, 9):
        data = stored_as(upright, o, quality=95, subsampling=0)
        out[f"exif-{o}"] = (data, Expect("ok", size, upright))
    stored = np.asarray(Image.fromarray(upright).transpose(_UPRIGHT[8]))
    exif = Image.Exif()
    exif[0x0112] = 6
    tiff = exif.tobytes().removeprefix(b"Exif\0\0")  # a PNG eXIf chunk holds the TIFF block alone
    out["png-exif-6"] = (png_bytes(stored, colour=2, exif=tiff), Expect("ok", size, upright, lossless=True))
    if features.check("webp"):  # WebP EXIF chunks are written both with the "Exif\0\0" prefix and without
        for name, payload in (("webp-exif-6", exif.tobytes()), ("webp-exif-6-tiff", tiff)):
            data = _save(stored, "WEBP", lossless=True, exif=payload)
            out[name] = (data, Expect("ok", size, upright, lossless=True))
    # two Exif APP1 segments (non-conformant, seen from some editors): the first one counts,
    # as in the header check (whose upright size places crop boxes) and in Pillow
    data = out["exif-6"][0]
    second = _app1_exif(1)
    out["exif-6-two-app1"] = (data[:data.index(b"\xff\xdb")] + second + data[data.index(b"\xff\xdb"):],
                              Expect("ok", size, upright))
    return out


def _app1_exif(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    payload = exif.tobytes()  # b"Exif\0\0" + TIFF
    return b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload


def _bad_cases() -> dict[str, tuple[bytes, Expect]]:
    big = natural_jpegs(1, (160, 120), seed=SEED + 1)[0]
    rng = np.random.default_rng([SEED, 2])
    out = {f"bad-truncated-{p}": (big[:len(big) * p // 100], Expect("bad")) for p in (10, 50, 90)}
    png = _save(np.asarray(Image.open(io.BytesIO(big)).convert("RGB")), "PNG")
    out["bad-truncated-png"] = (png[:len(png) * 90 // 100], Expect("bad"))
    out["bad-empty"] = (b"", Expect("bad"))
    out["bad-random"] = (rng.integers(0, 256, 5000, dtype=np.uint8).tobytes(), Expect("bad"))
    out["bad-html"] = (b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>\n<body><h1>Not Found"
                       b"</h1><p>The requested URL was not found on this server.</p></body></html>\n", Expect("bad"))
    out["bad-bomb"] = (_patch_sof(big, 65500, 65500), Expect("bad"))
    sos = _scan_start(big)
    noise = rng.integers(0, 256, len(big) - sos - 2, dtype=np.uint8)
    noise[noise == 0xFF] = 0xFE  # no byte stuffing needed, no marker appears
    out["garbage-entropy"] = (big[:sos] + noise.tobytes() + b"\xff\xd9", Expect("either", (120, 160)))
    return out


def _natural_pixels() -> np.ndarray:
    """(60, 80, 3) uint8 photo-like pixels: the first natural JPEG, decoded."""
    return np.asarray(Image.open(io.BytesIO(natural_jpegs(1)[0])).convert("RGB"))


def _save(img, fmt: str, **options) -> bytes:
    buf = io.BytesIO()
    (img if isinstance(img, Image.Image) else Image.fromarray(img)).save(buf, fmt, **options)
    return buf.getvalue()


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.flags.writeable = False
    return a


def _patch_sof(data: bytes, width: int, height: int) -> bytes:
    at = data.index(b"\xff\xc0") + 5  # marker (2), length (2), precision (1)
    return data[:at] + struct.pack(">HH", height, width) + data[at + 4:]


def _scan_start(data: bytes) -> int:
    at = data.index(b"\xff\xda")
    return at + 2 + struct.unpack_from(">H", data, at + 2)[0]


def odd_files() -> dict[str, bytes]:
    """Real-world odd files, each distinct (its own random pixels), most of which pass the
    header checks: the formats DALI decodes badly or not at all (RLE, 1- and 4-bit BMP,
    16-bit and animated PNG, animated / lossless / EXIF WebP, lossless, arithmetic-coded
    and 12-bit JPEG) and damage only a decoder can find (corrupt PNG IDAT and CRC, a
    truncated RLE stream, garbage entropy data, a scan cut short before its EOI)."""
    rng = np.random.default_rng([SEED, 3])

    def rgb(w: int = 64, h: int = 48) -> Image.Image:
        return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))

    def animated(fmt: str) -> bytes:
        buf = io.BytesIO()
        rgb().save(buf, fmt, save_all=True, append_images=[rgb(), rgb()])
        return buf.getvalue()

    exif = Image.Exif()
    exif[0x0112] = 6
    jpeg = _save(rgb(), "JPEG", quality=90)
    sof, scan = jpeg.index(b"\xff\xc0"), _scan_start(jpeg)
    noise = rng.integers(0, 255, len(jpeg) - scan - 2, dtype=np.uint8).tobytes().replace(b"\xff", b"\xfe")
    png = _save(rgb(), "PNG")
    idat = png.index(b"IDAT")
    out = {
        "bmp-rle8": _rle8_bmp(rng), "bmp-1bit": _save(rgb().convert("1"), "BMP"),
        "bmp-4bit": _save(rgb().convert("P", palette=Image.Palette.ADAPTIVE, colors=16), "BMP"),
        "png-16bit": _save(Image.fromarray(rng.integers(0, 65536, (48, 64), dtype=np.uint16)), "PNG"),
        "png-animated": animated("PNG"), "gif": _save(rgb().convert("P"), "GIF"),
        "jpeg-cmyk": _save(rgb().convert("CMYK"), "JPEG"), "jpeg-progressive": _save(rgb(), "JPEG", progressive=True),
        "jpeg-lossless-sof3": jpeg[:sof] + b"\xff\xc3" + jpeg[sof + 2:],
        "jpeg-arithmetic-sof9": jpeg[:sof] + b"\xff\xc9" + jpeg[sof + 2:],
        "jpeg-12bit": jpeg[:sof + 4] + b"\x0c" + jpeg[sof + 5:],
        "jpeg-garbage-entropy": jpeg[:scan] + noise + b"\xff\xd9",
        "jpeg-cut-with-eoi": jpeg[:scan + (len(jpeg) - scan) // 3] + b"\xff\xd9",
        "png-corrupt-idat": png[:idat + 24] + rng.integers(0, 256, 40, dtype=np.uint8).tobytes() + png[idat + 64:],
        "png-bad-crc": png[:idat + 4] + bytes([png[idat + 4] ^ 0xFF]) + png[idat + 5:],
        "bmp-rle8-truncated": _rle8_bmp(rng)[:-30] + bytes(30),
    }
    if features.check("webp"):
        out.update({"webp-animated": animated("WEBP"), "webp-lossless": _save(rgb(), "WEBP", lossless=True),
                    "webp-exif-6": _save(rgb(), "WEBP", exif=exif.tobytes())})
    return out


def _rle8_bmp(rng: np.random.Generator, w: int = 64, h: int = 48) -> bytes:
    """An 8-bit palette BMP compressed with BI_RLE8 (Pillow reads it but does not write it)."""
    palette = b"".join(bytes([i, (i * 7) % 256, (i * 13) % 256, 0]) for i in range(256))
    runs = b"".join(b"".join(bytes([8, int(v)]) for v in rng.integers(0, 256, w // 8)) + b"\x00\x00"
                    for _ in range(h)) + b"\x00\x01"
    offset = 14 + 40 + len(palette)
    dib = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 8, 1, len(runs), 2835, 2835, 256, 0)
    return b"BM" + struct.pack("<IHHI", offset + len(runs), 0, 0, offset) + dib + palette + runs
