"""Issue 34: the decode thread places a batch's crop boxes and decode windows with a fixed number
of numpy operations, not a Python loop per sample. The vectorized functions must give exactly
what the per-row code gave (the same integers, the same float64 bits, the same float32 casts):
the ``_rowwise_*`` functions below are that per-row code as it was (commit 161d1bb), kept here as
the reference."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpupipe.decode import DecodeConfig, DecodeStats
from gpupipe.decode.common import (
    STRETCH_TOLERANCE,
    count_stretched,
    count_stretched_sizes,
    crop_boxes,
    crop_boxes_from_sizes,
    shorter_box,
    shorter_boxes,
    shorter_geometries,
    shorter_geometry,
    upright_size,
    upright_sizes,
)
from gpupipe.decode.roi import _EDGE, any_partial, dali_slices, decode_window, decode_windows
from gpupipe.formats.imageheader import ImageHeader

# -- the per-row reference (the code these functions replace) --------------------------------


def _rowwise_any_partial(boxes, images, size, **window) -> bool:
    return any(image is not None and decode_window(box, image, size, **window) != (0, 0, *image)
               for box, image in zip(boxes, images))


def _rowwise_dali_slices(boxes, images, size, **window) -> dict[str, np.ndarray]:
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


def _rowwise_crop_boxes(images, config) -> np.ndarray:
    """``shorter`` and ``fixed`` (``random_resized_crop`` is still per row: the same code)."""
    boxes = np.zeros((len(images), 4), dtype=np.float64)
    for i, image in enumerate(images):
        if image is not None:
            h, w = image
            boxes[i] = shorter_box(h, w, config.image_size) if config.resize.value == "shorter" else (0, 0, h, w)
    return boxes


def _rowwise_stretch(images, size) -> tuple[int, float, tuple[int, int]]:
    out_h, out_w = size
    found, worst, worst_hw = 0, 1.0, (0, 0)
    for image in images:
        if image is None:
            continue
        h, w = image
        stretch = (w * out_h) / (h * out_w)
        stretch = max(stretch, 1 / stretch)
        if stretch > 1 + STRETCH_TOLERANCE:
            found += 1
            if stretch > worst:
                worst, worst_hw = stretch, (h, w)
    return found, worst, worst_hw


def _arrays(images) -> tuple[np.ndarray, np.ndarray]:
    hw = np.array([(0, 0) if im is None else im for im in images], np.int64).reshape(-1, 2)
    return hw, np.array([im is not None for im in images], bool)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# -- strategies -------------------------------------------------------------------------------

_EDGES = [1, 2, 3, 7, 224, 250, 256, 4999, 5000, 20000]
sides = st.one_of(st.sampled_from(_EDGES), st.integers(1, 20000))
out_sizes = st.tuples(st.one_of(st.sampled_from([1, 2, 224, 1024]), st.integers(1, 1024)),
                      st.one_of(st.sampled_from([1, 2, 224, 1024]), st.integers(1, 1024)))


@st.composite
def rows(draw, size: tuple[int, int]):
    """An upright (h, w) (None: a row not decoded as itself) and a box inside it: whole pixels
    or fractions, at the edges or anywhere, the ``shorter`` box, or the whole image."""
    if draw(st.integers(0, 9)) == 0:
        return None, (0.0, 0.0, 0.0, 0.0)
    h, w = draw(sides), draw(sides)
    kind = draw(st.sampled_from(["pixels", "fraction", "edge", "shorter", "whole"]))
    if kind == "shorter":
        return (h, w), shorter_box(h, w, size)
    if kind == "whole":
        return (h, w), (0.0, 0.0, float(h), float(w))
    box = []
    for extent in (h, w):
        if kind == "pixels":
            start = draw(st.integers(0, extent - 1))
            length = draw(st.integers(1, extent - start))
        elif kind == "edge":  # touching the far edge
            length = draw(st.integers(1, extent))
            start = extent - length
        else:
            start = draw(st.floats(0, extent, exclude_max=True))
            length = draw(st.floats(min(1e-3, extent - start), extent - start).filter(lambda v: v > 0))
        box.append((float(start), float(length)))
    return (h, w), (box[0][0], box[1][0], box[0][1], box[1][1])


@st.composite
def batches(draw):
    size = draw(out_sizes)
    drawn = draw(st.lists(rows(size), min_size=0, max_size=24))
    images = [im for im, _ in drawn]
    boxes = np.array([b for _, b in drawn], np.float64).reshape(-1, 4)
    return size, images, boxes


# -- decode windows and DALI's slice inputs -----------------------------------------------------

@settings(max_examples=600, deadline=None)
@given(batch=batches(), past_box=st.booleans(), from_origin=st.booleans())
def test_dali_slices_and_any_partial_are_the_rowwise_ones_bit_for_bit(batch, past_box, from_origin):
    size, images, boxes = batch
    hw, exists = _arrays(images)
    window = {"past_box": past_box, "from_origin": from_origin}
    got, want = dali_slices(boxes, hw, exists, size, **window), _rowwise_dali_slices(boxes, images, size, **window)
    assert got.keys() == want.keys()
    for k in want:
        assert _same_bits(got[k], want[k]), k
    assert any_partial(boxes, hw, exists, size, **window) == _rowwise_any_partial(boxes, images, size, **window)


@settings(max_examples=300, deadline=None)
@given(batch=batches(), past_box=st.booleans(), from_origin=st.booleans())
def test_decode_windows_are_decode_window_row_by_row(batch, past_box, from_origin):
    size, images, boxes = batch
    keep = [i for i, im in enumerate(images) if im is not None]
    hw = np.array([images[i] for i in keep], np.int64).reshape(-1, 2)
    got = decode_windows(boxes[keep], hw, size, past_box=past_box, from_origin=from_origin)
    assert got.dtype == np.int64 and got.shape == (len(keep), 4)
    want = [decode_window(boxes[i], images[i], size, past_box=past_box, from_origin=from_origin) for i in keep]
    assert got.tolist() == [list(w) for w in want]


def test_integer_boxes_and_an_empty_batch():
    """Integer boxes (as ``random_resized_crop`` draws them) go in as they are; no rows, no work."""
    boxes = np.array([(10, 20, 100, 50), (0, 0, 157, 203), (100, 190, 40, 13)], np.int64)
    images = [(157, 203)] * 3
    hw, exists = _arrays(images)
    for past_box in (True, False):
        got = dali_slices(boxes, hw, exists, (25, 25), past_box=past_box)
        want = _rowwise_dali_slices(boxes, images, (25, 25), past_box=past_box)
        assert all(_same_bits(got[k], want[k]) for k in want)
    empty = dali_slices(np.zeros((0, 4)), np.zeros((0, 2), np.int64), np.zeros(0, bool), (8, 8))
    assert all(v.shape == (0, 2) and v.dtype == np.float32 for v in empty.values())
    assert not any_partial(np.zeros((0, 4)), np.zeros((0, 2), np.int64), np.zeros(0, bool), (8, 8))


def test_rows_that_do_not_exist_get_the_whole_image_and_are_never_partial():
    boxes = np.array([(5.0, 5.0, 10.0, 10.0)] * 2)
    hw = np.array([(100, 100), (0, 0)], np.int64)
    out = dali_slices(boxes, hw, np.array([False, False]), (8, 8))
    assert [out[k].tolist() for k in ("win_start", "win_end", "roi_start", "roi_end")] == [
        [[0, 0]] * 2, [[1, 1]] * 2, [[0, 0]] * 2, [[1, 1]] * 2]
    assert not any_partial(boxes, hw, np.array([False, False]), (8, 8))
    assert any_partial(boxes, hw, np.array([True, False]), (8, 8))


# -- shorter's geometry and the crop boxes ----------------------------------------------------

@settings(max_examples=1000, deadline=None)
@given(h=st.integers(1, 5000), w=st.integers(1, 5000), size=st.tuples(st.integers(1, 1024), st.integers(1, 1024)))
@example(h=1, w=1, size=(1024, 1024))
@example(h=5000, w=1, size=(1, 1024))
@example(h=1, w=5000, size=(1024, 1))
@example(h=157, w=203, size=(224, 224))
def test_shorter_geometries_are_shorter_geometry(h, w, size):
    assert shorter_geometries(np.array([(h, w)]), size).tolist() == [list(shorter_geometry(h, w, size))]
    assert _same_bits(shorter_boxes(np.array([(h, w)]), size), np.array([shorter_box(h, w, size)]))


@pytest.mark.parametrize("seed", range(4))
def test_shorter_geometries_over_a_sweep(seed):
    """25k random (h, w) in 1..5000 a seed, in one call, against the scalar rule; the size in
    1..1024, square for seed 0."""
    rng = np.random.default_rng(seed)
    size = (int(rng.integers(1, 1025)), int(rng.integers(1, 1025)))
    size = (size[0], size[0]) if seed == 0 else size
    hw = rng.integers(1, 5001, (25_000, 2))
    got = shorter_geometries(hw, size)
    want = np.array([shorter_geometry(int(h), int(w), size) for h, w in hw.tolist()])
    assert np.array_equal(got, want)
    assert _same_bits(shorter_boxes(hw, size), np.array([shorter_box(int(h), int(w), size) for h, w in hw.tolist()]))


def test_shorter_geometries_at_the_sizes_extremes():
    side = np.arange(1, 5001)
    for size in [(1, 1), (1, 1024), (1024, 1), (1024, 1024), (224, 224), (3, 5)]:
        for hw in (np.stack([side, side[::-1]], 1), np.stack([side, np.full_like(side, 20000)], 1),
                   np.stack([np.full_like(side, 1), side], 1)):
            want = [list(shorter_geometry(int(h), int(w), size)) for h, w in hw.tolist()]
            assert shorter_geometries(hw, size).tolist() == want, size


@settings(max_examples=300, deadline=None)
@given(batch=batches(), mode=st.sampled_from(["shorter", "fixed"]))
def test_crop_boxes_from_sizes_are_the_rowwise_ones(batch, mode):
    size, images, _ = batch
    config = DecodeConfig(image_size=size, resize=mode)
    hw, exists = _arrays(images)
    got = crop_boxes_from_sizes(hw, exists, list(range(len(images))), 0, config)
    assert _same_bits(got, _rowwise_crop_boxes(images, config))


def _header(h: int, w: int, orientation: int = 1) -> ImageHeader:
    return ImageHeader(format="jpeg", width=w, height=h, channels=3, orientation=orientation)


def test_upright_sizes_swap_for_orientations_5_to_8():
    headers = [_header(30, 40, o) for o in range(1, 9)] + [None, _header(1, 20000, 6)]
    hw, exists = upright_sizes(headers)
    assert hw.dtype == np.int64 and exists.dtype == bool
    assert hw.tolist() == [list(upright_size(h)) if h is not None else [0, 0] for h in headers]
    assert exists.tolist() == [h is not None for h in headers]
    assert upright_sizes([])[0].shape == (0, 2)


@pytest.mark.parametrize("mode", ["random_resized_crop", "shorter", "fixed"])
def test_crop_boxes_from_headers_is_the_sizes_form(mode):
    headers = [_header(30 + 7 * i, 200 - 9 * i, 1 + i % 8) for i in range(12)] + [None]
    config = DecodeConfig(image_size=(24, 32), resize=mode, seed=5)
    ids = [101 + 3 * i for i in range(len(headers))]
    got = crop_boxes(headers, ids, 2, config)
    assert _same_bits(got, crop_boxes_from_sizes(*upright_sizes(headers), ids, 2, config))
    assert got[-1].tolist() == [0, 0, 0, 0]
    if mode != "random_resized_crop":
        assert _same_bits(got, _rowwise_crop_boxes([None if h is None else upright_size(h) for h in headers], config))


@settings(max_examples=300, deadline=None)
@given(images=st.lists(st.one_of(st.none(), st.tuples(sides, sides)), max_size=24), size=out_sizes)
def test_count_stretched_sizes_counts_as_the_rowwise_loop(images, size):
    stats = DecodeStats()
    hw, exists = _arrays(images)
    count_stretched_sizes(hw, exists, DecodeConfig(image_size=size), stats)
    found, worst, _ = _rowwise_stretch(images, size)
    assert stats.stretched == found
    assert stats.worst_stretch == (worst if found else DecodeStats().worst_stretch)


def test_count_stretched_names_the_first_of_the_worst(caplog):
    """The warning names the first image with the largest stretch, as the loop did."""
    images = [(100, 100), (100, 300), (300, 100), (100, 300), None]
    hw, exists = _arrays(images)
    with caplog.at_level("WARNING", "gpupipe.decode.common"):
        count_stretched_sizes(hw, exists, DecodeConfig(image_size=(50, 50)), DecodeStats())
    assert _rowwise_stretch(images, (50, 50)) == (3, 3.0, (100, 300))
    (message,) = [r.getMessage() for r in caplog.records]
    assert "3 of 4 images" in message and "width x height 300x100 to 50x50, 3.00x" in message
    stats = DecodeStats()
    count_stretched([_header(*im) if im else None for im in images], DecodeConfig(image_size=(50, 50)), stats)
    assert stats.stretched == 3 and stats.worst_stretch == 3.0
