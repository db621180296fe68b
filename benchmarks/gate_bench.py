"""What the pre-decode check costs an image: ``probe`` + ``check_complete``, the work
``gpupipe.decode.common.check_batch`` does for every sample before any decoder sees it (issue 23).

    .venv/bin/python benchmarks/gate_bench.py [--images 512] [--repeat 7]

The corpus is what encoders write: photo-like JPEGs of 250x250 and ImageNet-like 500x375,
baseline 4:2:0 and 4:4:4, progressive, optimised tables, restart markers, an Exif
orientation and an ICC profile (one setting an image, in turn). Prints the median over
``--repeat`` rounds of microseconds per image, and the share of the corpus the gate sends to
a native decoder (every file here is well-formed: it should be all of them). ``--cold``
empties the gate's verdict caches before every image (the cost when no two files share
their encoder's tables). Not a test.
"""
from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]


def corpus(n: int) -> list[bytes]:
    from PIL import Image, ImageCms

    from gpupipe.tools.synth import synthetic_jpeg

    rng = np.random.default_rng(23)
    exif = Image.Exif()
    exif[0x0112] = 6
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    settings = [{"quality": 90}, {"quality": 90, "subsampling": 0}, {"quality": 85, "progressive": True},
                {"quality": 80, "optimize": True}, {"quality": 90, "restart_marker_blocks": 4},
                {"quality": 90, "exif": exif.tobytes()}, {"quality": 90, "icc_profile": icc}]
    out = []
    for i in range(n):
        img = Image.open(io.BytesIO(synthetic_jpeg(rng, (250, 250) if i % 2 else (500, 375), quality=95)))
        buf = io.BytesIO()
        img.save(buf, "JPEG", **settings[i % len(settings)])
        out.append(buf.getvalue())
    return out


def _caches() -> list[dict]:
    from gpupipe.formats import jpeg

    return [getattr(jpeg, name) for name in ("_HUFF_CACHE", "_LAYOUT_CACHE") if hasattr(jpeg, name)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--cold", action="store_true", help="empty the verdict caches before every image")
    args = parser.parse_args()
    from gpupipe.formats.imageheader import check_complete, probe

    caches = _caches() if args.cold else []

    try:
        from gpupipe.decode.gate import native_decodable
    except ImportError:  # before the strict gate (issue 23)
        native_decodable = None
    images = corpus(args.images)
    per_image = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        for data in images:
            for cache in caches:
                cache.clear()
            check_complete(data, probe(data, max_pixels=178_956_970))
        per_image.append((time.perf_counter() - t0) / len(images) * 1e6)
    native = "n/a" if native_decodable is None else \
        f"{sum(native_decodable(probe(d)) for d in images)}/{len(images)}"
    print(f"probe + check_complete{' (cold caches)' if args.cold else ''}: {statistics.median(per_image):.1f} us/image (median of {args.repeat}, "
          f"min {min(per_image):.1f}); to the native decoder: {native}")


if __name__ == "__main__":
    main()
