"""Loader room: the main-process side — GpuLoader, its stages and the epoch ledger.

* :mod:`~gpupipe.loader.gpu` — :class:`GpuLoader`: encoded batches → decode → augment, overlapped;
* :mod:`~gpupipe.loader.encoded` — :class:`EncodedLoader`: the plan, the DataLoader workers, resume;
* :mod:`~gpupipe.loader.epoch` — :class:`EpochLedger`: which epoch, how far, and its saved state;
* :mod:`~gpupipe.loader.stages` — the threads that overlap the stages.

The top of the library: imports config and the stages below it; only lightning and tools import it.
"""
from gpupipe.loader.encoded import EncodedDataset, EncodedLoader, LoaderStats
from gpupipe.loader.gpu import GpuLoader, StageStats

__all__ = ["GpuLoader", "StageStats", "EncodedLoader", "EncodedDataset", "LoaderStats"]
