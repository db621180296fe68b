"""Geometric batch transforms: torchvision's names and argument meanings, one set of
random parameters per sample, each transform a 3×3 homography applied with one
:func:`kornia.geometry.transform.warp_perspective`.

Coordinates are pixel centres: pixel ``(x, y)`` sits at integer ``(x, y)`` and an
image of width ``W`` spans ``[-0.5, W - 0.5]`` (torchvision's / ``align_corners=False``
resampling convention). ``matrix(params, in_hw)`` takes INPUT pixel coordinates to
OUTPUT pixel coordinates (Kornia's convention); ``apply`` warps with it (bilinear).
Because the matrices are already in pixel-centre coordinates they are handed to
Kornia with ``align_corners=True``, which maps pixel ``0`` / ``W - 1`` to ``-1`` / ``1``
exactly, so a resize matches ``F.interpolate(mode="bilinear", align_corners=False,
antialias=False)`` and a flip or integer crop samples pixels exactly.

Dtypes: (B, C, H, W) uint8 in → (B, C, h, w) float32 out, still in [0, 255] (not
rounded, not rescaled); float32 in → float32 out; float16 / bfloat16 are warped in
float32 and cast back. channels_last input is fine.

Differences from torchvision, all deliberate:

* the warp is bilinear and does NOT antialias: a strong downscale (more than ~2×)
  aliases where torchvision's ``antialias=True`` resize would not;
* ``RandomCrop`` has no ``padding`` / ``pad_if_needed`` (a crop larger than the
  image raises, as torchvision does without padding); ``Resize`` has no ``max_size``;
* no ``interpolation`` / ``fill`` / ``center`` / ``expand`` arguments: bilinear,
  fill 0 outside the image, rotation about the image centre, output size = input size;
* ``RandomPerspective`` maps corner pixel centres (torchvision maps pixel corners,
  half a pixel apart);
* ``RandomResizedCrop`` raises (torchvision warns) when scale or ratio is not (min, max).
"""
from __future__ import annotations

import math
import numbers
from typing import Sequence

import torch

from .base import AugKey, Transform, check_probability
from .keys import uniform

__all__ = [
    "GeometricTransform", "warp", "Resize", "CenterCrop", "RandomCrop", "RandomResizedCrop",
    "RandomAffine", "RandomRotation", "RandomHorizontalFlip", "RandomVerticalFlip",
    "RandomPerspective",
]

HW = tuple[int, int]


# ---------------------------------------------------------------- functional core

def warp(images: torch.Tensor, matrix: torch.Tensor, out_hw: HW, padding_mode: str = "zeros") -> torch.Tensor:
    """Bilinear warp of each sample by its (B, 3, 3) input→output pixel homography.

    Shape: (B, C, H, W) uint8 / float → (B, C, *out_hw) float32 (uint8 in; values
    stay in [0, 255]) or the input float dtype.
    """
    from kornia.geometry.transform import warp_perspective

    out_dtype = images.dtype if images.is_floating_point() else torch.float32
    x = images.to(torch.float32)
    out = warp_perspective(x, matrix.to(device=x.device, dtype=torch.float32), dsize=(int(out_hw[0]), int(out_hw[1])),
                           mode="bilinear", padding_mode=padding_mode, align_corners=True)
    return out.to(out_dtype)


def _affine(a, b, c, d, e, f) -> torch.Tensor:
    """(B, 3, 3) [[a, b, c], [d, e, f], [0, 0, 1]] from (B,) tensors."""
    zero, one = torch.zeros_like(a), torch.ones_like(a)
    return torch.stack([a, b, c, d, e, f, zero, zero, one], dim=-1).reshape(-1, 3, 3)


def box_matrix(top, left, box_h, box_w, out_hw: HW) -> torch.Tensor:
    """(B, 3, 3) taking the box (top, left, box_h, box_w) of the input onto an
    ``out_hw`` output (crop, then resize); all (B,) float tensors."""
    sy, sx = out_hw[0] / box_h, out_hw[1] / box_w
    zero = torch.zeros_like(sx)
    return _affine(sx, zero, (0.5 - left) * sx - 0.5, zero, sy, (0.5 - top) * sy - 0.5)


