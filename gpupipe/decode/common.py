"""What every decode backend shares: the pre-decode check, crop boxes, replacement
of bad images, and assembling the output batch.

Each backend only turns (encoded bytes, crop box, output size) into pixels;
everything that must be identical across backends lives here.
"""
from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from gpupipe.core.errors import DecodeError
from gpupipe.core.types import ErrorPolicy
from gpupipe.decode.base import DecodedBatch, ResizeMode, RowTargets, TargetRows
from gpupipe.decode.columns import keyed_crops, probed
from gpupipe.formats.headers import ProbedHeaders, upright_hw
from gpupipe.formats.imageheader import ImageHeader

__all__ = ["Checked", "StandIn", "prepare", "account", "assemble", "finish", "check_batch", "crop_boxes",
           "crop_boxes_from_sizes", "random_resized_crop_box", "shorter_geometry", "shorter_geometries", "shorter_box",
           "shorter_boxes", "crop_first", "replacements", "record_bad", "upright_size", "upright_sizes",
           "count_stretched", "count_stretched_sizes", "STRETCH_TOLERANCE"]

log = logging.getLogger(__name__)
_TAG_CROP = 3
# resize "fixed" changes an image's aspect ratio by more than this (a factor of 1.05) before it is
# called a stretch: sizes a pixel or two off square (256x250: 2.4%) stay under it, every photo
# format is far over it (4:3 is 33%, 3:2 50%, 16:9 78% from square)
STRETCH_TOLERANCE = 0.05


@dataclass
class Checked:
    """The pre-decode verdict on a batch: headers of good images, reasons for bad ones.

    ``uncounted[i]`` marks samples that are not deliveries of their own: placeholders the
    stream already counted (no bytes) and end-of-epoch padding (a repeat of a sample
    delivered elsewhere). When bad, they are filled like bad images but neither counted
    nor raised again.
    """

    headers: list[ImageHeader | None]
    reasons: list[str | None]
    uncounted: list[bool]
    probed: ProbedHeaders | None = None  # the same headers as a table and an index
    _upright: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    def good(self) -> list[int]:
        return [i for i, r in enumerate(self.reasons) if r is None]

    def upright(self) -> tuple[np.ndarray, np.ndarray]:
        """(B, 2) int64 upright (height, width) of each image (0 where the probe refused it) and
        (B,) bool, whether it has a header (:func:`upright_sizes`); from the probed table when
        there is one: a lookup per distinct header, then numpy."""
        if self._upright is None:
            p = self.probed
            if p is None:
                self._upright = upright_sizes(self.headers)
            else:
                hw = p.per_header([upright_hw(h) for h in p.table], (0, 0)).astype(np.int64).reshape(-1, 2)
                self._upright = hw, p.index >= 0
        return self._upright

    def good_mask(self) -> np.ndarray:
        """(B,) bool: the images not found bad so far."""
        return np.fromiter((r is None for r in self.reasons), dtype=bool, count=len(self.reasons))


def check_batch(batch, max_pixels: int | None) -> Checked:
    """Magic bytes, header dimensions, ``max_pixels`` and completeness of every image: read
    from the columns the batch carries (probed where it was packed,
    :mod:`gpupipe.decode.columns`), else probed now."""
    headers = probed(batch, max_pixels)
    reasons: list[str | None] = [None] * len(headers)
    for i, reason in headers.reasons.items():
        reasons[i] = reason
    return Checked(headers.headers(), reasons, torch.logical_not(batch.valid).tolist(), headers)


def record_bad(checked: Checked, i: int, reason: str, policy: ErrorPolicy, stats, key: str) -> None:
    """Mark image ``i`` bad: raise under ``raise``, else count and log it."""
    checked.reasons[i] = reason
    if checked.uncounted[i]:
        return
    if policy is ErrorPolicy.RAISE:
        raise DecodeError(f"cannot decode sample {key!r}: {reason}")
    stats.skipped += 1
    if len(stats.skipped_keys) < 100:
        stats.skipped_keys.append(key)
    log.warning("skipping undecodable sample %s: %s", key, reason)


