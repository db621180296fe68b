"""The decode's crop modes against the real torchvision v2 applied to Pillow's decode of the
same JPEG (issue 26): ``resize: shorter`` is ``Resize(s)`` + ``CenterCrop(s)``,
``random_resized_crop`` is ``resized_crop`` of the same box.

Photo-like JPEGs (dead leaves, q90) at four aspect ratios. Tolerances (0..255 scale) are
interpolation rounding, never another geometry:

* DALI on the CPU: torch's uint8 resize, the kernel torchvision runs, of the same pixels (DALI
  and Pillow both decode with libjpeg-turbo): max 1 (measured 0: 3 images x 4 shapes x 3 sizes
  here, and 320x240 photos).
* Pillow (``pil``): its own fixed-point triangle filter: max 1 (measured max 1, mean <= 0.17,
  at most 17% of values, by one level). Where the box is 4x the output or more, Pillow decodes
  at 1/2..1/8 scale in the DCT domain first (gpupipe.decode.roi.draft_scale), a cruder
  low-pass: ``TOL_DRAFT`` mean 1.0, p99 5 (measured mean 0.61-0.78, p99 2-4, max 6 here; mean
  0.63-0.68, p99 3, max 9 on 320x240 photos at 56).
* before issue 26 the box was the largest centred box of the output's aspect, resized alone:
  mean 1.6, p99 15, max 65 (benchmarks/tv_pixels.py).
"""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import torchvision.transforms.v2 as v2
import torchvision.transforms.v2.functional as TF
from PIL import Image

from gpupipe.core.types import Sample
from gpupipe.decode import DecodeConfig, make_decoder
from gpupipe.decode.common import crop_boxes, shorter_box, shorter_geometry
from gpupipe.decode.roi import draft_scale
from gpupipe.formats.imageheader import probe
from gpupipe.stream.batch import pack
from gpupipe.tools.synth import dead_leaves_jpeg

SHAPES = [(96, 72), (72, 96), (100, 60), (80, 80)]  # (width, height)
SIDES = [56, 32, 16]  # 16 from a 60-72 px side: the DCT draft (1/2) in the pil backend


def _stats(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float, float]:
    d = (got.double() - want.double()).abs().flatten()
    return d.max().item(), d.mean().item(), torch.quantile(d, 0.99).item()


@pytest.fixture(scope="module")
def photos() -> dict[tuple[int, int], tuple[list[bytes], torch.Tensor]]:
    """(width, height) -> (3 JPEGs, their Pillow decode as a (3, 3, H, W) uint8 batch)."""
    out = {}
    for size in SHAPES:
        jpegs = [dead_leaves_jpeg(26, i, size) for i in range(3)]
        pixels = [np.array(Image.open(io.BytesIO(j)).convert("RGB")) for j in jpegs]
        out[size] = jpegs, torch.stack([torch.from_numpy(p).permute(2, 0, 1) for p in pixels])
    return out


def _decode(backend: str, jpegs: list[bytes], **config):
    batch = pack([Sample(key=f"s{i}", fields={"jpg": j}, sample_id=i, label=0) for i, j in enumerate(jpegs)],
                 [True] * len(jpegs))
    decoder = make_decoder(DecodeConfig(backend=backend, num_threads=2, **config), torch.device("cpu"))
    try:
        return decoder.decode(batch).images
    finally:
        decoder.close()


