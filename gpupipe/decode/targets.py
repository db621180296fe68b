"""Boxes and masks through the decode: each sample's targets moved exactly as the decode moved
its image, as torchvision v2 moves ``tv_tensors.BoundingBoxes`` and ``tv_tensors.Mask``.

The encoded batch carries them in the upright image's frame (``batch.targets``, duck-typed:
``box_counts``/``boxes``/``box_labels``, ``mask(i)``); the decode's crop box (top, left,
height, width) of :func:`gpupipe.decode.common.crop_boxes` and the output size place them:

* **boxes** (absolute ``xyxy``, pixel edges): ``x' = clip(x - left, 0, width) * out_w / width``,
  ``y`` likewise — torchvision's crop (shift, clamp to the crop's canvas) then resize (scale).
  ``random_resized_crop`` is ``resized_crop`` of the integer box; ``shorter`` is ``Resize(s)``
  + ``CenterCrop`` (the fractional box of :func:`~gpupipe.decode.common.shorter_box`: the same
  line, in one step); ``fixed`` is ``Resize((h, w))`` (the box is the image); ``none`` leaves
  boxes where they are (clamped to the image).
* **masks** (an 8-bit ``L`` or ``P`` PNG of class indices, the upright image's size): decoded
  with Pillow on the decoder's thread pool, then nearest-neighbour by torch's rule (numpy indices
  computed as its kernel does: :func:`nearest_index`), the one
  torchvision's ``resize_mask`` runs: ``random_resized_crop`` crops the integer box then
  resizes; ``shorter`` resizes to ``Resize(s)``'s size then cuts the centre
  (:func:`~gpupipe.decode.common.shorter_geometry`); ``fixed`` resizes; ``none`` keeps it.

A sample is bad (:func:`~gpupipe.decode.common.record_bad`: ``raise`` names it, ``skip``
counts it and its row takes another sample's image *and targets*) when a box is not finite,
has a negative width or height, or lies outside its upright image by more than
:data:`BOX_TOLERANCE` pixels (within it, the box is clamped to the image: annotation tools
round); when its mask is missing, not a PNG, not 8-bit ``L``/``P``, of another size than its
image, or does not decode. Box checks run before the images are decoded (a bad sample's image
is not decoded at all); mask checks when the masks are collected, before
:func:`~gpupipe.decode.common.finish` picks replacements.
"""
from __future__ import annotations

import io
from collections.abc import Sequence
from concurrent.futures import Executor, Future

import numpy as np
import torch

from gpupipe.core.errors import DecodeError
from gpupipe.core.targets import Boxes, Targets, ragged_rows
from gpupipe.decode.base import ResizeMode, RowTargets
from gpupipe.decode.common import Checked, record_bad, shorter_geometry, upright_size

__all__ = ["BOX_TOLERANCE", "RowTargets", "TargetJob", "start_targets", "check_boxes", "move_boxes", "read_mask",
           "move_mask"]

# how far (pixels) a box may reach past its image before the sample is bad; within it, clamped
BOX_TOLERANCE = 0.5
_PNG = b"\x89PNG\r\n\x1a\n"


class BadMask(ValueError):
    """A mask that breaks the layout (:mod:`gpupipe.formats.annotations`); the message says how."""


def check_boxes(boxes: np.ndarray, counts: np.ndarray, sizes: np.ndarray) -> dict[int, str]:
    """{image: why its boxes are bad} for (N, 4) ``xyxy`` ``boxes`` owned by images as
    ``counts`` (B,) says, against ``sizes`` (B, 2) upright (height, width) — NaN for an image
    not checked (no header). The first bad box of each image is named."""
    image = np.repeat(np.arange(len(counts)), counts)
    h, w = sizes[image, 0], sizes[image, 1]
    x1, y1, x2, y2 = boxes.astype(np.float64).T
    t = BOX_TOLERANCE
    finite = np.isfinite(boxes).all(axis=1)
    ordered = (x2 >= x1) & (y2 >= y1)
    inside = (x1 >= -t) & (y1 >= -t) & (x2 <= w + t) & (y2 <= h + t)
    bad = ~(finite & ordered & inside) & ~np.isnan(h)
    out: dict[int, str] = {}
    firsts = np.flatnonzero(bad)
    for i, first in zip(*np.unique(image[firsts], return_index=True)):
        k = int(firsts[first])
        nth = k - int(counts[:i].sum())
        box = [round(float(v), 3) for v in boxes[k]]
        if not finite[k]:
            why = "is not finite"
        elif not ordered[k]:
            why = "has a negative width or height"
        else:
            why = (f"lies outside the {int(w[k])}x{int(h[k])} image (upright width x height) by more than "
                   f"{BOX_TOLERANCE} px; boxes are absolute xyxy pixels of the image as displayed (EXIF applied)")
        out[int(i)] = f"box {nth} {box} {why}"
    return out


