"""What every batch transform shares: the key its randomness comes from, and the
``make_params`` / ``apply`` split (parameters are sampled, returned, then applied;
nothing is stored on ``self`` during ``forward``).
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, cast, overload

import torch
from torch import nn

from gpupipe.core.errors import UnknownKeywordError, suggest
from gpupipe.core.targets import Targets

__all__ = ["AugKey", "Transform", "TransformList", "check_probability", "check_dtype", "check_targets",
           "naming_keywords"]

_T = TypeVar("_T", bound="Transform")


@dataclass(frozen=True)
class AugKey:
    """Where a batch's randomness comes from: (seed, epoch, sample ids), plus the tag
    of the transform in its pipeline. ``sample_ids`` (B,) int64 lives on the
    images' device; the same sample gets the same parameters in any batch."""

    seed: int
    epoch: int
    sample_ids: torch.Tensor
    tag: int = 0

    def child(self, tag: int) -> AugKey:
        """The key for the transform at position ``tag`` of a pipeline."""
        return AugKey(self.seed, self.epoch, self.sample_ids, self.tag * 1_000_003 + tag + 1)

    @classmethod
    def for_batch(cls, batch, seed: int = 0) -> AugKey:
        """The key of a :class:`~gpupipe.decode.DecodedBatch`."""
        return cls(seed=seed, epoch=batch.epoch, sample_ids=batch.sample_ids.to(batch.images.device))


