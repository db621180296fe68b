"""Decode only what is used (issue 16): the windows and DCT scales of ``gpupipe.decode.roi``,
and that each backend takes its shortcut. That the pixels stay within the contract's tolerance
of a full decode, under every EXIF orientation, is the contract suite's
``test_crop_modes_match_a_full_decode_under_every_orientation``."""
from __future__ import annotations

import io

import decode_corpus as corpus
import numpy as np
import pytest
import torch
from PIL import Image, ImageOps, JpegImagePlugin

from gpupipe.core.types import Sample
from gpupipe.decode import DecodeConfig, ResizeMode, make_decoder
from gpupipe.decode.roi import dali_slices, decode_window, draft_scale, drafted_box, transpose_box
from gpupipe.stream.batch import pack

PHOTO = corpus.oriented_jpegs()  # 203x157 (w x h), orientations 1..8
INVERSE = {1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 8, 7: 7, 8: 6}


def batch_of(images: list[bytes], ids: list[int] | None = None):
    ids = list(range(len(images))) if ids is None else ids
    samples = [Sample(key=f"k{i}", fields={"jpg": d}, sample_id=i, label=0) for i, d in zip(ids, images)]
    return pack(samples, [True] * len(samples))


def decode(backend: str, images: list[bytes], **options):
    decoder = make_decoder(DecodeConfig(backend=backend, num_threads=2, **options), torch.device("cpu"))
    try:
        return decoder.decode(batch_of(images))
    finally:
        decoder.close()


def exif_transposed(pixels: np.ndarray, orientation: int) -> np.ndarray:
    """What Pillow shows for ``pixels`` stored with EXIF ``orientation`` (a lossless PNG)."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG", exif=exif.tobytes())
    return np.asarray(ImageOps.exif_transpose(Image.open(buf)))


# -- the pure parts -------------------------------------------------------------------------

@pytest.mark.parametrize("orientation", range(1, 9))
def test_transpose_box_carries_an_upright_box_to_the_stored_pixels(orientation):
    """An upright box carried to the stored frame selects the stored pixels that Pillow's EXIF
    transpose turns into that box's pixels."""
    rng = np.random.default_rng(orientation)
    stored = rng.integers(0, 256, (13, 19, 3), dtype=np.uint8)
    upright = exif_transposed(stored, orientation)
    uh, uw = upright.shape[:2]
    for _ in range(5):
        top, left = int(rng.integers(0, uh - 2)), int(rng.integers(0, uw - 2))
        h, w = int(rng.integers(1, uh - top + 1)), int(rng.integers(1, uw - left + 1))
        x0, y0, x1, y1 = (int(v) for v in transpose_box((left, top, left + w, top + h), INVERSE[orientation], (uw, uh)))
        assert np.array_equal(exif_transposed(stored[y0:y1, x0:x1], orientation), upright[top:top + h, left:left + w])


def test_drafted_box_minds_the_rounded_up_scaled_size():
    """203 px wide at scale 1/2 decodes to 102 px; flipped (orientation 2), the upright left
    edge is 0.5 drafted px in (stored x 203 -> 101.5 of 102), where plain division says 0."""
    assert drafted_box((0, 0, 157, 10), 2, (203, 157), (102, 79), 2.0) == (0.5, 0.0, 5.5, 78.5)
    assert drafted_box((0, 0, 157, 10), 1, (203, 157), (102, 79), 2.0) == (0.0, 0.0, 5.0, 78.5)
    for o in range(1, 9):  # at scale 1 the box comes back as it went
        stored = (157, 203) if o in (5, 6, 7, 8) else (203, 157)
        assert drafted_box((3, 5, 100, 90), o, stored, stored, 1.0) == (5, 3, 95, 103)


@pytest.mark.parametrize(("side", "out", "scale"), [(250, 128, 1), (375, 128, 1), (511, 128, 1), (512, 128, 2),
                                                     (1000, 128, 2), (1024, 128, 4), (2048, 128, 8), (4096, 128, 8)])
def test_draft_scale_leaves_at_least_twice_to_the_resize(side, out, scale):
    assert draft_scale((0, 0, side, side + 50), (out, out)) == scale


