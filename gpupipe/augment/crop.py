"""Resize and the crops: boxes of the input mapped onto the output (one matrix per
sample, see :mod:`gpupipe.augment.warp`), with torchvision's arguments.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch

from .keys import draw
from .warp import (
    HW,
    GeometricTransform,
    _check_range,
    _int,
    _int_between,
    _ones,
    _setup_size,
    box_matrix,
    check_interpolation,
)

__all__ = ["Resize", "CenterCrop", "RandomCrop", "RandomResizedCrop", "crop_padding"]

_PADDING_MODES = {"constant": "zeros", "edge": "border", "reflect": "reflection", "symmetric": None}


class Resize(GeometricTransform):
    """torchvision ``Resize(size)``: an int resizes the shorter side to ``size``
    (longer side ``int(size * long / short)``), an (h, w) pair resizes to it.
    ``interpolation``: bilinear (default), nearest or bicubic; no antialias (see
    :mod:`gpupipe.augment.geometry`)."""

    samples_outside = False

    def __init__(self, size, interpolation="bilinear"):
        super().__init__()
        self.interpolation = check_interpolation(interpolation)
        if isinstance(size, str) or not isinstance(size, (numbers.Real, Sequence)):
            raise TypeError(f"Size should be int or sequence. Got {type(size)}")
        if isinstance(size, Sequence) and len(size) not in (1, 2):
            raise ValueError(f"size can be an integer or a sequence of one or two integers, but got {size} instead.")
        self.size = _int(size) if isinstance(size, numbers.Real) else tuple(int(s) for s in size)
        if min((self.size,) if isinstance(self.size, int) else self.size) <= 0:
            raise ValueError(f"size should be positive (got {size})")

    def output_size(self, in_hw: HW) -> HW:
        if isinstance(self.size, tuple) and len(self.size) == 2:
            return self.size
        requested = self.size if isinstance(self.size, int) else self.size[0]
        h, w = in_hw
        short, long = min(h, w), max(h, w)
        new_short, new_long = requested, int(requested * long / short)
        return (new_short, new_long) if h <= w else (new_long, new_short)

    def make_params(self, images, key):
        return {"ones": _ones(key)}

    def matrix(self, params, in_hw):
        ones = params["ones"]
        return box_matrix(0 * ones, 0 * ones, in_hw[0] * ones, in_hw[1] * ones, self.output_size(in_hw))


class _Crop(GeometricTransform):
    """A crop to a fixed ``size`` (h, w): integer offsets, exact sampling."""

    interpolation = None

    def __init__(self, size):
        super().__init__()
        self.size = _setup_size(size)

    def output_size(self, in_hw):
        return self.size


class CenterCrop(_Crop):
    """torchvision ``CenterCrop(size)``: top = round((H - h) / 2); a crop larger than
    the image pads with zeros, as torchvision does."""

    def make_params(self, images, key):
        return {"ones": _ones(key)}

    def matrix(self, params, in_hw):
        ones = params["ones"]
        top, left = round((in_hw[0] - self.size[0]) / 2.0), round((in_hw[1] - self.size[1]) / 2.0)
        return box_matrix(top * ones, left * ones, self.size[0] * ones, self.size[1] * ones, self.size)


def crop_padding(padding) -> tuple[int, int, int, int]:
    """torchvision's ``padding``: an int (all sides), (left/right, top/bottom) or
    (left, top, right, bottom) → (left, top, right, bottom)."""
    if padding is None:
        return (0, 0, 0, 0)
    if (isinstance(padding, bool) or not isinstance(padding, (numbers.Real, tuple, list))
            or isinstance(padding, (tuple, list)) and len(padding) not in (1, 2, 4)):
        raise ValueError(f"Padding must be an int or a 1, 2, or 4 element of tuple or list, got {padding}.")
    values = [_int(padding)] if isinstance(padding, numbers.Real) else [int(p) for p in padding]
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
        return {"top": _int_between(u[:, 0], 0, PH - h + 1) - top, "left": _int_between(u[:, 1], 0, PW - w + 1) - left}

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


def _symmetric(start: torch.Tensor, length: int, size: int, device) -> torch.Tensor:
    """(B, length) indices ``start + i`` mirrored into [0, size) with the edge pixel
    repeated (numpy's "symmetric": ... 1 0 | 0 1 ... size-1 | size-1 ...)."""
    i = start.to(device, torch.int64).view(-1, 1) + torch.arange(length, device=device).view(1, -1)
    i = torch.remainder(i, 2 * size)
    return torch.where(i >= size, 2 * size - 1 - i, i)


class RandomResizedCrop(GeometricTransform):
    """torchvision ``RandomResizedCrop(size, scale, ratio)``: its 10-attempt rule,
    vectorised: 10 candidate boxes per sample drawn at once, the first valid one kept,
    else the central fallback crop. Params: ``top``, ``left``, ``height``, ``width`` (B,) float32."""

    samples_outside = False

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0), interpolation="bilinear"):
        super().__init__()
        self.interpolation = check_interpolation(interpolation)
        self.size = _setup_size(size)
        self.scale = _check_range(scale, "scale")
        self.ratio = _check_range(ratio, "ratio")

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
        top, left = _int_between(u[:, 0], 0, H - h + 1), _int_between(u[:, 1], 0, W - w + 1)
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