BACKENDS = ["pil", pytest.param("dali", marks=pytest.mark.dali)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{w}x{h}" for w, h in SHAPES])
def test_shorter_is_resize_then_center_crop(photos, backend, shape):
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    jpegs, pixels = photos[shape]
    for s in SIDES:
        got = _decode(backend, jpegs, image_size=(s, s), resize="shorter")
        want = v2.CenterCrop(s)(v2.Resize(s)(pixels))
        worst, mean, p99 = _stats(got, want)
        drafted = backend == "pil" and draft_scale(shorter_box(shape[1], shape[0], (s, s)), (s, s)) > 1
        if drafted:  # TOL_DRAFT
            assert mean <= 1.0 and p99 <= 5, (shape, s, worst, mean, p99)
        else:
            assert worst <= 1, (shape, s, worst, mean, p99)


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_resized_crop_is_resized_crop_of_the_same_box(photos, backend):
    """torchvision's ``resized_crop``: the box cut out, then resized (the filter never reads
    past the box); max 1 (measured 1 for pil, 0 for DALI on the CPU)."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    config = {"image_size": (24, 24), "resize": "random_resized_crop", "scale": (0.3, 1.0), "seed": 4}
    for shape in SHAPES[:2]:
        jpegs, pixels = photos[shape]
        got = _decode(backend, jpegs, **config)
        boxes = crop_boxes([probe(j) for j in jpegs], list(range(len(jpegs))), 0, DecodeConfig(**config))
        want = torch.stack([TF.resized_crop(pixels[i], *(int(v) for v in boxes[i]), [24, 24]) for i in range(3)])
        assert _stats(got, want)[0] <= 1, shape


@pytest.mark.parametrize("h, w", [(72, 96), (96, 72), (60, 100), (80, 80), (157, 203), (375, 500), (500, 333)])
@pytest.mark.parametrize("s", [16, 56, 224])
def test_shorter_geometry_is_torchvisions(h, w, s):
    """(resized size, crop corner) as torchvision computes them (its output size from a resize
    of an empty-content image, its crop anchor int(round((H - s) / 2)))."""
    rh, rw, top, left = shorter_geometry(h, w, (s, s))
    resized = TF.resize(torch.zeros((1, h, w), dtype=torch.uint8), [s])
    assert (rh, rw) == tuple(resized.shape[-2:])
    assert (top, left) == (int(round((rh - s) / 2.0)), int(round((rw - s) / 2.0)))
    box = shorter_box(h, w, (s, s))  # the crop carried back: scale h / rh, w / rw
    assert box == pytest.approx((top * h / rh, left * w / rw, s * h / rh, s * w / rw))


@pytest.mark.parametrize("h, w, size", [(120, 160, (30, 80)), (160, 120, (30, 80)), (100, 100, (20, 50)),
                                        (333, 500, (224, 160))])
def test_shorter_covers_a_non_square_output_with_the_smallest_side(h, w, size):
    """A non-square ``image_size``: the smallest ``Resize(s)`` whose result covers it."""
    rh, rw, top, left = shorter_geometry(h, w, size)
    assert rh >= size[0] and rw >= size[1] and top >= 0 and left >= 0
    short, long = min(h, w), max(h, w)
    s = min(rh, rw)
    smaller = (s - 1, int((s - 1) * long / short))
    smaller_hw = smaller if h <= w else smaller[::-1]
    assert smaller_hw[0] < size[0] or smaller_hw[1] < size[1]


def test_nvjpeg_resizes_as_torchvision_does():
    """The nvjpeg backend's resize (pure torch; the GPU decode is not needed to check it) on a
    CPU tensor: float32, antialiased, rounded, as torchvision on CUDA; against torchvision's
    CPU uint8 kernel, a level of rounding."""
    from gpupipe.decode.base import ResizeMode
    from gpupipe.decode.nvjpeg import _resize

    image = torch.from_numpy(np.array(Image.open(io.BytesIO(dead_leaves_jpeg(26, 0, (96, 72)))))).permute(2, 0, 1)
    got = _resize(image, shorter_box(72, 96, (32, 32)), ResizeMode.SHORTER, (32, 32))
    assert _stats(got, v2.CenterCrop(32)(v2.Resize(32)(image)))[0] <= 1
    box = (5, 7, 40, 50)
    got = _resize(image, box, ResizeMode.RANDOM_CROP, (24, 24))
    assert _stats(got, TF.resized_crop(image, *box, [24, 24]))[0] <= 1