def test_decode_window_reaches_past_the_box_by_the_filter_and_stays_inside():
    # 100x50 to 25x25: the filter reaches 4 source px, plus one
    assert decode_window((10, 20, 100, 50), (157, 203), (25, 25)) == (5, 15, 110, 60)
    assert decode_window((0, 0, 157, 203), (157, 203), (25, 25)) == (0, 0, 157, 203)
    assert decode_window((100, 190, 40, 13), (157, 203), (50, 50)) == (98, 188, 44, 15)  # enlarging: reach 2


@pytest.mark.parametrize("extent", [(157, 203), (4000, 6000), (65000, 30000)])
def test_dali_slices_round_back_to_the_window(extent):
    """DALI turns relative slice coordinates into pixels; rounded or floored, in float32, they
    come back as the integer window, and the box within it as the box."""
    rng = np.random.default_rng(extent[0])
    boxes = []
    for _ in range(200):
        h, w = int(rng.integers(1, extent[0] + 1)), int(rng.integers(1, extent[1] + 1))
        boxes.append((int(rng.integers(0, extent[0] - h + 1)), int(rng.integers(0, extent[1] - w + 1)), h, w))
    out = dali_slices(np.array(boxes), np.tile(extent, (len(boxes), 1)), np.ones(len(boxes), bool), (64, 64))
    for i, box in enumerate(boxes):
        top, left, h, w = decode_window(box, extent, (64, 64))
        for how in (np.round, np.floor):
            assert how(out["win_start"][i] * np.float32(extent)).tolist() == [top, left]
            assert how(out["win_end"][i] * np.float32(extent)).tolist() == [top + h, left + w]
        roi = np.concatenate([out["roi_start"][i], out["roi_end"][i]]) * (h, w, h, w)
        assert np.allclose(roi, (box[0] - top, box[1] - left, box[0] - top + box[2], box[1] - left + box[3]), atol=1e-2)


# -- each backend takes its shortcut --------------------------------------------------------

@pytest.fixture
def drafts(monkeypatch):
    """The DCT scale of every JPEG Pillow decodes scaled down, in call order."""
    scales: list[float] = []
    real = JpegImagePlugin.JpegImageFile.draft

    def spy(self, mode, size):
        width = self.size[0]
        result = real(self, mode, size)
        if result is not None:
            scales.append(width / result[1][2])
        return result

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", spy)
    return scales


@pytest.mark.parametrize("resize", [ResizeMode.RANDOM_CROP, ResizeMode.SHORTER, ResizeMode.FIXED])
def test_pil_decodes_scaled_down_when_the_box_is_4x_the_output(drafts, resize):
    """157x196 boxes to 16x20 (9.8x): libjpeg decodes at 1/4, leaving 2.4x to the resize."""
    out = decode("pil", [PHOTO[o] for o in range(1, 9)], image_size=(16, 20), resize=resize, scale=(1.0, 1.0),
                 ratio=(1.25, 1.25))
    assert out.images.shape == (8, 3, 16, 20) and out.valid.all()
    assert drafts == [4.0] * 8


def test_pil_decodes_whole_when_the_box_is_under_4x_the_output(drafts):
    """157x196 to 64x80 (2.45x): a DCT scale would leave less than 2x to the resize, and the
    pixels would drift past the contract's tolerance; the JPEG is decoded at full size."""
    out = decode("pil", [PHOTO[1], PHOTO[6]], image_size=(64, 80), resize=ResizeMode.SHORTER)
    assert out.images.shape == (2, 3, 64, 80) and drafts == []


@pytest.fixture
def dali_calls(monkeypatch):
    """Which DALI decoder each pipeline was built with, and what was fed to each input."""
    fn = pytest.importorskip("nvidia.dali.fn")
    from nvidia.dali.pipeline import Pipeline

    seen: dict[str, list] = {"built": []}
    for name in ("image", "image_slice"):
        real = getattr(fn.decoders, name)
        monkeypatch.setattr(fn.decoders, name,
                            lambda *a, _real=real, _name=name, **k: seen["built"].append(_name) or _real(*a, **k))
    feed = Pipeline.feed_input

    def spy(self, name, data, *args, **kwargs):
        seen.setdefault(name, []).append([np.array(d) for d in data])
        return feed(self, name, data, *args, **kwargs)

    monkeypatch.setattr(Pipeline, "feed_input", spy)
    return seen


