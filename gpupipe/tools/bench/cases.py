"""What to bench: :class:`~gpupipe.tools.bench.runner.BenchCase` objects from configs or a source.

From a config (``gpupipe.config.schema.load_config``): its train source, ``decode.image_size``,
``augment`` specs, ``loader.batch_size`` and seed; gpupipe's loader is
``GpuLoader(cfg.split("train"))`` with ``num_workers=w``. From a shard folder or pattern: one target
per ``--augment`` set, gpupipe's loader a ``GpuLoader`` with that set. The baselines
read the shards from the local disk; the torch DataLoader baseline reads the image
folder beside them (``images/``, as ``--make-data`` writes) when there is one. Given an
image folder itself (read in place, as the README's ``gpupipe bench FOLDER``), the baseline
reads its image files, the ones gpupipe lists, with their labels and keys; webdataset and
DALI read tar shards only, and say so.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from gpupipe.core.errors import ConfigError
from gpupipe.tools.bench.runner import BenchCase
from gpupipe.tools.bench.steps import SETS, gpupipe_pipeline, steps_of

__all__ = ["set_names", "source_cases", "config_cases", "describe_case"]


def set_names(text: str) -> list[str]:
    names = [n.strip() for n in (text or "none").split(",") if n.strip()]
    bad = [n for n in names if n not in SETS]
    if bad:
        raise ConfigError(f"--augment: unknown set {bad[0]!r}; choose from {', '.join(SETS)}")
    return names


@dataclasses.dataclass(frozen=True)
class _Local:
    """A source as the baselines read it: its units' local paths (tar shards, or an image folder's
    images), sample count, kind, and for an image folder its images as baseline items."""

    paths: tuple[str, ...]
    num_samples: int | None
    kind: str
    items: tuple | None


def _local_data(source, storage_options) -> _Local:
    from gpupipe.sources.source import Source, resolve

    resolved = resolve(Source(source, dict(storage_options or {})))
    paths = []
    for url in resolved.shard_urls:
        path = url[len("file://"):] if url.startswith("file://") else url
        if "://" in path:
            raise ConfigError(f"bench: the baselines read local data only; {url!r} is remote "
                              "(copy it locally, or run without --compare)")
        paths.append(path)
    items = None
    if resolved.kind == "folder" and resolved.manifest is not None and resolved.manifest.objects is not None:
        table = resolved.manifest.objects  # (path, offset, whole file, label, sample key): baselines.Item
        items = tuple((paths[i], 0, -1, int(table.labels[i]), table.key(i)) for i in range(len(table)))
    return _Local(tuple(paths), resolved.num_samples, resolved.kind, items)


def _images_dir(local: _Local, given: str | None) -> str | None:
    if given:
        if not os.path.isdir(given):
            raise ConfigError(f"--images-dir: no such folder {given!r}")
        return given
    if local.kind != "tar" or not local.paths:  # an image folder is read as gpupipe lists it
        return None
    beside = Path(local.paths[0]).resolve().parent.parent / "images"
    return str(beside) if beside.is_dir() else None


def describe_case(self: BenchCase) -> dict:
    return {"name": self.name, "kind": self.kind, "shards": len(self.shards), "first_shard": self.shards[0],
            "images_dir": self.images_dir, "num_samples": self.num_samples, "image_size": list(self.image_size),
            "batch_size": self.batch_size, "augment": [{"name": n, **a} for n, a in self.steps],
            "dataset": _dataset_summary(self.shards[0])}


def _dataset_summary(shard: str) -> dict | None:
    """``dataset.json`` written by ``--make-data`` beside the shard folder, if any."""
    import json

    path = Path(shard).resolve().parent.parent / "dataset.json"
    if not path.is_file():
        return None
    with open(path) as f:
        data = json.load(f)
    return {k: data[k] for k in ("preset", "images", "seed", "quality", "mean_bytes", "bytes_per_pixel",
                                 "mean_pixels") if k in data}


def source_cases(source: str, args: argparse.Namespace) -> list[BenchCase]:
    from gpupipe.loader.gpu import GpuLoader

    local = _local_data(source, args.storage_options and dict(args.storage_options))
    size = args.image_size or 224
    batch = args.batch_size or 256
    targets = []
    for name in set_names(args.augment):
        def make(workers, device, steps=SETS[name]):
            return GpuLoader(source, batch_size=batch, image_size=size, decode=args.decode, device=device,
                             num_workers=workers, storage_options=dict(args.storage_options), rank=0, world_size=1,
                             on_error="skip", augment=gpupipe_pipeline(steps), seed=args.seed)

        targets.append(BenchCase(name, local.paths, (size, size), batch, SETS[name], make,
                              _images_dir(local, args.images_dir), local.num_samples, args.seed, on_error="skip",
                              kind=local.kind, items=local.items))
    return targets


def config_cases(paths: list[str], args: argparse.Namespace) -> list[BenchCase]:
    from gpupipe.config.schema import load_config

    targets = []
    for path in paths:
        cfg = load_config(path)
        if args.batch_size:
            cfg = dataclasses.replace(cfg, loader=dataclasses.replace(cfg.loader, batch_size=args.batch_size))
        if cfg.decode.image_size is None:
            raise ConfigError(f"{path}: decode.image_size is needed to bench (the baselines resize to it)")
        train = cfg.source.train
        if train is None:
            raise ConfigError(f"{path}: source.train is not set")
        local = _local_data(list(train) if isinstance(train, tuple) else train, cfg.source.storage_options)

        def make(workers, device, cfg=cfg):
            from gpupipe.core.types import World
            from gpupipe.loader.gpu import GpuLoader

            split = cfg.split("train")  # workers None: the config's own count (or gpupipe's automatic one)
            split = split if workers is None else dataclasses.replace(split, num_workers=workers)
            return GpuLoader(split, world=World(), device=device)

        targets.append(BenchCase(Path(path).stem, local.paths, cfg.decode.image_size, cfg.loader.batch_size,
                              steps_of(cfg.augment), make, _images_dir(local, args.images_dir), local.num_samples,
                              cfg.seed, on_error=str(getattr(cfg.decode.on_error, "value", cfg.decode.on_error)),
                              kind=local.kind, items=local.items))
    return targets
