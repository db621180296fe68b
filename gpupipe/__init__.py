"""gpupipe: encoded images from any storage → GPU decode (DALI/nvJPEG) → GPU batch augmentation.

``import gpupipe`` is light: torch, DALI, Lightning and Kornia are imported only
when the object that needs them is first used (``gpupipe.transforms`` included: the
submodule is imported on first access, as torchvision's are).
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "GpuLoader": "gpupipe.loader.gpu:GpuLoader",
    "GpuDataModule": "gpupipe.lightning:GpuDataModule",
    "load_config": "gpupipe.config.schema:load_config",
    "PipelineConfig": "gpupipe.config.schema:PipelineConfig",
    "DecodeConfig": "gpupipe.decode:DecodeConfig",
    "EncodedLoader": "gpupipe.loader.encoded:EncodedLoader",
    "StreamConfig": "gpupipe.stream.settings:StreamConfig",
    "EncodedBatch": "gpupipe.stream.batch:EncodedBatch",
    "FetchConfig": "gpupipe.storage.fetch:FetchConfig",
    "Source": "gpupipe.sources.source:Source",
    "World": "gpupipe.core.types:World",
    "Manifest": "gpupipe.formats.manifest:Manifest",
    "ingest": "gpupipe.prepare.ingest:ingest",
    "index": "gpupipe.prepare.indexer:index",
}

_SUBMODULES = ("transforms",)  # ``gpupipe.transforms.Compose`` after a plain ``import gpupipe``, as in torchvision

__all__ = ["__version__", *_LAZY, *_SUBMODULES]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"gpupipe.{name}")  # the import binds it as an attribute too
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'gpupipe' has no attribute {name!r}")
    module, attr = target.split(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