def enforce(checked: Checked, batch, policy: ErrorPolicy, stats) -> None:
    """Apply ``policy`` to every image the pre-decode check rejected."""
    bad = checked.probed.reasons.keys() if checked.probed is not None else range(len(checked.reasons))
    for i in sorted(bad):
        reason = checked.reasons[i]
        if reason is not None:
            record_bad(checked, i, reason, policy, stats, batch.keys[i])


def prepare(batch, config, stats) -> tuple[Checked, np.ndarray]:
    """The first steps every backend takes: check each image, apply ``on_error`` to the
    rejected ones, and place each crop box."""
    checked = check_batch(batch, config.max_pixels)
    enforce(checked, batch, config.on_error, stats)
    upright_hw, exists = checked.upright()
    count_stretched_sizes(upright_hw, exists, config, stats)
    boxes = keyed_crops(batch, config) if config.resize is ResizeMode.RANDOM_CROP else None
    if boxes is None:
        boxes = crop_boxes_from_sizes(upright_hw, exists, batch.sample_ids.tolist(), batch.epoch, config)
    return checked, boxes


def count_stretched(headers: Sequence[ImageHeader | None], config, stats) -> None:
    """:func:`count_stretched_sizes` of the images of ``headers`` (None: not an image)."""
    count_stretched_sizes(*upright_sizes(headers), config, stats)


def count_stretched_sizes(upright_hw: np.ndarray, exists: np.ndarray, config, stats) -> None:
    """Under resize ``fixed``, count in ``stats`` the images whose aspect ratio the resize changes
    by more than :data:`STRETCH_TOLERANCE` (``stats.stretched``, ``stats.worst_stretch``), and
    warn the first time some are (a decoder is one loader's: once per loader). Shape:
    ``upright_hw`` (B, 2) int64 upright (h, w), ``exists`` (B,) bool (False: not an image)."""
    if config.resize is not ResizeMode.FIXED or config.image_size is None:
        return
    out_h, out_w = config.image_size
    hw = np.asarray(upright_hw, np.int64).reshape(-1, 2)[np.asarray(exists, bool)]
    stretch = (hw[:, 1] * out_h) / (hw[:, 0] * out_w)
    stretch = np.maximum(stretch, 1 / stretch)
    found = int(np.count_nonzero(stretch > 1 + STRETCH_TOLERANCE))
    if not found:
        return
    at = int(np.argmax(stretch))  # the first of the largest: over the tolerance, since some are
    worst, (h, w) = float(stretch[at]), hw[at].tolist()
    first = stats.stretched == 0
    stats.stretched += found
    stats.worst_stretch = max(stats.worst_stretch, worst)
    if first and stats.warn_stretched:
        log.warning("decode: resize 'fixed' (the default) changes the aspect ratio of %d of %d images of this batch "
                    "by more than %d%% (the most: width x height %dx%d to %dx%d, %.2fx); torchvision's "
                    "Resize(size) with one number keeps it. To keep it: resize='shorter' (Resize + CenterCrop) or, "
                    "for training, resize='random_resized_crop'. Said once per loader; decoder.stats.stretched "
                    "counts them all", found, len(hw), round(STRETCH_TOLERANCE * 100), w, h, out_w, out_h, worst)


def account(stats, batch, started: float) -> None:
    """Count one decoded batch that began at ``started`` (``time.perf_counter``)."""
    stats.batches += 1
    stats.images += len(batch)
    stats.seconds += time.perf_counter() - started


def replacements(reasons: Sequence[str | None]) -> dict[int, int | None]:
    """For each bad index, the next good index in the batch (cyclically), or None if
    none is good: deterministic, and the batch keeps its shape."""
    good = [i for i, r in enumerate(reasons) if r is None]
    out: dict[int, int | None] = {}
    for i, r in enumerate(reasons):
        if r is not None:
            out[i] = next((j for j in good if j > i), good[0] if good else None)
    return out


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


