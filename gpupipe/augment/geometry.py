"""Geometric batch transforms: torchvision's names and argument meanings, one set of
random parameters per sample, each transform a 3×3 homography (coordinates, dtypes
and the warp: :mod:`gpupipe.augment.warp`; Resize and the crops: :mod:`gpupipe.augment.crop`).

Defaults, interpolation and fill are torchvision v2's (``inspect.signature`` of each, checked
by tests/augment/test_tv_pixels.py): nearest for ``RandomAffine`` and ``RandomRotation``,
bilinear for ``RandomPerspective``, ``Resize`` and ``RandomResizedCrop`` (those two with
``antialias=True``); ``fill=0``. Each op alone gives torchvision's pixels within interpolation
rounding (the tolerances, and what was measured, are in that test). Differences, all deliberate:

* bicubic is also offered for the affine ops and the perspective (torchvision takes nearest and
  bilinear there);
* no ``center`` / ``expand`` arguments: rotation about the image centre, output size =
  input size;
* ``RandomResizedCrop`` raises (torchvision warns) when scale or ratio is not (min, max).

``Compose`` folds consecutive geometric transforms into one warp only where that gives the
sequential result within interpolation rounding (:mod:`gpupipe.augment.compose` says when).
"""
from __future__ import annotations

import torch

from .base import check_probability
from .crop import CenterCrop, RandomCrop, RandomResizedCrop, Resize
from .keys import draw
from .warp import (
    HW,
    GeometricTransform,
    affine_rows,
    batch_ones,
    box_matrix,
    check_interpolation,
    check_sequence,
    int_between,
    setup_angle,
    warp,
)

__all__ = [
    "GeometricTransform", "warp", "Resize", "CenterCrop", "RandomCrop", "RandomResizedCrop",
    "RandomAffine", "RandomRotation", "RandomHorizontalFlip", "RandomVerticalFlip",
    "RandomPerspective", "affine_matrix", "box_matrix", "HW",
]


def affine_matrix(angle, tx, ty, scale, shear_x, shear_y, in_hw: HW) -> torch.Tensor:
    """torchvision's ``F.affine`` forward matrix T·C·RSS·C⁻¹ (angle and shears in
    degrees, (B,) tensors), centre = image centre, in pixel-centre coordinates."""
    rot, sx, sy = torch.deg2rad(angle), torch.deg2rad(shear_x), torch.deg2rad(shear_y)
    a = torch.cos(rot - sy) / torch.cos(sy)
    b = -torch.cos(rot - sy) * torch.tan(sx) / torch.cos(sy) - torch.sin(rot)
    c = torch.sin(rot - sy) / torch.cos(sy)
    d = -torch.sin(rot - sy) * torch.tan(sx) / torch.cos(sy) + torch.cos(rot)
    a, b, c, d = a * scale, b * scale, c * scale, d * scale
    cx, cy = (in_hw[1] - 1) / 2.0, (in_hw[0] - 1) / 2.0
    return affine_rows(a, b, cx + tx - a * cx - b * cy, c, d, cy + ty - c * cx - d * cy)