def move_boxes(boxes: np.ndarray, counts: np.ndarray, crop: np.ndarray, out_hw: np.ndarray) -> np.ndarray:
    """(N, 4) ``xyxy`` boxes through each image's crop box ``crop`` (B, 4) (top, left, height,
    width) and resize to ``out_hw`` (B, 2): shifted, clamped to the crop, scaled — torchvision's
    ``resized_crop`` / ``resize`` + ``center_crop`` on ``BoundingBoxes``. float64 in, float32 out.
    Rows of ``crop`` with no area must own no boxes that matter (they are left at 0)."""
    image = np.repeat(np.arange(len(counts)), counts)
    top, left, ch, cw = (crop[image, k] for k in range(4))
    live = (ch > 0) & (cw > 0)
    ch, cw = np.where(live, ch, 1.0), np.where(live, cw, 1.0)
    xs = np.clip(boxes[:, 0::2] - left[:, None], 0, cw[:, None]) * (out_hw[image, 1] / cw)[:, None]
    ys = np.clip(boxes[:, 1::2] - top[:, None], 0, ch[:, None]) * (out_hw[image, 0] / ch)[:, None]
    out = np.stack([xs[:, 0], ys[:, 0], xs[:, 1], ys[:, 1]], axis=1)
    out[~live] = 0
    return out.astype(np.float32)


def read_mask(data, image_hw: tuple[int, int]) -> np.ndarray:
    """The (H, W) uint8 class indices of an encoded mask (an 8-bit grayscale or palette PNG of
    the upright image's size ``image_hw``). Raises :class:`BadMask` saying what is wrong."""
    from PIL import Image

    data = bytes(data)
    if not data:
        raise BadMask("has no mask (the source names masks; every sample needs a .mask.png)")
    if not data.startswith(_PNG) or len(data) < 26:
        raise BadMask(f"mask is not a PNG (starts {data[:8]!r}); masks are 8-bit grayscale or palette PNGs")
    depth = data[24]  # IHDR: width, height, then the bit depth
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.mode not in ("L", "P") or (img.mode == "L" and depth != 8):
                kind = f"{depth}-bit {img.mode}"
                raise BadMask(f"mask is a {kind} PNG; masks are 8-bit grayscale (L) or palette (P) PNGs whose "
                              "values are class indices (Pillow scales 1/2/4-bit grayscale, and colour is no index)")
            if img.size != (image_hw[1], image_hw[0]):
                raise BadMask(f"mask is {img.size[0]}x{img.size[1]}, its image {image_hw[1]}x{image_hw[0]} "
                              "(upright width x height); a mask has its image's size")
            img.load()
            return np.array(img, dtype=np.uint8)  # writable: torch takes it as is
    except BadMask:
        raise
    except Exception as exc:  # noqa: BLE001 — untrusted bytes: Pillow raises many kinds
        raise BadMask(f"mask does not decode: {type(exc).__name__}: {exc}") from None


