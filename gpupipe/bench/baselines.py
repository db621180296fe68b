"""The loaders users would otherwise pick, as endless streams of batch sizes.

Each ``*_batches`` generator yields ``len(batch)`` for every batch it produces,
forever (a new epoch starts when one ends), so the runner can time any number of
batches. Closing the generator shuts its worker processes down. All of them run the
same steps per sample (:mod:`gpupipe.bench.persample`), seeded per sample:

* ``torch_batches``: ``torch.utils.data.DataLoader`` over a map-style dataset of
  the image folder (ImageNet layout) — or, with no folder, of the shards' members
  read by offset — with a Pillow decode per sample;
* ``webdataset_batches``: the ``webdataset`` library over the same tar shards
  (resampled shards, a 1,000-sample shuffle buffer, Pillow decode), in a ``WebLoader``.

The libraries are imported here, lazily: they are benchmark extras (``gpupipe[bench]``),
never runtime dependencies.
"""
from __future__ import annotations

import io
import os
import tarfile
import zlib
from typing import Callable, Iterator, Sequence

import numpy as np

from gpupipe.errors import ConfigError, MissingDependencyError

__all__ = ["Item", "folder_items", "shard_items", "torch_batches", "webdataset_batches"]

Item = tuple[str, int, int, int]  # (path, offset, size (-1: whole file), label)
_IMAGE_EXT = (".jpg", ".jpeg", ".png", ".webp", ".bmp")


def folder_items(root: str) -> list[Item]:
    """The images of ``root/<class>/<image>``; labels are the sorted class indices."""
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    if not classes:
        raise ConfigError(f"bench baseline: {root!r} has no class sub-folders (ImageNet layout expected)")
    items = []
    for label, c in enumerate(classes):
        for name in sorted(os.listdir(os.path.join(root, c))):
            if name.lower().endswith(_IMAGE_EXT):
                items.append((os.path.join(root, c, name), 0, -1, label))
    return items


def shard_items(shards: Sequence[str]) -> list[Item]:
    """The image members of local tar shards, by offset (labels from their ``.cls`` members)."""
    items = []
    for path in shards:
        with tarfile.open(path) as tar:
            pending: dict[str, list] = {}
            for m in tar:
                if not m.isfile():
                    continue
                key, _, ext = m.name.partition(".")
                entry = pending.setdefault(key, [None, 0])
                if ext.lower() in ("jpg", "jpeg", "png", "webp", "bmp"):
                    entry[0] = (path, m.offset_data, m.size)
                elif ext == "cls":
                    entry[1] = int(tar.extractfile(m).read().decode().strip() or 0)
            items.extend((*e[0], e[1]) for e in pending.values() if e[0] is not None)
    if not items:
        raise ConfigError(f"bench baseline: no images found in {len(shards)} shard(s)")
    return items


class _ImageDataset:
    """Map-style dataset: read, Pillow-decode to RGB, run the per-sample pipeline."""

    def __init__(self, items: list[Item], pipeline: Callable, seed: int):
        self.items, self.pipeline, self.seed = items, pipeline, seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        from PIL import Image

        path, offset, size, label = self.items[i]
        with open(path, "rb") as f:
            if size >= 0:
                f.seek(offset)
            data = f.read(size if size >= 0 else -1)
        img = Image.open(io.BytesIO(data)).convert("RGB")
        return self.pipeline(img, np.random.default_rng([self.seed, self.epoch, i])), label


def torch_batches(items: list[Item], pipeline: Callable, *, batch_size: int, workers: int,
                  seed: int = 0) -> Iterator[int]:
    """torch DataLoader (shuffled, drop_last, default collate), endless over epochs."""
    import torch

    dataset = _ImageDataset(items, pipeline, seed)
    if len(dataset) < batch_size:
        raise ConfigError(f"bench baseline: {len(dataset)} images, fewer than one batch of {batch_size}")
    while True:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + dataset.epoch)
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True,
                                             num_workers=workers, generator=gen)
        for images, _ in loader:
            yield len(images)
        dataset.epoch += 1


class _WdsSample:
    """``sample dict → (tensor, label)`` with a generator from (seed, key) (picklable)."""

    def __init__(self, pipeline: Callable, seed: int):
        self.pipeline, self.seed = pipeline, seed

    def __call__(self, sample: dict):
        rng = np.random.default_rng([self.seed, zlib.crc32(sample["__key__"].encode())])
        return self.pipeline(sample["jpg"], rng), int(sample["cls"])


def webdataset_batches(shards: Sequence[str], pipeline: Callable, *, batch_size: int, workers: int,
                       seed: int = 0) -> Iterator[int]:
    """webdataset: resampled shards → shuffle(1000) → decode("pil") → per-sample steps
    → batched, in a ``WebLoader`` with ``workers`` processes; endless."""
    try:
        import webdataset as wds
    except ImportError:
        raise MissingDependencyError("webdataset", extra="bench", feature="--compare webdataset") from None
    dataset = (wds.WebDataset(list(shards), resampled=True, shardshuffle=False, seed=seed, empty_check=False,
                              nodesplitter=None)
               .shuffle(1000)
               .decode("pil").map(_WdsSample(pipeline, seed)).batched(batch_size, partial=False))
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=workers)
    for images, _ in loader:
        yield len(images)
