"""Where each image's crop box lies, before anything is decoded: pure arithmetic on upright
image sizes, the same for every backend, and in the DataLoader workers (the keyed
``random_resized_crop`` boxes are drawn there: :mod:`gpupipe.decode.columns`).

Boxes are (top, left, height, width) in upright image coordinates (EXIF orientation applied).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from gpupipe.decode.base import ResizeMode
from gpupipe.formats.imageheader import ImageHeader

__all__ = ["upright_size", "upright_sizes", "random_resized_crop_box", "shorter_geometry", "shorter_box",
           "shorter_geometries", "shorter_boxes", "crop_first", "crop_boxes", "crop_boxes_from_sizes"]

_TAG_CROP = 3


def upright_size(header: ImageHeader) -> tuple[int, int]:
    """(height, width) as displayed, after the EXIF orientation is applied."""
    if header.orientation in (5, 6, 7, 8):
        return header.width, header.height
    return header.height, header.width


def upright_sizes(headers: Sequence[ImageHeader | None]) -> tuple[np.ndarray, np.ndarray]:
    """(B, 2) int64 upright (height, width) of every header (:func:`upright_size`; 0 where
    None) and (B,) bool, whether the row has a header."""
    raw = np.array([(0, 0, 0, False) if h is None else (h.height, h.width, h.orientation, True) for h in headers],
                   np.int64).reshape(-1, 4)
    swap = (raw[:, 2] >= 5) & (raw[:, 2] <= 8)
    return np.where(swap[:, None], raw[:, 1::-1], raw[:, :2]), raw[:, 3].astype(bool)


def random_resized_crop_box(h: int, w: int, scale, ratio, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params``: (top, left, height, width)."""
    area = h * w
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            return int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1)), ch, cw
    in_ratio = w / h
    if in_ratio < ratio[0]:
        cw, ch = w, int(round(w / ratio[0]))
    elif in_ratio > ratio[1]:
        ch, cw = h, int(round(h * ratio[1]))
    else:
        ch, cw = h, w
    return (h - ch) // 2, (w - cw) // 2, ch, cw



