"""Stream room: the worker side — planned units → bytes → checked samples → encoded batches.

* :mod:`~gpupipe.stream.chunks` — :func:`iter_units` (with a manifest) and :func:`iter_whole_shards`;
* :mod:`~gpupipe.stream.readers` — the spans of sources read in place (objects, row groups);
* :mod:`~gpupipe.stream.batch` — :func:`pack` samples into an :class:`EncodedBatch`;
* :mod:`~gpupipe.stream.workers` — starting, watching and stopping the DataLoader workers.

Imports plan_units, plan, sources, formats, storage and core.
"""
import importlib
from typing import Any

__all__ = ["StreamConfig", "SkipLog", "iter_units", "iter_whole_shards", "EncodedBatch", "pack"]

_WHERE = {"StreamConfig": "settings", "SkipLog": "chunks", "iter_units": "chunks", "iter_whole_shards": "chunks",
          "EncodedBatch": "batch", "pack": "batch"}  # imported on first use: the room's front door costs no torch


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"gpupipe.stream.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'gpupipe.stream' has no attribute {name!r}")
