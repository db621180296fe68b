"""Spatial-neighbourhood colour transforms: GaussianBlur and RandomErasing, with
torchvision's arguments and messages and one keyed draw per sample."""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from kornia.filters import filter2d_separable, get_gaussian_kernel1d

from . import keys
from .base import AugKey, Transform
from .colorfn import check_image as _check_image
from .keys import draw

__all__ = ["GaussianBlur", "RandomErasing"]


class GaussianBlur(Transform):
    """torchvision's GaussianBlur: ``kernel_size`` (kx, ky) odd, sigma uniform in
    ``sigma`` = (min, max) per sample, the same for both axes, reflect padding.

    Kernels come from Kornia's ``get_gaussian_kernel1d`` with a (B, 1) sigma and run
    through ``filter2d_separable`` (``gaussian_blur2d`` itself reads its sigma tensor
    on the host to check it, a device sync). uint8 in → uint8 out, rounded (torchvision's).
    """

    keeps_targets = True  # a blur: boxes and masks stay

    def __init__(self, kernel_size, sigma=(0.1, 2.0)) -> None:
        super().__init__()
        ks = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
        if len(ks) != 2:
            raise ValueError("Kernel size should be a tuple/list of two integers")
        for k in ks:
            if k <= 0 or k % 2 == 0:
                raise ValueError("Kernel size value should be an odd and positive number.")
        if isinstance(sigma, (int, float)):
            sigma = (float(sigma), float(sigma))
        elif not isinstance(sigma, Sequence):
            raise TypeError(f"sigma should be a number or a sequence of numbers. Got {type(sigma)}")
        elif len(sigma) not in (1, 2):
            raise ValueError(f"If sigma is a sequence its length should be 1 or 2. Got {len(sigma)}")
        elif bad := [v for v in sigma if isinstance(v, bool) or not isinstance(v, (int, float))]:
            raise ValueError(f"sigma should be a sequence of numbers. Got {type(bad[0])}")
        sigma = (float(sigma[0]), float(sigma[-1]))
        if not 0.0 < sigma[0] <= sigma[1]:
            raise ValueError(f"sigma values should be positive and of the form (min, max). Got {list(sigma)}")
        self.kernel_size = (int(ks[0]), int(ks[1]))  # (x, y) as torchvision
        self.sigma = (float(sigma[0]), float(sigma[1]))

    def make_params(self, images: torch.Tensor, key: AugKey) -> dict[str, torch.Tensor]:
        return {"sigma": draw(key, 0, 1, *self.sigma)[:, 0]}

    def transform(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        _check_image(images, "GaussianBlur", channels=None)
        work = images if images.dtype in (torch.float32, torch.float64) else images.float()
        sigma = params["sigma"].to(work.device, work.dtype).reshape(-1, 1)
        kx = get_gaussian_kernel1d(self.kernel_size[0], sigma)
        ky = get_gaussian_kernel1d(self.kernel_size[1], sigma)
        out = filter2d_separable(work, kx, ky, "reflect")
        return out.to(images.dtype) if images.is_floating_point() else out.round_().to(images.dtype)


class RandomErasing(Transform):
    """torchvision's RandomErasing, per sample: with probability ``p`` a box of area
    fraction in ``scale`` and log-uniform aspect ``ratio`` is filled with ``value``
    (a number, one per channel, or ``"random"`` for keyed standard normals). The
    10-attempt rule is vectorised: 10 candidates per sample, the first that fits
    wins, none fitting means no erase. Any float dtype and range (usually after Normalize),
    or uint8 (the value cast to uint8; ``"random"`` noise clamped to 0-255).
    """

    keeps_targets = True  # torchvision's RandomErasing passes boxes and masks through

    def __init__(self, p: float = 0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0, inplace: bool = False) -> None:
        super().__init__()
        if not isinstance(value, (int, float, str, tuple, list)):
            raise TypeError("Argument value should be either a number or str or a sequence")
        if isinstance(value, str) and value != "random":
            raise ValueError("If value is str, it should be 'random'")
        if not isinstance(scale, Sequence):
            raise TypeError("Scale should be a sequence")
        if not isinstance(ratio, Sequence):
            raise TypeError("Ratio should be a sequence")
        if scale[0] > scale[1] or ratio[0] > ratio[1]:
            raise ValueError(f"Scale and ratio should be of kind (min, max), got scale={scale}, ratio={ratio}")
        if scale[0] < 0 or scale[1] > 1:
            raise ValueError("Scale should be between 0 and 1")
        if not 0 <= p <= 1:
            raise ValueError(f"`p` should be a floating point value in the interval [0.0, 1.0] (got {p}).")
        self.p, self.scale, self.ratio, self.value = float(p), tuple(scale), tuple(ratio), value

    def make_params(self, images: torch.Tensor, key: AugKey) -> dict[str, torch.Tensor]:
        H, W = images.shape[-2:]
        area = draw(key, 0, 10, *self.scale) * (H * W)
        aspect = torch.exp(draw(key, 1, 10, math.log(self.ratio[0]), math.log(self.ratio[1])))
        h = torch.round(torch.sqrt(area * aspect)).to(torch.int64)
        w = torch.round(torch.sqrt(area / aspect)).to(torch.int64)
        fits = (h < H) & (w < W)
        first = fits.to(torch.int8).argmax(dim=1, keepdim=True)  # the first attempt that fits
        h, w = h.gather(1, first)[:, 0], w.gather(1, first)[:, 0]
        erase = fits.any(dim=1) & (draw(key, 2)[:, 0] < self.p)
        k = key.child(3)
        top = keys.randint(k.seed, k.epoch, k.sample_ids, k.tag, (H - h + 1).clamp_min(1))
        k = key.child(4)
        left = keys.randint(k.seed, k.epoch, k.sample_ids, k.tag, (W - w + 1).clamp_min(1))
        params = {"erase": erase, "top": top, "left": left, "height": h * erase, "width": w * erase}
        if isinstance(self.value, str):  # "random": a keyed standard normal per pixel
            k = key.child(5)
            params["noise"] = keys.normal(k.seed, k.epoch, k.sample_ids, k.tag, images[0].numel())
        return params

    def transform(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        B, C, H, W = images.shape
        dev = images.device
        top, left = params["top"].to(dev).view(-1, 1, 1, 1), params["left"].to(dev).view(-1, 1, 1, 1)
        rows = torch.arange(H, device=dev).view(1, 1, H, 1)
        cols = torch.arange(W, device=dev).view(1, 1, 1, W)
        inside = ((rows >= top) & (rows < top + params["height"].to(dev).view(-1, 1, 1, 1))
                  & (cols >= left) & (cols < left + params["width"].to(dev).view(-1, 1, 1, 1)))
        if isinstance(self.value, str):
            noise = params["noise"].to(dev).view(B, C, H, W)
            fill = noise.to(images.dtype) if images.is_floating_point() else noise.clamp(0, 255).to(images.dtype)
        else:
            vals = [float(v) for v in self.value] if isinstance(self.value, (tuple, list)) else [float(self.value)]
            if len(vals) not in (1, C):
                raise ValueError(f"If value is a sequence, it should have either a single value or {C} "
                                 "(number of inpt channels)")
            fill = torch.tensor(vals, dtype=images.dtype).to(dev, non_blocking=True).view(1, -1, 1, 1)
        return torch.where(inside, fill, images)
