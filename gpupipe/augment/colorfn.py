"""The functional core of the colour transforms: typed functions on (B, C, H, W)
batches, float in [0, 1] or uint8 in [0, 255] (torchvision v2's integer rules: computed
in float, clamped, truncated back), one factor per sample, and the keyed draws they use.

These are the *reference* definitions (the sequential path that the fused one in
:mod:`gpupipe.augment.colorfuse` is tested against): Kornia's op where Kornia's
has torchvision's meaning (``adjust_brightness_accumulative``, ``adjust_hue``),
otherwise torchvision's few-line formulas with torchvision's luma weights
(0.2989, 0.587, 0.114; Kornia's ``rgb_to_grayscale`` uses 0.299).
"""
from __future__ import annotations

import math

import torch
from kornia.enhance import adjust_brightness_accumulative
from kornia.enhance import adjust_hue as _k_adjust_hue

from .base import check_dtype

__all__ = ["rgb_to_grayscale", "adjust_brightness", "adjust_contrast", "adjust_saturation", "adjust_hue",
           "check_image"]

_TV_LUMA = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights


def _per_sample(factor: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    return factor.to(images.device, images.dtype).reshape(-1, 1, 1, 1)


def _top(images: torch.Tensor) -> float:
    """The largest value of ``images``' range: 1 for float, 255 for uint8."""
    return 1.0 if images.is_floating_point() else float(torch.iinfo(images.dtype).max)


def _blend(images: torch.Tensor, ref: torch.Tensor | float, f: torch.Tensor) -> torch.Tensor:
    """torchvision's ``_blend``: ``clamp(f·x + (1-f)·ref)`` to the dtype's range; an
    integer image is computed in float32 and truncated back (``.to(uint8)``)."""
    work = images if images.is_floating_point() else images.to(torch.float32)
    f = _per_sample(f, work)
    out = (f * work + (1 - f) * ref).clamp_(0.0, _top(images))
    return out if images.is_floating_point() else out.to(images.dtype)


def _gray_float(images: torch.Tensor) -> torch.Tensor:
    """The (B, 1, H, W) float luma torchvision blends with: floored for an integer image."""
    gray = rgb_to_grayscale(images, preserve_dtype=False)
    return gray if images.is_floating_point() or images.shape[-3] == 1 else gray.floor_()


def rgb_to_grayscale(images: torch.Tensor, preserve_dtype: bool = True) -> torch.Tensor:
    """(B, 3, H, W) → (B, 1, H, W), torchvision's weights, computed in float; a uint8
    image's luma is truncated back to uint8 (``preserve_dtype``, torchvision's rule).
    (B, 1, H, W) passes through (as float when not ``preserve_dtype``)."""
    if images.shape[-3] == 1:
        return images if preserve_dtype or images.is_floating_point() else images.to(torch.float32)
    r, g, b = images.unbind(dim=-3)  # Python-scalar weights: no host-to-device copy per call
    gray = r.mul(_TV_LUMA[0]).add_(g, alpha=_TV_LUMA[1]).add_(b, alpha=_TV_LUMA[2]).unsqueeze(-3)
    return gray.to(images.dtype) if preserve_dtype and not images.is_floating_point() else gray


def adjust_brightness(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``image * factor`` clamped to the range (torchvision's multiplicative brightness).
    ``factor`` (B,): one per sample. Float: Kornia's op; uint8: torchvision's integer blend."""
    if not images.is_floating_point():
        return _blend(images, 0.0, factor)
    return adjust_brightness_accumulative(images, _per_sample(factor, images))


def adjust_contrast(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Blend with the per-image mean of the grayscale image (torchvision's contrast)."""
    return _blend(images, _gray_float(images).mean(dim=(-3, -2, -1), keepdim=True), factor)


def adjust_saturation(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Blend with the grayscale image (torchvision's saturation); 1-channel input passes."""
    if images.shape[-3] == 1:
        return images
    return _blend(images, _gray_float(images), factor)


def adjust_hue(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Rotate the HSV hue by ``factor`` turns (torchvision's unit, in [-0.5, 0.5]);
    Kornia's op takes radians. 1-channel input passes. uint8 as torchvision: to [0, 1],
    rotated, back with ``trunc(x · (256 - 1e-3))``."""
    if images.shape[-3] == 1:
        return images
    if not images.is_floating_point():
        unit = adjust_hue(images.to(torch.float32) / _top(images), factor)
        return unit.mul_(_top(images) + 1.0 - 1e-3).clamp_(0.0, _top(images)).to(images.dtype)
    return _k_adjust_hue(images, factor.to(images.device, images.dtype) * (2 * math.pi))


def check_image(images: torch.Tensor, name: str, channels: tuple[int, ...] | None = (1, 3)) -> None:
    if images.ndim != 4 or (channels is not None and images.shape[1] not in channels):
        raise ValueError(f"{name} expects a (B, C, H, W) batch with C in {channels}, got shape {tuple(images.shape)}")
    check_dtype(images.dtype, name)
