"""RandomCrop's padding options and the ``interpolation`` / ``fill`` options, against
explicit references (numpy's pad modes are torchvision's: constant, edge, reflect,
symmetric), and what Compose fuses when transforms sample differently.

Tolerances (0..255 scale): integer crops sample pixel centres exactly, up to Kornia's
float32 coordinate normalisation (measured 4e-4), which the uint8 result's rounding
removes: asserted exact; resize modes against ``F.interpolate`` (float input):
measured <= 3e-4, asserted 1e-3.
"""
from __future__ import annotations

import enum

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import gpupipe.transforms as T
from gpupipe.augment import compose as compose_mod
from gpupipe.augment.base import AugKey
from gpupipe.augment.compose import Compose
from gpupipe.augment.geometry import (
    CenterCrop,
    RandomAffine,
    RandomCrop,
    RandomHorizontalFlip,
    RandomPerspective,
    RandomResizedCrop,
    RandomRotation,
    Resize,
)


class InterpolationMode(enum.Enum):
    """Shaped like torchvision's enum (its ``.value`` strings)."""
    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    LANCZOS = "lanczos"


def _key(n: int, seed: int = 1) -> AugKey:
    return AugKey(seed, 0, torch.arange(n))


def _uint8(n=6, h=9, w=11) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, h, w), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))


def _np_pad(img: np.ndarray, pads, mode: str, fill) -> np.ndarray:
    """(C, H, W) padded by (left, top, right, bottom) as torchvision pads."""
    left, top, right, bottom = pads
    if mode == "constant":
        fills = fill if isinstance(fill, tuple) else (fill,) * img.shape[0]
        return np.stack([np.pad(c, ((top, bottom), (left, right)), constant_values=v) for c, v in zip(img, fills)])
    return np.pad(img, ((0, 0), (top, bottom), (left, right)), mode=mode)


@pytest.mark.parametrize("mode, fill", [("constant", 0), ("constant", (10, 20, 30)), ("edge", 0), ("reflect", 0),
                                        ("symmetric", 0)])
@pytest.mark.parametrize("padding, pads", [(2, (2, 2, 2, 2)), ((3, 1), (3, 1, 3, 1)), ((3, 2, 1, 4), (3, 2, 1, 4))])
def test_padded_crop_matches_padding_then_slicing(mode, fill, padding, pads):
    x = _uint8()
    t = RandomCrop((8, 10), padding=padding, fill=fill, padding_mode=mode)
    params = t.make_params(x, _key(6))
    out = t.apply(x, params)
    assert out.dtype == torch.uint8 and out.shape == (6, 3, 8, 10)  # uint8 stays uint8, as in torchvision
    left, top = pads[0], pads[1]
    assert ((params["top"] >= -top) & (params["top"] <= 9 - 8 + pads[3])).all()
    for i in range(6):
        padded = torch.from_numpy(_np_pad(x[i].numpy(), pads, mode, fill)).float()
        r, c = int(params["top"][i]) + top, int(params["left"][i]) + left
        assert torch.equal(out[i].float(), padded[:, r:r + 8, c:c + 10])


def test_pad_if_needed_pads_both_sides_by_the_shortfall():
    x = _uint8(n=64, h=5, w=7)
    t = RandomCrop((8, 9), pad_if_needed=True, padding_mode="edge")
    params = t.make_params(x, _key(64))
    # padded height 5 + 2·3 = 11, width 7 + 2·2 = 11: the corner is uniform over 4 x 3 positions
    assert set(params["top"].tolist()) == {-3.0, -2.0, -1.0, 0.0}
    assert set(params["left"].tolist()) == {-2.0, -1.0, 0.0}
    out = t.apply(x, params)
    for i in range(0, 64, 9):
        padded = torch.from_numpy(_np_pad(x[i].numpy(), (2, 3, 2, 3), "edge", 0)).float()
        r, c = int(params["top"][i]) + 3, int(params["left"][i]) + 2
        assert torch.equal(out[i].float(), padded[:, r:r + 8, c:c + 9])
    with pytest.raises(ValueError, match=r"Required crop size \(8, 9\) is larger than input image size \(5, 7\)"):
        RandomCrop((8, 9))(x, _key(64))


