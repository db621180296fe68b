"""The transforms a config may name: a small, lazy, read-only registry.

Values are ``"module:attr"`` strings imported on first use, so reading a config
imports only the transforms it names. Adding a transform is one entry in ``_REGISTRY``
(:func:`register_transform` from outside the package); how a config's arguments become the
transform is the class's own ``from_config`` (``ToDtype`` reads dtype names; the containers
``RandomApply``, ``RandomChoice``, ``RandomOrder`` build their ``transforms``, steps written like
the top-level ones).
"""
from __future__ import annotations

import importlib
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

__all__ = ["TRANSFORMS", "MIXES", "transform_class", "build_transform", "register_transform", "build_item"]

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


def transform_class(name: str) -> type[nn.Module]:
    """The class registered as ``name`` (imported now): a Transform, or MixUp / CutMix."""
    target = TRANSFORMS.get(name) or MIXES.get(name)
    if target is None:
        raise ValueError(f"unknown transform {name!r} (supported: {', '.join(sorted({**TRANSFORMS, **MIXES}))})")
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def build_transform(name: str, args: Mapping[str, Any]):
    """The transform registered as ``name`` built from a config's arguments (its class's
    ``from_config``: dtype names become torch dtypes, a container's steps are built)."""
    cls = transform_class(name)
    return getattr(cls, "from_config", cls)(**dict(args))


def register_transform(name: str, target: str) -> None:
    """Make ``target`` (``"module:Class"``, imported when a config first names it) the transform
    a config calls ``name``: a plugin's transform, from its own module."""
    if ":" not in target:
        raise ValueError(f"register_transform({name!r}, {target!r}): the target is 'module:Class'")
    _REGISTRY[name] = target


def build_item(item: Any, where: str):
    """One step inside a container: a bare name or a mapping with ``name``."""
    if isinstance(item, str):
        item = {"name": item}
    if not isinstance(item, Mapping) or "name" not in item:
        raise ValueError(f"{where}: expected a mapping with 'name' and the transform's arguments, got {item!r}")
    try:
        return build_transform(item["name"], {k: v for k, v in item.items() if k != "name"})
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where} ({item['name']}): {exc}") from None
