"""torchvision's containers — ``RandomApply``, ``RandomChoice``, ``RandomOrder`` — with
the choice made per sample: each sample draws whether, which, or in what order from
its key, as every other gpupipe transform draws its parameters.

A batch keeps one shape and one dtype, so the transforms a container may skip or
reorder must keep the image size and dtype (``RandomChoice``'s alternatives must all
give the same size and dtype); this is checked before any pixel is touched. Each
transform runs once on the whole batch (``RandomOrder``: once per position of the
order, n² runs for n transforms) and every sample keeps the result its draw names:
a loop over the transforms, never over samples, no host sync.

Keys: the container's draw comes from ``key.child(0)``, transform ``i`` draws from
``key.child(i + 1)`` (``RandomApply``'s transforms, a pipeline, from ``key.child(1)``).

Targets (boxes, masks) follow the branch their image took: each branch moves the whole
batch's targets, as it transforms the whole batch's images, and each sample keeps the
targets of its own draw (:func:`~gpupipe.augment.targets.select_targets`).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .base import AugKey, Transform, TransformList
from .compose import Compose
from .keys import draw
from .targets import Targets, select_targets


def steps_from_config(items) -> list:
    """A container's steps from a config: each a bare name or a mapping with ``name`` and the
    transform's arguments, built by the registry (errors name the step)."""
    from .registry import build_item

    return [build_item(item, f"transforms[{i}]") for i, item in enumerate(items)]

__all__ = ["RandomApply", "RandomChoice", "RandomOrder"]

HW = tuple[int, int]


def _transforms(transforms, name: str) -> list[Transform]:
    """torchvision's check of the ``transforms`` argument, plus: each is a gpupipe Transform."""
    if not isinstance(transforms, (Sequence, nn.ModuleList)) or isinstance(transforms, str):
        raise TypeError(f"{name}: argument transforms should be a sequence of transforms "
                        f"(got {type(transforms).__name__})")
    for i, t in enumerate(transforms):
        if not isinstance(t, Transform):
            raise TypeError(f"{name}: transforms[{i}] should be a gpupipe Transform (got {type(t).__name__})")
    return list(transforms)