class RandomAffine(GeometricTransform):
    """torchvision ``RandomAffine(degrees, translate, scale, shear)``: angle uniform
    in ``degrees`` (a number d means (-d, d)), translation a whole number of pixels up
    to ``translate`` × (W, H), scale uniform in ``scale``, shear a number / 2-tuple
    (x only) / 4-tuple (x and y) in degrees; about the image centre; ``interpolation``
    (default nearest) and ``fill`` (default 0) as torchvision's.
    Params: ``angle``, ``tx``, ``ty``, ``scale``, ``shear_x``, ``shear_y`` (B,) float32."""

    def __init__(self, degrees, translate=None, scale=None, shear=None, interpolation="nearest", fill=0):
        super().__init__()
        self.interpolation = check_interpolation(interpolation)
        self.set_fill(fill, blend=True)
        self.degrees = setup_angle(degrees, "degrees")
        if translate is not None:
            check_sequence(translate, "translate")
            if not all(0.0 <= t <= 1.0 for t in translate):
                raise ValueError("translation values should be between 0 and 1")
        if scale is not None:
            check_sequence(scale, "scale")
            if not all(s > 0 for s in scale):
                raise ValueError("scale values should be positive")
        self.translate = translate
        self.scale = scale
        self.shear = None if shear is None else setup_angle(shear, "shear", (2, 4))

    def make_params(self, images, key):
        H, W = int(images.shape[-2]), int(images.shape[-1])
        zeros = 0 * batch_ones(key)
        params = {"angle": draw(key, 0, 1, *self.degrees)[:, 0], "tx": zeros, "ty": zeros, "scale": zeros + 1,
                  "shear_x": zeros, "shear_y": zeros}
        if self.translate is not None:
            mx, my = self.translate[0] * W, self.translate[1] * H
            u = draw(key, 1, 2, -1.0, 1.0)
            params["tx"], params["ty"] = torch.round(u[:, 0] * mx), torch.round(u[:, 1] * my)
        if self.scale is not None:
            params["scale"] = draw(key, 2, 1, *self.scale)[:, 0]
        if self.shear is not None:
            params["shear_x"] = draw(key, 3, 1, self.shear[0], self.shear[1])[:, 0]
            if len(self.shear) == 4:
                params["shear_y"] = draw(key, 4, 1, self.shear[2], self.shear[3])[:, 0]
        return params

    def matrix(self, params, in_hw):
        p = params
        return affine_matrix(p["angle"], p["tx"], p["ty"], p["scale"], p["shear_x"], p["shear_y"], in_hw)


class RandomRotation(GeometricTransform):
    """torchvision ``RandomRotation(degrees)``: counter-clockwise angle uniform in
    ``degrees`` about the image centre, same output size; ``interpolation`` (default
    nearest) and ``fill`` (default 0) as torchvision's. Params: ``angle`` (B,)."""

    def __init__(self, degrees, interpolation="nearest", fill=0):
        super().__init__()
        self.interpolation = check_interpolation(interpolation)
        self.set_fill(fill, blend=True)
        self.degrees = setup_angle(degrees, "degrees")

    def make_params(self, images, key):
        return {"angle": draw(key, 0, 1, *self.degrees)[:, 0]}

    def matrix(self, params, in_hw):
        zero = torch.zeros_like(params["angle"])
        # torchvision's rotate passes -angle to the affine matrix (rotate is counter-clockwise)
        return affine_matrix(-params["angle"], zero, zero, zero + 1, zero, zero, in_hw)


