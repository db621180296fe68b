"""torchvision v2's resize of a tensor image, batched: what ``Resize`` and ``RandomResizedCrop``
run where they are not one warp (:mod:`gpupipe.augment.crop` says when).

An antialiased reduction is a low-pass filter whose support grows with the scale factor: no
single ``grid_sample`` does it, so these call ``F.interpolate`` as torchvision's
``resize_image`` does, with its dtype rule: float32 / float64 as they are; uint8 as uint8 where
torch has a uint8 kernel (on the CPU: bilinear with AVX2 / AVX-512 or on ARM, bicubic, nearest),
else through float32, rounded (and clamped to 0..255 after a bicubic); float16 / bfloat16
through float32.
"""
from __future__ import annotations

import platform

import torch
import torch.nn.functional as F

__all__ = ["resize", "resized_crop", "uint8_kernel", "reduces"]

HW = tuple[int, int]


def uint8_kernel(device: torch.device, interpolation: str) -> bool:
    """Whether torchvision hands a uint8 image on ``device`` to ``F.interpolate`` as uint8
    (its ``_do_native_uint8_resize_on_cpu``, and nearest anywhere)."""
    if interpolation in ("nearest", "nearest-exact"):
        return True
    if device.type != "cpu":
        return False
    if interpolation == "bilinear":
        return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") or platform.machine() in ("aarch64", "arm64")
    return interpolation == "bicubic"


def reduces(box_hw: tuple[float, float], out_hw: HW) -> bool:
    """Whether resizing a ``box_hw`` region to ``out_hw`` scales down along either axis."""
    return box_hw[0] > out_hw[0] or box_hw[1] > out_hw[1]


def resize(images: torch.Tensor, size: HW, interpolation: str = "bilinear", antialias: bool = True) -> torch.Tensor:
    """torchvision v2 ``F.resize(images, size, interpolation, antialias=antialias)`` of a batch:
    one ``F.interpolate`` (``align_corners=False``; legacy ``"nearest"``, which takes
    ``floor(i * in / out)``, for nearest, which never antialiases).

    Shape: (B, C, H, W) → (B, C, *size), the input's dtype (uint8 or float)."""
    size = (int(size[0]), int(size[1]))
    if tuple(images.shape[-2:]) == size:
        return images
    dtype = images.dtype
    native = dtype in (torch.float32, torch.float64) or (dtype == torch.uint8 and uint8_kernel(images.device, interpolation))
    x = images if native else images.to(torch.float32)
    nearest = interpolation in ("nearest", "nearest-exact")
    out = F.interpolate(x, size=size, mode=interpolation, align_corners=None if nearest else False,
                        antialias=antialias and not nearest)
    if native:
        return out
    if dtype == torch.uint8:
        if interpolation == "bicubic":
            out = out.clamp_(0, 255)
        out = out.round_()
    return out.to(dtype)


def resized_crop(images: torch.Tensor, top: torch.Tensor, left: torch.Tensor, height: torch.Tensor,
                 width: torch.Tensor, size: HW, interpolation: str = "bilinear", antialias: bool = True) -> torch.Tensor:
    """torchvision v2 ``F.resized_crop`` of each sample with its own box: the integer box
    (``top``, ``left``, ``height``, ``width``: (B,) tensors, inside the image) cut out, then
    :func:`resize` d, so the filter never reads past the box's edges.

    One ``F.interpolate`` a sample, as torchvision runs one an image; the boxes are read on
    the host (one device sync on CUDA). Shape: (B, C, H, W) → (B, C, *size)."""
    boxes = torch.stack([top, left, height, width], dim=1).round().to(torch.int64).tolist()
    out = torch.empty((images.shape[0], images.shape[1], *size), dtype=images.dtype, device=images.device)
    for i, (t, lt, h, w) in enumerate(boxes):
        out[i] = resize(images[i:i + 1, :, t:t + h, lt:lt + w], size, interpolation, antialias)[0]
    return out
