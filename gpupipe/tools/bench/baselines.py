"""The loaders users would otherwise pick, as endless streams of batch sizes.

Each ``*_batches`` generator yields ``len(batch)`` for every batch it produces,
forever (a new epoch starts when one ends), so the runner can time any number of
batches. Closing the generator shuts its worker processes down. All of them run the
same steps per sample (:mod:`gpupipe.tools.bench.persample`), seeded per sample:

* ``torch_batches``: ``torch.utils.data.DataLoader`` over a map-style dataset of
  the image folder (ImageNet layout) — or, with no folder, of the shards' members
  read by offset — with a Pillow decode per sample;
* ``webdataset_batches``: the ``webdataset`` library over the same tar shards
  (resampled shards, a 1,000-sample shuffle buffer, Pillow decode), in a ``WebLoader``.

An image that does not decode (truncated, not an image) is handled as gpupipe's
``on_error`` for the run says: ``raise`` stops with a ``DecodeError`` naming the file, or
the shard and sample key; ``skip`` puts the next image that decodes in its place and
counts it (``counts["skipped"]``: distinct bad samples, by key, however often an epoch meets
them; :func:`new_counts`), so batches stay full and the timing stays comparable.

The libraries are imported here, lazily: they are benchmark extras (``gpupipe[bench]``),
never runtime dependencies.
"""
from __future__ import annotations

import io
import logging
import os
import tarfile
import zlib
from collections.abc import Callable, Generator, Iterator, Sequence

import numpy as np
from torch.utils.data import Dataset

from gpupipe.core.errors import ConfigError, DecodeError, MissingDependencyError

__all__ = ["Item", "folder_items", "shard_items", "torch_batches", "webdataset_batches", "new_counts"]

log = logging.getLogger(__name__)
Item = tuple[str, int, int, int, str]  # (path, offset, size (-1: whole file), label, sample key)
_MAX_BAD_IN_A_ROW = 1000  # webdataset's stream is endless: all-bad data must not spin forever
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
                items.append((os.path.join(root, c, name), 0, -1, label, f"{c}/{name}"))
    return items


def shard_items(shards: Sequence[str]) -> list[Item]:
    """The image members of local tar shards, by offset (labels from their ``.cls`` members)."""
    items: list[Item] = []
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
                elif ext == "cls" and (f := tar.extractfile(m)) is not None:  # (never None for a file)
                    entry[1] = int(f.read().decode().strip() or 0)
            items.extend((*e[0], e[1], key) for key, e in pending.items() if e[0] is not None)
    if not items:
        raise ConfigError(f"bench baseline: no images found in {len(shards)} shard(s)")
    return items


def _decode(data: bytes):
    """A PIL image in RGB (what ``webdataset``'s "pil" decoder gives)."""
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


def _problem(where: str, exc: BaseException) -> str:
    return f"cannot decode {where} ({type(exc).__name__}: {exc})"


class _ImageDataset(Dataset):
    """Map-style dataset: read, Pillow-decode to RGB, run the per-sample pipeline.

    Item ``i`` gives ``(tensor, label, bad, problem, key)``: ``bad`` is 1, ``problem`` says why
    and ``key`` is item ``i``'s when it does not decode itself; the tensor and label are then
    those of the next item that does (the consumer raises or counts)."""

    def __init__(self, items: list[Item], pipeline: Callable, seed: int):
        self.items, self.pipeline, self.seed = items, pipeline, seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        problem = ""
        for j in range(i, i + len(self.items)):
            path, offset, size, label, key = self.items[j % len(self.items)]
            try:
                img = _decode(_read(path, offset, size))
            except Exception as exc:  # noqa: BLE001  (whatever Pillow raises for a bad image)
                where = path if size < 0 else f"{path}: sample {key!r} (member at byte {offset})"
                problem = problem or _problem(where, exc)
                continue
            bad = j != i
            return (self.pipeline(img, np.random.default_rng([self.seed, self.epoch, i])), label, int(bad), problem,
                    self.items[i][4] if bad else "")
        raise DecodeError(f"bench baseline: none of the {len(self.items)} images decodes; the first: {problem}")


def _read(path: str, offset: int, size: int) -> bytes:
    with open(path, "rb") as f:
        if size >= 0:
            f.seek(offset)
        return f.read(size if size >= 0 else -1)


