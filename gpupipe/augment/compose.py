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

What fuses (:func:`_runs`), so that the fused result is the sequential one within
interpolation rounding:

* only a transform that IS its matrix warped at its input size
  (:meth:`~gpupipe.augment.warp.GeometricTransform.fuses`): not an antialiased reduction
  (``Resize`` / ``RandomResizedCrop`` with ``antialias=True`` that scale down: a low-pass
  filter wider than a bilinear tap, which no single ``grid_sample`` does), not bicubic
  with antialias, not a nearest ``Resize``; those run alone, as torchvision's
  ``F.interpolate``, and end the run;
* a transform that reads outside its input (a rotation, an affine, a perspective, a
  padded crop) joins only a run of transforms that each map their whole input onto their
  whole output (``Resize``, flips): after a crop or another fill, the composed warp would
  read the original image where the sequential path shows the fill;
* interpolations and fills must agree, as before.

A run of one ``Resize`` / ``RandomResizedCrop`` runs as torchvision's ``F.interpolate``
(``warps_alone``), whatever the sizes. The tolerances measured against torchvision, each op
alone and fused chains: tests/augment/test_tv_pixels.py.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import AugKey, Transform, TransformList
from .colorfuse import PointwiseTransform, Spec, run_steps
from .geometry import GeometricTransform, warp
from .targets import Targets

__all__ = ["Compose"]

HW = tuple[int, int]