class _RandomFlip(GeometricTransform):
    samples_outside = False
    covers_frame = True
    interpolation = None  # samples pixel centres exactly
    warps_alone = False  # alone (not fused with a neighbour's warp), an index flip: the same pixels, a copy's cost
    _axis = 1  # 1: x (horizontal flip), 0: y

    def __init__(self, p: float = 0.5):
        super().__init__()
        self.p = check_probability(p)

    def make_params(self, images, key):
        return {"flip": (draw(key, 0)[:, 0] < self.p).to(torch.float32)}

    def transform(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """Each flipped sample's pixels in reverse order along the axis: what its matrix's warp
        samples (pixel centres onto pixel centres), without a sampling grid — 64x3x224² uint8 on
        2 CPU cores: ~6 ms against ~110 ms through :func:`warp` — and without a host sync."""
        return _flip_where(images, params["flip"], -1 if self._axis == 1 else -2)

    def transform_masks(self, masks: torch.Tensor, params: dict[str, torch.Tensor], in_hw) -> torch.Tensor:
        return _flip_where(masks, params["flip"], -1 if self._axis == 1 else -2)

    def matrix(self, params, in_hw):
        f = params["flip"]
        s, t = 1 - 2 * f, f * (in_hw[self._axis] - 1)  # x' = -x + (W - 1) where flipped
        zero, one = torch.zeros_like(f), torch.ones_like(f)
        return affine_rows(s, zero, t, zero, one, zero) if self._axis == 1 else affine_rows(one, zero, zero, zero, s, t)


def _flip_where(x: torch.Tensor, flip: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` (B, ...) with sample i reversed along ``dim`` where ``flip[i]`` is 1. On a GPU one
    ``torch.where`` (no host sync); on the CPU, where that kernel takes 3x a copy (25 ms for
    64x3x224² uint8 against 8 ms), the batch flipped and the others copied back row by row."""
    if x.device.type != "cpu":
        return torch.where(flip.to(device=x.device).view(-1, *([1] * (x.ndim - 1))) > 0, x.flip(dim), x)
    out = x.flip(dim)
    for i in (flip == 0).nonzero().flatten().tolist():
        out[i] = x[i]
    return out


class RandomHorizontalFlip(_RandomFlip):
    """torchvision ``RandomHorizontalFlip(p)``, per sample. Params: ``flip`` (B,) float32 0/1."""
    _axis = 1


class RandomVerticalFlip(_RandomFlip):
    """torchvision ``RandomVerticalFlip(p)``, per sample. Params: ``flip`` (B,) float32 0/1."""
    _axis = 0


class RandomPerspective(GeometricTransform):
    """torchvision ``RandomPerspective(distortion_scale, p)``: with probability ``p``
    each corner moves inwards by a whole number of pixels below
    ``int(distortion_scale * half_size) + 1``. Params: ``apply`` (B,) float32 0/1 and
    ``end`` (B, 4, 2) float32 output corners (TL, TR, BR, BL; x, y). ``interpolation``
    (default bilinear) and ``fill`` (default 0) as torchvision's. As torchvision's, the
    corners are the corner pixels' indices, mapped onto each other in a frame whose origin
    is the image's top-left corner (pixel centres at i + 0.5)."""

    affine = False

    def __init__(self, distortion_scale: float = 0.5, p: float = 0.5, interpolation="bilinear", fill=0):
        super().__init__()
        self.interpolation = check_interpolation(interpolation)
        self.set_fill(fill, blend=True)
        if not 0.0 <= distortion_scale <= 1.0:
            raise ValueError("Argument distortion_scale value should be between 0 and 1")
        self.distortion_scale = float(distortion_scale)
        self.p = check_probability(p)

    @staticmethod
    def _corners(like: torch.Tensor) -> torch.Tensor:
        """(4, 2) float32 [[0, 0], [1, 0], [1, 1], [0, 1]] built on the device (no copy)."""
        i = torch.arange(4, device=like.device)
        return torch.stack([(i == 1) | (i == 2), i >= 2], dim=-1).to(torch.float32)

    @classmethod
    def _start(cls, in_hw: HW, like: torch.Tensor) -> torch.Tensor:
        """(B, 4, 2) corner pixel centres TL, TR, BR, BL as (x, y)."""
        size = torch.stack([torch.full_like(like[:, 0, 0], in_hw[1] - 1), torch.full_like(like[:, 0, 0], in_hw[0] - 1)], -1)
        return cls._corners(like)[None] * size[:, None, :]

    def make_params(self, images, key):
        H, W = int(images.shape[-2]), int(images.shape[-1])
        bh, bw = int(self.distortion_scale * (H // 2)) + 1, int(self.distortion_scale * (W // 2)) + 1
        u = draw(key, 1, 8)
        inward = torch.stack([int_between(u[:, :4], 0, bw), int_between(u[:, 4:], 0, bh)], dim=-1)  # (B, 4, 2)
        sign = 1 - 2 * self._corners(u)  # inwards: +x on the left corners, -x on the right, same for y
        end = self._start((H, W), inward) + sign * inward
        return {"apply": (draw(key, 0)[:, 0] < self.p).to(torch.float32), "end": end}

    def matrix(self, params, in_hw):
        from kornia.geometry.transform import get_perspective_transform

        start = self._start(in_hw, params["end"])
        end = torch.lerp(start, params["end"], params["apply"][:, None, None])  # not applied: end = start
        corner_frame = get_perspective_transform(start, end).to(torch.float64)
        # torchvision fits the map in the frame of pixel corners (centres at i + 0.5); in this
        # module's pixel-centre frame it is shift(-0.5) @ map @ shift(+0.5)
        to_corners, to_centres = (torch.tensor([[1.0, 0.0, d], [0.0, 1.0, d], [0.0, 0.0, 1.0]], dtype=torch.float64)
                                  .to(corner_frame.device, non_blocking=True) for d in (0.5, -0.5))
        return (to_centres @ corner_frame @ to_corners).to(torch.float32)
