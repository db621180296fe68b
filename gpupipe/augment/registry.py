"""The transforms a config may name: a small, lazy, read-only registry.

Values are ``"module:attr"`` strings imported on first use, so reading a config
imports only the transforms it names. ``ToTensor`` is torchvision's name for
``ToDtype(float32, scale=True)``.
"""
from __future__ import annotations

import importlib
import types
from typing import Any, Mapping

__all__ = ["TRANSFORMS", "MIXES", "transform_class", "build_transform", "DTYPES"]

_GEOMETRY = "gpupipe.augment.geometry"
_COLOR = "gpupipe.augment.color"
_REGISTRY = {
    **{name: f"{_GEOMETRY}:{name}" for name in (
        "Resize", "CenterCrop", "RandomCrop", "RandomResizedCrop", "RandomAffine", "RandomRotation",
        "RandomHorizontalFlip", "RandomVerticalFlip", "RandomPerspective")},
    **{name: f"{_COLOR}:{name}" for name in (
        "ToDtype", "Normalize", "RepeatChannels", "Grayscale", "ColorJitter", "RandomGrayscale", "GaussianBlur",
        "RandomErasing")},
    "ToTensor": f"{_COLOR}:ToDtype",
}
TRANSFORMS: Mapping[str, str] = types.MappingProxyType(_REGISTRY)
MIXES: Mapping[str, str] = types.MappingProxyType({"MixUp": "gpupipe.augment.mix:MixUp",
                                                   "CutMix": "gpupipe.augment.mix:CutMix"})
DTYPES = ("float32", "float16", "bfloat16", "float64", "uint8")


def transform_class(name: str) -> type:
    """The class registered as ``name`` (imported now)."""
    module, attr = (TRANSFORMS.get(name) or MIXES[name]).split(":")
    return getattr(importlib.import_module(module), attr)


def build_transform(name: str, args: Mapping[str, Any]):
    """``name(**args)`` with config-friendly values: dtype names become torch dtypes, and a
    cast defaults to ``input_range=255`` (a config pipeline always starts from uint8
    images, which a geometric warp turns into float in [0, 255])."""
    import torch

    kwargs = dict(args)
    if name in ("ToDtype", "ToTensor"):
        dtype = kwargs.get("dtype", "float32")
        if isinstance(dtype, str):
            if dtype.removeprefix("torch.") not in DTYPES:
                raise ValueError(f"dtype: unknown {dtype!r}; choose from {', '.join(DTYPES)}")
            kwargs["dtype"] = getattr(torch, dtype.removeprefix("torch."))
        kwargs.setdefault("input_range", 255.0)
    return transform_class(name)(**kwargs)
