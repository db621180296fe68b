"""Decode only what is used: the part of each image a backend decodes for its crop box.

Crop boxes (:func:`gpupipe.decode.common.crop_boxes`) are (top, left, height, width) in
upright image coordinates, the image as a viewer shows it after its EXIF orientation.

* **DALI** decodes a *window* with ``decoders.image_slice``. For ``shorter`` (torchvision's
  resize of the whole image, then a centre crop: the filter reads past the box) it is the box
  grown on every side by the reach of the resize filter (so the pixels at the box's edges are
  interpolated from the same neighbours as in a whole-image decode), clipped to the image;
  where torch resizes on the CPU, it starts at the image's top-left corner too (torch's resize
  of a fractional box needs the image's pixel grid: :mod:`gpupipe.decode.resize`). For
  ``random_resized_crop`` (torchvision's ``resized_crop``: the box cut out, then resized) the
  window is the box itself, so even DALI's resize, which reads past its ROI, cannot. DALI's slice, with
  ``adjust_orientation``, is taken in the upright frame too (tested for orientations 1..8).
  The window goes in *relative* coordinates: a window DALI reads in another frame (an image
  whose orientation DALI reads differently from the header check) stays inside the image,
  where an absolute one out of bounds makes DALI raise and, at times, crash the process.
* **Pillow** lets libjpeg scale down in the DCT domain (``Image.draft``: 1/2, 1/4, 1/8) when
  the box is large against the output (:func:`draft_scale`), then resizes the scaled box. The scale applies
  to the stored image, before the EXIF transpose, so the box is carried to the stored frame,
  scaled there, and carried back (:func:`drafted_box`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["filter_reach", "decode_window", "decode_windows", "any_partial", "dali_slices", "draft_scale", "drafted_box",
           "transpose_box"]

# A quarter pixel into each integer edge: DALI turns relative slice coordinates into pixels by
# rounding; the quarter keeps float error from moving an edge by one pixel either way.
_EDGE = 0.25


def filter_reach(box: Sequence[float], size: tuple[int, int]) -> int:
    """How many source pixels beyond ``box`` an antialiased bilinear resize of it to ``size``
    (h, w) reads: the filter's radius (the scale factor when reducing, 1 when enlarging), plus one."""
    return math.ceil(max(box[2] / size[0], box[3] / size[1], 1.0)) + 1


def decode_window(box: Sequence[float], image: tuple[int, int], size: tuple[int, int], *, past_box: bool = True,
                  from_origin: bool = False) -> tuple[int, int, int, int]:
    """(top, left, height, width) to decode for ``box`` in an ``image`` of (h, w). ``past_box``
    (a resize that reads past the box): the box, rounded out to whole pixels, grown by
    :func:`filter_reach`, clipped to the image; else the box (whole pixels) itself.
    ``from_origin``: the window starts at (0, 0)."""
    reach = filter_reach(box, size) if past_box else 0
    top, left = max(0, math.floor(box[0]) - reach), max(0, math.floor(box[1]) - reach)
    bottom = min(image[0], math.ceil(box[0] + box[2]) + reach)
    right = min(image[1], math.ceil(box[1] + box[3]) + reach)
    if from_origin:
        top = left = 0
    return top, left, bottom - top, right - left


def decode_windows(boxes: np.ndarray, upright_hw: np.ndarray, size: tuple[int, int], *, past_box: bool = True,
                   from_origin: bool = False) -> np.ndarray:
    """:func:`decode_window` of every row at once. Shape: boxes (B, 4) float64 (top, left,
    height, width), ``upright_hw`` (B, 2) int64 → (B, 4) int64 (top, left, height, width); the
    same integers as :func:`decode_window` row by row (float64 floor/ceil, then integers)."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    hw = np.asarray(upright_hw, np.int64).reshape(-1, 2)
    reach = np.zeros(len(boxes), np.int64)
    if past_box:
        scale = np.maximum(np.maximum(boxes[:, 2] / size[0], boxes[:, 3] / size[1]), 1.0)
        reach = np.ceil(scale).astype(np.int64) + 1
    reach = reach[:, None]
    start = np.maximum(0, np.floor(boxes[:, :2]).astype(np.int64) - reach)
    end = np.minimum(hw, np.ceil(boxes[:, :2] + boxes[:, 2:]).astype(np.int64) + reach)
    if from_origin:
        start[:] = 0
    return np.concatenate([start, end - start], axis=1)


def any_partial(boxes: np.ndarray, upright_hw: np.ndarray, exists: np.ndarray, size: tuple[int, int],
                **window) -> bool:
    """Whether the window of any row that ``exists`` is smaller than its image. Shape: boxes
    (B, 4) float64, ``upright_hw`` (B, 2) int64 upright (h, w), ``exists`` (B,) bool (False:
    a row not decoded as itself); ``window``: :func:`decode_window`'s options."""
    exists = np.asarray(exists, bool)
    hw = np.asarray(upright_hw, np.int64).reshape(-1, 2)[exists]
    win = decode_windows(np.asarray(boxes).reshape(-1, 4)[exists], hw, size, **window)
    return bool((win[:, :2] != 0).any() or (win[:, 2:] != hw).any())


