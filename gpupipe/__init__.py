"""gpupipe: encoded images from any storage → GPU decode (DALI/nvJPEG) → GPU batch augmentation.

``import gpupipe`` is light: torch, DALI, Lightning and Kornia are imported only
when the object that needs them is first used (``gpupipe.transforms`` included: the
submodule is imported on first access, as torchvision's are).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "GpuLoader": "gpupipe.loader.gpu:GpuLoader",
    "GpuDataModule": "gpupipe.lightning:GpuDataModule",
    "load_config": "gpupipe.config.schema:load_config",
    "PipelineConfig": "gpupipe.config.schema:PipelineConfig",
    "DecodeConfig": "gpupipe.decode:DecodeConfig",
    "EncodedLoader": "gpupipe.loader.encoded:EncodedLoader",
    "StreamConfig": "gpupipe.stream.chunks:StreamConfig",
    "EncodedBatch": "gpupipe.stream.batch:EncodedBatch",
    "FetchConfig": "gpupipe.storage.fetch:FetchConfig",
    "Source": "gpupipe.sources.source:Source",
    "World": "gpupipe.core.types:World",
    "Manifest": "gpupipe.formats.manifest:Manifest",
    "ingest": "gpupipe.tools.ingest:ingest",
    "index": "gpupipe.tools.indexer:index",
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


# Modules that moved into rooms (issue 24): the old names still import, with a DeprecationWarning.
_MOVED = {**{name: f"tools.{name}" for name in ("cli", "cliargs", "ingest", "indexer", "sourceinfo", "validate",
                                                 "validate_read", "validate_child", "preview", "demo", "fit",
                                                 "models", "synth", "bench")},
          **{name: f"core.{name}" for name in ("errors", "types", "machine")},
          "manifest": "formats.manifest",
          "cache": "storage.cache", "storage_faults": "storage.faults", "objects": "storage.objects",
          "inplace": "sources.inplace", "classes": "sources.classes",
          "batch": "stream.batch", "readers": "stream.readers", "workers": "stream.workers",
          "configtypes": "config.values", "split": "config.split",
          "dataset": "loader.encoded", "stages": "loader.stages", "epoch": "loader.epoch"}


def _moved_to(fullname: str) -> str | None:
    parts = fullname.split(".")
    if len(parts) >= 2 and parts[0] == "gpupipe" and parts[1] in _MOVED:
        return ".".join(["gpupipe", _MOVED[parts[1]], *parts[2:]])
    return None


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import gpupipe.validate`` gives ``gpupipe.tools.validate`` (the module itself, not a copy)."""

    def find_spec(self, fullname, path=None, target=None):
        new = _moved_to(fullname)
        return None if new is None else importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = _moved_to(spec.name)
        assert new is not None, "find_spec makes a spec for moved names only"
        warnings.warn(f"{spec.name} moved to {new}; import that instead", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        spec.loader_state = (module.__spec__, module.__loader__)  # the import machinery stamps the alias's on it
        return module

    def exec_module(self, module) -> None:
        """The module ran when it was imported under its new name; it gets its own spec back."""
        module.__spec__, module.__loader__ = module.__spec__.loader_state

if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedFinder())
