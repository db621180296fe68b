"""The ``make demo`` pipeline: sample images → shards → stream → decode, measured.

Builds (once) a folder of synthetic JPEGs in ImageNet layout, ingests it into
tar shards with a manifest, then runs epochs of :class:`~gpupipe.loader.gpu.GpuLoader`
(stream, decode one batch ahead in the training process, augment with the docs'
simple or complex transform set) and reports images/s with the time spent in each stage.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

from gpupipe.formats.manifest import MANIFEST_NAME

__all__ = ["DemoResult", "prepare", "run_demo"]


@dataclass(frozen=True)
class DemoResult:
    images: int
    shards: int
    batch_size: int
    num_workers: int
    backend: str
    device: str
    epochs: int
    seconds: float
    stages: dict

    @property
    def images_per_s(self) -> float:
        return self.stages["images"] / self.seconds


def prepare(root: str, *, images: int, size: int, shard_size: int, seed: int = 0) -> str:
    """Sample images and their shards under ``root`` (kept between runs): ``shards/`` for
    training and ``val-shards/`` (a tenth as many) for validation. Returns the training shards."""
    from gpupipe.prepare.ingest import ingest
    from gpupipe.tools.synth import write_image_folder

    splits = (("images", "shards", images, seed), ("val-images", "val-shards", max(1, images // 10), seed + 1))
    for images_dir, shards_dir, count, split_seed in splits:
        folder, shards = os.path.join(root, images_dir), os.path.join(root, shards_dir)
        if not os.path.exists(os.path.join(shards, MANIFEST_NAME)):
            if not os.path.isdir(folder):
                write_image_folder(folder, num_images=count, size=(size, size), seed=split_seed)
            ingest(folder, shards, shard_size=shard_size, seed=split_seed, progress=True)
    return os.path.join(root, "shards")


def run_demo(root: str = "demo-data", *, images: int = 2000, size: int = 250, shard_size: int = 250,
             batch_size: int = 128, image_size: int = 128, epochs: int = 3, num_workers: int | None = None,
             decode: str = "auto", augment: str | None = "simple", config=None) -> DemoResult:
    """Run ``epochs`` epochs; the first warms up (worker start, DALI pipeline build) and is not timed.
    With ``config`` (a :class:`~gpupipe.config.schema.PipelineConfig`) its training loader is used and
    the batch/decode/augment arguments are ignored."""
    shards = prepare(root, images=images, size=size, shard_size=shard_size)
    if config is not None:
        from gpupipe.core.types import World
        from gpupipe.loader.gpu import GpuLoader

        split = config.split("train")
        loader = GpuLoader(split if num_workers is None else replace(split, num_workers=num_workers), world=World())
    else:
        loader = _loader(shards, batch_size=batch_size, image_size=image_size, num_workers=num_workers,
                         decode=decode, augment=augment)
    from gpupipe.tools.bench.measure import time_epochs

    seconds = time_epochs(loader, epochs - 1)
    return DemoResult(images=loader.encoded.spec.num_samples, shards=len(loader.encoded.source.shard_urls),
                      batch_size=loader.encoded.spec.batch_size, num_workers=loader.encoded.num_workers,
                      backend=loader.decoder.name, device=str(loader.device), epochs=epochs - 1, seconds=seconds,
                      stages=loader.stats.as_dict())


def _loader(shards: str, *, batch_size: int, image_size: int, num_workers: int | None, decode: str,
            augment: str | None):
    from gpupipe.loader.gpu import GpuLoader

    pipeline = None
    if augment is not None:
        import gpupipe.transforms as T

        pipeline = {"simple": T.simple_set, "complex": T.complex_set}[augment]()
    return GpuLoader(shards + "/", batch_size=batch_size, image_size=image_size, decode=decode,
                     num_workers=num_workers, rank=0, world_size=1, on_error="skip", augment=pipeline)
