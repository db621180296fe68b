"""Synthetic sample images for the demo, benchmarks and tests.

Two generators, both encoding real JPEGs with Pillow (quality 90 by default), never
all-zero data:

* :func:`synthetic_jpeg` — smooth colour fields with a few discs and noise (the demo's);
* :func:`dead_leaves_jpeg` — the dead-leaves model of natural images (overlapping
  shapes with power-law sizes, so the spectrum falls off like a photo's), for the
  benchmarks. :func:`write_leaves_folder` writes many of them with a process pool;
  image ``i`` of seed ``s`` is the same bytes whatever the worker count;
* :func:`detection_sample` — detection and segmentation data: a few filled rectangles of random
  classes on a smooth background, with their boxes (``.json``) and class mask (``.mask.png``)
  exactly around them; :func:`write_detection_shards` writes shards of them (``gpupipe synth``).
"""
from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpupipe.core.errors import MissingDependencyError
from gpupipe.storage.fetch import open_filesystem

__all__ = ["synthetic_jpeg", "write_image_folder", "LeavesConfig", "dead_leaves", "dead_leaves_jpeg",
           "write_leaves_folder", "DetectionSample", "detection_sample", "write_detection_shards"]


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
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(min(5, max(w, h) / 4), max(w, h) / 4)
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


# ---------------------------------------------------------------- dead leaves


@dataclass(frozen=True)
class LeavesConfig:
    """The dead-leaves model: opaque shapes dropped back to front until the image is covered.

    Radii follow a power law ``p(r) ∝ r**-alpha`` on [``r_min``, ``r_max_frac`` × the longer
    side]; ``alpha = 3`` makes the image statistically scale invariant, so its power
    spectrum falls off about as ``1/f**2`` (amplitude ``1/f``), as in natural photos.
    Each shape gets a colour near one of a few per-image palette colours, a linear shading
    and, for larger shapes, a grain texture; the image is slightly blurred (optics) and gets
    sensor-like noise. ``coverage`` is the expected fraction of pixels hit at least once.
    """

    r_min: float = 2.0
    r_max_frac: float = 0.6
    alpha: float = 3.0
    coverage: float = 0.98
    palette: int = 5
    shading: float = 0.35  # max brightness change across a shape, in units of 255
    grain: float = 4.0  # std of the texture inside shapes of radius >= 12 px
    blur: float = 1.1  # Gaussian blur radius in pixels (the optics)
    noise: float = 1.5  # std of the per-pixel (sensor) noise
    jitter: float = 15.0  # std of a shape's colour around its palette colour


def _radii(rng: np.random.Generator, n: int, r_min: float, r_max: float, alpha: float) -> np.ndarray:
    """``n`` radii from ``p(r) ∝ r**-alpha`` on [r_min, r_max] (inverse-CDF sampling)."""
    a = 1.0 - alpha
    u = rng.random(n)
    return (r_min ** a + u * (r_max ** a - r_min ** a)) ** (1.0 / a)


def _expected_area(cfg: LeavesConfig, r_max: float) -> float:
    """Mean shape area: π E[r²] under the power law, times the mean ellipse aspect (0.7)."""
    a, lo, hi = cfg.alpha, cfg.r_min, r_max
    if abs(a - 3.0) < 1e-9:
        mean_r2 = np.log(hi / lo) * 2 / (lo ** -2 - hi ** -2)
    else:
        mean_r2 = (1 - a) / (3 - a) * (hi ** (3 - a) - lo ** (3 - a)) / (hi ** (1 - a) - lo ** (1 - a))
    return float(np.pi * mean_r2 * 0.7)