def move_mask(mask: np.ndarray, crop, mode: ResizeMode, size: tuple[int, int] | None) -> np.ndarray:
    """An (H, W) uint8 mask moved as the decode moved its image (``crop``: (top, left, height,
    width)), with torch's nearest rule, torchvision's for ``Mask`` (:func:`nearest_index`).
    Shape: → ``size``."""
    if size is None or mode is ResizeMode.NONE:
        return mask
    if mode is ResizeMode.RANDOM_CROP:
        top, left, h, w = (int(v) for v in crop)
        return _nearest(mask[top:top + h, left:left + w], size)
    if mode is ResizeMode.SHORTER:
        rh, rw, top, left = shorter_geometry(mask.shape[0], mask.shape[1], size)
        rows, cols = nearest_index(mask.shape[0], rh), nearest_index(mask.shape[1], rw)
        return mask[rows[top:top + size[0]]][:, cols[left:left + size[1]]]
    return _nearest(mask, size)


def nearest_index(n_in: int, n_out: int) -> np.ndarray:
    """The source row (or column) of each of ``n_out`` outputs under torch's ``nearest``
    (``F.interpolate(mode="nearest")``, which torchvision's ``resize_mask`` calls): ``floor(i *
    scale)`` in float32 with ``scale = float32(n_in) / n_out``, at most ``n_in - 1`` — exactly its
    CPU and CUDA kernels' arithmetic (tests/decode compares the two on random sizes). As numpy
    indices, a 250x200 → 224² mask takes ~50 µs against ~200 µs through ``F.interpolate``."""
    if n_in == n_out:
        return np.arange(n_out)
    scale = np.float32(n_in) / np.float32(n_out)
    return np.minimum(np.floor(np.arange(n_out, dtype=np.float32) * scale).astype(np.int64), n_in - 1)


