"""The augment stage: a decoded batch → the batch a training step gets (transforms, then a
batch mix). Written once, used by ``GpuLoader`` (in its decode thread), by ``GpuDataModule``
(``loader.augment_in: on_after_batch_transfer``) and by ``gpupipe preview``.
"""
from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch

from gpupipe.augment.base import AugKey, Transform

__all__ = ["AugmentStage"]

log = logging.getLogger(__name__)

_MIX_TAG = 7_919  # the batch mix draws from its own child key, apart from the pipeline's transforms


class AugmentStage:
    """``transforms`` then ``mix`` over a :class:`~gpupipe.decode.DecodedBatch`, keyed by
    (``seed``, the batch's epoch, its sample ids).

    ``transforms``: a ``gpupipe.transforms`` pipeline (called with the batch's key), or any
    callable on the image batch — ``f(images)`` as torchvision users write it, or
    ``f(images, batch)`` to see labels and sample ids too. ``mix``: ``MixUp`` / ``CutMix``
    (labels become (B, num_classes) float).

    Shape: images (B, 3, H, W) uint8 → what the transforms make; labels (B,) int64 →
    (B, num_classes) float with a mix.

    Layout: a channels_last batch (what every decoder gives) comes out channels_last, as the
    docs promise, where that is cheap: ``channels_last=None`` (default) restores it on a GPU
    (one device copy where an op returned the plain layout, as ``grid_sample`` does) and leaves
    the CPU path as the ops return it — there the geometric ops return the plain (B, C, H, W)
    layout on purpose (``grid_sample`` reads it ~25% faster) and a copy back would cost a
    quarter of the simple set's time. ``True``: restore it on any device; ``False``: never.
    """

    def __init__(self, transforms: Callable | None, mix: Callable | None, seed: int,
                 channels_last: bool | None = None) -> None:
        if isinstance(transforms, Transform):
            transforms.output_dtype(torch.uint8)  # decoders give uint8: a pipeline that cannot take it raises now
        if type(transforms).__module__.split(".")[0] == "torchvision":
            log.warning("augment: a torchvision %s on a whole batch draws one set of random parameters for all "
                        "its images (one crop, one flip for the batch); gpupipe.transforms.from_torchvision(...) "
                        "gives each image its own", type(transforms).__name__)
        self.transforms, self.mix, self.seed = transforms, mix, seed
        self.channels_last = channels_last
        self._with_batch = transforms is not None and not isinstance(transforms, Transform) \
            and _positional_arity(transforms) >= 2

    def to(self, device: torch.device) -> AugmentStage:
        """Module constants (Normalize's mean and std) on ``device``."""
        for part in (self.transforms, self.mix):
            if isinstance(part, torch.nn.Module):
                part.to(device)
        return self

    def __call__(self, batch: Any) -> Any:
        was_channels_last = _is_channels_last(batch.images)
        if self.transforms is not None:
            batch.images = self._transform(self.transforms, batch)
        if self.mix is not None:
            batch.images, batch.labels = self.mix(batch.images, batch.labels,
                                                  AugKey.for_batch(batch, self.seed).child(_MIX_TAG))
        if was_channels_last:
            batch.images = self._layout(batch.images)
        return batch

    def _layout(self, images: Any) -> Any:
        """``images`` channels_last again (see the class's Layout), or as they are."""
        if not isinstance(images, torch.Tensor) or images.dim() != 4 or images.shape[1] < 2 \
                or images.is_contiguous(memory_format=torch.channels_last):
            return images
        wanted = self.channels_last if self.channels_last is not None else images.device.type == "cuda"
        return images.contiguous(memory_format=torch.channels_last) if wanted else images

    def _transform(self, transforms: Callable, batch) -> torch.Tensor:
        if isinstance(transforms, Transform):
            return transforms(batch.images, AugKey.for_batch(batch, self.seed))
        if self._with_batch:
            return transforms(batch.images, batch)
        return transforms(batch.images)


def _is_channels_last(images: Any) -> bool:
    return isinstance(images, torch.Tensor) and images.dim() == 4 and images.shape[1] > 1 \
        and images.is_contiguous(memory_format=torch.channels_last)


def _positional_arity(fn: Callable) -> int:
    """How many named positional arguments ``fn`` takes; 1 if unknown. A ``*inputs``
    (torchvision v2's ``Compose``) counts as one: it gets the images alone."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params) or 1