def _leaves(rng: np.random.Generator, n: int, w: int, h: int, cfg: LeavesConfig) -> dict[str, np.ndarray]:
    """The ``n`` shapes, back to front: radius, centre, orientation, aspect, colour, shading."""
    r = _radii(rng, n, cfg.r_min, cfg.r_max_frac * max(w, h), cfg.alpha)
    palette = rng.uniform(20, 235, (cfg.palette, 3)).astype(np.float32)
    grey = palette.mean(1, keepdims=True)
    palette = grey + rng.uniform(0.25, 0.7) * (palette - grey)  # a per-image saturation
    theta = rng.uniform(0, np.pi, n)
    leaves = {"r": r, "cx": rng.uniform(-r, w + r), "cy": rng.uniform(-r, h + r), "cos": np.cos(theta),
              "sin": np.sin(theta), "aspect": rng.uniform(0.4, 1.0, n),
              "colour": palette[rng.integers(0, cfg.palette, n)] + rng.normal(0, cfg.jitter, (n, 3)),
              "grad": rng.uniform(-cfg.shading, cfg.shading, (n, 2)) * 255 / (2 * r[:, None])}
    leaves = {k: v.astype(np.float32) for k, v in leaves.items()}
    leaves["background"] = palette[0]
    return leaves


def _inside(dx: np.ndarray, dy: np.ndarray, leaves: dict, i) -> np.ndarray:
    """Which offsets (dx, dy) from the centre(s) ``i`` fall inside the ellipse(s)."""
    c, s, r = leaves["cos"][i], leaves["sin"][i], leaves["r"][i]
    u, v = c * dx + s * dy, (c * dy - s * dx) / leaves["aspect"][i]
    return u * u + v * v < r * r


def _paint_large(img: np.ndarray, depth: np.ndarray, leaves: dict, i: int, grain: np.ndarray | None) -> None:
    """Paint shape ``i`` over ``img`` (H, W, 3) float32 in place, with shading and grain,
    and record ``i`` in ``depth`` where it is now in front."""
    h, w = img.shape[:2]
    r, cx, cy = leaves["r"][i], leaves["cx"][i], leaves["cy"][i]
    x0, x1 = max(int(cx - r), 0), min(int(cx + r) + 2, w)
    y0, y1 = max(int(cy - r), 0), min(int(cy + r) + 2, h)
    if x0 >= x1 or y0 >= y1:
        return
    dx = np.arange(x0, x1, dtype=np.float32)[None, :] - cx
    dy = np.arange(y0, y1, dtype=np.float32)[:, None] - cy
    inside = _inside(dx, dy, leaves, i)
    gx, gy = leaves["grad"][i]
    tone = gx * dx + gy * dy
    if grain is not None:
        tone = tone + grain[y0:y1, x0:x1]
    patch = leaves["colour"][i][None, None, :] + tone[..., None]
    img[y0:y1, x0:x1][inside] = patch[inside]
    depth[y0:y1, x0:x1][inside] = i


def _small_points(leaves: dict, idx: np.ndarray, reach: int, w: int, h: int):
    """For shapes ``idx`` (radius < ``reach``): the flat pixel index, the shape index and
    the colour of every pixel they cover."""
    off = np.arange(-reach, reach + 1, dtype=np.float32)
    dy, dx = (a.ravel()[None, :] for a in np.meshgrid(off, off, indexing="ij"))
    cx, cy = leaves["cx"][idx, None], leaves["cy"][idx, None]
    x, y = np.rint(cx + dx), np.rint(cy + dy)
    dx, dy = x - cx, y - cy
    keep = _inside(dx, dy, leaves, (idx, None)) & (x >= 0) & (x < w) & (y >= 0) & (y < h)
    grad = leaves["grad"][idx]
    tone = (grad[:, :1] * dx + grad[:, 1:] * dy)[keep]
    which = np.broadcast_to(idx[:, None], keep.shape)[keep]
    pixel = (y[keep] * w + x[keep]).astype(np.int64)
    return pixel, which, leaves["colour"][which] + tone[:, None]


def _paint_small(img: np.ndarray, depth: np.ndarray, leaves: dict, idx: np.ndarray) -> None:
    """Paint the shapes ``idx`` (radius < ``_SMALL``) at once, in z-order: a pixel takes
    the colour of the frontmost shape covering it (``depth`` holds the large shapes' indices)."""
    h, w = depth.shape
    r = leaves["r"][idx]
    parts = [_small_points(leaves, idx[(r >= lo) & (r < hi)], hi, w, h)
             for lo, hi in ((0, 3), (3, 5), (5, _SMALL)) if np.any((r >= lo) & (r < hi))]
    if not parts:
        return
    pixel, which, colour = (np.concatenate(p) for p in zip(*parts))
    front = depth.ravel().copy()
    np.maximum.at(front, pixel, which.astype(front.dtype))
    won = front[pixel] == which
    img.reshape(-1, 3)[pixel[won]] = colour[won]


