"""The functional core of the colour transforms: typed functions on (B, C, H, W)
float batches in [0, 1], one factor per sample, and the keyed draws they use.

These are the *reference* definitions (the sequential path that the fused one in
:mod:`gpupipe.augment.colorfuse` is tested against): Kornia's op where Kornia's
has torchvision's meaning (``adjust_brightness_accumulative``, ``adjust_hue``),
otherwise torchvision's few-line formulas with torchvision's luma weights
(0.2989, 0.587, 0.114; Kornia's ``rgb_to_grayscale`` uses 0.299).
"""
from __future__ import annotations

import math

import torch
from kornia.enhance import adjust_brightness_accumulative, adjust_hue as _k_adjust_hue

from . import keys
from .base import AugKey

__all__ = ["rgb_to_grayscale", "adjust_brightness", "adjust_contrast", "adjust_saturation", "adjust_hue",
           "draw", "check_image"]

_TV_LUMA = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights


def draw(key: AugKey, sub: int, count: int = 1, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
    """(B, count) keyed uniforms for draw ``sub`` of the transform holding ``key``."""
    k = key.child(sub)
    return keys.uniform(k.seed, k.epoch, k.sample_ids, k.tag, count, low, high)


def _per_sample(factor: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    return factor.to(images.device, images.dtype).reshape(-1, 1, 1, 1)


def rgb_to_grayscale(images: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) float → (B, 1, H, W), torchvision's weights. (B, 1, H, W) passes through."""
    if images.shape[-3] == 1:
        return images
    r, g, b = images.unbind(dim=-3)  # Python-scalar weights: no host-to-device copy per call
    return (r * _TV_LUMA[0] + g * _TV_LUMA[1] + b * _TV_LUMA[2]).unsqueeze(-3)


def adjust_brightness(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``image * factor`` clamped to [0, 1] (torchvision's multiplicative brightness).
    ``factor`` (B,): one per sample."""
    return adjust_brightness_accumulative(images, _per_sample(factor, images))


def adjust_contrast(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Blend with the per-image mean of the grayscale image (torchvision's contrast)."""
    f = _per_sample(factor, images)
    mean = rgb_to_grayscale(images).mean(dim=(-3, -2, -1), keepdim=True)
    return (f * images + (1 - f) * mean).clamp(0.0, 1.0)


def adjust_saturation(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Blend with the grayscale image (torchvision's saturation); 1-channel input passes."""
    if images.shape[-3] == 1:
        return images
    f = _per_sample(factor, images)
    return (f * images + (1 - f) * rgb_to_grayscale(images)).clamp(0.0, 1.0)


def adjust_hue(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Rotate the HSV hue by ``factor`` turns (torchvision's unit, in [-0.5, 0.5]);
    Kornia's op takes radians. 1-channel input passes."""
    if images.shape[-3] == 1:
        return images
    return _k_adjust_hue(images, factor.to(images.device, images.dtype) * (2 * math.pi))


def check_image(images: torch.Tensor, name: str, channels: tuple[int, ...] | None = (1, 3)) -> None:
    if images.ndim != 4 or (channels is not None and images.shape[1] not in channels):
        raise ValueError(f"{name} expects a (B, C, H, W) batch with C in {channels}, got shape {tuple(images.shape)}")
    if not images.is_floating_point():
        raise TypeError(f"{name} expects float images in [0, 1], got {images.dtype}; put ToDtype() before it")