def _draw(key: AugKey, slot: int, count: int = 1, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
    """(B, count) float32 uniform draws of this transform's ``slot``."""
    k = key.child(slot)
    return uniform(k.seed, k.epoch, k.sample_ids, k.tag, count, low, high)


def _int_between(u: torch.Tensor, low, high) -> torch.Tensor:
    """Integers uniform in [low, high) from uniforms ``u`` in [0, 1) (float32 result);
    ``high`` an int or a tensor on ``u``'s device (no host-to-device copy either way)."""
    v = torch.floor(low + u * (high - low))
    return torch.minimum(v, high - 1) if torch.is_tensor(high) else v.clamp(max=high - 1)


def _ones(key: AugKey) -> torch.Tensor:
    return torch.ones(key.sample_ids.shape[0], dtype=torch.float32, device=key.sample_ids.device)


# ---------------------------------------------------------------- argument checks

def _setup_size(size, name: str = "size") -> HW:
    if isinstance(size, str):
        raise TypeError(f"{name} should be an int or a sequence of two ints (got {size!r})")
    if isinstance(size, numbers.Number):
        size = (int(size), int(size))
    elif isinstance(size, Sequence) and len(size) == 1:
        size = (int(size[0]), int(size[0]))
    elif not isinstance(size, Sequence) or len(size) != 2:
        raise ValueError("Please provide only two dimensions (h, w) for size.")
    if min(size) <= 0:
        raise ValueError(f"{name} should be positive (got {tuple(size)})")
    return int(size[0]), int(size[1])


def _setup_angle(x, name: str, req_sizes: Sequence[int] = (2,)) -> list[float]:
    if isinstance(x, numbers.Number):
        if x < 0:
            raise ValueError(f"If {name} is a single number, it must be positive.")
        return [-float(x), float(x)]
    if not isinstance(x, Sequence) or len(x) not in req_sizes:
        msg = " or ".join(str(s) for s in req_sizes)
        raise ValueError(f"{name} should be a sequence of length {msg}.")
    return [float(d) for d in x]


def _check_range(x, name: str) -> tuple[float, float]:
    if not isinstance(x, Sequence) or len(x) != 2:
        raise TypeError(f"{name} should be a sequence of length 2 (got {x!r})")
    if x[0] > x[1]:
        raise ValueError(f"Scale and ratio should be of kind (min, max) (got {name}={tuple(x)})")
    return float(x[0]), float(x[1])


# ---------------------------------------------------------------- module shells

class GeometricTransform(Transform):
    """A transform that is one homography per sample. Subclasses implement
    ``make_params`` (from the input size only: ``Compose`` calls it on a placeholder
    of the right shape), ``output_size`` and ``matrix``."""

    padding_mode = "zeros"  # "border" where every sample point lies inside the image

    def output_size(self, in_hw: HW) -> HW:
        return in_hw

    def matrix(self, params: dict[str, torch.Tensor], in_hw: HW) -> torch.Tensor:
        raise NotImplementedError

    def apply(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        in_hw = (int(images.shape[-2]), int(images.shape[-1]))
        return warp(images, self.matrix(params, in_hw), self.output_size(in_hw), self.padding_mode)


class Resize(GeometricTransform):
    """torchvision ``Resize(size)``: an int resizes the shorter side to ``size``
    (longer side ``int(size * long / short)``), an (h, w) pair resizes to it.
    Bilinear, no antialias (see the module docstring)."""

    padding_mode = "border"

    def __init__(self, size):
        super().__init__()
        if isinstance(size, str) or not isinstance(size, (numbers.Number, Sequence)):
            raise TypeError(f"Size should be int or sequence. Got {type(size)}")
        if isinstance(size, Sequence) and len(size) not in (1, 2):
            raise ValueError("If size is a sequence, it should have 1 or 2 values")
        self.size = int(size) if isinstance(size, numbers.Number) else tuple(int(s) for s in size)
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
    """A crop to a fixed ``size`` (h, w)."""

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


class RandomCrop(_Crop):
    """torchvision ``RandomCrop(size)`` without padding: the top-left corner is
    uniform over the valid positions, per sample. Params: ``top``, ``left`` (B,) float32."""

    padding_mode = "border"

    def make_params(self, images, key):
        H, W = images.shape[-2:]
        h, w = self.size
        if H < h or W < w:
            raise ValueError(f"Required crop size {(h, w)} is larger than input image size {(H, W)}")
        u = _draw(key, 0, 2)
        return {"top": _int_between(u[:, 0], 0, H - h + 1), "left": _int_between(u[:, 1], 0, W - w + 1)}

    def matrix(self, params, in_hw):
        ones = torch.ones_like(params["top"])
        return box_matrix(params["top"], params["left"], self.size[0] * ones, self.size[1] * ones, self.size)


class RandomResizedCrop(GeometricTransform):
    """torchvision ``RandomResizedCrop(size, scale, ratio)``: its 10-attempt rule,
    vectorised: 10 candidate boxes per sample drawn at once, the first valid one kept,
    else the central fallback crop. Params: ``top``, ``left``, ``height``, ``width`` (B,) float32."""

    padding_mode = "border"

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0)):
        super().__init__()
        self.size = _setup_size(size)
        self.scale = _check_range(scale, "scale")
        self.ratio = _check_range(ratio, "ratio")

    def output_size(self, in_hw):
        return self.size

    def make_params(self, images, key):
        H, W = int(images.shape[-2]), int(images.shape[-1])
        target_area = H * W * _draw(key, 0, 10, *self.scale)
        aspect = torch.exp(_draw(key, 1, 10, math.log(self.ratio[0]), math.log(self.ratio[1])))
        w = torch.round(torch.sqrt(target_area * aspect))
        h = torch.round(torch.sqrt(target_area / aspect))
        valid = (w > 0) & (w <= W) & (h > 0) & (h <= H)
        first = valid.to(torch.uint8).argmax(dim=1, keepdim=True)  # first True (0 if none)
        h, w = h.gather(1, first)[:, 0], w.gather(1, first)[:, 0]
        u = _draw(key, 2, 2)
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
    return _affine(a, b, cx + tx - a * cx - b * cy, c, d, cy + ty - c * cx - d * cy)


