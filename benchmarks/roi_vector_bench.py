"""Issue 34: the decode thread's per-batch placement, per-row Python (before) against numpy on
whole batches (now). µs per sample, B=256, one thread, the fastest of --repeat timings of
--number calls each (the least disturbed by other processes). Not a test; tests/decode/test_placement_vectorized.py holds the two equal.

    .venv/bin/python benchmarks/roi_vector_bench.py [--batch 256] [--repeat 15] [--number 50]

Cases: DALI's window inputs (``any_partial`` + ``dali_slices``, as ``DaliDecoder._placement``
calls them) for random_resized_crop boxes of 250x250 images to 224x224 and for ``shorter``
boxes (250x250, and ImageNet-like sizes 200..500 a side, to 224x224); ``crop_boxes`` for
``shorter`` and ``fixed`` (from the headers, and from the (h, w) arrays alone); the headers to
(h, w) arrays. The "before" functions are the code of commit 161d1bb, copied below.
"""
from __future__ import annotations

import argparse
import timeit

import numpy as np

from gpupipe.decode import DecodeConfig
from gpupipe.decode.common import (
    crop_boxes,
    crop_boxes_from_sizes,
    shorter_box,
    upright_size,
    upright_sizes,
)
from gpupipe.decode.roi import _EDGE, any_partial, dali_slices, decode_window
from gpupipe.formats.imageheader import ImageHeader

# -- before (161d1bb) ---------------------------------------------------------------------------


def old_any_partial(boxes, images, size, **window) -> bool:
    return any(image is not None and decode_window(box, image, size, **window) != (0, 0, *image)
               for box, image in zip(boxes, images))


def old_dali_slices(boxes, images, size, **window) -> dict[str, np.ndarray]:
    out = {k: np.zeros((len(boxes), 2), np.float32) for k in ("win_start", "win_end", "roi_start", "roi_end")}
    out["win_end"][:] = out["roi_end"][:] = 1.0
    for i, (box, image) in enumerate(zip(boxes, images)):
        if image is None:
            continue
        top, left, h, w = decode_window(box, image, size, **window)
        extent = np.array(image, np.float64)
        out["win_start"][i] = (np.array([top, left]) + _EDGE) / extent
        out["win_end"][i] = np.minimum(1.0, (np.array([top + h, left + w]) + _EDGE) / extent)
        start = np.array([box[0] - top, box[1] - left], np.float64)
        out["roi_start"][i] = start / (h, w)
        out["roi_end"][i] = (start + (box[2], box[3])) / (h, w)
    return out


def old_crop_boxes(headers, config) -> np.ndarray:
    """``shorter`` and ``fixed`` (``random_resized_crop`` keeps its per-sample generator)."""
    boxes = np.zeros((len(headers), 4), dtype=np.float64)
    for i, header in enumerate(headers):
        if header is None:
            continue
        h, w = upright_size(header)
        if config.resize.value == "shorter":
            boxes[i] = shorter_box(h, w, config.image_size)
        else:
            boxes[i] = (0, 0, h, w)
    return boxes


# -- the timings --------------------------------------------------------------------------------


def _us(fn, batch: int, repeat: int, number: int) -> float:
    return min(timeit.repeat(fn, repeat=repeat, number=number)) / number / batch * 1e6


def _headers(rng: np.random.Generator, batch: int, sides: tuple[int, int]) -> list[ImageHeader]:
    hw = rng.integers(sides[0], sides[1] + 1, (batch, 2))
    orientation = rng.choice([1, 1, 1, 6], batch)  # some EXIF-rotated rows: upright_size swaps them
    return [ImageHeader(format="jpeg", width=int(w), height=int(h), channels=3, orientation=int(o))
            for (h, w), o in zip(hw.tolist(), orientation.tolist())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--number", type=int, default=50)
    args = parser.parse_args()
    b, timing = args.batch, {"repeat": args.repeat, "number": args.number}
    rng, size = np.random.default_rng(0), (224, 224)
    square = _headers(rng, b, (250, 250))
    mixed = _headers(rng, b, (200, 500))
    print(f"µs per sample, B={b} (fastest of {args.repeat} x {args.number} calls)")
    print(f"{'case':<56} {'before':>8} {'now':>8} {'x':>6}")

    def row(name: str, before, now) -> None:
        old, new = _us(before, b, **timing), _us(now, b, **timing)
        print(f"{name:<56} {old:8.3f} {new:8.3f} {old / new:6.1f}")

    cases = [("rrc 250x250 -> 224", square, "random_resized_crop", False),
             ("shorter 250x250 -> 224", square, "shorter", True),
             ("shorter 200..500 -> 224", mixed, "shorter", True)]
    for name, headers, mode, past_box in cases:
        config = DecodeConfig(image_size=size, resize=mode)
        hw, exists = upright_sizes(headers)
        images = [upright_size(h) for h in headers]
        boxes = crop_boxes_from_sizes(hw, exists, list(range(b)), 0, config)
        window = {"past_box": past_box, "from_origin": False}
        row(f"any_partial + dali_slices, {name}",
            lambda: (old_any_partial(boxes, images, size, **window), old_dali_slices(boxes, images, size, **window)),
            lambda: (any_partial(boxes, hw, exists, size, **window), dali_slices(boxes, hw, exists, size, **window)))
    for mode in ("shorter", "fixed"):
        config = DecodeConfig(image_size=size, resize=mode)
        hw, exists = upright_sizes(mixed)
        ids = list(range(b))
        row(f"crop_boxes {mode} 200..500, from headers", lambda: old_crop_boxes(mixed, config),
            lambda: crop_boxes(mixed, ids, 0, config))
        row("  now crop_boxes_from_sizes (the sizes given)", lambda: old_crop_boxes(mixed, config),
            lambda: crop_boxes_from_sizes(hw, exists, ids, 0, config))
    row("headers -> sizes: [upright_size(h)] / upright_sizes",
        lambda: [None if h is None else upright_size(h) for h in mixed], lambda: upright_sizes(mixed))


if __name__ == "__main__":
    main()
