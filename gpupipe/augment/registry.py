"""The transforms a config may name: a small, lazy, read-only registry.

Values are ``"module:attr"`` strings imported on first use, so reading a config
imports only the transforms it names. Adding a transform is one entry in ``_REGISTRY``.
The containers (``RandomApply``, ``RandomChoice``, ``RandomOrder``) take their
``transforms`` as a list of steps written like the top-level ones.
"""
from __future__ import annotations

import importlib
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

__all__ = ["TRANSFORMS", "MIXES", "CONTAINERS", "transform_class", "build_transform", "DTYPES"]

_GEOMETRY = "gpupipe.augment.geometry"
_COLOR = "gpupipe.augment.color"
_CONTAINER = "gpupipe.augment.containers"
_REGISTRY = {
    **{name: f"{_GEOMETRY}:{name}" for name in (
        "Resize", "CenterCrop", "RandomCrop", "RandomResizedCrop", "RandomAffine", "RandomRotation",
        "RandomHorizontalFlip", "RandomVerticalFlip", "RandomPerspective")},
    **{name: f"{_COLOR}:{name}" for name in (
        "ToDtype", "ToTensor", "Normalize", "RepeatChannels", "Grayscale", "ColorJitter", "RandomGrayscale",
        "GaussianBlur", "RandomErasing")},
    **{name: f"{_CONTAINER}:{name}" for name in ("RandomApply", "RandomChoice", "RandomOrder")},
    **{name: f"gpupipe.augment.autoaugment:{name}" for name in (
        "AutoAugment", "RandAugment", "TrivialAugmentWide", "AugMix")},
    "RandomIoUCrop": "gpupipe.augment.ioucrop:RandomIoUCrop",
    "SanitizeBoundingBoxes": "gpupipe.augment.targets:SanitizeBoundingBoxes",
}
TRANSFORMS: Mapping[str, str] = types.MappingProxyType(_REGISTRY)
MIXES: Mapping[str, str] = types.MappingProxyType({"MixUp": "gpupipe.augment.mix:MixUp",
                                                   "CutMix": "gpupipe.augment.mix:CutMix"})
CONTAINERS = ("RandomApply", "RandomChoice", "RandomOrder")
DTYPES = ("float32", "float16", "bfloat16", "float64", "uint8")


def transform_class(name: str) -> type[nn.Module]:
    """The class registered as ``name`` (imported now): a Transform, or MixUp / CutMix."""
    target = TRANSFORMS.get(name) or MIXES.get(name)
    if target is None:
        raise ValueError(f"unknown transform {name!r} (supported: {', '.join(sorted({**TRANSFORMS, **MIXES}))})")
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def build_transform(name: str, args: Mapping[str, Any]):
    """``name(**args)`` with config-friendly values: dtype names become torch dtypes, and a
    container's ``transforms`` (a list of ``{name: ..., args...}`` or bare names) are built."""
    kwargs = dict(args)
    if name == "ToDtype" and "dtype" in kwargs:
        kwargs["dtype"] = _dtype(kwargs["dtype"])
    if name == "ToTensor" and "dtype" in kwargs:
        raise ValueError("ToTensor takes no arguments (it gives float32 in [0, 1], as torchvision's); "
                         "for another dtype use ToDtype")
    if name in CONTAINERS and "transforms" in kwargs:
        kwargs["transforms"] = [_build_item(item, f"transforms[{i}]") for i, item in enumerate(kwargs["transforms"])]
    return transform_class(name)(**kwargs)


def _dtype(dtype: Any):
    import torch

    if isinstance(dtype, str):
        if dtype.removeprefix("torch.") not in DTYPES:
            raise ValueError(f"dtype: unknown {dtype!r}; choose from {', '.join(DTYPES)}")
        return getattr(torch, dtype.removeprefix("torch."))
    return dtype


def _build_item(item: Any, where: str):
    """One step inside a container: a bare name or a mapping with ``name``."""
    if isinstance(item, str):
        item = {"name": item}
    if not isinstance(item, Mapping) or "name" not in item:
        raise ValueError(f"{where}: expected a mapping with 'name' and the transform's arguments, got {item!r}")
    try:
        return build_transform(item["name"], {k: v for k, v in item.items() if k != "name"})
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where} ({item['name']}): {exc}") from None