def dead_leaves(rng: np.random.Generator, size: tuple[int, int] = (250, 250),
                config: LeavesConfig = LeavesConfig()) -> np.ndarray:
    """A natural-image-like picture of ``size`` (width, height): (H, W, 3) uint8.

    Large shapes are painted one by one, back to front; the many small ones all at once
    behind or in front of them by their index (a z-buffer), so the order is exact."""
    w, h = size
    cfg = config
    n = int(np.ceil(-np.log(1.0 - cfg.coverage) * w * h / _expected_area(cfg, cfg.r_max_frac * max(w, h))))
    leaves = _leaves(rng, n, w, h, cfg)
    img = np.empty((h, w, 3), np.float32)
    img[:] = leaves["background"]
    grain = rng.normal(0, cfg.grain, (h, w)).astype(np.float32) if cfg.grain > 0 else None
    depth = np.full((h, w), -1, np.int64)  # index of the frontmost large shape at each pixel
    for i in np.flatnonzero(leaves["r"] >= _SMALL).tolist():
        _paint_large(img, depth, leaves, i, grain if leaves["r"][i] >= 12 else None)
    _paint_small(img, depth, leaves, np.flatnonzero(leaves["r"] < _SMALL))
    out = _pil().fromarray(np.clip(img, 0, 255).astype(np.uint8))
    if cfg.blur > 0:
        from PIL import ImageFilter

        out = out.filter(ImageFilter.GaussianBlur(cfg.blur))
    pixels = np.asarray(out, np.float32) + rng.normal(0, cfg.noise, (h, w, 1)).astype(np.float32)
    return np.clip(pixels, 0, 255).astype(np.uint8)


_SMALL = 8  # shapes below this radius (px) are painted together, vectorised


def dead_leaves_jpeg(seed: int, index: int, size: tuple[int, int] = (250, 250), quality: int = 90,
                     config: LeavesConfig = LeavesConfig()) -> bytes:
    """Image ``index`` of the set drawn from ``seed``: the same bytes whatever the process or order."""
    rng = np.random.default_rng([seed, index])
    buf = io.BytesIO()
    _pil().fromarray(dead_leaves(rng, size, config)).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _leaf_task(task: tuple) -> bytes:
    seed, index, size, quality, config = task
    return dead_leaves_jpeg(seed, index, size, quality, config)


def write_leaves_folder(dst: str, sizes: Sequence[tuple[int, int]], *, seed: int = 0, num_classes: int = 10,
                        quality: int = 90, config: LeavesConfig = LeavesConfig(), workers: int = 1,
                        storage_options: Mapping[str, Any] | None = None, progress: bool = False) -> int:
    """Write one dead-leaves JPEG per entry of ``sizes`` ((width, height) each) as
    ``dst/class_XX/img_NNNNNN.jpg`` (ImageNet layout), made by ``workers`` processes;
    returns the bytes written."""
    import multiprocessing as mp

    from tqdm import tqdm

    fs, root = open_filesystem(dst, storage_options)
    root = root.rstrip("/")
    for c in range(min(num_classes, len(sizes))):
        fs.makedirs(f"{root}/class_{c:02d}", exist_ok=True)
    tasks = [(seed, i, tuple(s), quality, config) for i, s in enumerate(sizes)]
    total = 0
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")  # fork: no re-import
    with ctx.Pool(workers) if workers > 1 else _Serial() as pool, \
            tqdm(total=len(tasks), disable=not progress, unit="img", desc="images") as bar:
        for i, data in enumerate(pool.imap(_leaf_task, tasks, chunksize=16)):
            fs.pipe_file(f"{root}/class_{i % num_classes:02d}/img_{i:06d}.jpg", data)
            total += len(data)
            bar.update(1)
    return total