@pytest.mark.dali
@pytest.mark.parametrize("resize", [ResizeMode.RANDOM_CROP, ResizeMode.SHORTER])
def test_dali_decodes_only_the_window_in_crop_modes(dali_calls, resize):
    out = decode("dali", [PHOTO[o] for o in range(1, 9)], image_size=(16, 16), resize=resize, scale=(0.1, 0.3))
    assert out.images.shape == (8, 3, 16, 16) and out.valid.all()
    assert dali_calls["built"] == ["image_slice"]
    (start,), (end,) = dali_calls["win_start"], dali_calls["win_end"]
    extent = np.array(end) - np.array(start)
    if resize is ResizeMode.RANDOM_CROP:  # at most 30% of the area: the box itself
        assert (extent.prod(axis=1) < 0.3).all(), extent
    else:  # torchvision's Resize(16) of 157x203 is 16x20, its CenterCrop starts 2 px in: the box is
        # x 20.3..182.7 of the source; torch's resize on the CPU needs the window to start at the image's
        # corner (gpupipe.decode.roi), and it reaches 12 px past the box: full height, 195 of 203 px wide
        assert np.allclose(extent * (157, 203), (156.75, 195), atol=0.01), extent


@pytest.mark.dali
def test_dali_decodes_whole_images_when_no_window_is_smaller(dali_calls):
    """``shorter`` on square images: every window is the whole image, and a whole decode costs
    less than a full-size slice (250x250: 6,542 against 5,774 images/s); one photo with a real
    window in the batch makes it a window decode."""
    square = corpus.natural_jpegs(2, (96, 96))
    decode("dali", square, image_size=(16, 16), resize=ResizeMode.SHORTER)
    assert dali_calls["built"] == ["image"] and "win_start" not in dali_calls
    decode("dali", [*square, PHOTO[6]], image_size=(16, 16), resize=ResizeMode.SHORTER)
    assert dali_calls["built"] == ["image", "image_slice"] and len(dali_calls["win_start"]) == 1


@pytest.mark.dali
@pytest.mark.parametrize("resize", [ResizeMode.FIXED, ResizeMode.NONE])
def test_dali_decodes_whole_images_without_a_crop(dali_calls, resize):
    out = decode("dali", [PHOTO[1], PHOTO[3]], image_size=(16, 20), resize=resize)
    assert out.valid.all() and dali_calls["built"] == ["image"] and "win_start" not in dali_calls


@pytest.mark.dali
@pytest.mark.parametrize("resize", [ResizeMode.RANDOM_CROP, ResizeMode.SHORTER, ResizeMode.FIXED])
def test_conflicting_exif_segments_decode_as_pillow_does(resize, monkeypatch):
    """``exif-6-two-app1``: the first Exif segment says 6 (32x48 upright), a second says 1.
    DALI read the second: its image came out 48x32, a box planned upright then cut the wrong
    part of it (with ``fixed``, a mean colour off by 40). Such images go to Pillow: the same
    pixels as the Pillow backend in every resize mode, and DALI is never handed them."""
    pytest.importorskip("nvidia.dali")
    import gpupipe.decode.dali as dali

    data = corpus.cases()["exif-6-two-app1"][0]
    fed = []
    submit = dali.DaliDecoder._submit
    monkeypatch.setattr(dali.DaliDecoder, "_submit", lambda self, inputs, placement: fed.extend(
        bytes(np.asarray(row)[:n]) for row, n in zip(*inputs)) or submit(self, inputs, placement))
    out = decode("dali", [data, PHOTO[1]], image_size=(16, 20), resize=resize, seed=5)
    ref = decode("pil", [data, PHOTO[1]], image_size=(16, 20), resize=resize, seed=5)
    assert out.valid.all() and out.images.shape == (2, 3, 16, 20)
    assert data not in fed and PHOTO[1] in fed
    assert (out.images[0].float() - ref.images[0].float()).abs().max() == 0
