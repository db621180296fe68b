"""The CPU path's resize (gpupipe.decode.resize): each crop box to the output size with
torch's antialiased bilinear uint8 resize — Pillow's resize of the cropped box, the same
interpolation DALI's CPU resize did at a quarter of its cost — and the DALI backend using
it for every resize mode."""
from __future__ import annotations

import decode_corpus as corpus
import numpy as np
import pytest
import torch
from PIL import Image

from gpupipe.core.types import Sample
from gpupipe.decode import DecodeConfig, make_decoder
from gpupipe.decode.resize import crop_and_resize
from gpupipe.stream.batch import pack


def _image(h: int, w: int, seed: int) -> np.ndarray:
    """Smooth gradients plus an edge and some noise: every filter tap matters."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    planes = [(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)), (xx > w // 3) * 180 + (yy % 7) * 10]
    noisy = np.stack(planes, -1) + rng.integers(-20, 21, (h, w, 3))
    return np.clip(noisy, 0, 255).astype(np.uint8)


def _pillow(image: np.ndarray, box, size) -> np.ndarray:
    top, left, bottom, right = box
    crop = Image.fromarray(np.ascontiguousarray(image[top:bottom, left:right]))
    return np.asarray(crop.resize(size[::-1], Image.BILINEAR))


@pytest.mark.parametrize("size", [(32, 32), (24, 40), (90, 70)])  # reduce, mixed, enlarge
def test_each_box_is_pillows_resize_of_the_cropped_box(size):
    images = [_image(60, 80, 1), _image(75, 50, 2), _image(60, 80, 3)]
    boxes = np.array([[0, 0, 60, 80], [10, 5, 61, 44], [7, 13, 19, 77]])  # (top, left, bottom, right)
    got = crop_and_resize(images, boxes[:, :2], boxes[:, 2:], relative=False, size=size)
    assert got.dtype == torch.uint8 and tuple(got.shape) == (3, *size, 3)
    for i, (image, box) in enumerate(zip(images, boxes)):
        diff = np.abs(got[i].numpy().astype(int) - _pillow(image, box, size))
        assert diff.max() <= 1, (i, diff.max())  # the same filter; 1 level of rounding


def test_relative_boxes_land_on_the_same_pixels_as_absolute_ones():
    images = [_image(68, 66, 4), _image(41, 97, 5)]
    boxes = np.array([[2, 2, 66, 64], [0, 31, 41, 90]], np.float64)
    extent = np.array([im.shape[:2] for im in images], np.float64)
    start, end = (boxes[:, :2] / extent).astype(np.float32), (boxes[:, 2:] / extent).astype(np.float32)  # float32 error
    absolute = crop_and_resize(images, boxes[:, :2], boxes[:, 2:], relative=False, size=(20, 20))
    assert torch.equal(crop_and_resize(images, start, end, relative=True, size=(20, 20)), absolute)


def test_a_box_of_the_output_size_is_copied_and_a_box_past_the_edge_is_clipped():
    image = _image(30, 40, 6)
    got = crop_and_resize([image, image], np.array([[5, 7], [-3, -3]]), np.array([[25, 31], [33, 43]]),
                       relative=False, size=(20, 24))
    assert torch.equal(got[0], torch.from_numpy(image[5:25, 7:31]))
    assert np.abs(got[1].numpy().astype(int) - _pillow(image, (0, 0, 30, 40), (20, 24))).max() <= 1


@pytest.mark.dali
@pytest.mark.parametrize("resize", ["fixed", "shorter", "random_resized_crop"])
def test_dali_on_the_cpu_resizes_its_decode_with_torch(resize):
    """DALI decodes (whole image or window), torch resizes: each row is within a level of
    Pillow's resize of DALI's own full-size decode: cropped to the row's box (``fixed``,
    ``random_resized_crop``), or the whole decode resized by Pillow's fractional ``box``, which
    reads past it (``shorter``: torchvision's Resize + CenterCrop)."""
    pytest.importorskip("nvidia.dali")
    from gpupipe.decode.common import crop_boxes
    from gpupipe.formats.imageheader import probe

    jpegs = corpus.natural_jpegs(6, (150, 200))
    batch = pack([Sample(key=f"s{i}", fields={"jpg": j}, sample_id=i, label=0) for i, j in enumerate(jpegs)],
                 [True] * len(jpegs))
    config = DecodeConfig(backend="dali", image_size=(48, 64), resize=resize, num_threads=2, seed=7)
    full = make_decoder(DecodeConfig(backend="dali", resize="none", num_threads=2), "cpu")
    decoder = make_decoder(config, "cpu")
    try:
        got = decoder.decode(batch).images.permute(0, 2, 3, 1).numpy()
        whole = full.decode(batch).images.permute(0, 2, 3, 1).numpy()
    finally:
        decoder.close()
        full.close()
    boxes = crop_boxes([probe(j) for j in jpegs], list(range(len(jpegs))), 0, config)
    for i, (top, left, h, w) in enumerate(boxes):
        if resize == "shorter":  # a resize of the whole image cut to the fractional box: Pillow's box reads past it
            want = np.asarray(Image.fromarray(whole[i]).resize((64, 48), Image.BILINEAR, box=(left, top, left + w, top + h)))
        else:
            want = _pillow(whole[i], tuple(int(v) for v in (top, left, top + h, left + w)), (48, 64))
        assert np.abs(got[i].astype(int) - want).max() <= 1, (resize, i)


def test_runs_on_a_pool_give_the_rows_of_one_thread():
    """Rows cut into runs for the pool's threads land in their own slots: the batch equals the
    one-thread batch, whatever the number of runs (more runs than rows included)."""
    from concurrent.futures import ThreadPoolExecutor

    images = [_image(40 + 3 * i, 50 + 2 * i, i) for i in range(7)]
    start = np.array([[i, 2 * i] for i in range(7)])
    end = np.array([[im.shape[0] - i, im.shape[1] - 1] for i, im in enumerate(images)])
    want = crop_and_resize(images, start, end, relative=False, size=(16, 24))
    with ThreadPoolExecutor(3) as pool:
        for parts in (2, 3, 9):
            got = crop_and_resize(images, start, end, relative=False, size=(16, 24), executor=pool, parts=parts)
            assert torch.equal(got, want), parts
