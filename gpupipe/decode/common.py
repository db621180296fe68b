"""What every decode backend shares: the pre-decode check, crop boxes, replacement
of bad images, and assembling the output batch.

Each backend only turns (encoded bytes, crop box, output size) into pixels;
everything that must be identical across backends lives here.
"""
from __future__ import annotations

import logging
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
from gpupipe.decode.crops import (  # noqa: F401  (re-exported: the backends and tests take them from here)
    crop_boxes,
    crop_boxes_from_sizes,
    crop_first,
    random_resized_crop_box,
    shorter_box,
    shorter_boxes,
    shorter_geometries,
    shorter_geometry,
    upright_size,
    upright_sizes,
)
from gpupipe.formats.headers import ProbedHeaders, upright_hw
from gpupipe.formats.imageheader import ImageHeader

__all__ = ["Checked", "StandIn", "prepare", "account", "assemble", "finish", "check_batch", "crop_boxes",
           "crop_boxes_from_sizes", "random_resized_crop_box", "shorter_geometry", "shorter_geometries", "shorter_box",
           "shorter_boxes", "crop_first", "replacements", "record_bad", "upright_size", "upright_sizes",
           "count_stretched", "count_stretched_sizes", "STRETCH_TOLERANCE"]

log = logging.getLogger(__name__)
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
        if self.reasons.count(None) == len(self.reasons):  # (in C: the usual batch has no bad image)
            return list(range(len(self.reasons)))
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
        if self.reasons.count(None) == len(self.reasons):
            return np.ones(len(self.reasons), dtype=bool)
        return np.fromiter((r is None for r in self.reasons), dtype=bool, count=len(self.reasons))


def check_batch(batch, max_pixels: int | None) -> Checked:
    """Magic bytes, header dimensions, ``max_pixels`` and completeness of every image: read
    from the columns the batch carries (probed where it was packed,
    :mod:`gpupipe.decode.columns`), else probed now."""
    headers = probed(batch, max_pixels)
    reasons: list[str | None] = [None] * len(headers)
    for i, reason in headers.reasons.items():
        reasons[i] = reason
    return Checked(headers.headers(), reasons, _not(batch.valid), headers)


def _not(valid: torch.Tensor) -> list[bool]:
    """The negation of a bool tensor, as a list (numpy on the CPU: torch's op costs ~10x more a call)."""
    return (~valid.numpy()).tolist() if valid.device.type == "cpu" else torch.logical_not(valid).tolist()


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
    if boxes is None:  # (the sample ids key random_resized_crop's boxes only)
        ids = batch.sample_ids.tolist() if config.resize is ResizeMode.RANDOM_CROP else ()
        boxes = crop_boxes_from_sizes(upright_hw, exists, ids, batch.epoch, config)
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
    if reasons.count(None) == len(reasons):
        return {}
    good = [i for i, r in enumerate(reasons) if r is None]
    out: dict[int, int | None] = {}
    for i, r in enumerate(reasons):
        if r is not None:
            out[i] = next((j for j in good if j > i), good[0] if good else None)
    return out


def decode_threads(config) -> int:
    """A decoder's threads: ``config.num_threads``, else the cores this process may use, up to 8."""
    return config.num_threads or max(1, min(8, len(os.sched_getaffinity(0))))


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
        copy = _copied(pixels)
        self.pixels, self.label, self.targets = copy, _copied(label), targets

    def take(self, shape, key: str) -> tuple[torch.Tensor, torch.Tensor]:
        if self.pixels is None or self.label is None or tuple(self.pixels.shape) != tuple(shape):
            raise DecodeError(f"no image of the batch holding {key!r} could be decoded, and no earlier image of "
                              "this size can stand in for them; check the data with `gpupipe validate`")
        return self.pixels, self.label


def _copied(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t``: numpy's on the CPU (no intra-op threads to wait for), else torch's."""
    return torch.from_numpy(t.numpy().copy()) if t.device.type == "cpu" else t.clone()


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
    labels, valid = _copied(batch.labels), _copied(batch.valid)
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