class Transform(nn.Module):
    """A batch transform. Subclasses implement ``make_params`` and ``transform``
    (torchvision v2's names); ``apply(images, params)`` runs ``transform``.

    ``apply(fn)`` is still ``nn.Module.apply``: a model holding transforms can call
    ``model.apply(init_weights)``, which calls ``apply(fn)`` on every submodule.

    Shape: (B, C, H, W) in, (B, C, h, w) out; dtypes as each subclass documents.

    Targets (boxes, masks: :mod:`gpupipe.augment.targets`) move through
    ``apply_targets(targets, params, in_hw)`` with the parameters the images got; a
    transform that leaves them alone (colour, blur, erasing) says so with
    ``keeps_targets = True``, and one that neither moves nor keeps them raises.
    """

    keeps_targets = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        naming_keywords(cls)

    @classmethod
    def from_config(cls, **args: Any) -> Transform:
        """The transform from a config's arguments (YAML values: a name where Python has an
        object): the constructor's, unless a transform says otherwise (``ToDtype`` reads dtype
        names, the containers build their steps). :func:`config_keys` names what it takes."""
        return cls(**args)

    def make_params(self, images: torch.Tensor, key: AugKey) -> dict[str, torch.Tensor]:
        return {}

    def output_size(self, in_hw: tuple[int, int]) -> tuple[int, int]:
        """The (h, w) this transform returns for an ``in_hw`` input (most keep it)."""
        return in_hw

    def output_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype this transform returns for ``dtype`` input (torchvision v2's rule: the
        input's, except for the casts); raises ``TypeError`` for a dtype it does not take.
        ``Compose`` walks a pipeline with it before running it."""
        return check_dtype(dtype, type(self).__name__)

    @overload
    def apply(self: _T, fn: Callable[[nn.Module], None]) -> _T: ...

    @overload
    def apply(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor: ...

    def apply(self, images, params=None):
        """``apply(images, params)``: :meth:`transform`; ``apply(fn)``: ``nn.Module.apply``."""
        if params is None:
            return super().apply(images)
        return self.transform(images, params)

    def transform(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """The images with the parameters ``params`` (from :meth:`make_params`) applied."""
        raise NotImplementedError

    def apply_reference(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """The plain definition ``Compose(fuse=False)`` runs (and tests compare against);
        ``apply`` unless a transform's ``transform`` is itself an optimised path."""
        return self.apply(images, params)

    def apply_targets(self, targets: Targets, params: dict[str, torch.Tensor], in_hw: tuple[int, int]) -> Targets:
        """``targets`` of (B, C, *in_hw) images moved as :meth:`apply` moves the images with
        ``params``; the same targets where this transform ``keeps_targets``."""
        if self.keeps_targets:
            return targets
        raise NotImplementedError(f"{type(self).__name__} does not move boxes or masks yet; "
                                  "call it on the images alone (without targets=)")

    def resolve_targets(self, targets: Targets, params: dict[str, torch.Tensor],
                        in_hw: tuple[int, int]) -> tuple[dict[str, torch.Tensor], Targets]:
        """``(params, targets moved)``: ``params`` completed where a draw depends on the boxes
        that reach this transform (``RandomIoUCrop`` picks its crop by them; ``make_params`` sees
        only a placeholder of the images), and the targets moved with them. Most transforms draw
        from the images' shape alone: ``params`` unchanged, :meth:`apply_targets`."""
        return params, self.apply_targets(targets, params, in_hw)

    def forward(self, images: torch.Tensor, key: AugKey, targets: Targets | None = None):
        """The transformed images; with ``targets`` (:class:`~gpupipe.augment.targets.Targets`
        of these images), ``(images, targets)`` both moved with the same parameters."""
        params = self.make_params(images, key)
        if targets is None:
            return self.apply(images, params)
        in_hw = (int(images.shape[-2]), int(images.shape[-1]))
        check_targets(targets, images)
        params, moved = self.resolve_targets(targets, params, in_hw)  # targets first: they may settle params
        return self.apply(images, params), moved


def naming_keywords(cls: type) -> None:
    """``cls.__init__`` (its own, if it has one), made to raise for a keyword it does not take an
    :class:`~gpupipe.core.errors.UnknownKeywordError` (a ``TypeError``, as Python's) naming the close
    match, as YAML does for a key: ``ColorJitter(brigthness=0.4)`` → ``ColorJitter() got an unexpected
    keyword argument 'brigthness'; did you mean 'brightness'?``. Python's own message names no match.
    The signature is kept (``functools.wraps``: ``inspect.signature`` and ``help`` show the real one)."""
    init = cls.__dict__.get("__init__")
    if init is None or getattr(init, "names_keywords", False):
        return

    @functools.wraps(init)
    def checked(self, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except TypeError as exc:
            taken = _keywords_taken(init)
            unknown = None if taken is None else next((k for k in kwargs if k not in taken), None)
            if taken is None or unknown is None:
                raise  # a TypeError of the body, or positional arguments: Python's message says it
            raise UnknownKeywordError(f"{cls.__name__}() got an unexpected keyword argument {unknown!r}"
                                      f"{suggest(unknown, taken)} (it takes: {', '.join(taken) or 'none'})"
                                      ) from exc

    checked.names_keywords = True  # type: ignore[attr-defined]
    cls.__init__ = checked  # type: ignore[misc]


def _keywords_taken(init: Callable) -> list[str] | None:
    """The keyword names ``init`` takes (``self`` left out); None when it takes ``**kwargs``."""
    taken = []
    for name, p in inspect.signature(init).parameters.items():
        if p.kind is p.VAR_KEYWORD:
            return None
        if name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            taken.append(name)
    return taken


class TransformList(nn.ModuleList):
    """An ``nn.ModuleList`` of :class:`Transform` (registered as children as usual), typed
    as such when iterated or indexed: the containers build it from checked transforms."""

    def __init__(self, transforms: Iterable[Transform] = ()) -> None:
        super().__init__(transforms)

    def __iter__(self) -> Iterator[Transform]:
        return cast(Iterator[Transform], super().__iter__())  # only transforms go in

    @overload
    def __getitem__(self, idx: slice) -> TransformList: ...

    @overload
    def __getitem__(self, idx: int) -> Transform: ...

    def __getitem__(self, idx: int | slice) -> Transform | TransformList:
        return cast("Transform | TransformList", super().__getitem__(idx))  # only transforms go in


def check_probability(p: float, name: str = "p") -> float:
    """torchvision's message for a probability outside [0, 1]."""
    if not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"`{name}` should be a floating point value in the interval [0.0, 1.0] (got {p}).")
    return float(p)


def check_dtype(dtype: torch.dtype, name: str) -> torch.dtype:
    """Images are uint8 (0-255) or float (0-1), as torchvision's; anything else raises."""
    if dtype != torch.uint8 and not dtype.is_floating_point:
        raise TypeError(f"{name} takes uint8 (0-255) or float (0-1) images, got {dtype}; "
                        f"convert with ToDtype(torch.float32, scale=True) first")
    return dtype


def check_targets(targets: Targets, images: torch.Tensor) -> None:
    """Raise unless ``targets`` belong to the (B, C, H, W) ``images``: B counts, (B, H, W) masks."""
    if not isinstance(targets, Targets):
        raise TypeError(f"targets should be gpupipe.augment.targets.Targets, got {type(targets).__name__}; "
                        "build them with pack_targets(list_of_dicts)")
    B, H, W = int(images.shape[0]), int(images.shape[-2]), int(images.shape[-1])
    if targets.boxes is not None and targets.boxes.counts.shape[0] != B:
        raise ValueError(f"boxes have counts for {targets.boxes.counts.shape[0]} images, the batch has {B}")
    if targets.masks is not None and tuple(targets.masks.shape) != (B, H, W):
        raise ValueError(f"masks should be (B, H, W) = {(B, H, W)} for these images, got {tuple(targets.masks.shape)}")


def config_keys(cls: type) -> set[str]:
    """The arguments a config may give the transform class ``cls``: those of its own
    ``from_config`` where it declares them, else its constructor's."""
    built = getattr(cls, "from_config", None)
    params = inspect.signature(built).parameters if built is not None else {}
    if not params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        params = inspect.signature(cls).parameters
    return {p for p in params if p != "self" and params[p].kind is not inspect.Parameter.VAR_KEYWORD}
