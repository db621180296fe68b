"""Benchmark datasets made by gpupipe itself, reproducibly from a seed.

Two presets of dead-leaves JPEGs (:mod:`gpupipe.tools.synth`), quality 90:

* ``paper`` — N images at 250×250, the setup of the docs this project grew from
  (~0.34 bytes per pixel, ~21 KB each, like real photos at that size);
* ``imagenet`` — ImageNet-like sizes and aspect ratios (mostly 500×375 / 375×500 /
  500×333, a spread of others from 200 to 800 px on the long side) with more detail
  per pixel, ~110 KB on average like ImageNet's training JPEGs.

``make_dataset`` writes ``ROOT/images`` (ImageNet folder layout, what the torch
DataLoader baseline reads) and ingests it into ``ROOT/shards`` (tar shards +
``index.json``, what gpupipe, webdataset and DALI read). Run as
``python -m gpupipe.tools.bench.data paper --images 5000 --root .bench/paper-5000`` or
``gpupipe bench --make-data paper --images 5000 --root ...``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass

import numpy as np

from gpupipe.core.errors import ConfigError
from gpupipe.formats.manifest import MANIFEST_NAME
from gpupipe.tools.synth import LeavesConfig

__all__ = ["Preset", "PRESETS", "preset_sizes", "make_dataset", "main"]


@dataclass(frozen=True)
class Preset:
    name: str
    leaves: LeavesConfig
    quality: int = 90
    shard_size: int = 1000


PRESETS = {
    "paper": Preset("paper", LeavesConfig()),
    "imagenet": Preset("imagenet", LeavesConfig(blur=0.5, noise=3.5, grain=8.0, jitter=20.0), shard_size=500),
}
_IMAGENET_COMMON = ((500, 375, 0.40), (375, 500, 0.10), (500, 333, 0.15), (333, 500, 0.05))


def preset_sizes(name: str, count: int, seed: int) -> list[tuple[int, int]]:
    """(width, height) of each image of the preset, drawn from ``seed``."""
    if name == "paper":
        return [(250, 250)] * count
    if name != "imagenet":
        raise ConfigError(f"bench data: unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    rng = np.random.default_rng([seed, 0x5153])
    p_common = [p for _, _, p in _IMAGENET_COMMON]
    pick = rng.choice(len(p_common) + 1, size=count, p=[*p_common, 1 - sum(p_common)])
    long_side = rng.integers(200, 801, count)
    aspect = rng.uniform(0.55, 1.0, count)
    portrait = rng.random(count) < 0.3
    out = []
    for k, side, a, tall in zip(pick, long_side, aspect, portrait):
        if k < len(_IMAGENET_COMMON):
            out.append(_IMAGENET_COMMON[k][:2])
        else:
            short = max(int(side * a), 64)
            out.append((short, int(side)) if tall else (int(side), short))
    return out


def make_dataset(preset: str, images: int, root: str, *, seed: int = 0, workers: int | None = None,
                 progress: bool = True) -> dict:
    """Write ``root/images`` and ``root/shards`` (skipped when ``root/shards/index.json``
    exists); returns a summary (also written to ``root/dataset.json``)."""
    from gpupipe.prepare.ingest import ingest
    from gpupipe.tools.synth import write_leaves_folder

    if preset not in PRESETS:
        raise ConfigError(f"bench data: unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    if images < 1:
        raise ConfigError(f"bench data: --images must be >= 1, got {images}")
    p = PRESETS[preset]
    folder, shards = os.path.join(root, "images"), os.path.join(root, "shards")
    summary_path = os.path.join(root, "dataset.json")
    if os.path.exists(os.path.join(shards, MANIFEST_NAME)) and os.path.exists(summary_path):
        with open(summary_path) as f:
            return json.load(f)
    sizes = preset_sizes(preset, images, seed)
    nbytes = write_leaves_folder(folder, sizes, seed=seed, quality=p.quality, config=p.leaves,
                                 workers=workers or os.cpu_count() or 1, progress=progress)
    ingest(folder, shards, shard_size=p.shard_size, seed=seed, progress=progress)
    pixels = sum(w * h for w, h in sizes)
    summary = {"preset": preset, "images": images, "seed": seed, "quality": p.quality, "bytes": nbytes,
               "mean_bytes": nbytes / images, "bytes_per_pixel": nbytes / pixels, "mean_pixels": pixels / images,
               "leaves": asdict(p.leaves), "images_dir": folder, "shards": shards}
    with open(summary_path, "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def describe(summary: dict) -> str:
    return (f"{summary['images']:,} {summary['preset']} JPEGs (seed {summary['seed']}, quality {summary['quality']}): "
            f"mean {summary['mean_bytes'] / 1000:.1f} KB, {summary['bytes_per_pixel']:.3f} B/px; "
            f"folder {summary['images_dir']}, shards {summary['shards']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpupipe.tools.bench.data", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("preset", choices=sorted(PRESETS))
    ap.add_argument("--images", type=int, required=True)
    ap.add_argument("--root", required=True, help="output folder (images/ and shards/ inside)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=None, help="generating processes (default: all cores)")
    args = ap.parse_args(argv)
    print(describe(make_dataset(args.preset, args.images, args.root, seed=args.seed, workers=args.workers)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