def shorter_geometry(h: int, w: int, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """torchvision's ``Resize(s)`` + ``CenterCrop(size)`` of an (h, w) image: (resized height,
    resized width, crop top, crop left) in the resized image.

    ``Resize(s)``: the shorter side to ``s``, the longer to ``int(s * long / short)``; ``s`` is
    the smallest that makes the resized image cover ``size`` (``s`` = the side of a square
    ``size``). ``CenterCrop``: top ``int(round((H - h) / 2))``, left likewise."""
    out_h, out_w = size
    short, long = min(h, w), max(h, w)
    need_short, need_long = (out_h, out_w) if h <= w else (out_w, out_h)
    s = max(need_short, math.ceil(need_long * short / long))
    while int(s * long / short) < need_long:  # the longer side is truncated: one more may be needed
        s += 1
    new_short, new_long = s, int(s * long / short)
    rh, rw = (new_short, new_long) if h <= w else (new_long, new_short)
    return rh, rw, int(round((rh - out_h) / 2.0)), int(round((rw - out_w) / 2.0))


def shorter_box(h: int, w: int, size: tuple[int, int]) -> tuple[float, float, float, float]:
    """The ``shorter`` box of an (h, w) image: :func:`shorter_geometry`'s crop carried back to
    the source, (top, left, height, width) in source pixels, fractional. Resized to ``size``
    with the filter reading past the box (to the image's edges), it is torchvision's
    ``Resize(s)`` + ``CenterCrop(size)`` in one interpolation: the same sample positions
    (source ``(i + 0.5) * h / rh - 0.5``) and the same filter width (``h / rh``)."""
    rh, rw, top, left = shorter_geometry(h, w, size)
    sy, sx = h / rh, w / rw
    return top * sy, left * sx, size[0] * sy, size[1] * sx


def shorter_geometries(upright_hw: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """:func:`shorter_geometry` of every row at once, the same integers. Shape: (B, 2) int64
    (h, w), each at least 1 → (B, 4) int64 (resized height, resized width, crop top, crop left)."""
    hw = np.asarray(upright_hw, np.int64).reshape(-1, 2)
    out_h, out_w = size
    wide = hw[:, 0] <= hw[:, 1]
    short, long = hw.min(axis=1), hw.max(axis=1)
    need_short, need_long = np.where(wide, out_h, out_w), np.where(wide, out_w, out_h)
    s = np.maximum(need_short, np.ceil(need_long * short / long).astype(np.int64))
    new_long = (s * long / short).astype(np.int64)  # truncated, as int() does
    short_of = new_long < need_long
    while short_of.any():  # as shorter_geometry's while; never taken for sides under 2**40 (s >= need_long *
        # short / long exactly, and float64 keeps that): rows short of it get one more, all at once
        s += short_of
        new_long = (s * long / short).astype(np.int64)
        short_of = new_long < need_long
    rh, rw = np.where(wide, s, new_long), np.where(wide, new_long, s)
    top, left = np.rint((rh - out_h) / 2.0), np.rint((rw - out_w) / 2.0)  # round half to even, as round()
    return np.stack([rh, rw, top.astype(np.int64), left.astype(np.int64)], axis=1)


def shorter_boxes(upright_hw: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """:func:`shorter_box` of every row at once, the same floats. Shape: (B, 2) int64 (h, w) →
    (B, 4) float64 (top, left, height, width) in source pixels."""
    hw = np.asarray(upright_hw, np.int64).reshape(-1, 2)
    geometry = shorter_geometries(hw, size)
    scale = hw / geometry[:, :2]
    return np.concatenate([geometry[:, 2:] * scale, np.asarray(size, np.int64) * scale], axis=1)


def crop_first(config) -> bool:
    """Whether a box is cut out and then resized (torchvision's ``resized_crop``: the filter
    never reads past the box), as ``random_resized_crop`` does; the other modes resize the
    whole image and cut the box out of that (``shorter``; ``fixed``'s box is the image)."""
    return config.resize is ResizeMode.RANDOM_CROP


def crop_boxes(headers: Sequence[ImageHeader | None], sample_ids, epoch: int, config) -> np.ndarray:
    """:func:`crop_boxes_from_sizes` of the images of ``headers`` (None: not an image)."""
    upright_hw, exists = upright_sizes(headers)
    return crop_boxes_from_sizes(upright_hw, exists, sample_ids, epoch, config)


def crop_boxes_from_sizes(upright_hw: np.ndarray, exists: np.ndarray, sample_ids, epoch: int,
                          config) -> np.ndarray:
    """(B, 4) float64 boxes (top, left, height, width) in upright image coordinates, zeros where
    not ``exists``. Shape: ``upright_hw`` (B, 2) int64 upright (h, w), ``exists`` (B,) bool,
    ``sample_ids`` (B,) ints.

    ``fixed``: the whole image; ``shorter``: torchvision's ``Resize(s)`` + ``CenterCrop``
    carried back to the source (:func:`shorter_boxes`, fractional); ``random_resized_crop``:
    torchvision's rule (whole pixels), drawn from a generator keyed by (seed, epoch, sample
    id) — the same sample gets the same crop whatever the batch, worker count or resume point.
    """
    hw = np.asarray(upright_hw, np.int64).reshape(-1, 2)
    exists = np.asarray(exists, bool)
    boxes = np.zeros((len(hw), 4), dtype=np.float64)
    if config.resize is ResizeMode.RANDOM_CROP:
        for i in np.flatnonzero(exists).tolist():
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(
                [config.seed, epoch, int(sample_ids[i]) & 0xFFFFFFFFFFFF, _TAG_CROP])))
            boxes[i] = random_resized_crop_box(int(hw[i, 0]), int(hw[i, 1]), config.scale, config.ratio, rng)
    elif config.resize is ResizeMode.SHORTER:
        boxes[exists] = shorter_boxes(hw[exists], config.image_size)
    else:
        boxes[exists, 2:] = hw[exists]
    return boxes