def _nearest(mask: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    if tuple(mask.shape) == tuple(size):
        return mask
    return mask[nearest_index(mask.shape[0], size[0])][:, nearest_index(mask.shape[1], size[1])]


def _one_mask(data, image_hw: tuple[int, int], crop, mode: ResizeMode, size) -> np.ndarray:
    return np.ascontiguousarray(move_mask(read_mask(data, image_hw), crop, mode, size))


class TargetJob:
    """The targets of one batch on their way through the decode: boxes checked and moved when
    it starts (:func:`start_targets`), masks decoding on the pool; :meth:`settle` collects the
    masks (bad ones go to ``on_error``), :meth:`gather` builds each row's targets."""

    def __init__(self, boxes: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
                 masks: dict[int, Future] | None, keys: Sequence[str], config, stats) -> None:
        self.boxes = boxes  # (moved (N, 4) float32, labels (N,), counts (B,)), or None
        self.offsets = None if boxes is None else np.cumsum(boxes[2]) - boxes[2]
        self._futures = masks
        self.masks: dict[int, np.ndarray] = {}
        self._keys, self._config, self._stats = keys, config, stats

    def settle(self, checked: Checked) -> None:
        """Wait for the masks; a mask that breaks the layout makes its sample bad (raised
        under ``raise``, counted under ``skip``). Samples already bad are not counted again."""
        if self._futures is None:
            return
        futures, self._futures = self._futures, {}
        for i, fut in futures.items():
            try:
                mask = fut.result()
            except BadMask as exc:
                if checked.reasons[i] is None:
                    record_bad(checked, i, str(exc), self._config.on_error, self._stats, self._keys[i])
                continue
            self.masks[i] = mask

    def row(self, i: int) -> RowTargets:
        boxes = labels = None
        if self.boxes is not None and self.offsets is not None:
            a, n = int(self.offsets[i]), int(self.boxes[2][i])
            boxes, labels = self.boxes[0][a:a + n].copy(), self.boxes[1][a:a + n].copy()
        return RowTargets(boxes, labels, None if self._futures is None else self.masks[i])

    def gather(self, rows: Sequence[int | None], stand_in: RowTargets | None, device: torch.device) -> Targets:
        """Row i's targets are those of image ``rows[i]`` (itself, or its replacement), or of
        ``stand_in`` where ``rows[i]`` is None. Shape: boxes (N', 4), masks (B, H, W) uint8."""
        if any(r is None for r in rows) and stand_in is None:
            raise DecodeError("no targets to stand in for a batch in which nothing could be decoded")
        boxes = masks = None
        if self.boxes is not None:
            boxes = self._gather_boxes(rows, stand_in, device)
        if self._futures is not None:
            masks = self._gather_masks(rows, stand_in, device)
        return Targets(boxes, masks)

    def _gather_masks(self, rows: Sequence[int | None], stand_in: RowTargets | None,
                      device: torch.device) -> torch.Tensor:
        maps = []
        for r in rows:
            mask = self.masks[r] if r is not None else None if stand_in is None else stand_in.mask
            if mask is None:
                raise DecodeError("the image standing in for this batch has no mask to stand in with")
            maps.append(mask)
        shapes = sorted({m.shape for m in maps})
        if len(shapes) > 1:
            raise DecodeError(f"masks of different sizes {shapes[:3]}; set decode image_size")
        return torch.from_numpy(np.stack(maps)).to(device)

    def _gather_boxes(self, rows: Sequence[int | None], stand_in: RowTargets | None, device: torch.device) -> Boxes:
        assert self.boxes is not None and self.offsets is not None
        moved, labels, counts = self.boxes
        if any(r is None for r in rows):  # nothing decoded (replacements() gives None to all or none)
            assert stand_in is not None
            if stand_in.boxes is None or stand_in.labels is None:
                raise DecodeError("the image standing in for this batch has no boxes to stand in with")
            k = len(rows)
            return Boxes(torch.from_numpy(np.tile(stand_in.boxes, (k, 1))).to(device),
                         torch.from_numpy(np.tile(stand_in.labels, k)).to(device),
                         torch.full((k,), len(stand_in.boxes), dtype=torch.int64, device=device))
        take, index = ragged_rows(counts, np.asarray(rows, np.int64))
        return Boxes(torch.from_numpy(moved[index]).to(device), torch.from_numpy(labels[index]).to(device),
                     torch.from_numpy(take).to(device))


def start_targets(executor: Executor, batch, checked: Checked, crop: np.ndarray, config, stats) -> TargetJob | None:
    """Begin the targets of ``batch`` (None when it carries none: nothing to do): check and
    move its boxes — a sample with a bad box goes to ``on_error`` here, before any image is
    decoded — and submit its good samples' masks to ``executor``."""
    enc = getattr(batch, "targets", None)
    if enc is None:
        return None
    n = len(batch)
    sizes = np.full((n, 2), np.nan)
    for i, header in enumerate(checked.headers):
        if header is not None:
            sizes[i] = upright_size(header)
    size = config.resize_to
    # crop_boxes gives (0, 0, h, w) under none and fixed: the output frame is the crop's under none
    out_hw = np.tile(np.asarray(size, np.float64), (n, 1)) if size is not None else np.nan_to_num(sizes)
    boxes = None
    if enc.boxes is not None:
        boxes = _boxes(enc, n, checked, sizes, crop, out_hw, config, stats, batch.keys)
    masks = None
    if enc.mask_data is not None:
        if enc.mask_offsets is None or len(enc.mask_offsets) != n + 1:
            raise DecodeError(f"the batch's mask offsets should be ({n + 1},), one more than its {n} images")
        masks = {i: executor.submit(_one_mask, enc.mask(i), (int(sizes[i, 0]), int(sizes[i, 1])), crop[i],
                                    config.resize, size) for i in checked.good()}
    return TargetJob(boxes, masks, batch.keys, config, stats)


def _boxes(enc, n: int, checked: Checked, sizes, crop, out_hw, config, stats, keys):
    counts = enc.box_counts.numpy().astype(np.int64, copy=False)
    raw = enc.boxes.numpy()
    labels = enc.box_labels.numpy().astype(np.int64, copy=False)
    if counts.shape != (n,) or int(counts.sum()) != len(raw) or len(labels) != len(raw) or (counts < 0).any():
        raise DecodeError(f"the batch's boxes do not add up: {len(raw)} boxes, {len(labels)} labels and counts "
                          f"{counts.tolist()[:8]} for {n} images")
    for i, reason in check_boxes(raw, counts, sizes).items():
        if checked.reasons[i] is None:
            record_bad(checked, i, reason, config.on_error, stats, keys[i])
    return move_boxes(raw.astype(np.float64), counts, crop, out_hw), labels, counts