def _child_params(params: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def _prefixed(params: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {f"{prefix}{k}": v for k, v in params.items()}


def _merge(chosen: torch.Tensor, new: dict[str, torch.Tensor], old: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``new`` parameters for the samples ``chosen`` (B,), ``old`` for the others, where a
    transform settled them by the targets (every parameter is per sample: (B, ...))."""
    out = dict(old)
    for k, v in new.items():
        if k in old and old[k] is not v:
            out[k] = torch.where(chosen.to(v.device).reshape(-1, *[1] * (v.ndim - 1)), v, old[k])
        else:
            out[k] = v
    return out


def _select(chosen: torch.Tensor, out: torch.Tensor, other: torch.Tensor, name: str) -> torch.Tensor:
    """``out`` where ``chosen`` (B,), else ``other``; both must have one shape."""
    if out.shape != other.shape:
        raise ValueError(f"{name}: its transforms give {tuple(out.shape)} and {tuple(other.shape)}; the samples "
                         "of a batch keep one size, so put size-changing transforms outside it")
    return torch.where(chosen.to(out.device).reshape(-1, 1, 1, 1), out, other)


def _keeps_dtype(t: Transform, dtype: torch.dtype, name: str, what: str) -> torch.dtype:
    """``dtype``, or raise if ``t`` changes it (then it may not be skipped or reordered)."""
    out = t.output_dtype(dtype)
    if out != dtype:
        raise TypeError(f"{name}: with {what}, {dtype} becomes {out}; the samples of a batch keep one dtype, "
                        f"so put the cast outside {name}")
    return dtype


def _keeps(t: Transform, dtype: torch.dtype, hw: HW, name: str, what: str) -> None:
    """Raise unless ``t`` keeps ``dtype`` and size ``hw`` (so that it may be skipped or reordered)."""
    _keeps_dtype(t, dtype, name, what)
    if t.output_size(hw) != hw:
        raise ValueError(f"{name}: with {what}, the image size {hw} becomes {t.output_size(hw)}; the samples of "
                         f"a batch keep one size, so put size-changing transforms outside {name}")


class RandomApply(Transform):
    """torchvision's ``RandomApply(transforms, p)``: each sample, with probability ``p``,
    goes through ``transforms`` (a fused :class:`Compose`), else passes unchanged.
    Params: ``apply`` (B,) bool and the pipeline's, prefixed ``"t."``."""

    @classmethod
    def from_config(cls, transforms=(), **args):
        """Its ``transforms`` as a config writes them: steps like the top-level ones."""
        return cls(steps_from_config(transforms), **args)

    def __init__(self, transforms, p: float = 0.5) -> None:
        super().__init__()
        self.pipeline = Compose(_transforms(transforms, "RandomApply"))
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError("`p` should be a floating point value in the interval [0.0, 1.0].")
        self.p = float(p)

    @property
    def transforms(self) -> TransformList:
        return self.pipeline.transforms

    def output_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return _keeps_dtype(self.pipeline, dtype, "RandomApply", "its transforms")

    def make_params(self, images: torch.Tensor, key: AugKey) -> dict[str, torch.Tensor]:
        hw = (int(images.shape[-2]), int(images.shape[-1]))
        _keeps(self.pipeline, images.dtype, hw, "RandomApply", "its transforms")
        inner = self.pipeline.make_params(images, key.child(1))
        return {"apply": draw(key, 0)[:, 0] < self.p, **{f"t.{k}": v for k, v in inner.items()}}

    def transform(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        out = self.pipeline.apply(images, _child_params(params, "t."))
        return _select(params["apply"], out, images, "RandomApply")

    def apply_reference(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        out = self.pipeline.apply_reference(images, _child_params(params, "t."))
        return _select(params["apply"], out, images, "RandomApply")

    def apply_targets(self, targets: Targets, params: dict[str, torch.Tensor], in_hw: HW) -> Targets:
        return self.resolve_targets(targets, params, in_hw)[1]

    def resolve_targets(self, targets: Targets, params: dict[str, torch.Tensor],
                        in_hw: HW) -> tuple[dict[str, torch.Tensor], Targets]:
        inner, moved = self.pipeline.resolve_targets(targets, _child_params(params, "t."), in_hw)
        return {**params, **_prefixed(inner, "t.")}, select_targets(params["apply"], moved, targets)


class RandomChoice(Transform):
    """torchvision's ``RandomChoice(transforms, p)``: each sample goes through one of
    ``transforms``, transform ``i`` with probability ``p[i] / sum(p)`` (equal without
    ``p``). The alternatives must give one size and dtype. Params: ``choice`` (B,)
    int64 and transform ``i``'s, prefixed ``"{i}."``."""

    @classmethod
    def from_config(cls, transforms=(), **args):
        """Its ``transforms`` as a config writes them: steps like the top-level ones."""
        return cls(steps_from_config(transforms), **args)

    def __init__(self, transforms, p: Sequence[float] | None = None) -> None:
        super().__init__()
        self.transforms = TransformList(_transforms(transforms, "RandomChoice"))
        if p is None:
            p = [1.0] * len(self.transforms)
        elif not isinstance(p, Sequence):
            raise TypeError(f"RandomChoice: argument p should be a sequence (got {type(p).__name__})")
        elif len(p) != len(self.transforms):
            raise ValueError(f"Length of p doesn't match the number of transforms: "
                             f"{len(p)} != {len(self.transforms)}")
        if not self.transforms or any(float(v) < 0 for v in p) or not sum(p) > 0:
            raise ValueError(f"RandomChoice needs at least one transform and non-negative p with a positive sum "
                             f"(got {len(self.transforms)} transforms, p={list(p)})")
        total = float(sum(p))
        self.p = [float(v) / total for v in p]

    def output_dtype(self, dtype: torch.dtype) -> torch.dtype:
        outs = [t.output_dtype(dtype) for t in self.transforms]
        if len(set(outs)) > 1:
            raise TypeError(f"RandomChoice: its transforms give different dtypes {[str(o) for o in outs]} for "
                            f"{dtype}; the samples of a batch keep one dtype")
        return outs[0]

    def output_size(self, in_hw: HW) -> HW:
        sizes = {t.output_size(in_hw) for t in self.transforms}
        if len(sizes) > 1:
            raise ValueError(f"RandomChoice: its transforms give different sizes {sorted(sizes)} for {in_hw}; "
                             "the samples of a batch keep one size")
        return sizes.pop()

    def make_params(self, images: torch.Tensor, key: AugKey) -> dict[str, torch.Tensor]:
        self.output_size((int(images.shape[-2]), int(images.shape[-1])))
        u = draw(key, 0)[:, 0]
        choice = torch.zeros_like(u, dtype=torch.int64)
        edge = 0.0
        for prob in self.p[:-1]:  # the index whose cumulative interval holds u
            edge += prob
            choice += (u >= edge).to(torch.int64)
        params = {"choice": choice}
        for i, t in enumerate(self.transforms):
            params.update({f"{i}.{k}": v for k, v in t.make_params(images, key.child(i + 1)).items()})
        return params

    def _run(self, images: torch.Tensor, params: dict[str, torch.Tensor], reference: bool) -> torch.Tensor:
        out = images  # replaced by the first transform's result (there is at least one)
        for i, t in enumerate(self.transforms):
            sub = _child_params(params, f"{i}.")
            result = t.apply_reference(images, sub) if reference else t.apply(images, sub)
            out = result if i == 0 else _select(params["choice"] == i, result, out, "RandomChoice")
        return out

    def transform(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._run(images, params, reference=False)

    def apply_reference(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._run(images, params, reference=True)

    def apply_targets(self, targets: Targets, params: dict[str, torch.Tensor], in_hw: HW) -> Targets:
        return self.resolve_targets(targets, params, in_hw)[1]

    def resolve_targets(self, targets: Targets, params: dict[str, torch.Tensor],
                        in_hw: HW) -> tuple[dict[str, torch.Tensor], Targets]:
        params, out = dict(params), targets
        for i, t in enumerate(self.transforms):
            sub, moved = t.resolve_targets(targets, _child_params(params, f"{i}."), in_hw)
            params.update(_prefixed(sub, f"{i}."))
            out = moved if i == 0 else select_targets(params["choice"] == i, moved, out)
        return params, out


class RandomOrder(Transform):
    """torchvision's ``RandomOrder(transforms)``: each sample goes through all of
    ``transforms`` in its own uniformly drawn order. Each must keep the size and dtype.
    Params: ``order`` (B, n) int64 (position → transform index) and transform ``i``'s,
    prefixed ``"{i}."`` (drawn once, used at whatever position the order puts it)."""

    @classmethod
    def from_config(cls, transforms=(), **args):
        """Its ``transforms`` as a config writes them: steps like the top-level ones."""
        return cls(steps_from_config(transforms), **args)

    def __init__(self, transforms) -> None:
        super().__init__()
        self.transforms = TransformList(_transforms(transforms, "RandomOrder"))

    def output_dtype(self, dtype: torch.dtype) -> torch.dtype:
        for t in self.transforms:
            _keeps_dtype(t, dtype, "RandomOrder", type(t).__name__)
        return dtype

    def make_params(self, images: torch.Tensor, key: AugKey) -> dict[str, torch.Tensor]:
        hw = (int(images.shape[-2]), int(images.shape[-1]))
        params: dict[str, torch.Tensor] = {}
        for i, t in enumerate(self.transforms):
            _keeps(t, images.dtype, hw, "RandomOrder", type(t).__name__)
            params.update({f"{i}.{k}": v for k, v in t.make_params(images, key.child(i + 1)).items()})
        n = len(self.transforms)
        params["order"] = draw(key, 0, max(n, 1)).argsort(dim=1)[:, :n]
        return params

    def _run(self, images: torch.Tensor, params: dict[str, torch.Tensor], reference: bool) -> torch.Tensor:
        order = params["order"]
        subs = [_child_params(params, f"{i}.") for i in range(len(self.transforms))]
        for slot in range(order.shape[1]):
            out = images
            for i, t in enumerate(self.transforms):
                result = t.apply_reference(images, subs[i]) if reference else t.apply(images, subs[i])
                out = _select(order[:, slot] == i, result, out, "RandomOrder")
            images = out
        return images

    def transform(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._run(images, params, reference=False)

    def apply_reference(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._run(images, params, reference=True)

    def apply_targets(self, targets: Targets, params: dict[str, torch.Tensor], in_hw: HW) -> Targets:
        return self.resolve_targets(targets, params, in_hw)[1]

    def resolve_targets(self, targets: Targets, params: dict[str, torch.Tensor],
                        in_hw: HW) -> tuple[dict[str, torch.Tensor], Targets]:
        """Slot by slot, as the images: each transform moves the targets as they stand, each
        sample keeps those of the transform its order puts there (and that transform's
        parameters, where it settles them by the targets: the slot it runs at is the sample's)."""
        order = params["order"]
        subs = [_child_params(params, f"{i}.") for i in range(len(self.transforms))]
        for slot in range(order.shape[1]):
            out = targets
            for i, t in enumerate(self.transforms):
                here = order[:, slot] == i
                sub, moved = t.resolve_targets(targets, subs[i], in_hw)
                subs[i] = _merge(here, sub, subs[i])
                out = select_targets(here, moved, out)
            targets = out
        params = dict(params)
        for i, sub in enumerate(subs):
            params.update(_prefixed(sub, f"{i}."))
        return params, targets
