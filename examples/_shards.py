"""Tiny learnable shards for the examples (not an example itself).

``colour_shards(root, n)`` writes ``n`` JPEGs whose class (0..3) is the colour they are
tinted with, on top of a random smooth field and a disc, as WebDataset tar shards plus
``index.json`` (``gpupipe.formats.writer.ShardSink``). A small CNN learns them in one or two
epochs, so the examples can show the loss falling; ``gpupipe.tools.demo.prepare`` makes bigger
sample data whose labels are random (good for throughput, not for learning).
"""
from __future__ import annotations

import io

import numpy as np

from gpupipe.formats.writer import ShardSink

__all__ = ["colour_shards", "NUM_CLASSES", "COLOURS"]

NUM_CLASSES = 4
COLOURS = ("red", "green", "blue", "yellow")  # the class of each tint, in label order
_TINTS = np.array([(200, 40, 40), (40, 180, 60), (50, 70, 210), (210, 200, 60)], dtype=np.float32)


def _image(rng: np.random.Generator, label: int, size: int) -> bytes:
    from PIL import Image

    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    field = rng.uniform(0, 90) * np.sin(rng.uniform(2, 9) * xx + rng.uniform(2, 9) * yy)[..., None]
    img = 0.6 * _TINTS[label] + field + rng.normal(0, 12, (size, size, 3))
    cy, cx, r = rng.uniform(0.2, 0.8, 2).tolist() + [rng.uniform(0.1, 0.3)]
    img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.uniform(0, 255, 3)
    buf = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def colour_shards(root: str, n: int, *, size: int = 48, shard_size: int = 64, seed: int = 0,
                  classes: tuple[str, ...] = ()) -> str:
    """Write ``n`` samples (label = i % 4) under ``root`` (any fsspec URL); returns ``root``.
    ``classes``: the :data:`COLOURS` in another order, which then numbers the labels (and the
    index lists it), as a data set made elsewhere would."""
    rng = np.random.default_rng(seed)
    with ShardSink(root, shard_size=shard_size, classes=tuple(classes)) as sink:
        for i in range(n):
            tint = i % NUM_CLASSES
            label = classes.index(COLOURS[tint]) if classes else tint
            sink.write(f"img{seed:02d}-{i:06d}", {"jpg": _image(rng, tint, size), "cls": str(label).encode()})
    return root
