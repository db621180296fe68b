"""Resize and the crops: boxes of the input mapped onto the output (one matrix per
sample, see :mod:`gpupipe.augment.warp`), with torchvision's arguments.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch

from . import resample
from .keys import draw
from .warp import (
    HW,
    RESIZE_INTERPOLATIONS,
    GeometricTransform,
    batch_ones,
    box_matrix,
    check_interpolation,
    check_range,
    int_between,
    real_to_int,
    setup_size,
)

__all__ = ["Resize", "CenterCrop", "RandomCrop", "RandomResizedCrop", "crop_padding"]

_PADDING_MODES = {"constant": "zeros", "edge": "border", "reflect": "reflection", "symmetric": None}


class Resize(GeometricTransform):
    """torchvision ``Resize(size, interpolation, max_size, antialias)``: an int (or a
    1-sequence) resizes the shorter side to ``size`` (longer side ``int(size * long /
    short)``, then capped at ``max_size``), ``None`` the longer side to ``max_size``, an
    (h, w) pair resizes to it. ``interpolation``: bilinear (default), nearest or bicubic;
    ``antialias`` (default True) low-pass filters a reduction, as torchvision's.

    Applied, it is torchvision's resize, one ``F.interpolate`` on the batch
    (:func:`gpupipe.augment.resample.resize`). In a ``Compose`` it joins its neighbours'
    warp only where a bilinear warp gives the same pixels within rounding: bilinear and
    enlarging (or ``antialias=False``); an antialiased reduction, bicubic with antialias
    (Pillow's a=-0.5 cubic) and nearest (``floor(i * in / out)``) run on their own."""

    samples_outside = False
    covers_frame = True
    warps_alone = False

    def __init__(self, size, interpolation="bilinear", max_size=None, antialias=True):
        super().__init__()
        self.interpolation = check_interpolation(interpolation, RESIZE_INTERPOLATIONS)
        if size is None:
            if max_size is None:
                raise ValueError("If size is None, then max_size must be set")
        elif isinstance(size, str) or not isinstance(size, (numbers.Real, Sequence)):
            raise TypeError(f"Size should be int or sequence. Got {type(size)}")
        elif isinstance(size, Sequence) and len(size) not in (1, 2):
            raise ValueError(f"size can be an integer, a sequence of one or two integers, or None, but got {size} instead.")
        self.size = (None if size is None else real_to_int(size) if isinstance(size, numbers.Real)
                     else tuple(int(s) for s in size))
        if self.size is not None and min((self.size,) if isinstance(self.size, int) else self.size) <= 0:
            raise ValueError(f"size should be positive (got {size})")
        if max_size is not None and isinstance(self.size, tuple) and len(self.size) == 2:
            raise ValueError("max_size should only be passed if size is None or specifies the length of the "
                             "smaller edge, i.e. size should be an int or a sequence of length 1")
        self.max_size = None if max_size is None else int(max_size)
        self.antialias = bool(antialias)  # torchvision: None means False for tensors

    def output_size(self, in_hw: HW) -> HW:
        """torchvision's ``_compute_resized_output_size``."""
        if isinstance(self.size, tuple) and len(self.size) == 2:
            return self.size
        h, w = in_hw
        short, long = min(h, w), max(h, w)
        if self.size is None:
            assert self.max_size is not None, "__init__ requires one of them"
            new_short, new_long = int(self.max_size * short / long), self.max_size
        else:
            requested = self.size if isinstance(self.size, int) else self.size[0]
            new_short, new_long = requested, int(requested * long / short)
            if self.max_size is not None:
                if self.max_size <= requested:
                    raise ValueError(f"max_size = {self.max_size} must be strictly greater than the requested "
                                     f"size for the smaller edge size = {self.size}")
                if new_long > self.max_size:
                    new_short, new_long = int(self.max_size * new_short / new_long), self.max_size
        return (new_short, new_long) if h <= w else (new_long, new_short)

    def make_params(self, images, key):
        return {"ones": batch_ones(key)}

    def matrix(self, params, in_hw):
        ones = params["ones"]
        return box_matrix(0 * ones, 0 * ones, in_hw[0] * ones, in_hw[1] * ones, self.output_size(in_hw))

    def fuses(self, in_hw: HW) -> bool:
        out_hw = self.output_size(in_hw)  # the same size: nothing to do, an identity matrix
        return out_hw == tuple(in_hw) or _warp_resizes(self.interpolation, self.antialias, in_hw, out_hw)

    def transform(self, images, params):
        in_hw = (int(images.shape[-2]), int(images.shape[-1]))
        return resample.resize(images, self.output_size(in_hw), self.interpolation or "bilinear", self.antialias)

    def transform_masks(self, masks, params, in_hw):
        """torchvision's ``resize_mask`` (0.28): ``F.interpolate`` nearest (nearest-exact if that
        is the images' mode; torchvision 0.27 and older: nearest always), whatever the images'
        interpolation."""
        return resample.resize(masks[:, None], self.output_size(in_hw), _mask_mode(self.interpolation), False)[:, 0]


def _mask_mode(interpolation: str | None) -> str:
    """The mode torchvision resizes a mask with: nearest, or nearest-exact where asked."""
    return "nearest-exact" if interpolation == "nearest-exact" else "nearest"


def _warp_resizes(interpolation: str | None, antialias: bool, box_hw: tuple[float, float], out_hw: HW) -> bool:
    """Whether a bilinear warp resizes a ``box_hw`` region to ``out_hw`` as torchvision's
    ``F.interpolate`` would: bilinear and no antialiased reduction (an antialiased bilinear
    enlargement is plain bilinear interpolation; bicubic's antialias filter is another cubic)."""
    if interpolation == "bilinear":
        return not (antialias and resample.reduces(box_hw, out_hw))
    return interpolation == "bicubic" and not antialias


class _Crop(GeometricTransform):
    """A crop to a fixed ``size`` (h, w): integer offsets, exact sampling."""

    interpolation = None

    def __init__(self, size):
        super().__init__()
        self.size = setup_size(size)

    def output_size(self, in_hw):
        return self.size


class CenterCrop(_Crop):
    """torchvision ``CenterCrop(size)``: top = round((H - h) / 2); a crop larger than
    the image pads with zeros, as torchvision does (``(h - H) // 2`` rows above)."""

    def make_params(self, images, key):
        return {"ones": batch_ones(key)}

    def reads_outside(self, in_hw: HW) -> bool:
        return self.size[0] > in_hw[0] or self.size[1] > in_hw[1]

    def matrix(self, params, in_hw):
        ones = params["ones"]
        top, left = (-((c - n) // 2) if c > n else round((n - c) / 2.0) for n, c in zip(in_hw, self.size))
        return box_matrix(top * ones, left * ones, self.size[0] * ones, self.size[1] * ones, self.size)


def crop_padding(padding) -> tuple[int, int, int, int]:
    """torchvision's ``padding``: an int (all sides), (left/right, top/bottom) or
    (left, top, right, bottom) → (left, top, right, bottom)."""
    if padding is None:
        return (0, 0, 0, 0)
    values = list(padding) if isinstance(padding, (tuple, list)) else [padding]
    if (isinstance(padding, bool) or not isinstance(padding, (numbers.Integral, tuple, list)) or len(values) not in (1, 2, 4)
            or not all(isinstance(v, numbers.Integral) for v in values)):  # floats too, as torchvision
        raise ValueError(f"Padding must be an int or a 1, 2, or 4 element of tuple or list, got {padding}.")
    values = [int(v) for v in values]
    if min(values) < 0:
        raise ValueError(f"padding should be non-negative, got {padding}")
    if len(values) == 1:
        values *= 4
    elif len(values) == 2:
        values = [values[0], values[1], values[0], values[1]]
    return values[0], values[1], values[2], values[3]


class RandomCrop(_Crop):
    """torchvision ``RandomCrop(size, padding, pad_if_needed, fill, padding_mode)``:
    the input is (virtually) padded by ``padding`` — (left, top, right, bottom), and
    by the shortfall on both sides of a too small dimension with ``pad_if_needed`` —
    then the top-left corner is uniform over the valid positions, per sample.

    Nothing is padded in memory: the crop box is placed in input coordinates (negative
    inside the padding) and the warp's padding mode supplies the border: "constant"
    is Kornia's "zeros" (``fill`` 0) or "fill", "edge" its "border", "reflect" its
    "reflection". "symmetric" (the edge pixel repeated) has no warp equivalent, so such
    a crop is not fused: it runs alone, gathering the mirrored pixels exactly.
    Params: ``top``, ``left`` (B,) float32, the box corner in input pixel coordinates.
    """

    def __init__(self, size, padding=None, pad_if_needed: bool = False, fill=0, padding_mode: str = "constant"):
        super().__init__(size)
        if padding_mode not in _PADDING_MODES:
            raise ValueError(f"Padding mode should be either constant, edge, reflect or symmetric, "
                             f"but got {padding_mode}")
        self.padding = crop_padding(padding)
        self.pad_if_needed, self.padding_mode = bool(pad_if_needed), padding_mode
        self.set_fill(fill)
        self.samples_outside = any(self.padding) or self.pad_if_needed
        if padding_mode != "constant":
            self.warp_padding = _PADDING_MODES[padding_mode] or "symmetric"
        self.fusable = padding_mode != "symmetric"

    def _padded(self, H: int, W: int) -> tuple[int, int, int, int]:
        left, top, right, bottom = self.padding
        h, w = self.size
        grow_h = max(0, h - (H + top + bottom)) if self.pad_if_needed else 0
        grow_w = max(0, w - (W + left + right)) if self.pad_if_needed else 0
        return left + grow_w, top + grow_h, right + grow_w, bottom + grow_h

    def output_size(self, in_hw):
        self._fits(*in_hw)
        return self.size

    def _fits(self, H: int, W: int) -> tuple[int, int, int, int]:
        """The padding (left, top, right, bottom); raises as torchvision does when the crop
        is larger than the padded input."""
        left, top, right, bottom = self._padded(H, W)
        PH, PW = H + top + bottom, W + left + right
        if PH < self.size[0] or PW < self.size[1]:
            raise ValueError(f"Required crop size {tuple(self.size)} is larger than input image size {(PH, PW)}"
                             + ("" if self.pad_if_needed else "; pad_if_needed=True pads it"))
        return left, top, right, bottom

    def make_params(self, images, key):
        H, W = int(images.shape[-2]), int(images.shape[-1])
        left, top, right, bottom = self._fits(H, W)
        PH, PW = H + top + bottom, W + left + right
        h, w = self.size
        u = draw(key, 0, 2)
        return {"top": int_between(u[:, 0], 0, PH - h + 1) - top, "left": int_between(u[:, 1], 0, PW - w + 1) - left}

    def matrix(self, params, in_hw):
        ones = torch.ones_like(params["top"])
        return box_matrix(params["top"], params["left"], self.size[0] * ones, self.size[1] * ones, self.size)

    def transform(self, images, params):
        if self.fusable:
            return super().transform(images, params)
        rows = _symmetric(params["top"], self.size[0], images.shape[-2], images.device)  # (B, h)
        cols = _symmetric(params["left"], self.size[1], images.shape[-1], images.device)  # (B, w)
        batch = torch.arange(images.shape[0], device=images.device).view(-1, 1, 1)
        return images[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)  # (B, h, w, C) → (B, C, h, w)

    def apply_targets(self, targets, params, in_hw):
        """Boxes and masks as the images; boxes refuse a padding that is not "constant", as
        torchvision's ``pad`` does (the mirrored content has no boxes)."""
        if targets.boxes is not None and self.samples_outside and self.padding_mode != "constant":
            raise ValueError(f"Padding mode '{self.padding_mode}' is not supported with bounding boxes")
        return super().apply_targets(targets, params, in_hw)

    def transform_masks(self, masks, params, in_hw):
        if self.fusable:
            return super().transform_masks(masks, params, in_hw)
        return self.transform(masks[:, None], params)[:, 0]  # "symmetric": the exact gather


def _symmetric(start: torch.Tensor, length: int, size: int, device) -> torch.Tensor:
    """(B, length) indices ``start + i`` mirrored into [0, size) with the edge pixel
    repeated (numpy's "symmetric": ... 1 0 | 0 1 ... size-1 | size-1 ...)."""
    i = start.to(device, torch.int64).view(-1, 1) + torch.arange(length, device=device).view(1, -1)
    i = torch.remainder(i, 2 * size)
    return torch.where(i >= size, 2 * size - 1 - i, i)


class RandomResizedCrop(GeometricTransform):
    """torchvision ``RandomResizedCrop(size, scale, ratio, interpolation, antialias)``: its
    10-attempt rule, vectorised: 10 candidate boxes per sample drawn at once, the first valid
    one kept, else the central fallback crop. Params: ``top``, ``left``, ``height``, ``width``
    (B,) float32, whole pixels.

    Applied, it is torchvision's ``resized_crop``: each box cut out and resized with
    ``antialias`` (default True), one ``F.interpolate`` a sample
    (:func:`gpupipe.augment.resample.resized_crop`). In a ``Compose`` it runs on its own
    (see :meth:`fuses`); the ops after it may share a warp."""

    samples_outside = False
    warps_alone = False

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0), interpolation="bilinear",
                 antialias=True):
        super().__init__()
        self.interpolation = check_interpolation(interpolation, RESIZE_INTERPOLATIONS)
        self.size = setup_size(size)
        self.scale = check_range(scale, "scale")
        self.ratio = check_range(ratio, "ratio")
        self.antialias = bool(antialias)

    def fuses(self, in_hw: HW) -> bool:
        """Never: torchvision resizes the box as an image of its own, so an enlarged box's edge
        pixels repeat the box's edge; a warp of the whole image reads past the box there (its
        neighbours' pixels: up to 148 levels on the outer ring, measured in a Compose with flip)."""
        return False

    def transform(self, images, params):
        return resample.resized_crop(images, params["top"], params["left"], params["height"], params["width"],
                                     self.size, self.interpolation or "bilinear", self.antialias)

    def transform_masks(self, masks, params, in_hw):
        return resample.resized_crop(masks[:, None], params["top"], params["left"], params["height"], params["width"],
                                     self.size, _mask_mode(self.interpolation), False)[:, 0]

    def output_size(self, in_hw):
        return self.size

    def make_params(self, images, key):
        H, W = int(images.shape[-2]), int(images.shape[-1])
        target_area = H * W * draw(key, 0, 10, *self.scale)
        aspect = torch.exp(draw(key, 1, 10, math.log(self.ratio[0]), math.log(self.ratio[1])))
        w = torch.round(torch.sqrt(target_area * aspect))
        h = torch.round(torch.sqrt(target_area / aspect))
        valid = (w > 0) & (w <= W) & (h > 0) & (h <= H)
        first = valid.to(torch.uint8).argmax(dim=1, keepdim=True)  # first True (0 if none)
        h, w = h.gather(1, first)[:, 0], w.gather(1, first)[:, 0]
        u = draw(key, 2, 2)
        top, left = int_between(u[:, 0], 0, H - h + 1), int_between(u[:, 1], 0, W - w + 1)
        fh, fw = self._fallback(H, W)
        ok = valid.any(dim=1)
        return {"top": torch.where(ok, top, float((H - fh) // 2)), "left": torch.where(ok, left, float((W - fw) // 2)),
                "height": torch.where(ok, h, float(fh)), "width": torch.where(ok, w, float(fw))}

    def _fallback(self, H: int, W: int) -> HW:
        in_ratio = W / H
        if in_ratio < min(self.ratio):
            return int(round(W / min(self.ratio))), W
        if in_ratio > max(self.ratio):
            return H, int(round(H * max(self.ratio)))
        return H, W

    def matrix(self, params, in_hw):
        return box_matrix(params["top"], params["left"], params["height"], params["width"], self.size)
