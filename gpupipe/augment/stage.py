"""The augment stage: a decoded batch → the batch a training step gets (transforms, then a
batch mix). Written once, used by ``GpuLoader`` (in its decode thread), by ``GpuDataModule``
(``loader.augment_in: on_after_batch_transfer``) and by ``gpupipe preview``.
"""
from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch

from gpupipe.augment.base import AugKey, Transform
from gpupipe.core.targets import Targets

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

    Targets: a batch with ``targets`` (boxes, masks) goes through a gpupipe pipeline with
    ``targets=`` and gets the moved targets back on ``batch.targets``. A plain callable cannot
    know where each image's boxes went, so with targets it raises — unless it takes a
    ``targets`` keyword: ``f(images, targets=t)`` (or ``f(images, batch, targets=t)``) returning
    ``(images, targets)``, a :class:`~gpupipe.core.targets.Targets` the callable moved itself.
    A ``mix`` with targets raises torchvision's ``ValueError`` (MixUp and CutMix do not support
    boxes or masks). ``targets``: the kinds the batches will carry (a source's ``targets``), so
    that those errors come at construction rather than at the first batch.
    """

    def __init__(self, transforms: Callable | None, mix: Callable | None, seed: int,
                 channels_last: bool | None = None, targets: Iterable[str] = ()) -> None:
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
        self._takes_targets = transforms is not None and not isinstance(transforms, Transform) \
            and _names_targets(transforms)
        if tuple(targets):
            self._check_targets(", ".join(targets))

    def _check_targets(self, kinds: str) -> None:
        """Raise unless this stage can move targets (``kinds``: what the batches carry)."""
        if self.mix is not None:
            raise ValueError(f"{type(self.mix).__name__}() does not support PIL images, bounding boxes, keypoints and "
                             f"masks (as in torchvision); the batches carry {kinds}: leave the mix out")
        if self.transforms is not None and not isinstance(self.transforms, Transform) and not self._takes_targets:
            raise TypeError(f"augment: {_name(self.transforms)} is a plain callable on the images and cannot move "
                            f"the batches' {kinds} with them; use gpupipe.transforms (each image's boxes and masks "
                            "move with its own parameters), or give it a `targets` keyword: "
                            "f(images, targets=Targets) -> (images, Targets)")

    def to(self, device: torch.device) -> AugmentStage:
        """Module constants (Normalize's mean and std) on ``device``."""
        for part in (self.transforms, self.mix):
            if isinstance(part, torch.nn.Module):
                part.to(device)
        return self

    def __call__(self, batch: Any) -> Any:
        was_channels_last = _is_channels_last(batch.images)
        targets = getattr(batch, "targets", None)
        if targets is not None:
            self._check_targets(", ".join(k for k in ("boxes", "masks") if getattr(targets, k) is not None))
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
        """The images transformed; moved targets are put back on ``batch``."""
        targets = getattr(batch, "targets", None)
        if isinstance(transforms, Transform):
            key = AugKey.for_batch(batch, self.seed)
            if targets is None:
                return transforms(batch.images, key)
            images, batch.targets = transforms(batch.images, key, targets=targets)
            return images
        args = (batch.images, batch) if self._with_batch else (batch.images,)
        if targets is None:
            return transforms(*args)
        out = transforms(*args, targets=targets)
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], Targets)):
            raise TypeError(f"augment: {_name(transforms)} takes `targets`, so it should return (images, Targets), "
                            f"got {type(out).__name__}")
        images, batch.targets = out
        return images


def _is_channels_last(images: Any) -> bool:
    return isinstance(images, torch.Tensor) and images.dim() == 4 and images.shape[1] > 1 \
        and images.is_contiguous(memory_format=torch.channels_last)


def _positional_arity(fn: Callable) -> int:
    """How many named positional arguments ``fn`` takes, ``targets`` aside; 1 if unknown. A
    ``*inputs`` (torchvision v2's ``Compose``) counts as one: it gets the images alone."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "targets" for p in params) or 1


def _names_targets(fn: Callable) -> bool:
    """Whether ``fn`` has an argument named ``targets`` that a keyword can pass (not ``**kwargs``:
    a callable that swallows any keyword does not promise to move boxes)."""
    try:
        param = inspect.signature(fn).parameters.get("targets")
    except (TypeError, ValueError):
        return False
    return param is not None and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)


def _name(fn: Callable) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__