def decode_threads(config) -> int:
    """A decoder's threads: ``config.num_threads``, else the cores this process may use, up to 8."""
    return config.num_threads or max(1, min(8, len(os.sched_getaffinity(0))))


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


class StandIn:
    """The last good image a decoder delivered, with its label (and its targets, moved, when
    the batch had them): what fills a batch in which no image at all could be decoded (a batch
    keeps its shape, and every slot a genuine (pixels, label) pair)."""

    def __init__(self) -> None:
        self.pixels: torch.Tensor | None = None
        self.label: torch.Tensor | None = None
        self.targets: RowTargets | None = None

    def keep(self, pixels: torch.Tensor, label: torch.Tensor, targets: RowTargets | None = None) -> None:
        """Keep a copy (the batch goes on to be augmented, perhaps in place). On the CPU numpy
        copies it: torch's ``clone`` of one 250x250 image spread over intra-op threads that wait
        for cores the decoder's threads hold, 19 ms of the decode thread a batch on 2 cores."""
        copy = torch.from_numpy(pixels.numpy().copy()) if pixels.device.type == "cpu" else pixels.clone()
        self.pixels, self.label, self.targets = copy, label.clone(), targets

    def take(self, shape, key: str) -> tuple[torch.Tensor, torch.Tensor]:
        if self.pixels is None or self.label is None or tuple(self.pixels.shape) != tuple(shape):
            raise DecodeError(f"no image of the batch holding {key!r} could be decoded, and no earlier image of "
                              "this size can stand in for them; check the data with `gpupipe validate`")
        return self.pixels, self.label


def assemble(pixels: Mapping[int, np.ndarray | torch.Tensor], checked: Checked, batch, device: torch.device,
             image_size: tuple[int, int] | None, stand_in: StandIn, targets: TargetRows | None = None):
    """Stack per-image HWC uint8 arrays into a (B, 3, H, W) channels_last batch and
    :func:`finish` it (with ``targets``, when the batch carries them)."""
    shapes = {tuple(p.shape) for p in pixels.values()}
    if len(shapes) > 1:
        raise DecodeError(f"decoded images have different sizes {sorted(shapes)[:3]}; set decode image_size")
    h, w, _ = shapes.pop() if shapes else (*(image_size or (1, 1)), 3)  # nothing decoded: keep the shape
    out = torch.zeros((len(batch), h, w, 3), dtype=torch.uint8, device=device)
    for i, p in pixels.items():
        out[i] = p if isinstance(p, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(p))
    return finish(out, checked, batch, stand_in, targets)


def finish(out: torch.Tensor, checked: Checked, batch, stand_in: StandIn, targets: TargetRows | None = None):
    """The decoded batch from (B, H, W, 3) uint8 rows in which the good images are set.

    Every bad row takes the pixels *and the label* of its replacement (the next good
    image of the batch, cyclically; the stand-in when none is good), so each slot is a
    genuine pair; ``valid`` is False there, and ``sample_ids``/``keys`` still name the
    sample that was lost. With ``targets`` (:mod:`gpupipe.decode.targets`), the masks are
    collected first (a bad one makes its sample bad, so it is replaced too) and every row
    gets the boxes and mask of the image it ends up holding.
    """
    if targets is not None:
        targets.settle(checked)
    labels, valid = batch.labels.clone(), batch.valid.clone()
    good = checked.good()
    if good:
        stand_in.keep(out[good[-1]], labels[good[-1]], None if targets is None else targets.row(good[-1]))
    rows: list[int | None] = list(range(len(batch)))
    for i, src in replacements(checked.reasons).items():
        pixels, label = (out[src], labels[src]) if src is not None else stand_in.take(out.shape[1:], batch.keys[i])
        out[i], labels[i], valid[i], rows[i] = pixels, label, False, src
    moved = None if targets is None else targets.gather(rows, stand_in.targets, out.device)
    return DecodedBatch(images=out.permute(0, 3, 1, 2), labels=labels, valid=valid,
                        sample_ids=batch.sample_ids, keys=batch.keys, epoch=batch.epoch, targets=moved)