def new_counts() -> dict:
    """What a baseline counts: ``skipped`` (distinct bad samples) and their ``skipped_keys``."""
    return {"skipped": 0, "skipped_keys": set()}


def _checked(bad, problems, keys: Sequence[str], on_error: str, counts: dict | None) -> None:
    """Raise for the batch's first bad image (``on_error="raise"``), or count them: each bad
    sample once (by its key, ``keys``: ``"\n"``-joined where one row stands for several), and a
    warning for the first one not met before."""
    if not int(bad.sum()):
        return
    first = next(p for p in problems if p)
    if on_error == "raise":
        raise DecodeError(f"bench baseline: {first}; run `gpupipe validate` to list the bad images, "
                          "or bench with decode.on_error: skip")
    met = {k for joined in keys for k in joined.split("\n") if k}
    counts = counts if counts is not None else new_counts()
    if met - counts["skipped_keys"]:
        log.warning("bench baseline: %s (skipped)", first)
    counts["skipped_keys"] |= met
    counts["skipped"] = len(counts["skipped_keys"])


def torch_batches(items: list[Item], pipeline: Callable, *, batch_size: int, workers: int, seed: int = 0,
                  on_error: str = "raise", counts: dict | None = None) -> Generator[int, None, None]:
    """torch DataLoader (shuffled, drop_last, default collate), endless over epochs."""
    import torch

    dataset = _ImageDataset(items, pipeline, seed)
    if len(dataset) < batch_size:
        raise ConfigError(f"bench baseline: {len(dataset)} images, fewer than one batch of {batch_size}")
    while True:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + dataset.epoch)
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True,
                                             num_workers=workers, generator=gen)
        for images, _, bad, problems, keys in loader:
            _checked(bad, problems, keys, on_error, counts)
            yield len(images)
        dataset.epoch += 1


class _WdsSamples:
    """webdataset stage: samples → ``(tensor, label, bad, problem, keys)``, each with a generator
    from (seed, key) (picklable). A sample whose image does not decode is left out and
    reported with the next one that does (``bad`` of them, the first ``problem``, their
    ``"\n"``-joined ``shard#key``s)."""

    def __init__(self, pipeline: Callable, seed: int):
        self.pipeline, self.seed = pipeline, seed

    def __call__(self, samples: Iterator[dict]) -> Iterator[tuple]:
        bad, problem, keys = 0, "", []
        for sample in samples:
            try:
                img = _decode(sample["jpg"])
            except Exception as exc:  # noqa: BLE001  (whatever Pillow raises for a bad image)
                bad, problem = bad + 1, problem or _problem(f"{sample.get('__url__')}: sample {sample['__key__']!r}", exc)
                keys.append(f"{sample.get('__url__')}#{sample['__key__']}")
                if bad >= _MAX_BAD_IN_A_ROW:
                    raise DecodeError(f"bench webdataset: {bad} images in a row do not decode; the first: {problem}") \
                        from exc
                continue
            rng = np.random.default_rng([self.seed, zlib.crc32(sample["__key__"].encode())])
            yield self.pipeline(img, rng), int(sample["cls"]), bad, problem, "\n".join(keys)
            bad, problem, keys = 0, "", []


def webdataset_batches(shards: Sequence[str], pipeline: Callable, *, batch_size: int, workers: int,
                       seed: int = 0, on_error: str = "raise", counts: dict | None = None
                       ) -> Generator[int, None, None]:
    """webdataset: resampled shards → shuffle(1000) → Pillow decode and per-sample steps
    → batched, in a ``WebLoader`` with ``workers`` processes; endless."""
    try:
        import webdataset as wds
    except ImportError:
        raise MissingDependencyError("webdataset", extra="bench", feature="--compare webdataset") from None
    dataset = (wds.WebDataset(list(shards), resampled=True, shardshuffle=False, seed=seed, empty_check=False,
                              nodesplitter=None)
               .shuffle(1000)
               .compose(_WdsSamples(pipeline, seed)).batched(batch_size, partial=False))
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=workers)
    for images, _, bad, problems, keys in loader:
        _checked(bad, problems, keys, on_error, counts)
        yield len(images)