def test_symmetric_crop_runs_alone(monkeypatch):
    real, calls = compose_mod.warp, []
    monkeypatch.setattr(compose_mod, "warp", lambda *a, **k: calls.append(1) or real(*a, **k))
    pipe = Compose([RandomCrop(8, padding=3, padding_mode="symmetric"), RandomHorizontalFlip(), Resize((16, 16))])
    assert [kind for kind, _ in compose_mod._runs(pipe.transforms, (9, 11))] == [None, "geometric"]
    out = pipe(_uint8(), _key(6))
    assert out.shape == (6, 3, 16, 16) and len(calls) == 1  # the crop gathers; flip + resize are one warp


@pytest.mark.parametrize("interpolation, torch_mode", [("nearest", "nearest"), ("bicubic", "bicubic"),
                                                       (InterpolationMode.BICUBIC, "bicubic"), (2, "bilinear")])
@pytest.mark.parametrize("antialias", [True, False])
def test_resize_interpolations_are_torchvisions_interpolate(interpolation, torch_mode, antialias):
    """Resize alone is torchvision's resize: ``F.interpolate`` with legacy "nearest"
    (``floor(dst * in / out)``) for NEAREST, which never antialiases, and ``antialias``
    for bilinear / bicubic (whose antialiased cubic is Pillow's a=-0.5, enlarging too)."""
    x = torch.rand(2, 3, 10, 12, generator=torch.Generator().manual_seed(0)) * 255
    for size in ((20, 24), (15, 17), (7, 9)):
        out = Resize(size, interpolation=interpolation, antialias=antialias)(x, _key(2))
        nearest = torch_mode == "nearest"
        ref = F.interpolate(x, size=size, mode=torch_mode, align_corners=None if nearest else False,
                            antialias=antialias and not nearest)
        assert torch.equal(out, ref)


def test_bicubic_on_uint8_stays_in_range():
    x = torch.zeros(2, 3, 8, 8, dtype=torch.uint8)
    x[..., ::2, ::2] = 255  # ringing: bicubic overshoots, torchvision clamps integer images
    out = Resize((13, 13), interpolation="bicubic")(x, _key(2))
    assert out.min() >= 0 and out.max() <= 255


@pytest.mark.parametrize("make", [
    lambda: RandomAffine(30, interpolation=InterpolationMode.NEAREST),
    lambda: RandomRotation(30, interpolation="nearest"),
    lambda: RandomPerspective(0.6, p=1.0, interpolation=0),
])
def test_nearest_only_returns_input_values(make):
    x = _uint8(n=4, h=16, w=16)
    out = make()(x, _key(4))
    values = set(x.unique().tolist()) | {0}  # 0: fill outside the image
    assert set(out.round().unique().tolist()) <= values
    assert (out - out.round()).abs().max() < 0.01


def test_fill_outside_the_image():
    x = torch.full((3, 3, 10, 10), 7, dtype=torch.uint8)
    out = RandomRotation((45, 45), fill=(100, 150, 200))(x, _key(3))
    assert torch.equal(out[:, :, 0, 0], torch.tensor([100, 150, 200], dtype=torch.uint8).expand(3, 3))
    assert torch.equal(out[:, :, 5, 5], torch.full((3, 3), 7, dtype=torch.uint8))
    unit = RandomRotation((45, 45), fill=(0.25, 0.5, 1.0))(x.float() / 255, _key(3))  # float: fill in [0, 1] units
    torch.testing.assert_close(unit[:, :, 0, 0], torch.tensor([0.25, 0.5, 1.0]).expand(3, 3), atol=1e-6, rtol=0)


