"""The reference backend: Pillow, one image at a time on a thread pool.

Pillow releases the GIL while decoding and resizing, so a few threads use a few
cores. Resize is bilinear with Pillow's built-in antialiasing, from the crop box
straight to the output size (one interpolation).
"""
from __future__ import annotations

import io
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from gpupipe.decode import DecodeConfig, DecodedBatch, DecodeStats, ResizeMode
from gpupipe.decode.common import account, assemble, prepare, record_bad

__all__ = ["PilDecoder", "decode_one"]


def _to_rgb(img):
    """8-bit RGB from any Pillow mode (16-bit scaled, CMYK converted, alpha dropped)."""
    from PIL import Image

    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        arr = np.asarray(img, dtype=np.uint32 if img.mode == "I" else np.uint16)
        shift = 8 if img.mode != "I" or arr.max(initial=0) > 255 else 0
        img = Image.fromarray((arr >> shift).astype(np.uint8), mode="L")
    return img if img.mode == "RGB" else img.convert("RGB")


def decode_one(data, box, size: tuple[int, int] | None) -> np.ndarray:
    """Decode one image upright (EXIF applied), crop ``box`` (top, left, h, w) and
    resize to ``size`` (h, w); HWC uint8. Raises OSError / ValueError on bad data."""
    from PIL import Image, ImageOps

    with Image.open(io.BytesIO(bytes(data))) as raw:
        raw.load()
        img = _to_rgb(ImageOps.exif_transpose(raw))
    if size is not None:
        top, left, h, w = (int(v) for v in box)
        img = img.resize((size[1], size[0]), Image.BILINEAR, box=(left, top, left + w, top + h))
    return np.array(img)  # a writable copy the batch can take


class PilDecoder:
    name = "pil"

    def __init__(self, config: DecodeConfig, device: torch.device):
        self.config, self.device = config, device
        self.stats = DecodeStats()
        threads = config.num_threads or max(1, min(8, len(os.sched_getaffinity(0))))
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="gpupipe-pil")

    def decode(self, batch) -> DecodedBatch:
        t0 = time.perf_counter()
        cfg = self.config
        checked, boxes = prepare(batch, cfg, self.stats)
        size = None if cfg.resize is ResizeMode.NONE else cfg.image_size
        good = checked.good()
        futures = {i: self._pool.submit(decode_one, batch.image(i), boxes[i], size) for i in good}
        pixels = {}
        for i, fut in futures.items():
            try:
                pixels[i] = fut.result()
            except Exception as exc:  # noqa: BLE001 — untrusted bytes: Pillow raises many kinds (incl. DecompressionBombError)
                record_bad(checked, i, f"{type(exc).__name__}: {exc}", cfg.on_error, self.stats, batch.keys[i])
        out = assemble(pixels, checked, batch, self.device, batch.epoch, cfg.image_size)
        account(self.stats, batch, t0)
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
