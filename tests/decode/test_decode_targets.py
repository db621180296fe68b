"""Boxes and masks through the decode (issue 27): each sample's targets come out moved exactly as
its image was, against the real torchvision v2 on ``tv_tensors.BoundingBoxes`` / ``Mask`` with
the decoder's own crop box: boxes within 1e-4 px, masks identical, for every resize mode, on the
pil and DALI (CPU) backends, and on CUDA (pil, DALI, nvjpeg: marked ``gpu``).

Also: EXIF-rotated images (boxes and masks are in the upright frame), odd sizes, bad annotations
under ``raise`` (the sample named) and ``skip`` (counted; the row takes its replacement's pixels
*and* targets), placeholders and padding, the whole-batch stand-in, and no targets at all.
"""
from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from gpupipe.core.errors import DecodeError
from gpupipe.core.types import Sample
from gpupipe.decode import DecodeConfig, make_decoder
from gpupipe.decode.common import crop_boxes, shorter_geometry
from gpupipe.decode.targets import BOX_TOLERANCE, check_boxes, move_mask, nearest_index, read_mask
from gpupipe.formats.imageheader import probe
from gpupipe.stream.batch import EncodedTargets, pack

tv_tensors = pytest.importorskip("torchvision.tv_tensors")
TF = pytest.importorskip("torchvision.transforms.v2.functional")

_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
RUNS = [  # (backend, device)
    pytest.param("pil", "cpu", id="pil-cpu"),
    pytest.param("dali", "cpu", id="dali-cpu", marks=pytest.mark.dali),
    pytest.param("pil", "cuda", id="pil-cuda", marks=[pytest.mark.gpu, _CUDA]),
    pytest.param("dali", "cuda", id="dali-cuda", marks=[pytest.mark.gpu, pytest.mark.dali, _CUDA]),
    pytest.param("nvjpeg", "cuda", id="nvjpeg-cuda", marks=[pytest.mark.gpu, _CUDA]),
]


def _needs(backend: str) -> None:
    if backend == "dali":
        pytest.importorskip("nvidia.dali")


# -- fixtures: small JPEGs with known boxes and masks ------------------------------------------

def _jpeg(rng: np.random.Generator, upright_wh: tuple[int, int], orientation: int = 1,
          pixels: np.ndarray | None = None) -> bytes:
    """A JPEG whose *upright* image is ``upright_wh`` (``pixels``, or random blocks), stored
    under EXIF ``orientation``."""
    w, h = upright_wh
    if pixels is None:
        pixels = rng.integers(0, 256, (h // 4 + 1, w // 4 + 1, 3), dtype=np.uint8).repeat(4, 0).repeat(4, 1)[:h, :w]
    img = Image.fromarray(pixels)
    stored = {1: img, 6: img.transpose(Image.Transpose.ROTATE_90), 8: img.transpose(Image.Transpose.ROTATE_270),
              3: img.transpose(Image.Transpose.ROTATE_180)}[orientation]
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    stored.save(out, "JPEG", quality=90, exif=exif.tobytes())
    return out.getvalue()


def _png(mask: np.ndarray, mode: str = "L") -> bytes:
    img = Image.frombytes("L", mask.shape[::-1], mask.tobytes())
    if mode == "P":  # the indices, under a palette of other colours
        img = Image.frombytes("P", img.size, mask.tobytes())
        img.putpalette([v for i in range(256) for v in ((i * 37) % 256, (i * 91) % 256, i)])
    elif mode != "L":
        img = img.convert(mode)
    out = io.BytesIO()
    img.save(out, "PNG")
    return out.getvalue()


def _boxes(rng: np.random.Generator, wh: tuple[int, int], n: int) -> np.ndarray:
    """``n`` boxes in a (w, h) image, some touching its edges; xyxy float32."""
    w, h = wh
    x = np.sort(rng.uniform(0, w, (n, 2)), axis=1)
    y = np.sort(rng.uniform(0, h, (n, 2)), axis=1)
    out = np.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], 1)
    if n >= 2:
        out[0] = (0, 0, w, h)  # the whole image
        out[1, 2:] = (w, h)  # to the far corner
    return out.astype(np.float32)


