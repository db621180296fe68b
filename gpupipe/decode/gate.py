"""The gate in front of every native decoder (DALI on the CPU or GPU, torchvision's nvJPEG).

A native decoder gets an image only if :func:`native_decodable` says so: an 8-bit baseline,
extended or progressive Huffman JPEG whose whole header is strictly well-formed
(:mod:`gpupipe.formats.jpeg`: segments exactly where the lengths say, one SOF, the tables
the first scan needs, an SOS that fits the frame) and whose Exif segments agree on the
orientation; and, for a decoder that takes them (DALI on the CPU), a *plain* PNG
(:mod:`gpupipe.formats.png`: 8-bit gray/RGB(A), not interlaced, every chunk's CRC right, only
chunks that leave the pixels alone). Everything else -- other formats, other JPEG codings, other
PNGs, and headers libjpeg recovers from -- is decoded by Pillow, which decodes it or refuses it
with an exception (a counted skip under ``on_error: skip``).

Why so strict: the JPEG parser under DALI (nvImageCodec) kills the process with SIGSEGV on
headers that libjpeg and Pillow tolerate -- stray bytes between segments, ``FF 00`` where a
marker should be, a segment length a few bytes off (Pillow's own test images
``jpeg_ff00_header.jpg``, ``junk_jpeg_header.jpg``, ``photoshop-200dpi-broken.jpg`` among
them). A segfault is no exception: no ``on_error`` policy can catch it, and the training
run is lost with nothing logged. Encoders write well-formed headers, so the gate costs
nothing but a few microseconds of header walk for them (benchmarks/gate_bench.py).
"""
from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Collection, Sequence

import numpy as np

from gpupipe.formats.headers import ProbedHeaders
from gpupipe.formats.imageheader import ImageHeader
from gpupipe.formats.jpeg import HUFFMAN_SOF

__all__ = ["native_decodable", "why_not_native", "route", "route_probed", "gpu_region_decode_safe", "nvimgcodec_version"]


# GPU region decode (DALI's decoders.image_slice / image_random_crop on "mixed") goes through
# nvImageCodec's sub-code-stream regions, which regressed in nvImageCodec 0.9.0: ordinary,
# in-bounds ROIs on ImageNet JPEGs kill the process with SIGSEGV on H100 and B200 and fail
# with INTERNAL_ERROR on A100 (NVIDIA/nvImageCodec#55, open; 0.8.0 was the last good one).
# DALI 2.4 requires nvimgcodec >=0.9,<0.10, so the extras cannot pin 0.8. Until a GPU check
# (tests/decode/test_gpu_region_decode.py) passes with a version, the CUDA path decodes whole images
# and crops in DALI's GPU resize, as the CPU path's torch resize does; region decode on the
# CPU (libjpeg-turbo's cropped decode) is not affected and stays.
_REGION_DECODE_GOOD_BELOW = (0, 9)
_NVIMGCODEC = ("nvidia-nvimgcodec-cu12", "nvidia-nvimgcodec-cu13", "nvidia-nvimgcodec-tegra-cu12",
               "nvidia-nvimgcodec-tegra-cu13", "nvidia-nvimgcodec")


def why_not_native(header: ImageHeader, formats: Collection[str] = ("jpeg",)) -> str:
    """Why an image goes to Pillow instead of a native decoder that takes ``formats``
    (``"jpeg"``, ``"png"``); "" when it may go native."""
    if header.format not in formats:
        return header.format
    if header.format == "png":
        return f"PNG that is not plain: {header.irregular}" if header.irregular else ""
    if header.sof not in HUFFMAN_SOF:
        return f"JPEG coding SOF 0xFF{header.sof:02X}"
    if header.bit_depth != 8:
        return f"{header.bit_depth}-bit JPEG"
    if header.exif_conflict:
        return "Exif segments that disagree on the orientation (DALI reads a later one than the first)"
    if header.irregular:
        return f"irregular JPEG header: {header.irregular}"
    return ""


def native_decodable(header: ImageHeader, formats: Collection[str] = ("jpeg",)) -> bool:
    """Whether a native decoder that takes ``formats`` may get this image (see the module docstring)."""
    return not why_not_native(header, formats)


def route(headers: Sequence[ImageHeader | None], good: Sequence[int],
          formats: Collection[str] = ("jpeg",)) -> tuple[list[int], list[int]]:
    """The rows ``good`` (of a batch with these ``headers``) split into (for the native decoder
    that takes ``formats``, for Pillow)."""
    native = [i for i in good if (h := headers[i]) is not None and native_decodable(h, formats)]  # good rows have one
    chosen = set(native)
    return native, [i for i in good if i not in chosen]


def route_probed(probed: ProbedHeaders, good: np.ndarray,
                 formats: Collection[str] = ("jpeg",)) -> tuple[list[int], list[int]]:
    """:func:`route` on a batch's probed headers (``good``: (B,) bool): the gate's verdict once
    per distinct header, spread to the images by the index — the same split."""
    ok = probed.per_header([native_decodable(h, formats) for h in probed.table], False).astype(bool)
    return np.flatnonzero(good & ok).tolist(), np.flatnonzero(good & ~ok).tolist()


@functools.lru_cache(maxsize=1)
def nvimgcodec_version() -> tuple[int, ...] | None:
    """The installed nvImageCodec's version (from the package metadata: nothing is imported),
    or None when none is found."""
    for name in _NVIMGCODEC:
        try:
            text = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return tuple(int(part) for part in text.split(".")[:3] if part.isdigit())
    return None


def gpu_region_decode_safe() -> bool:
    """Whether DALI may decode only a region of each image on the GPU: only with an
    nvImageCodec older than the 0.9.0 regression (see the note above); unknown is unsafe."""
    version = nvimgcodec_version()
    return version is not None and version < _REGION_DECODE_GOOD_BELOW
