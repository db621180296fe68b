"""Pack samples into an :class:`EncodedBatch`: one uint8 buffer of still-encoded
images, int64 offsets, labels, sample ids, keys and a valid mask.

Made in DataLoader workers; cheap to send to the main process (a handful of
tensors, one of them the bytes) and pinnable for an asynchronous copy.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from gpupipe.core.errors import ShardFormatError
from gpupipe.core.types import Sample

__all__ = ["EncodedBatch", "pack", "IMAGE_EXTENSIONS", "LABEL_EXTENSIONS", "image_field", "label_of"]

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "ppm", "tif", "tiff")
LABEL_EXTENSIONS = ("cls", "label", "class", "cls2")


@dataclass(frozen=True)
class EncodedBatch:
    """A batch of encoded images.

    Shape: ``data`` (total_bytes,) uint8; ``offsets`` (B+1,) int64 — image i is
    ``data[offsets[i]:offsets[i+1]]``; ``labels``, ``sample_ids`` (B,) int64;
    ``valid`` (B,) bool — False for padding and for samples skipped as unreadable.
    ``epoch``, ``chunk`` and ``batch`` place it in the epoch plan (resume state).
    """

    data: torch.Tensor
    offsets: torch.Tensor
    labels: torch.Tensor
    sample_ids: torch.Tensor
    valid: torch.Tensor
    keys: tuple[str, ...]
    epoch: int = 0
    chunk: int = -1
    batch: int = -1
    skipped: int = 0  # samples replaced by placeholders since the worker's previous batch
    io_wait_s: float = 0.0  # time the worker waited for storage since its previous batch

    def __len__(self) -> int:
        return len(self.keys)

    def image(self, i: int) -> memoryview:
        """Encoded bytes of image ``i`` (a view, no copy)."""
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.data.numpy().data[a:b]

    @property
    def nbytes(self) -> int:
        return int(self.data.numel())

    def pin_memory(self) -> EncodedBatch:
        """Called by torch's DataLoader when ``pin_memory=True``."""
        return replace(self, data=self.data.pin_memory(), offsets=self.offsets.pin_memory(),
                       labels=self.labels.pin_memory(), sample_ids=self.sample_ids.pin_memory(),
                       valid=self.valid.pin_memory())


def image_field(sample: Sample) -> bytes:
    """The encoded image of a sample; an empty ``bytes`` when it has none."""
    for ext in IMAGE_EXTENSIONS:
        if ext in sample.fields:
            return sample.fields[ext]
    return b""


def label_of(sample: Sample) -> int:
    """The integer class label (``.cls`` and friends, ASCII), or -1 when absent."""
    for ext in LABEL_EXTENSIONS:
        if ext in sample.fields:
            text = bytes(sample.fields[ext]).strip()
            try:
                return int(text)
            except ValueError:
                raise ShardFormatError(f"sample {sample.key!r}: label .{ext} is {text[:20]!r}, not an integer",
                                       shard=sample.shard, offset=sample.offset) from None
    return -1


def pack(samples: Sequence[Sample], valid: Iterable[bool], *, epoch: int = 0, chunk: int = -1, batch: int = -1,
         shared: bool = False) -> EncodedBatch:
    """Concatenate the samples' encoded images into one buffer; labels are the
    samples' parsed ``label`` (the stream checks and parses them).

    Shape: B samples → data (sum of image sizes,) uint8, offsets (B+1,) int64.
    ``shared=True`` (in DataLoader workers) builds the tensors in shared memory.
    """
    images = [image_field(s) for s in samples]
    n = len(images)
    sizes = [len(b) for b in images]
    meta = torch.zeros(4, n + 1, dtype=torch.int64)  # one tensor, four views: one transfer between processes
    data = torch.empty(sum(sizes), dtype=torch.uint8)
    if shared:  # allocate in shared memory and fill it: no second copy on the way to the main process
        meta.share_memory_()
        data.share_memory_()
    offsets = meta[0].numpy()
    np.cumsum(sizes, out=offsets[1:])
    meta[1, :n] = torch.tensor([s.label for s in samples], dtype=torch.int64)
    meta[2, :n] = torch.tensor([s.sample_id for s in samples], dtype=torch.int64)
    meta[3, :n] = torch.tensor([bool(v) and size > 0 for v, size in zip(valid, sizes)], dtype=torch.int64)
    view = data.numpy().data
    for img, a, b in zip(images, offsets[:-1].tolist(), offsets[1:].tolist()):
        view[a:b] = img
    return EncodedBatch(
        data=data, offsets=meta[0], labels=meta[1, :n], sample_ids=meta[2, :n], valid=meta[3, :n].bool(),
        keys=tuple(s.key for s in samples),
        epoch=epoch, chunk=chunk, batch=batch,
    )
