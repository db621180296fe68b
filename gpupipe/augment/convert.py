"""torchvision's conversion steps, for a line-by-line port of a v2 pipeline.

A torchvision recipe converts its input before and after the augmentation: ``PILToTensor()`` or
``ToImage()`` (a PIL image or an array to a tensor), ``ConvertImageDtype(torch.float)`` (to
float in [0, 1]) and, last, ``ToPureTensor()`` (a ``tv_tensors.Image`` back to a plain tensor).
Here a batch is already a plain uint8 tensor on the loader's device, so ``ToImage``,
``PILToTensor`` and ``ToPureTensor`` have nothing to do: they pass the batch through unchanged
(and say so once, at their first construction in a process), so that the ported lines can stay
as they were. ``ConvertImageDtype(dtype)`` is torchvision's: ``ToDtype(dtype, scale=True)``.
"""
from __future__ import annotations

import logging

import torch

from .color import ToDtype
from .colorfuse import PointwiseTransform, Spec, Step

__all__ = ["ToImage", "PILToTensor", "ToPureTensor", "ConvertImageDtype", "PASSTHROUGH"]

log = logging.getLogger(__name__)
_SAID: set[str] = set()  # the pass-through steps that have said so in this process


class _PassThrough(PointwiseTransform):
    """A torchvision conversion with nothing to do on a batch of tensors: the images (and their
    boxes and masks) pass unchanged, in any dtype. In a ``Compose`` it joins a colour pass as no
    step at all. Shape: (B, C, H, W) → the same tensor."""

    why = "the batch is already a uint8 (B, 3, H, W) tensor on the loader's device"

    def __init__(self) -> None:
        super().__init__()
        name = type(self).__name__
        if name not in _SAID:
            _SAID.add(name)
            log.info("%s(): nothing to do, %s; kept as a no-op so that a torchvision pipeline ports line by line",
                     name, self.why)

    def output_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return dtype

    def transform(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        return images

    def steps(self, params: dict[str, torch.Tensor], spec: Spec) -> tuple[list[Step], Spec]:
        return [], spec


class ToImage(_PassThrough):
    """torchvision v2 ``ToImage()``: a PIL image or array to a ``tv_tensors.Image``. A no-op here."""


class PILToTensor(_PassThrough):
    """torchvision ``PILToTensor()``: a PIL image to a uint8 (C, H, W) tensor. A no-op here."""

    why = "the batch is already a uint8 (B, 3, H, W) tensor, decoded without PIL"


class ToPureTensor(_PassThrough):
    """torchvision v2 ``ToPureTensor()``: ``tv_tensors`` to plain tensors. A no-op here."""

    why = "the batch is already a plain tensor (gpupipe has no tv_tensors)"


class ConvertImageDtype(ToDtype):
    """torchvision ``ConvertImageDtype(dtype=torch.float)``: ``ToDtype(dtype, scale=True)`` (uint8
    → [0, 1] for a float ``dtype``). Shape: (B, C, H, W) → (B, C, H, W) ``dtype``."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(dtype, scale=True)


PASSTHROUGH = ("ToImage", "PILToTensor", "ToPureTensor")  # the names whose step does nothing here
