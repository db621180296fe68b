"""Batch-level mixing: MixUp and CutMix as torchvision v2 does them.

One lambda per BATCH from Beta(alpha, alpha), the partner of sample i is sample
i - 1 (the batch rolled by one), labels become (B, num_classes) float32 mixed with
the same weight as the pixels (CutMix: by the box's actual area). Lambda and the
box centre are drawn from the key with the batch's smallest sample id as the
"sample" (a device-side reduction, no host sync): the same set of ids gives the same
lambda whatever their order, though the pairing (the roll) follows the order.

Beta is sampled as two keyed Gamma draws (Marsaglia–Tsang with 16 candidate
proposals, the first accepted wins; alpha < 1 via Gamma(alpha + 1) · U^(1/alpha)),
combined in log space so tiny alphas do not give 0/0.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar, overload

import torch
from torch import nn

from . import keys
from .base import AugKey, naming_keywords

__all__ = ["MixUp", "CutMix", "sample_beta"]

_CANDIDATES = 16
_M = TypeVar("_M", bound="_LabelMix")


def _batch_ids(key: AugKey) -> torch.Tensor:
    if key.sample_ids.numel() == 0:
        raise ValueError("MixUp/CutMix need a non-empty batch")
    return key.sample_ids.min().reshape(1)


def _log_gamma_sample(key: AugKey, ids: torch.Tensor, alpha: float) -> torch.Tensor:
    """(1,) log of a Gamma(alpha, 1) draw keyed by (key, ids)."""
    a = alpha + 1.0 if alpha < 1.0 else alpha
    d = a - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    k_n, k_u, k_b = key.child(0), key.child(1), key.child(2)
    x = keys.normal(k_n.seed, k_n.epoch, ids, k_n.tag, _CANDIDATES)[0]
    u = keys.uniform(k_u.seed, k_u.epoch, ids, k_u.tag, _CANDIDATES)[0].clamp_min(1e-7)
    v = (1.0 + c * x) ** 3
    log_v = torch.log(v.clamp_min(1e-30))
    ok = (v > 0) & (torch.log(u) < 0.5 * x * x + d - d * v + d * log_v)
    first = ok.to(torch.int8).argmax()
    # No candidate accepted (probability < 1e-20): fall back to the mode, d.
    chosen = log_v.gather(0, first.reshape(1))[0]  # not log_v[first]: a tensor index is read on the host (a sync)
    log_g = torch.where(ok.any(), math.log(d) + chosen, math.log(d))
    if alpha < 1.0:
        boost = keys.uniform(k_b.seed, k_b.epoch, ids, k_b.tag)[0, 0].clamp_min(1e-7)
        log_g = log_g + torch.log(boost) / alpha
    return log_g.reshape(1)


def sample_beta(key: AugKey, alpha: float) -> torch.Tensor:
    """(1,) float32 Beta(alpha, alpha) draw for the batch holding ``key``, on its device."""
    ids = _batch_ids(key)
    return torch.sigmoid(_log_gamma_sample(key.child(0), ids, alpha) - _log_gamma_sample(key.child(1), ids, alpha))


def _check_args(alpha: float, num_classes: int | None) -> tuple[float, int | None]:
    if not float(alpha) > 0:
        raise ValueError(f"alpha should be a positive float, got {alpha}")
    if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1):
        raise ValueError(f"num_classes should be a positive integer, got {num_classes!r}")
    return float(alpha), num_classes


def _check_batch(images: torch.Tensor, labels: torch.Tensor, num_classes: int | None) -> None:
    """Labels as torchvision takes them: (B,) int64 class indices (``num_classes`` needed), or
    (B, C) per-class weights (one-hot or already mixed; C = ``num_classes`` where given)."""
    if images.ndim != 4:
        raise ValueError(f"Expected a batched input with 4 dims, but got {images.ndim} dimensions instead.")
    if labels.ndim == 2:
        if labels.shape[0] != images.shape[0] or num_classes is not None and labels.shape[1] != num_classes:
            raise ValueError(f"labels should be tensor of shape (batch_size, num_classes) = ({images.shape[0]}, "
                             f"{num_classes if num_classes is not None else 'C'}) but got shape "
                             f"{tuple(labels.shape)} instead.")
        return
    if num_classes is None:
        raise ValueError("num_classes must be passed if the labels are index-based (1D)")
    if labels.shape != (images.shape[0],):
        raise ValueError(f"labels should be tensor of shape (batch_size,) = ({images.shape[0]},) "
                         f"but got shape {tuple(labels.shape)} instead.")
    if labels.dtype != torch.int64:
        raise TypeError(f"labels should be int64 class indices in [0, {num_classes}), got {labels.dtype}")


def _mix_labels(labels: torch.Tensor, lam: torch.Tensor, num_classes: int | None) -> torch.Tensor:
    if labels.ndim == 2:  # per-class weights already
        one_hot = labels.to(torch.float32)
    else:
        assert num_classes is not None, "_check_batch: index labels need num_classes"
        one_hot = nn.functional.one_hot(labels, num_classes).to(torch.float32)
    lam = lam.to(one_hot.device, torch.float32)
    return one_hot.roll(1, 0) * (1.0 - lam) + one_hot * lam


class _LabelMix(nn.Module):
    """What MixUp and CutMix share: ``apply(images, labels, params)`` runs :meth:`mix`
    (``apply(fn)`` stays ``nn.Module.apply``, which ``model.apply(fn)`` calls on every
    submodule); ``forward`` draws the parameters, then applies them."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        naming_keywords(cls)  # MixUp(alhpa=1.0): did you mean 'alpha'?, as a Transform says

    def make_params(self, images: torch.Tensor, key: AugKey) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def mix(self, images: torch.Tensor, labels: torch.Tensor,
            params: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    @overload
    def apply(self: _M, fn: Callable[[nn.Module], None]) -> _M: ...

    @overload
    def apply(self, images: torch.Tensor, labels: torch.Tensor,
              params: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]: ...

    def apply(self, images, labels=None, params=None):
        if params is None:
            return super().apply(images)
        return self.mix(images, labels, params)

    def forward(self, images: torch.Tensor, labels: torch.Tensor, key: AugKey,
                targets: object = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``targets``: boxes or masks raise torchvision's error (a mixed image has no one box
        list or label map); the argument exists so that passing them says so."""
        if targets is not None:
            raise ValueError(f"{type(self).__name__}() does not support PIL images, bounding boxes, keypoints and "
                             "masks (as in torchvision); mix only batches without targets")
        return self.apply(images, labels, self.make_params(images, key))


class MixUp(_LabelMix):
    """``lam * x + (1 - lam) * x.roll(1, 0)``, labels likewise; lam ~ Beta(alpha, alpha) per batch.

    Shape: images (B, C, H, W) float, labels (B,) int64 (or (B, num_classes) weights, as
    torchvision takes; ``num_classes`` may then be left out) → images same, labels
    (B, num_classes) float32.
    """

    def __init__(self, *, alpha: float = 1.0, num_classes: int | None = None) -> None:
        super().__init__()
        self.alpha, self.num_classes = _check_args(alpha, num_classes)

    def make_params(self, images: torch.Tensor, key: AugKey) -> dict[str, torch.Tensor]:
        return {"lam": sample_beta(key, self.alpha)}

    def mix(self, images: torch.Tensor, labels: torch.Tensor,
            params: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        _check_batch(images, labels, self.num_classes)
        if not images.is_floating_point():
            raise TypeError(f"MixUp expects float images, got {images.dtype}; put ToDtype() before it")
        lam = params["lam"].to(images.device, images.dtype).reshape(1, 1, 1, 1)
        mixed = images.roll(1, 0) * (1.0 - lam) + images * lam
        return mixed, _mix_labels(labels, params["lam"], self.num_classes)


class CutMix(_LabelMix):
    """Paste a box of ``x.roll(1, 0)`` into each image; labels mixed by the box's area.

    torchvision v2's box: centre uniform over pixels, half-size ``int(0.5 * sqrt(1 - lam) * W)``
    (and H), clipped to the image; the label weight is ``1 - box area / (H * W)``.
    Shape: images (B, C, H, W) any dtype, labels (B,) int64 (or (B, num_classes) weights) →
    images same, labels (B, num_classes) float32.
    """

    def __init__(self, *, alpha: float = 1.0, num_classes: int | None = None) -> None:
        super().__init__()
        self.alpha, self.num_classes = _check_args(alpha, num_classes)

    def make_params(self, images: torch.Tensor, key: AugKey) -> dict[str, torch.Tensor]:
        H, W = images.shape[-2:]
        lam = sample_beta(key, self.alpha)
        ids, k = _batch_ids(key), key.child(3)
        centre = keys.uniform(k.seed, k.epoch, ids, k.tag, 2)[0].to(torch.float64)
        r_x = (centre[0] * W).floor().clamp_max(W - 1)  # randint(W), randint(H)
        r_y = (centre[1] * H).floor().clamp_max(H - 1)
        r = 0.5 * torch.sqrt(1.0 - lam.to(torch.float64))[0]
        half_w, half_h = (r * W).floor(), (r * H).floor()
        x1, y1 = (r_x - half_w).clamp_min(0), (r_y - half_h).clamp_min(0)
        x2, y2 = (r_x + half_w).clamp_max(W), (r_y + half_h).clamp_max(H)
        box = torch.stack([x1, y1, x2, y2]).to(torch.int64)
        lam_box = (1.0 - (x2 - x1) * (y2 - y1) / (W * H)).to(torch.float32).reshape(1)
        return {"lam": lam_box, "lam_drawn": lam, "box": box}

    def mix(self, images: torch.Tensor, labels: torch.Tensor,
            params: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        _check_batch(images, labels, self.num_classes)
        H, W = images.shape[-2:]
        x1, y1, x2, y2 = params["box"].to(images.device).unbind()
        rows = torch.arange(H, device=images.device).view(H, 1)
        cols = torch.arange(W, device=images.device).view(1, W)
        inside = (rows >= y1) & (rows < y2) & (cols >= x1) & (cols < x2)
        return torch.where(inside, images.roll(1, 0), images), _mix_labels(labels, params["lam"], self.num_classes)
