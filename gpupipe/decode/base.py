"""The decode stage's values: how to decode (:class:`DecodeConfig`), what comes out
(:class:`DecodedBatch`), what it counted (:class:`DecodeStats`) and what a backend is
(:class:`Decoder`), and what the shared decode steps (:mod:`gpupipe.decode.common`) ask of the
targets of a batch (:class:`TargetRows`, made by :mod:`gpupipe.decode.targets`). Every backend
imports these from here; :mod:`gpupipe.decode` picks one."""
from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from gpupipe.core.targets import Targets
from gpupipe.decode.settings import BACKENDS, BackendSpec, DecodeConfig, ResizeMode, register_backend

__all__ = ["ResizeMode", "DecodeConfig", "DecodedBatch", "DecodeStats", "Decoder", "BACKENDS", "BackendSpec",
           "register_backend", "RowTargets", "TargetRows"]


@dataclass
class DecodedBatch:
    """Decoded images and what travels with them.

    Shape: ``images`` (B, 3, H, W) uint8, channels_last, on the decoder's device;
    ``labels``, ``sample_ids`` (B,) int64; ``valid`` (B,) bool — False for padding
    and for images replaced because they could not be decoded.
    ``targets`` (:class:`~gpupipe.core.targets.Targets`): the boxes and masks of a source
    with targets, moved with the decode's crop and resize (``None`` without).
    ``images, labels = batch`` unpacks the two a training loop needs; with targets,
    ``images, targets = batch`` gives torchvision's per-image dicts (``targets.per_image()``).
    It indexes as that pair too (what a DataLoader's batch is): ``batch[0]`` the images,
    ``batch[1]`` (and ``batch[-1]``) the labels or per-image targets, ``batch[:2]`` both.
    ``len(batch)`` is still the number of samples (B), not 2.
    """

    images: torch.Tensor
    labels: torch.Tensor
    valid: torch.Tensor
    sample_ids: torch.Tensor
    keys: tuple[str, ...]
    epoch: int = 0
    targets: Targets | None = None

    def __iter__(self) -> Iterator:
        yield self.images
        yield self.labels if self.targets is None else self.targets.per_image()

    def __getitem__(self, index: int | slice):
        """``tuple(batch)[index]``: ``batch[0]`` the images, ``batch[1]`` the labels (with targets,
        the per-image dicts); a slice gives a tuple of them."""
        if isinstance(index, slice):
            return tuple(self)[index]
        if isinstance(index, bool) or not hasattr(index, "__index__") or not -2 <= operator.index(index) <= 1:
            raise IndexError(f"a batch indexes as the pair it unpacks to, (images, labels): 0 or 1 (or -2, -1), got "
                             f"{index!r}; batch.images[i] is image i and batch.keys[i] its key")
        if operator.index(index) in (0, -2):
            return self.images
        return self.labels if self.targets is None else self.targets.per_image()

    def __len__(self) -> int:
        return len(self.keys)


@dataclass
class DecodeStats:
    batches: int = 0
    images: int = 0
    skipped: int = 0
    seconds: float = 0.0
    skipped_keys: list[str] = field(default_factory=list)
    stretched: int = 0  # images whose aspect ratio resize "fixed" changed (common.count_stretched)
    worst_stretch: float = 1.0  # the largest such change: 1.33 is a 4:3 image made square
    # warn the first time images are stretched; False for a decode that is no one's training input
    # (`gpupipe validate` decodes to 8x8 to check every image in full: its stretch is its own business)
    warn_stretched: bool = True


class Decoder(Protocol):
    name: str
    device: torch.device
    stats: DecodeStats

    def decode(self, batch) -> DecodedBatch: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RowTargets:
    """One image's targets in the output frame: (n, 4) float32 boxes and (n,) int64 labels
    (None without boxes), an (H, W) uint8 mask (None without masks)."""

    boxes: np.ndarray | None
    labels: np.ndarray | None
    mask: np.ndarray | None


class TargetRows(Protocol):
    """The targets of one batch on their way through a decode, as :func:`~gpupipe.decode.common.finish`
    uses them (:class:`gpupipe.decode.targets.TargetJob` is the one there is): ``settle`` waits for what is
    still decoding (a bad mask makes its sample bad in the ``checked`` verdict), ``row(i)`` is image ``i``'s
    targets in the output frame, ``gather(rows, stand_in, device)`` row ``i``'s of image ``rows[i]`` (the
    ``stand_in``'s where None)."""

    def settle(self, checked) -> None: ...

    def row(self, i: int) -> RowTargets: ...

    def gather(self, rows: Sequence[int | None], stand_in: RowTargets | None, device: torch.device) -> Targets: ...