@dataclasses.dataclass
class Item:
    jpeg: bytes
    boxes: np.ndarray
    labels: np.ndarray
    mask: np.ndarray  # upright (h, w)
    png: bytes


def _item(seed: int, wh: tuple[int, int], n: int, orientation: int = 1, mode: str = "L") -> Item:
    rng = np.random.default_rng(seed)
    mask = rng.integers(0, 5, (wh[1] // 3 + 1, wh[0] // 3 + 1), dtype=np.uint8).repeat(3, 0).repeat(3, 1)
    mask = np.ascontiguousarray(mask[:wh[1], :wh[0]])
    mask[0, :] = 7  # a line at the edge: a nearest-neighbour slip shows
    return Item(_jpeg(rng, wh, orientation), _boxes(rng, wh, n), rng.integers(0, 9, n).astype(np.int64), mask,
                _png(mask, mode))


def make_batch(items: list[Item], *, kinds=("boxes", "masks"), valid=None, pngs=None, boxes=None):
    """An EncodedBatch of ``items`` with their targets (``pngs``/``boxes`` override per row)."""
    valid = valid or [True] * len(items)
    samples = [Sample(key=f"s{i}", fields={"jpg": it.jpeg} if it.jpeg else {}, sample_id=i, label=10 + i)
               for i, it in enumerate(items)]
    batch = pack(samples, valid)
    targets = {}
    if "boxes" in kinds:
        per = boxes or [it.boxes for it in items]
        targets.update(box_counts=torch.tensor([len(b) for b in per], dtype=torch.int64),
                       boxes=torch.from_numpy(np.concatenate(per).reshape(-1, 4).astype(np.float32)),
                       box_labels=torch.from_numpy(np.concatenate([it.labels for it in items])))
    if "masks" in kinds:
        data = pngs or [it.png for it in items]
        offsets = np.concatenate([[0], np.cumsum([len(d) for d in data])])
        targets.update(mask_data=torch.frombuffer(bytearray(b"".join(data) or b"\0"), dtype=torch.uint8),
                       mask_offsets=torch.from_numpy(offsets.astype(np.int64)))
    return dataclasses.replace(batch, targets=EncodedTargets(**targets))


def _decode(backend: str, device: str, batches, **config):
    decoder = make_decoder(DecodeConfig(backend=backend, num_threads=2, **config), torch.device(device))
    try:
        return [decoder.decode(b) for b in batches], decoder.stats
    finally:
        decoder.close()


ITEMS = [  # (seed, upright (w, h), boxes, orientation, mask mode)
    (0, (64, 48), 5, 1, "L"),
    (1, (37, 53), 3, 1, "P"),  # odd sides, a palette mask
    (2, (50, 50), 0, 1, "L"),  # no boxes
    (3, (45, 31), 4, 6, "L"),  # stored 31x45, rotated upright by EXIF
    (4, (41, 59), 2, 8, "L"),
    (5, (33, 29), 1, 3, "L"),
]


@pytest.fixture(scope="module")
def items() -> list[Item]:
    return [_item(s, wh, n, o, m) for s, wh, n, o, m in ITEMS]


# -- against torchvision ----------------------------------------------------------------------

def _torchvision(item: Item, crop, config: DecodeConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """torchvision v2 on the sample's BoundingBoxes and Mask, with the decoder's crop box."""
    h, w = item.mask.shape
    boxes = tv_tensors.BoundingBoxes(torch.from_numpy(item.boxes), format="XYXY", canvas_size=(h, w))
    mask = tv_tensors.Mask(torch.from_numpy(item.mask))
    size = list(config.image_size) if config.image_size else None

    def apply(x):
        if config.resize.value == "random_resized_crop":
            return TF.resized_crop(x, *(int(v) for v in crop), size)
        if config.resize.value == "shorter":
            rh, rw, _, _ = shorter_geometry(h, w, config.image_size)
            return TF.center_crop(TF.resize(x, [min(rh, rw)]), size)
        if config.resize.value == "fixed":
            return TF.resize(x, size)
        return x

    return apply(boxes).as_subclass(torch.Tensor), apply(mask).as_subclass(torch.Tensor)


CONFIGS = [
    pytest.param({"image_size": (24, 24), "resize": "random_resized_crop", "scale": (0.2, 1.0), "seed": 3}, id="rrc"),
    pytest.param({"image_size": (40, 40), "resize": "random_resized_crop", "scale": (0.5, 1.0), "seed": 5},
                 id="rrc-up"),
    pytest.param({"image_size": (20, 20), "resize": "shorter"}, id="shorter"),
    pytest.param({"image_size": (18, 26), "resize": "shorter"}, id="shorter-wide"),
    pytest.param({"image_size": (70, 30), "resize": "shorter"}, id="shorter-up"),
    pytest.param({"image_size": (21, 33), "resize": "fixed"}, id="fixed"),
]


@pytest.mark.parametrize("backend, device", RUNS)
@pytest.mark.parametrize("config", CONFIGS)
def test_targets_move_as_torchvision_moves_them(items, backend, device, config):
    _needs(backend)
    (out,), stats = _decode(backend, device, [make_batch(items)], **config)
    cfg = DecodeConfig(**config)
    crops = crop_boxes([probe(it.jpeg) for it in items], list(range(len(items))), 0, cfg)
    assert stats.skipped == 0 and out.valid.all()
    assert out.targets is not None and out.targets.masks is not None
    assert out.targets.masks.device.type == device and out.targets.boxes.boxes.device.type == device
    assert tuple(out.targets.masks.shape) == (len(items), *cfg.image_size)
    assert out.targets.masks.dtype == torch.uint8
    for i, (item, got) in enumerate(zip(items, out.targets.per_image())):
        want_boxes, want_mask = _torchvision(item, crops[i], cfg)
        assert got["boxes"].shape == want_boxes.shape, i
        assert torch.allclose(got["boxes"].cpu().double(), want_boxes.double(), atol=1e-4, rtol=0), (
            i, got["boxes"], want_boxes)
        assert torch.equal(got["labels"].cpu(), torch.from_numpy(item.labels)), i
        assert torch.equal(got["masks"].cpu(), want_mask), (i, (got["masks"].cpu() != want_mask).sum())


COLOURS = np.array([[230, 20, 20], [20, 230, 20], [20, 20, 230], [240, 240, 240]], np.uint8)  # class -> colour


@pytest.mark.parametrize("backend, device", RUNS)
@pytest.mark.parametrize("resize", ["random_resized_crop", "shorter"])
def test_targets_stay_on_their_pixels_under_every_orientation(backend, device, resize):
    """Images painted with their own label map (a colour per class; class 3 only inside the
    box), stored under EXIF orientations 1, 6, 8, 3: after the decode the mask still names the
    colour under it and the box still frames the class-3 patch — in the upright frame."""
    _needs(backend)
    items, w, h = [], 61, 43
    for seed, orientation in enumerate((1, 6, 8, 3)):
        rng = np.random.default_rng(100 + seed)
        labels = rng.integers(0, 3, (h // 10 + 1, w // 10 + 1), dtype=np.uint8).repeat(10, 0).repeat(10, 1)[:h, :w]
        x0, y0 = 12 + 3 * seed, 9 + 2 * seed
        labels[y0:y0 + 20, x0:x0 + 28] = 3
        box = np.array([[x0, y0, x0 + 28, y0 + 20]], np.float32)
        jpeg = _jpeg(rng, (w, h), orientation, pixels=COLOURS[labels])
        items.append(Item(jpeg, box, np.array([3]), np.ascontiguousarray(labels), _png(np.ascontiguousarray(labels))))
    config = {"image_size": (32, 32), "resize": resize, "scale": (0.6, 1.0), "seed": 1}
    (out,), _ = _decode(backend, device, [make_batch(items)], **config)
    images = out.images.cpu().permute(0, 2, 3, 1).int()
    seen = (images[:, :, :, None, :] - torch.from_numpy(COLOURS).int()).abs().sum(-1).argmin(-1)  # (B, H, W)
    masks = out.targets.masks.cpu().long()
    for i, per in enumerate(out.targets.per_image()):
        agree = (seen[i] == masks[i]).float().mean().item()
        assert agree > 0.8, (i, agree)  # measured 0.89-0.93 (edges: bilinear pixels, nearest labels); rotated 180 degrees 0.45
        x1, y1, x2, y2 = (int(round(v)) for v in per["boxes"][0].tolist())
        assert x2 - x1 >= 4 and y2 - y1 >= 4, per["boxes"]
        inside = seen[i, y1 + 1:y2 - 1, x1 + 1:x2 - 1]
        assert (inside == 3).float().mean().item() > 0.95, (i, per["boxes"])
        assert (masks[i, y1 + 1:y2 - 1, x1 + 1:x2 - 1] == 3).all(), i


@pytest.mark.parametrize("backend, device", RUNS[:2])
def test_resize_none_keeps_targets(backend, device):
    """Under resize ``none`` (one size per batch) boxes and masks come out as they went in,
    in the upright frame of an EXIF-rotated image too."""
    _needs(backend)
    same = [_item(s, (36, 28), 3, o) for s, o in ((10, 1), (11, 6), (12, 3))]
    (out,), _ = _decode(backend, device, [make_batch(same)])
    assert tuple(out.images.shape[-2:]) == (28, 36)
    for item, got in zip(same, out.targets.per_image()):
        assert torch.equal(got["boxes"], torch.from_numpy(item.boxes))
        assert torch.equal(got["masks"], torch.from_numpy(item.mask))


def test_no_targets_is_none_and_one_kind_alone(items):
    (plain,), _ = _decode("pil", "cpu", [dataclasses.replace(make_batch(items[:2]), targets=None)],
                          image_size=(16, 16))
    assert plain.targets is None
    images, labels = plain
    assert torch.equal(labels, torch.tensor([10, 11]))
    (boxes_only, masks_only), _ = _decode("pil", "cpu", [make_batch(items[:2], kinds=("boxes",)),
                                                         make_batch(items[:2], kinds=("masks",))],
                                          image_size=(16, 16))
    assert boxes_only.targets.masks is None and boxes_only.targets.boxes.counts.tolist() == [5, 3]
    assert masks_only.targets.boxes is None and tuple(masks_only.targets.masks.shape) == (2, 16, 16)
    _, per_image = boxes_only
    assert sorted(per_image[0]) == ["boxes", "labels"]


def test_a_box_within_the_tolerance_is_clamped(items):
    item = dataclasses.replace(items[0], labels=np.array([5]))
    w, h = 64, 48
    edge = np.array([[-BOX_TOLERANCE * 0.8, 2, w + BOX_TOLERANCE * 0.8, h + 0.3]], np.float32)
    (out,), stats = _decode("pil", "cpu", [make_batch([item], boxes=[edge], kinds=("boxes",))], resize="none")
    assert stats.skipped == 0
    assert out.targets.boxes.boxes.tolist() == [[0.0, 2.0, float(w), float(h)]]


# -- bad annotations --------------------------------------------------------------------------

def _bad_cases(items):
    it = items[0]  # 64x48
    w, h = 64, 48
    rgb = _png(np.zeros((h, w), np.uint8), "RGB")
    i16 = io.BytesIO()
    Image.fromarray(np.zeros((h, w), np.uint16)).save(i16, "PNG")
    return {
        "box-outside": ({"boxes": [np.array([[1, 1, w + 1, 10]], np.float32)]}, "outside the 64x48 image"),
        "box-negative-size": ({"boxes": [np.array([[9, 1, 3, 10]], np.float32)]}, "negative width or height"),
        "box-nan": ({"boxes": [np.array([[np.nan, 1, 3, 10]], np.float32)]}, "not finite"),
        "mask-size": ({"pngs": [_png(np.zeros((h, w + 1), np.uint8))]}, "mask is 65x48, its image 64x48"),
        "mask-rgb": ({"pngs": [rgb]}, "8-bit RGB PNG"),
        "mask-16bit": ({"pngs": [i16.getvalue()]}, "PNG; masks are 8-bit grayscale"),
        "mask-truncated": ({"pngs": [it.png[:len(it.png) // 2]]}, "mask does not decode"),
        "mask-not-png": ({"pngs": [it.jpeg]}, "mask is not a PNG"),
        "mask-missing": ({"pngs": [b""]}, "has no mask"),
    }


BAD = ["box-outside", "box-negative-size", "box-nan", "mask-size", "mask-rgb", "mask-16bit", "mask-truncated",
       "mask-not-png", "mask-missing"]


def _with_bad_first(items, case):
    """items[0] made bad by ``case``, then two good samples."""
    change, reason = _bad_cases(items)[case]
    rows = items[:3]
    kwargs = {}
    if "boxes" in change:
        kwargs["boxes"] = change["boxes"] + [it.boxes for it in rows[1:]]
        bad_count = len(change["boxes"][0])
        rows = [dataclasses.replace(rows[0], labels=np.arange(bad_count, dtype=np.int64)), *rows[1:]]
    if "pngs" in change:
        kwargs["pngs"] = change["pngs"] + [it.png for it in rows[1:]]
    return make_batch(rows, **kwargs), reason


@pytest.mark.parametrize("case", BAD)
def test_a_bad_annotation_raises_naming_the_sample(items, case):
    batch, reason = _with_bad_first(items, case)
    with pytest.raises(DecodeError, match=r"'s0'") as info:
        _decode("pil", "cpu", [batch], image_size=(16, 16))
    assert reason in str(info.value)


@pytest.mark.parametrize("backend, device", RUNS)
@pytest.mark.parametrize("case", BAD)
def test_a_bad_annotation_is_skipped_and_its_row_takes_a_whole_sample(items, backend, device, case):
    """Under skip the sample is counted, and row 0 holds sample 1's pixels, label, boxes and mask."""
    _needs(backend)
    batch, _ = _with_bad_first(items, case)
    config = {"image_size": (16, 16), "on_error": "skip"}
    (out,), stats = _decode(backend, device, [batch], **config)
    assert stats.skipped == 1 and stats.skipped_keys == ["s0"]
    assert out.valid.tolist() == [False, True, True]
    assert out.labels.tolist() == [11, 11, 12]
    assert torch.equal(out.images[0], out.images[1])
    per = out.targets.per_image()
    assert out.targets.boxes.counts.tolist() == [3, 3, 0]
    assert torch.equal(per[0]["boxes"], per[1]["boxes"]) and torch.equal(per[0]["labels"], per[1]["labels"])
    assert torch.equal(per[0]["masks"], per[1]["masks"])
    (clean,), _ = _decode(backend, device, [make_batch(items[1:3])], **config)  # row 1 is sample 1 untouched
    assert torch.equal(per[1]["boxes"], clean.targets.per_image()[0]["boxes"])
    assert torch.equal(per[1]["masks"], clean.targets.masks[0])


def test_placeholders_and_padding_keep_pairs_without_being_counted(items):
    """A placeholder (no bytes, not valid) takes its replacement's targets uncounted; padding
    (a repeat, not valid) keeps its own."""
    rows = [dataclasses.replace(items[0], jpeg=b"", boxes=np.zeros((0, 4), np.float32),
                                labels=np.zeros(0, np.int64), png=b""), items[1], items[2]]
    batch = make_batch(rows, valid=[False, True, False])
    (out,), stats = _decode("pil", "cpu", [batch], image_size=(16, 16), on_error="raise")
    assert stats.skipped == 0
    assert out.valid.tolist() == [False, True, False]
    assert out.targets.boxes.counts.tolist() == [3, 3, 0]
    assert torch.equal(out.targets.masks[0], out.targets.masks[1])
    assert not torch.equal(out.targets.masks[2], out.targets.masks[1])


def test_a_batch_with_nothing_good_takes_the_stand_in(items):
    """Every sample bad: each row is the last good image of an earlier batch, with its targets."""
    good = make_batch(items[:2])
    bad, _ = _with_bad_first(items[:1], "mask-rgb")
    (first, second), stats = _decode("pil", "cpu", [good, bad], image_size=(16, 16), on_error="skip")
    assert stats.skipped == 1 and not second.valid.any()
    assert torch.equal(second.images[0], first.images[1])
    assert second.labels.tolist() == [11]
    assert torch.equal(second.targets.boxes.boxes, first.targets.per_image()[1]["boxes"])
    assert torch.equal(second.targets.masks[0], first.targets.masks[1])


# -- the pieces -------------------------------------------------------------------------------

def test_check_boxes_names_the_first_bad_box_of_each_image():
    boxes = np.array([[0, 0, 5, 5], [0, 0, 10.6, 5], [1, 1, 2, 2], [0, 0, 3, 3], [-0.6, 0, 1, 1]], np.float32)
    counts = np.array([3, 0, 2])
    sizes = np.array([[8.0, 10.0], [np.nan, np.nan], [4.0, 4.0]])
    reasons = check_boxes(boxes, counts, sizes)
    assert sorted(reasons) == [0, 2]
    assert reasons[0].startswith("box 1 [0.0, 0.0, 10.6, 5.0] lies outside the 10x8 image")
    assert reasons[2].startswith("box 1 [-0.6, 0.0, 1.0, 1.0]")
    assert check_boxes(boxes[:3], np.array([3, 0, 0]), np.full((3, 2), np.nan)) == {}  # no header: not checked


def test_read_mask_keeps_palette_indices_and_refuses_scaled_grayscale():
    mask = np.arange(12, dtype=np.uint8).reshape(3, 4)
    assert np.array_equal(read_mask(_png(mask, "P"), (3, 4)), mask)
    assert np.array_equal(read_mask(_png(mask), (3, 4)), mask)
    small = io.BytesIO()
    Image.fromarray(mask < 6).save(small, "PNG")  # mode "1": Pillow gives 0/255 through "L"
    with pytest.raises(ValueError, match="1-bit 1 PNG"):
        read_mask(small.getvalue(), (3, 4))


def test_move_mask_shorter_is_resize_then_center_crop():
    mask = np.random.default_rng(0).integers(0, 4, (31, 47), dtype=np.uint8)
    from gpupipe.decode.base import ResizeMode

    got = move_mask(mask, None, ResizeMode.SHORTER, (12, 12))
    want = TF.center_crop(TF.resize(tv_tensors.Mask(torch.from_numpy(mask)), [12]), [12, 12])
    assert np.array_equal(got, want.numpy())


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 600), st.integers(1, 600), st.integers(1, 600), st.integers(1, 600))
def test_nearest_index_is_torchs_nearest_kernel(h, w, out_h, out_w):
    """The masks' resize indexes with torch's own float32 rule: the same pixels as the kernel
    torchvision's resize_mask runs, for any sizes (halving, doubling, odd ratios)."""
    m = np.arange(h * w, dtype=np.int64).reshape(h, w)  # every source pixel distinct, as 3 uint8 digits: masks
    digits = np.stack([(m >> s) & 255 for s in (0, 8, 16)]).astype(np.uint8)  # are uint8, and the kernel's
    out = torch.nn.functional.interpolate(torch.from_numpy(digits)[None], size=[out_h, out_w],  # arithmetic
                                          mode="nearest")[0].long().numpy()  # follows the dtype
    ref = out[0] | (out[1] << 8) | (out[2] << 16)
    assert np.array_equal(m[nearest_index(h, out_h)][:, nearest_index(w, out_w)], ref)