def _placeholder(like: torch.Tensor, hw: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """A (B, C, *hw) tensor of ``dtype`` that allocates nothing (zero strides)."""
    return torch.zeros((), dtype=dtype, device=like.device).expand(like.shape[0], like.shape[1], *hw)


class Compose(Transform):
    """Apply ``transforms`` in order. ``fuse=True``: each run of consecutive
    :class:`GeometricTransform` is one matrix per sample and one warp, each run of
    consecutive :class:`PointwiseTransform` (ToDtype, ColorJitter, RandomGrayscale,
    RepeatChannels, Normalize) one fused colour pass; ``fuse=False``: one transform
    after another, each by its ``apply_reference`` (the reference path). ``compile``:
    colour passes through ``torch.compile`` (opt-in, never required; see
    :func:`~gpupipe.augment.colorfuse.run_steps`). Params: the children's, keyed
    ``"{i}.{name}"``.

    Dtypes follow torchvision v2: each child keeps its input's dtype and value range
    (uint8 0-255 stays uint8 through geometry and colour) except the casts. The
    dtype reaching each child is known from the input's (:meth:`output_dtype`), so a
    pipeline that cannot work raises before any pixel is touched: at construction when
    ``input_dtype`` is given (``torch.uint8`` is what a :class:`~gpupipe.GpuLoader`
    decodes), else at the first call. Between a warp and a colour pass the fused path
    keeps the warped uint8 values in a float32 buffer (rounded, as the uint8 result
    would be), and the colour pass reads them as uint8.

    Shape: (B, C, H, W) → whatever the last transform returns.
    """

    def __init__(self, transforms: Sequence[Transform], *, fuse: bool = True, compile: bool = False,
                 input_dtype: torch.dtype | None = None):
        super().__init__()
        for i, t in enumerate(transforms):
            if not isinstance(t, Transform):
                raise TypeError(f"transforms[{i}] should be a gpupipe Transform (got {type(t).__name__})")
        self.transforms = TransformList(transforms)
        self.fuse = bool(fuse)
        self.compile_colour = bool(compile)  # not ``self.compile``: that would hide nn.Module.compile()
        if input_dtype is not None:
            self.output_dtype(input_dtype)

    def output_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype this pipeline returns for ``dtype`` input; raises naming the first
        child that cannot take what reaches it (and the step to put before it)."""
        for i, t in enumerate(self.transforms):
            try:
                dtype = t.output_dtype(dtype)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"transforms[{i}] ({type(t).__name__}): {exc}") from None
        return dtype

    def make_params(self, images: torch.Tensor, key: AugKey) -> dict[str, torch.Tensor]:
        self.output_dtype(images.dtype)  # a pipeline that cannot work raises before any work
        params: dict[str, torch.Tensor] = {}
        hw, dtype = (int(images.shape[-2]), int(images.shape[-1])), images.dtype
        for i, t in enumerate(self.transforms):
            child = t.make_params(_placeholder(images, hw, dtype), key.child(i))
            params.update({f"{i}.{name}": value for name, value in child.items()})
            hw, dtype = t.output_size(hw), t.output_dtype(dtype)
        return params

    def output_size(self, in_hw: tuple[int, int]) -> tuple[int, int]:
        for t in self.transforms:
            in_hw = t.output_size(in_hw)
        return in_hw

    def _child_params(self, params: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
        prefix = f"{i}."
        return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}

    def transform(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        self.output_dtype(images.dtype)  # a pipeline that cannot work raises before any work
        if not self.fuse:
            return self.apply_reference(images, params)
        source, runs = images, _runs(self.transforms, (int(images.shape[-2]), int(images.shape[-1])))
        holds = images.dtype  # the dtype whose values ``images`` holds (a float32 buffer may hold uint8 values)
        for n, (kind, run) in enumerate(runs):
            if kind == "pointwise":
                images = self._apply_pointwise(images, holds, run, params, owned=not _shares_memory(images, source))
                holds = images.dtype
                continue
            images = images.to(holds)
            if kind == "geometric":
                carry = n + 1 < len(runs) and runs[n + 1][0] == "pointwise"
                images = self._apply_warp(images, run, params, keep_float=carry)
            else:
                images = self.transforms[run[0]].apply(images, self._child_params(params, run[0]))
                holds = images.dtype
        return images.to(holds)

    def apply_targets(self, targets: Targets, params: dict[str, torch.Tensor], in_hw: HW) -> Targets:
        """Each child's ``apply_targets`` in turn, fused or not: torchvision's sequential rule
        (a box is re-enclosed and clamped after every op, a mask resampled nearest by every
        op), which a fused run's image follows within its interpolation rounding."""
        return self.resolve_targets(targets, params, in_hw)[1]

    def resolve_targets(self, targets: Targets, params: dict[str, torch.Tensor],
                        in_hw: HW) -> tuple[dict[str, torch.Tensor], Targets]:
        """Each child's ``resolve_targets`` on the targets as they reach it (see
        :meth:`apply_targets`): the parameters a child settles by its boxes join ``params``."""
        params = dict(params)
        for i, t in enumerate(self.transforms):
            child, targets = t.resolve_targets(targets, self._child_params(params, i), in_hw)
            params.update({f"{i}.{name}": value for name, value in child.items()})
            in_hw = t.output_size(in_hw)
        return params, targets

    def apply_reference(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """One child after another, each by its ``apply_reference``."""
        self.output_dtype(images.dtype)
        for i, t in enumerate(self.transforms):
            images = t.apply_reference(images, self._child_params(params, i))
        return images

    def _apply_pointwise(self, images: torch.Tensor, holds: torch.dtype, run: list[int],
                         params: dict[str, torch.Tensor], owned: bool) -> torch.Tensor:
        """One fused colour pass for the pointwise transforms ``run`` (indices) on
        ``images`` holding values of dtype ``holds``."""
        spec = Spec(holds, int(images.shape[1]), images.device)
        steps = []
        for i in run:
            t = self.transforms[i]
            assert isinstance(t, PointwiseTransform), "_runs puts only these in a pointwise run"
            more, spec = t.steps(self._child_params(params, i), spec)
            steps += more
        return run_steps(images, steps, spec.dtype, owned=owned, compile=self.compile_colour)

    def _apply_warp(self, images: torch.Tensor, run: list[int], params: dict[str, torch.Tensor],
                    keep_float: bool = False) -> torch.Tensor:
        """One warp for the geometric transforms ``run`` (indices), sizes tracked through it.
        ``keep_float``: an integer batch comes back as rounded float32 (see :func:`warp`)."""
        hw = (int(images.shape[-2]), int(images.shape[-1]))
        matrix: torch.Tensor | None = None
        members: list[tuple[GeometricTransform, HW]] = []
        for i in run:
            t = self.transforms[i]
            assert isinstance(t, GeometricTransform), "_runs puts only these in a geometric run"
            m = t.matrix(self._child_params(params, i), hw)
            matrix = m if matrix is None else m @ matrix
            members.append((t, hw))
            hw = t.output_size(hw)
        assert matrix is not None, "a run is never empty"
        padding, fill, interpolation = _sampling(members)
        return warp(images, matrix, hw, padding, interpolation, fill, all(t.affine for t, _ in members),
                    keep_float=keep_float)



def _kind(t: Transform, hw: HW) -> str | None:
    if isinstance(t, GeometricTransform) and t.fuses(hw):
        return "geometric"
    return "pointwise" if isinstance(t, PointwiseTransform) and t.fusable else None


def _sampling(members: list[tuple[GeometricTransform, HW]]) -> tuple[str, tuple[float, ...] | None, str]:
    """(padding mode, fill, interpolation) of one warp for ``members`` (each with its input
    size): the mode of the one that reads outside its input ("border" if none does: it only
    guards the rounding at the edge), the interpolation of those that interpolate (bilinear
    if none)."""
    outside = [(t.warp_padding, t.fill) for t, hw in members if t.reads_outside(hw)]
    interpolations = [t.interpolation for t, _ in members if t.interpolation is not None]
    padding, fill = outside[0] if outside else ("border", None)
    return padding, fill, interpolations[0] if interpolations else "bilinear"


def _joins(members: list[tuple[GeometricTransform, HW]], t: GeometricTransform, hw: HW) -> bool:
    """Whether ``t`` (on an ``hw`` input) can share one warp with ``members``: if it reads
    outside its input, every member maps its whole input onto its whole output (so outside
    ``t``'s input is outside the original image too); the same interpolation where both
    interpolate."""
    if t.reads_outside(hw) and not all(m.covers_frame and not m.reads_outside(mhw) for m, mhw in members):
        return False
    interpolation = _sampling(members)[2]
    if t.interpolation is not None and any(m.interpolation is not None for m, _ in members):
        return t.interpolation == interpolation
    return True


def _runs(transforms, hw: HW) -> list[tuple[str | None, list[int]]]:
    """Consecutive geometric / pointwise transforms grouped: [(kind, indices)] for an
    ``hw`` input; any other transform is a run of its own, a geometric one that cannot
    share the run's warp (:func:`_joins`) starts the next run, and a geometric run of one
    transform whose own path is not a warp (``warps_alone``) runs that path."""
    runs: list[tuple[str | None, list[int]]] = []
    sizes: list[HW] = []
    for i, t in enumerate(transforms):
        sizes.append(hw)
        kind = _kind(t, hw)
        same = bool(runs) and kind is not None and runs[-1][0] == kind
        if same and kind == "geometric":
            same = _joins([(transforms[j], sizes[j]) for j in runs[-1][1]], t, hw)
        if same:
            runs[-1][1].append(i)
        else:
            runs.append((kind, [i]))
        hw = t.output_size(hw)
    return [(None if kind == "geometric" and len(run) == 1 and not transforms[run[0]].warps_alone else kind, run)
            for kind, run in runs]


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
