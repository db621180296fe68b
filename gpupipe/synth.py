"""Synthetic sample images for the demo, benchmarks and tests.

Images are smooth colour fields with texture and a few shapes, encoded as real
JPEGs by Pillow (quality 90 by default) — never all-zero data, and with sizes
close to natural photos of the same resolution.
"""
from __future__ import annotations

import io
from typing import Any, Mapping

import numpy as np

from gpupipe.errors import MissingDependencyError
from gpupipe.storage import open_filesystem

__all__ = ["synthetic_jpeg", "write_image_folder"]


def _pil():
    try:
        from PIL import Image
    except ImportError:
        raise MissingDependencyError("Pillow", extra="pil", feature="generating sample images") from None
    return Image


def synthetic_jpeg(rng: np.random.Generator, size: tuple[int, int] = (250, 250), quality: int = 90) -> bytes:
    """One JPEG of ``size`` (width, height) with random smooth content."""
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.empty((h, w, 3), np.float32)
    for c in range(3):
        fx, fy, phase = rng.uniform(0.5, 6, 2) / max(w, h), rng.uniform(0, 6.3), 0
        img[..., c] = 127 + 90 * np.sin(2 * np.pi * (fx[0] * xx + fx[1] * yy) + fy + phase)
    for _ in range(rng.integers(2, 6)):  # a few filled discs
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(5, max(w, h) / 4)
        img[(xx - cx) ** 2 + (yy - cy) ** 2 < r * r] = rng.uniform(0, 255, 3)
    img += rng.normal(0, 6, img.shape)  # sensor-like noise keeps the JPEG size realistic
    buf = io.BytesIO()
    _pil().fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def write_image_folder(dst: str, *, num_images: int, num_classes: int = 10, size: tuple[int, int] = (250, 250),
                       seed: int = 0, storage_options: Mapping[str, Any] | None = None) -> int:
    """Write ``num_images`` JPEGs as ``dst/class_XX/img_NNNNNN.jpg`` (ImageNet layout); returns bytes written."""
    fs, root = open_filesystem(dst, storage_options)
    root = root.rstrip("/")
    rng = np.random.default_rng(seed)
    total = 0
    for i in range(num_images):
        cls = f"class_{i % num_classes:02d}"
        if i < num_classes:
            fs.makedirs(f"{root}/{cls}", exist_ok=True)
        data = synthetic_jpeg(rng, size)
        fs.pipe_file(f"{root}/{cls}/img_{i:06d}.jpg", data)
        total += len(data)
    return total