@pytest.mark.parametrize("ts, runs", [
    ([RandomCrop(8, padding=2, padding_mode="reflect"), RandomHorizontalFlip(), Resize(12)], [[0, 1, 2]]),
    ([RandomCrop(8, padding=2, padding_mode="reflect"), RandomAffine(10)], [[0], [1]]),
    # the crop's padding, after a rotation's fill, would read the original image in one warp
    ([RandomAffine(10), RandomCrop(8, padding=2, fill=0), RandomHorizontalFlip()], [[0], [1, 2]]),
    ([RandomAffine(10), RandomCrop(8, padding=2, fill=9)], [[0], [1]]),
    ([RandomAffine(10, interpolation="nearest"), RandomHorizontalFlip(), RandomPerspective()], [[0, 1], [2]]),
    # a RandomResizedCrop never joins: its box is resized as an image of its own (edges clamp to the box)
    ([Resize(12, interpolation="bicubic", antialias=False), CenterCrop(8),
      RandomResizedCrop(6, interpolation="bicubic", antialias=False)], [[0, 1], [2]]),
    # antialiased reductions run alone; an enlargement joins; a resize to the input's size is none
    ([Resize(6), RandomHorizontalFlip(), Resize(24), RandomResizedCrop(6)], [[0], [1, 2], [3]]),
    ([Resize(12, interpolation="bicubic"), CenterCrop(8), RandomResizedCrop(6, interpolation="bicubic")],
     [[0, 1], [2]]),
    ([RandomRotation(10, interpolation="bilinear"), Resize(24)], [[0, 1]]),
    ([RandomHorizontalFlip(), CenterCrop(16)], [[0, 1]]),  # pads, after a transform that covers the frame
    ([RandomCrop(8), CenterCrop(10)], [[0], [1]]),  # pads what the first crop cut off
])
def test_compose_fuses_only_what_samples_alike(ts, runs):
    assert [run for _, run in compose_mod._runs(ts, (12, 12))] == runs
    x = _uint8(n=3, h=12, w=12)
    assert Compose(ts)(x, _key(3)).dtype == torch.uint8


@pytest.mark.parametrize("make, exc, msg", [
    (lambda: RandomCrop(8, padding_mode="wrap"), ValueError,
     "Padding mode should be either constant, edge, reflect or symmetric, but got wrap"),
    (lambda: RandomCrop(8, padding=(1, 2, 3)), ValueError,
     r"Padding must be an int or a 1, 2, or 4 element of tuple or list, got \(1, 2, 3\)"),
    (lambda: RandomCrop(8, padding="4"), ValueError, "Padding must be an int or a 1, 2, or 4 element"),
    (lambda: RandomCrop(8, padding=-1), ValueError, "padding should be non-negative"),
    (lambda: RandomCrop(8, padding=2, fill="red"), TypeError, "Got inappropriate fill arg"),
    (lambda: RandomAffine(5, fill=None), TypeError, "Got inappropriate fill arg"),
    (lambda: Resize(8, interpolation="lanczos"), ValueError, "interpolation 'lanczos' is not supported"),
    (lambda: RandomRotation(5, interpolation=InterpolationMode.LANCZOS), ValueError, "is not supported"),
    (lambda: RandomResizedCrop(8, interpolation=1), ValueError,
     "Argument interpolation should be an InterpolationMode or a corresponding Pillow integer constant"),
    (lambda: RandomPerspective(interpolation=1.5), TypeError, "Argument interpolation should be"),
])
def test_bad_arguments(make, exc, msg):
    with pytest.raises(exc, match=msg):
        make()


def _tv(name: str, **attrs):
    return type(name, (), attrs)()


def test_from_torchvision_maps_padding_interpolation_and_fill():
    crop = T.from_torchvision(_tv("RandomCrop", size=[8, 8], padding=[4], pad_if_needed=True, fill=(1, 2, 3),
                                  padding_mode="reflect")).transforms[0]
    assert crop.padding == (4, 4, 4, 4) and crop.pad_if_needed and crop.padding_mode == "reflect"
    assert crop.fill == (1.0, 2.0, 3.0) and crop.warp_padding == "reflection"
    v2_fill = {type("Image", (), {}): 5, type("Mask", (), {}): 0}
    aff = T.from_torchvision(_tv("RandomAffine", degrees=[-5.0, 5.0], translate=None, scale=None, shear=None,
                                 interpolation=InterpolationMode.NEAREST, fill=v2_fill, center=None)).transforms[0]
    assert aff.interpolation == "nearest" and aff.fill == (5.0,) and aff.warp_padding == "fill"
    for name, extra in (("Resize", {"size": [8, 8], "max_size": None}),
                        ("RandomResizedCrop", {"size": [8, 8], "scale": (0.5, 1.0), "ratio": (0.75, 1.33)}),
                        ("RandomRotation", {"degrees": [-5.0, 5.0], "expand": False, "center": None, "fill": 0}),
                        ("RandomPerspective", {"distortion_scale": 0.5, "p": 0.5, "fill": [0]})):
        t = T.from_torchvision(_tv(name, interpolation=InterpolationMode.BICUBIC, **extra)).transforms[0]
        assert t.interpolation == "bicubic", name
