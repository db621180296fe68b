"""A pipeline of batch transforms; consecutive geometric ones fused into one warp.

Each child ``i`` draws from ``key.child(i)``, and all parameters are sampled up
front by :meth:`Compose.make_params` (children see a zero-stride placeholder of the
shape and dtype that will reach them), so the fused and the sequential paths apply
exactly the same parameters. A child's ``make_params`` must therefore depend only on
its input's shape, dtype and device, never on pixel values.

Why fuse: every bilinear resampling low-pass filters the image a little and every
boundary it crosses costs a pixel of edge; composing a run of homographies into one
matrix per sample resamples once, so the fused result is closer to the ideal
(continuous) transform than the sequential reference, and costs one kernel instead
of several.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .base import AugKey, Transform
from .geometry import GeometricTransform, warp

__all__ = ["Compose"]


def _placeholder(like: torch.Tensor, hw: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """A (B, C, *hw) tensor of ``dtype`` that allocates nothing (zero strides)."""
    return torch.zeros((), dtype=dtype, device=like.device).expand(like.shape[0], like.shape[1], *hw)


class Compose(Transform):
    """Apply ``transforms`` in order. ``fuse=True``: each run of consecutive
    :class:`GeometricTransform` is one matrix per sample and one warp; ``fuse=False``:
    one transform after another (the reference path). Params: the children's, keyed
    ``"{i}.{name}"``.

    Shape: (B, C, H, W) → whatever the last transform returns (float32 once a
    geometric transform has touched a uint8 batch).
    """

    def __init__(self, transforms: Sequence[Transform], *, fuse: bool = True):
        super().__init__()
        for i, t in enumerate(transforms):
            if not isinstance(t, Transform):
                raise TypeError(f"transforms[{i}] should be a gpupipe Transform (got {type(t).__name__})")
        self.transforms = torch.nn.ModuleList(transforms)
        self.fuse = bool(fuse)

    def make_params(self, images: torch.Tensor, key: AugKey) -> dict[str, torch.Tensor]:
        params: dict[str, torch.Tensor] = {}
        hw, dtype = (int(images.shape[-2]), int(images.shape[-1])), images.dtype
        for i, t in enumerate(self.transforms):
            child = t.make_params(_placeholder(images, hw, dtype), key.child(i))
            params.update({f"{i}.{name}": value for name, value in child.items()})
            if isinstance(t, GeometricTransform):
                hw = t.output_size(hw)
                dtype = dtype if dtype.is_floating_point else torch.float32
            # a non-geometric child keeps shape; its output dtype is only known by running it,
            # so later children see the dtype of the input (documented contract above)
        return params

    def _child_params(self, params: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
        prefix = f"{i}."
        return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}

    def apply(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        if not self.fuse:
            for i, t in enumerate(self.transforms):
                images = t.apply(images, self._child_params(params, i))
            return images
        run: list[int] = []
        for i, t in enumerate(self.transforms):
            if isinstance(t, GeometricTransform):
                run.append(i)
                continue
            images = self._apply_run(images, run, params)
            run = []
            images = t.apply(images, self._child_params(params, i))
        return self._apply_run(images, run, params)

    def _apply_run(self, images: torch.Tensor, run: list[int], params: dict[str, torch.Tensor]) -> torch.Tensor:
        """One warp for the geometric transforms ``run`` (indices), sizes tracked through it."""
        if not run:
            return images
        if len(run) == 1:
            return self.transforms[run[0]].apply(images, self._child_params(params, run[0]))
        hw = (int(images.shape[-2]), int(images.shape[-1]))
        matrix = None
        for i in run:
            t = self.transforms[i]
            m = t.matrix(self._child_params(params, i), hw)
            matrix = m if matrix is None else m @ matrix
            hw = t.output_size(hw)
        # zero fill if any member fills with zeros; "border" only where all sample inside
        modes = {self.transforms[i].padding_mode for i in run}
        return warp(images, matrix, hw, "zeros" if "zeros" in modes else "border")