def dali_slices(boxes: np.ndarray, upright_hw: np.ndarray, exists: np.ndarray, size: tuple[int, int],
                **window) -> dict[str, np.ndarray]:
    """Per-row inputs of the ROI pipeline, each (B, 2) float32 in (y, x) order:
    ``win_start``/``win_end``, the window relative to the upright image (for ``image_slice``);
    ``roi_start``/``roi_end``, the box relative to the window (for ``fn.resize``).
    Shape: boxes (B, 4) float64, ``upright_hw`` (B, 2) int64 upright (h, w), ``exists`` (B,)
    bool; a row that does not exist (never decoded as itself) gets the whole image, (0, 0) to
    (1, 1). ``window``: :func:`decode_window`'s options. Computed in float64, then cast."""
    exists = np.asarray(exists, bool)
    out = {k: np.zeros((len(exists), 2), np.float32) for k in ("win_start", "win_end", "roi_start", "roi_end")}
    out["win_end"][:] = out["roi_end"][:] = 1.0
    box = np.asarray(boxes, np.float64).reshape(-1, 4)[exists]
    hw = np.asarray(upright_hw, np.int64).reshape(-1, 2)[exists]
    win = decode_windows(box, hw, size, **window)
    extent, corner, extent_win = hw.astype(np.float64), win[:, :2], win[:, 2:]
    start = box[:, :2] - corner
    out["win_start"][exists] = (corner + _EDGE) / extent
    out["win_end"][exists] = np.minimum(1.0, (corner + extent_win + _EDGE) / extent)
    out["roi_start"][exists] = start / extent_win
    out["roi_end"][exists] = (start + box[:, 2:]) / extent_win
    return out


def draft_scale(box: Sequence[float], size: tuple[int, int]) -> int:
    """The DCT scale denominator (1, 2, 4 or 8) for resizing ``box`` to ``size`` (h, w): the
    largest that leaves at least a 2x reduction to the antialiased resize.

    Why not the largest that keeps the box at least ``size``: libjpeg's scaled IDCT is a cruder
    low-pass than Pillow's triangle filter, and where it does most of the reduction the pixels
    drift from a full decode's. Measured on q90 photo-like and dead-leaves JPEGs against the
    full decode + resize: DCT scale s with 2s or more left to the resize, mean |diff| 0.3-0.9,
    p99 1-4; with less than 2x left (s=2 at 2.0-2.5x, s=4 at 4.1x, s=8 at 8.4x), mean 1.2-2.9,
    p99 6-12, past the decode contract's tolerance (tests/decode/test_decode_contract.py, TOL)."""
    ratio = min(box[2] / size[0], box[3] / size[1])
    return next(s for s in (8, 4, 2, 1) if ratio >= 2 * s or s == 1)


# Pillow's transpose for each EXIF orientation (what ImageOps.exif_transpose applies), as a map of
# a point (x, y) of a w x h frame; the inverse of orientation o's transpose is orientation
# _INVERSE[o]'s, applied to the transposed frame.
_POINT = {
    1: lambda x, y, w, h: (x, y),
    2: lambda x, y, w, h: (w - x, y),
    3: lambda x, y, w, h: (w - x, h - y),
    4: lambda x, y, w, h: (x, h - y),
    5: lambda x, y, w, h: (y, x),
    6: lambda x, y, w, h: (h - y, x),
    7: lambda x, y, w, h: (h - y, w - x),
    8: lambda x, y, w, h: (y, w - x),
}
_INVERSE = {1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 8, 7: 7, 8: 6}


def transpose_box(ltrb: Sequence[float], orientation: int, frame: tuple[int, int]) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) of a ``frame`` (w, h) after orientation ``orientation``'s
    transpose (the identity for values outside 2..8, as in Pillow)."""
    point = _POINT.get(orientation, _POINT[1])
    (x0, y0), (x1, y1) = point(ltrb[0], ltrb[1], *frame), point(ltrb[2], ltrb[3], *frame)
    return min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)


def drafted_box(box: Sequence[int], orientation: int, stored: tuple[int, int], drafted: tuple[int, int],
                scale: float) -> tuple[float, float, float, float]:
    """The upright ``box`` (top, left, h, w) as (left, top, right, bottom) of the upright
    drafted image: carried to the stored frame of ``stored`` (w, h), divided by ``scale``,
    carried back upright in the drafted stored frame ``drafted`` (w, h). Exact where the
    scaled size was rounded up, which moves a flipped axis' origin."""
    upright = stored[::-1] if orientation in (5, 6, 7, 8) else stored
    top, left, h, w = (float(v) for v in box)
    inverse = _INVERSE.get(orientation, 1)
    in_stored = transpose_box((left, top, left + w, top + h), inverse, upright)
    return transpose_box(tuple(v / scale for v in in_stored), orientation, drafted)
