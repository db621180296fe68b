"""The reference backend: Pillow, one image at a time on a thread pool.

Pillow releases the GIL while decoding and resizing, so a few threads use a few
cores. Resize is bilinear with Pillow's built-in antialiasing, from the crop box
straight to the output size (one interpolation). Pillow's ``resize(box=...)`` takes a
fractional box and its filter reads past the box to the image's edges: torchvision's
``Resize(s)`` + ``CenterCrop`` (``shorter``) in one interpolation. ``random_resized_crop``
cuts the box out first, as torchvision's ``resized_crop`` does.
"""
from __future__ import annotations

import io
import re
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from gpupipe.decode.base import DecodeConfig, DecodedBatch, DecodeStats
from gpupipe.decode.common import Checked, StandIn, account, assemble, crop_first, decode_threads, prepare, record_bad
from gpupipe.decode.roi import draft_scale, drafted_box
from gpupipe.decode.targets import start_targets

__all__ = ["PilDecoder", "decode_one", "decode_many", "pool"]

_ORIENTATION = 0x0112  # the EXIF tag


def _to_rgb(img):
    """8-bit RGB from any Pillow mode (16-bit scaled, CMYK converted, alpha dropped)."""
    from PIL import Image

    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        arr = np.asarray(img, dtype=np.uint32 if img.mode == "I" else np.uint16)
        shift = 8 if img.mode != "I" or arr.max(initial=0) > 255 else 0
        img = Image.fromarray((arr >> shift).astype(np.uint8), mode="L")
    return img if img.mode == "RGB" else img.convert("RGB")


def decode_one(data, box, size: tuple[int, int] | None, crop_first: bool = False) -> np.ndarray:
    """Decode one image upright (EXIF applied), crop ``box`` (top, left, h, w; fractional
    allowed) and resize to ``size`` (h, w); HWC uint8. Raises OSError / ValueError on bad data.
    The filter reads past the box (a resize of the whole image, cut to the box), unless
    ``crop_first`` (the box, whole pixels, cut out and then resized).

    A JPEG whose box is at least twice ``size`` is decoded scaled down in the DCT domain
    (1/2, 1/4 or 1/8: :func:`gpupipe.decode.roi.draft_scale`) and the scaled box resized (past
    the box: a scaled box is fractional)."""
    from PIL import Image, ImageOps

    with Image.open(io.BytesIO(bytes(data))) as raw:
        ltrb = None if size is None else _draft(raw, box, size)
        raw.load()
        img = _to_rgb(ImageOps.exif_transpose(raw))
    if ltrb is not None and crop_first and all(float(v).is_integer() for v in ltrb):
        img, ltrb = img.crop(tuple(int(v) for v in ltrb)), None
    if size is not None:
        img = img.resize((size[1], size[0]), Image.Resampling.BILINEAR, box=ltrb)
    return np.array(img)  # a writable copy the batch can take



def _draft(raw, box, size: tuple[int, int]) -> tuple[float, float, float, float]:
    """Ask the decoder of ``raw`` (opened, not loaded) for the smallest DCT scale that keeps
    ``box`` at least ``size``; return the box as (left, top, right, bottom) of the upright
    image it will then decode to. Formats without DCT scaling decode at full size."""
    top, left, h, w = (float(v) for v in box)
    scale = draft_scale(box, size)
    stored = raw.size
    drafted = raw.draft(None, (stored[0] // scale, stored[1] // scale)) if scale > 1 else None
    if drafted is None:
        return left, top, left + w, top + h
    orientation = raw.getexif().get(_ORIENTATION, 1)  # what ImageOps.exif_transpose reads
    return drafted_box(box, orientation, stored, raw.size, stored[0] / drafted[1][2])


def pool(config: DecodeConfig) -> ThreadPoolExecutor:
    """The thread pool Pillow decodes on (Pillow releases the GIL)."""
    return ThreadPoolExecutor(decode_threads(config), thread_name_prefix="gpupipe-pil")


def decode_many(executor: ThreadPoolExecutor, batch, indices, boxes, checked: Checked, config: DecodeConfig,
                stats: DecodeStats, earlier: Mapping[int, str] | None = None) -> dict[int, np.ndarray]:
    """Decode images ``indices`` of ``batch`` with Pillow: {index: HWC uint8}. The ones
    Pillow cannot decode are handed to ``on_error``; ``earlier[i]`` (why another decoder
    refused image i) goes in front of Pillow's reason."""
    size = config.resize_to
    futures = {i: executor.submit(decode_one, batch.image(i), boxes[i], size, crop_first(config)) for i in indices}
    pixels = {}
    for i, fut in futures.items():
        try:
            pixels[i] = fut.result()
        except Exception as exc:  # noqa: BLE001 — untrusted bytes: Pillow raises many kinds (incl. DecompressionBombError)
            reason = re.sub(r" <_io\.BytesIO object at 0x[0-9a-f]+>", "", f"{type(exc).__name__}: {exc}")
            if earlier and i in earlier:
                reason = f"{earlier[i]}; Pillow: {reason}"
            record_bad(checked, i, reason, config.on_error, stats, batch.keys[i])
    return pixels


class PilDecoder:
    name = "pil"

    def __init__(self, config: DecodeConfig, device: torch.device):
        self.config, self.device = config, device
        self.stats = DecodeStats()
        self._pool = pool(config)
        self._stand_in = StandIn()

    def decode(self, batch) -> DecodedBatch:
        t0 = time.perf_counter()
        checked, boxes = prepare(batch, self.config, self.stats)
        targets = start_targets(self._pool, batch, checked, boxes, self.config, self.stats)
        pixels = decode_many(self._pool, batch, checked.good(), boxes, checked, self.config, self.stats)
        out = assemble(pixels, checked, batch, self.device, self.config.image_size, self._stand_in, targets)
        account(self.stats, batch, t0)
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
