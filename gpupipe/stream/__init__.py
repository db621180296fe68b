"""Stream room: the worker side — planned units → bytes → checked samples → encoded batches.

* :mod:`~gpupipe.stream.chunks` — :func:`iter_units` (with a manifest) and :func:`iter_whole_shards`;
* :mod:`~gpupipe.stream.readers` — the spans of sources read in place (objects, row groups);
* :mod:`~gpupipe.stream.batch` — :func:`pack` samples into an :class:`EncodedBatch`;
* :mod:`~gpupipe.stream.workers` — starting, watching and stopping the DataLoader workers.

Imports plan_units, plan, sources, formats, storage and core.
"""
from gpupipe.stream.batch import EncodedBatch, pack
from gpupipe.stream.chunks import SkipLog, StreamConfig, iter_units, iter_whole_shards

__all__ = ["StreamConfig", "SkipLog", "iter_units", "iter_whole_shards", "EncodedBatch", "pack"]