class _Serial:
    """``Pool``'s ``imap`` in this process (for ``workers=1``)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    @staticmethod
    def imap(fn, items, chunksize: int = 1):
        return map(fn, items)


# ---------------------------------------------------------------- detection data


@dataclass(frozen=True)
class DetectionSample:
    """One generated detection sample: ``boxes`` (n, 4) float32 ``xyxy`` pixel edges of its
    rectangles, ``labels`` (n,) int64, ``mask`` (H, W) uint8 (class + 1 per pixel, 0 for the
    background; a later rectangle covers an earlier one), and ``fields``: the sample's members
    (``jpg``, and ``json`` / ``mask.png`` as ``targets`` ask, or ``cls`` without targets)."""

    boxes: np.ndarray
    labels: np.ndarray
    mask: np.ndarray
    fields: dict[str, bytes] = field(repr=False)


def detection_sample(seed: int, index: int, size: tuple[int, int] = (64, 48), num_classes: int = 3,
                     targets: Sequence[str] = ("boxes", "masks"), max_objects: int = 4) -> DetectionSample:
    """Sample ``index`` of the set drawn from ``seed``, the same whatever the order: every fourth
    image has no objects; the others 1..``max_objects`` rectangles of random classes, some touching
    the image's edges. ``size``: (width, height)."""
    from gpupipe.formats.annotations import encode_boxes

    rng = np.random.default_rng([seed, index])
    w, h = size
    n = 0 if index % 4 == 0 else int(rng.integers(1, max_objects + 1))
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = 110 + 50 * np.sin(xx * rng.uniform(0.05, 0.2) + rng.uniform(0, 6))[..., None] * np.ones(3, np.float32)
    mask = np.zeros((h, w), np.uint8)
    palette = np.random.default_rng([seed, 1 << 20]).uniform(0, 255, (num_classes, 3))
    boxes = np.zeros((n, 4), np.float32)
    labels = rng.integers(0, num_classes, n).astype(np.int64)
    for k in range(n):
        bw, bh = int(rng.integers(2, max(3, w // 2))), int(rng.integers(2, max(3, h // 2)))
        x0, y0 = int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1))
        edge = int(rng.integers(0, 6))  # 0..3: pushed against that edge, else where it fell
        x0 = 0 if edge == 0 else w - bw if edge == 1 else x0
        y0 = 0 if edge == 2 else h - bh if edge == 3 else y0
        img[y0:y0 + bh, x0:x0 + bw] = palette[labels[k]]
        mask[y0:y0 + bh, x0:x0 + bw] = labels[k] + 1
        boxes[k] = (x0, y0, x0 + bw, y0 + bh)
    pil = _pil()
    jpeg, png = io.BytesIO(), io.BytesIO()
    pil.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(jpeg, format="JPEG", quality=90)
    fields = {"jpg": jpeg.getvalue()}
    if "boxes" in targets:
        fields["json"] = encode_boxes(boxes, labels)
    if "masks" in targets:
        pil.fromarray(mask, mode="L").save(png, format="PNG")
        fields["mask.png"] = png.getvalue()
    if not targets:
        fields["cls"] = str(index % num_classes).encode()
    return DetectionSample(boxes, labels, mask, fields)


def write_detection_shards(dst: str, *, num_images: int, size: tuple[int, int] = (64, 48), num_classes: int = 3,
                           targets: Sequence[str] = ("boxes", "masks"), seed: int = 0, shard_size: int = 100,
                           storage_options: Mapping[str, Any] | None = None, max_objects: int = 4):
    """Write :func:`detection_sample` 0..``num_images``-1 as shards + ``index.json`` (keys
    ``det_NNNNNN``, classes ``class_0``...) under ``dst``; returns the manifest. With several
    objects an image's later rectangles may cover an earlier one (its box stays, its mask pixels
    go); ``max_objects=1`` never overlaps."""
    from gpupipe.formats.writer import ShardSink

    sink = ShardSink(dst, shard_size=shard_size, storage_options=storage_options,
                     classes=tuple(f"class_{c}" for c in range(num_classes)))
    for i in range(num_images):
        sink.write(f"det_{i:06d}", detection_sample(seed, i, size, num_classes, targets, max_objects).fields)
    return sink.close()