class RandomAffine(GeometricTransform):
    """torchvision ``RandomAffine(degrees, translate, scale, shear)``: angle uniform
    in ``degrees`` (a number d means (-d, d)), translation a whole number of pixels up
    to ``translate`` × (W, H), scale uniform in ``scale``, shear a number / 2-tuple
    (x only) / 4-tuple (x and y) in degrees; about the image centre, fill 0.
    Params: ``angle``, ``tx``, ``ty``, ``scale``, ``shear_x``, ``shear_y`` (B,) float32."""

    def __init__(self, degrees, translate=None, scale=None, shear=None):
        super().__init__()
        self.degrees = _setup_angle(degrees, "degrees")
        if translate is not None:
            if not isinstance(translate, Sequence) or len(translate) != 2:
                raise ValueError("translate should be a sequence of length 2.")
            if not all(0.0 <= t <= 1.0 for t in translate):
                raise ValueError("translation values should be between 0 and 1")
        if scale is not None:
            if not isinstance(scale, Sequence) or len(scale) != 2:
                raise ValueError("scale should be a sequence of length 2.")
            if not all(s > 0 for s in scale):
                raise ValueError("scale values should be positive")
        self.translate = translate
        self.scale = scale
        self.shear = None if shear is None else _setup_angle(shear, "shear", (2, 4))

    def make_params(self, images, key):
        H, W = int(images.shape[-2]), int(images.shape[-1])
        zeros = 0 * _ones(key)
        params = {"angle": _draw(key, 0, 1, *self.degrees)[:, 0], "tx": zeros, "ty": zeros, "scale": zeros + 1,
                  "shear_x": zeros, "shear_y": zeros}
        if self.translate is not None:
            mx, my = self.translate[0] * W, self.translate[1] * H
            u = _draw(key, 1, 2, -1.0, 1.0)
            params["tx"], params["ty"] = torch.round(u[:, 0] * mx), torch.round(u[:, 1] * my)
        if self.scale is not None:
            params["scale"] = _draw(key, 2, 1, *self.scale)[:, 0]
        if self.shear is not None:
            params["shear_x"] = _draw(key, 3, 1, self.shear[0], self.shear[1])[:, 0]
            if len(self.shear) == 4:
                params["shear_y"] = _draw(key, 4, 1, self.shear[2], self.shear[3])[:, 0]
        return params

    def matrix(self, params, in_hw):
        p = params
        return affine_matrix(p["angle"], p["tx"], p["ty"], p["scale"], p["shear_x"], p["shear_y"], in_hw)


class RandomRotation(GeometricTransform):
    """torchvision ``RandomRotation(degrees)``: counter-clockwise angle uniform in
    ``degrees`` about the image centre, same output size, fill 0. Params: ``angle`` (B,)."""

    def __init__(self, degrees):
        super().__init__()
        self.degrees = _setup_angle(degrees, "degrees")

    def make_params(self, images, key):
        return {"angle": _draw(key, 0, 1, *self.degrees)[:, 0]}

    def matrix(self, params, in_hw):
        zero = torch.zeros_like(params["angle"])
        # torchvision's rotate passes -angle to the affine matrix (rotate is counter-clockwise)
        return affine_matrix(-params["angle"], zero, zero, zero + 1, zero, zero, in_hw)


class _RandomFlip(GeometricTransform):
    padding_mode = "border"
    _axis = 1  # 1: x (horizontal flip), 0: y

    def __init__(self, p: float = 0.5):
        super().__init__()
        self.p = check_probability(p)

    def make_params(self, images, key):
        return {"flip": (_draw(key, 0)[:, 0] < self.p).to(torch.float32)}

    def matrix(self, params, in_hw):
        f = params["flip"]
        s, t = 1 - 2 * f, f * (in_hw[self._axis] - 1)  # x' = -x + (W - 1) where flipped
        zero, one = torch.zeros_like(f), torch.ones_like(f)
        return _affine(s, zero, t, zero, one, zero) if self._axis == 1 else _affine(one, zero, zero, zero, s, t)


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
    ``end`` (B, 4, 2) float32 output corners (TL, TR, BR, BL; x, y)."""

    def __init__(self, distortion_scale: float = 0.5, p: float = 0.5):
        super().__init__()
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
        u = _draw(key, 1, 8)
        inward = torch.stack([_int_between(u[:, :4], 0, bw), _int_between(u[:, 4:], 0, bh)], dim=-1)  # (B, 4, 2)
        sign = 1 - 2 * self._corners(u)  # inwards: +x on the left corners, -x on the right, same for y
        end = self._start((H, W), inward) + sign * inward
        return {"apply": (_draw(key, 0)[:, 0] < self.p).to(torch.float32), "end": end}

    def matrix(self, params, in_hw):
        from kornia.geometry.transform import get_perspective_transform

        start = self._start(in_hw, params["end"])
        end = torch.lerp(start, params["end"], params["apply"][:, None, None])  # not applied: end = start
        return get_perspective_transform(start, end).to(torch.float32)
