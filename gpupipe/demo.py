"""The ``make demo`` pipeline: sample images → shards → one streamed epoch, measured.

Builds (once) a folder of synthetic JPEGs in ImageNet layout, ingests it into
tar shards with a manifest, then streams epochs of encoded batches through
:class:`~gpupipe.dataset.EncodedLoader` and reports throughput. Decode and
augmentation stages join this pipeline as they land.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from gpupipe.dataset import EncodedLoader
from gpupipe.manifest import MANIFEST_NAME

__all__ = ["DemoResult", "run_demo"]


@dataclass(frozen=True)
class DemoResult:
    images: int
    shards: int
    batch_size: int
    num_workers: int
    epochs: int
    samples: int
    bytes: int
    seconds: float
    io_wait_s: float
    main_wait_s: float
    skipped: int

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6


def prepare(root: str, *, images: int, size: int, shard_size: int, seed: int = 0) -> str:
    """Sample images and their shards under ``root`` (kept between runs); returns the shard folder."""
    from gpupipe.ingest import ingest
    from gpupipe.synth import write_image_folder

    folder, shards = os.path.join(root, "images"), os.path.join(root, "shards")
    if not os.path.exists(os.path.join(shards, MANIFEST_NAME)):
        if not os.path.isdir(folder):
            write_image_folder(folder, num_images=images, size=(size, size), seed=seed)
        ingest(folder, shards, shard_size=shard_size, seed=seed, progress=True)
    return shards


def run_demo(root: str = "demo-data", *, images: int = 2000, size: int = 250, shard_size: int = 250,
             batch_size: int = 128, epochs: int = 3, num_workers: int | None = None) -> DemoResult:
    """Stream ``epochs`` epochs (the first one warms up and is not timed)."""
    shards = prepare(root, images=images, size=size, shard_size=shard_size)
    loader = EncodedLoader(shards + "/", batch_size=batch_size, num_workers=num_workers, rank=0, world_size=1)
    for _ in loader:  # warm-up epoch: page cache, worker start-up
        pass
    loader.stats.__init__()
    t0 = time.perf_counter()
    for _ in range(epochs - 1):
        for _ in loader:
            pass
    seconds = time.perf_counter() - t0
    s = loader.stats
    return DemoResult(images=loader.spec.num_samples, shards=len(loader.source.shard_urls), batch_size=batch_size,
                      num_workers=loader.num_workers, epochs=epochs - 1, samples=s.samples, bytes=s.bytes,
                      seconds=seconds, io_wait_s=s.io_wait_s, main_wait_s=s.wait_s, skipped=s.skipped)
