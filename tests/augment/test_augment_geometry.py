"""Geometric batch transforms and their fused composition.

Tolerances (values on a 0..255 scale):

* flips, integer crops, 90° rotations sample exactly on pixel centres; Kornia's
  float32 coordinate normalisation leaves ~2e-3 of error, which the uint8 result's
  rounding removes (uint8 in, uint8 out, as torchvision): compared exactly;
* ``Resize`` alone is torchvision's call, ``F.interpolate(align_corners=False,
  antialias=...)``: compared exactly; its matrix warped (what a fused run does) against
  ``F.interpolate(antialias=False)``: measured ~5e-5, asserted ``atol=1e-3``, at scale
  factors between 0.5 and 2 (an antialiased reduction is not a warp and never fuses:
  tests/augment/test_tv_pixels.py);
* Resize→RandomAffine→RandomHorizontalFlip→Resize (bilinear, ``antialias=False``: one
  warp fused; a second transform reading outside its input after the affine would not
  fuse, see gpupipe.augment.compose) on a smooth image (amplitude ±100), 3 px inside
  every stage's valid region, against the analytic image evaluated at each output
  pixel's exact preimage (8 seeds): fused mean 0.024 / max 0.083, sequential mean
  0.083 / max 0.29, fused−sequential max 0.27; asserted:
  fused max < 0.2, sequential max < 0.6, fused−sequential max < 0.5, fused mean
  < half the sequential mean.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gpupipe.augment import compose as compose_mod
from gpupipe.augment.base import AugKey, Transform
from gpupipe.augment.compose import Compose
from gpupipe.augment.geometry import (
    CenterCrop,
    RandomAffine,
    RandomCrop,
    RandomHorizontalFlip,
    RandomPerspective,
    RandomResizedCrop,
    RandomRotation,
    RandomVerticalFlip,
    Resize,
)
from gpupipe.augment.keys import uniform
from gpupipe.augment.warp import warp


def _key(n: int, device="cpu", seed: int = 7, epoch: int = 0) -> AugKey:
    return AugKey(seed, epoch, torch.arange(n, device=device))


def _uint8(n=4, h=32, w=48, device="cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, 3, h, w), generator=g, dtype=torch.uint8).to(device)


def _analytic(x: torch.Tensor, y: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """A smooth test image as a function of input pixel-centre coordinates."""
    u, v = (x + 0.5) / w, (y + 0.5) / h
    return 128 + 60 * torch.sin(2 * math.pi * (0.9 * u + 0.4 * v)) + 40 * torch.cos(2 * math.pi * (0.3 * u - 0.8 * v))


def _smooth(n=4, h=64, w=80, device="cpu") -> torch.Tensor:
    y, x = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij")
    return _analytic(x, y, h, w).to(torch.float32).expand(n, 3, h, w).contiguous().to(device)


def _placeholder(n: int, h: int, w: int) -> torch.Tensor:
    return torch.zeros((), dtype=torch.uint8).expand(n, 3, h, w)


# ------------------------------------------------------------------ exact sampling

def test_flips_are_exact_on_uint8(device):
    x = _uint8(device=device)
    for t, dims in ((RandomHorizontalFlip(1.0), [-1]), (RandomVerticalFlip(1.0), [-2])):
        out = t(x, _key(4, device))
        assert out.dtype == torch.uint8  # torchvision's: a flip of uint8 is uint8
        assert torch.equal(out, torch.flip(x, dims))
    assert torch.equal(RandomHorizontalFlip(0.0)(x, _key(4, device)), x)


def test_channels_last_input(device):
    x = _uint8(device=device).to(memory_format=torch.channels_last)
    out = RandomHorizontalFlip(1.0)(x, _key(4, device))
    assert torch.equal(out, torch.flip(x, [-1]))


def test_float_stays_float(device):
    x = _smooth(device=device).to(torch.float16)
    assert Resize((40, 50))(x, _key(4, device)).dtype == torch.float16


@pytest.mark.parametrize("antialias", [True, False])
@pytest.mark.parametrize("hw", [(48, 72), (100, 120), (32, 40), (40, 64), (64, 80)])
def test_resize_is_interpolate_and_its_warp_matches_interpolate(hw, antialias, device):
    x = _smooth(device=device)  # 64 x 80; factors 0.5 .. 2
    t = Resize(hw, antialias=antialias)
    want = F.interpolate(x, size=hw, mode="bilinear", align_corners=False, antialias=antialias)
    assert torch.equal(t(x, _key(4, device)), want)
    warped = warp(x, t.matrix(t.make_params(x, _key(4, device)), (64, 80)), hw, "border")
    no_antialias = F.interpolate(x, size=hw, mode="bilinear", align_corners=False, antialias=False)
    torch.testing.assert_close(warped, no_antialias, atol=1e-3, rtol=0)


def test_resize_int_is_shorter_side():
    assert Resize(32).output_size((64, 80)) == (32, 40)
    assert Resize([32]).output_size((90, 60)) == (48, 32)
    assert Resize((10, 20)).output_size((64, 80)) == (10, 20)


def test_center_and_random_crop_match_slicing(device):
    x = _uint8(device=device)
    out = CenterCrop((20, 31))(x, _key(4, device))
    assert torch.equal(out, x[:, :, 6:26, 8:39])  # round(12/2), round(17/2)
    t = RandomCrop(16)
    params = t.make_params(x, _key(4, device))
    out = t.apply(x, params)
    for b in range(4):
        i, j = int(params["top"][b]), int(params["left"][b])
        assert torch.equal(out[b], x[b, :, i:i + 16, j:j + 16])


def test_rotation_directions_follow_torchvision(device):
    x = _uint8(h=24, w=24, device=device)
    ccw = RandomRotation((90, 90))(x, _key(4, device))  # F.rotate: counter-clockwise
    assert torch.equal(ccw, torch.rot90(x, 1, (-2, -1)))
    cw = RandomAffine((90, 90))(x, _key(4, device))  # F.affine: clockwise
    assert torch.equal(cw, torch.rot90(x, -1, (-2, -1)))


# ------------------------------------------------------------------ parameter distributions

N = 20_000


def test_affine_angle_uniform():
    p = RandomAffine(30, translate=(0.1, 0.2), scale=(0.8, 1.2), shear=(-5, 5, 10, 20)).make_params(
        _placeholder(N, 50, 100), _key(N))
    a = p["angle"]
    assert a.min() >= -30 and a.max() < 30
    assert abs(a.mean().item()) < 0.5  # sd of the mean: 17.3 / sqrt(N) = 0.12
    assert abs(a.std().item() - 30 / math.sqrt(3)) < 0.3
    assert torch.equal(p["tx"], p["tx"].round()) and p["tx"].abs().max() <= 10 and p["ty"].abs().max() <= 10
    assert p["tx"].abs().max() == 10
    assert 0.8 <= p["scale"].min() and p["scale"].max() < 1.2
    assert -5 <= p["shear_x"].min() and p["shear_x"].max() < 5
    assert 10 <= p["shear_y"].min() and p["shear_y"].max() < 20


@pytest.mark.parametrize("t", [RandomHorizontalFlip(0.3), RandomVerticalFlip(0.3)])
def test_flip_rate(t):
    rate = t.make_params(_placeholder(N, 8, 8), _key(N))["flip"].mean().item()
    assert abs(rate - 0.3) < 0.015  # sd 0.0032


def test_random_resized_crop_boxes():
    H, W = 60, 90
    t = RandomResizedCrop(32, scale=(0.2, 0.9), ratio=(0.5, 2.0))
    p = t.make_params(_placeholder(N, H, W), _key(N))
    top, left, h, w = p["top"], p["left"], p["height"], p["width"]
    assert top.min() >= 0 and left.min() >= 0 and (top + h).max() <= H and (left + w).max() <= W
    area, aspect = h * w / (H * W), w / h
    slack = 2.5 / min(H, W)  # both sides are rounded to whole pixels
    assert area.min() >= 0.2 - 2 * slack and area.max() <= 0.9 + 2 * slack
    assert aspect.min() >= 0.5 * (1 - slack) * 0.9 and aspect.max() <= 2.0 * (1 + slack) * 1.1
    assert torch.equal(top, top.round()) and torch.equal(w, w.round())
    # every box uses the whole image range of positions: the first and last are reached
    assert abs((top / (H - h).clamp_min(1)).mean().item() - 0.5) < 0.02


def test_random_resized_crop_fallback_is_central_crop():
    # scale (2, 3) never fits: every sample falls back to torchvision's central crop
    t = RandomResizedCrop(8, scale=(2.0, 3.0), ratio=(1.0, 1.0))
    p = t.make_params(_placeholder(16, 20, 40), _key(16))
    assert torch.equal(p["height"], torch.full((16,), 20.0)) and torch.equal(p["width"], torch.full((16,), 20.0))
    assert torch.equal(p["top"], torch.zeros(16)) and torch.equal(p["left"], torch.full((16,), 10.0))


def test_perspective_corners():
    H, W = 40, 60
    t = RandomPerspective(0.5, p=0.4)
    p = t.make_params(_placeholder(N, H, W), _key(N))
    assert abs(p["apply"].mean().item() - 0.4) < 0.015
    end = p["end"]
    bw, bh = int(0.5 * (W // 2)) + 1, int(0.5 * (H // 2)) + 1
    dx = torch.stack([end[:, 0, 0], W - 1 - end[:, 1, 0], W - 1 - end[:, 2, 0], end[:, 3, 0]])
    dy = torch.stack([end[:, 0, 1], end[:, 1, 1], H - 1 - end[:, 2, 1], H - 1 - end[:, 3, 1]])
    assert dx.min() == 0 and dx.max() == bw - 1 and dy.min() == 0 and dy.max() == bh - 1


# ------------------------------------------------------------------ keys and batches

def _pipeline(fuse: bool) -> Compose:
    return Compose([RandomResizedCrop((40, 48)), RandomAffine(20, (0.1, 0.1), (0.9, 1.1), 5),
                    RandomHorizontalFlip(), RandomPerspective(0.3)], fuse=fuse)


@pytest.mark.parametrize("fuse", [True, False])
def test_same_key_same_output_whatever_the_batch(fuse, device):
    x = _uint8(n=8, h=50, w=60, device=device)
    ids = torch.arange(100, 108, device=device)
    t = _pipeline(fuse)
    out = t(x, AugKey(3, 1, ids))
    perm = torch.tensor([5, 2, 7, 0, 1, 6, 3, 4], device=device)
    torch.testing.assert_close(t(x[perm], AugKey(3, 1, ids[perm])), out[perm], atol=1e-4, rtol=0)
    torch.testing.assert_close(t(x[:3], AugKey(3, 1, ids[:3])), out[:3], atol=1e-4, rtol=0)
    assert not torch.allclose(t(x, AugKey(3, 2, ids)), out)  # another epoch, other parameters


class _Gain(Transform):
    """A non-geometric test transform: a keyed per-sample gain."""

    def make_params(self, images, key):
        return {"gain": uniform(key.seed, key.epoch, key.sample_ids, key.tag, 1, 0.5, 1.5)[:, 0]}

    def apply(self, images, params):
        return images.float() * params["gain"][:, None, None, None]


def test_compose_fuses_runs_into_one_warp_each(monkeypatch):
    calls = []
    real = compose_mod.warp
    monkeypatch.setattr(compose_mod, "warp", lambda *a, **k: calls.append(1) or real(*a, **k))
    x, key = _smooth(), _key(4)
    t = Compose([Resize((48, 60)), RandomAffine(10), _Gain(), RandomHorizontalFlip(), CenterCrop(40)])
    params = t.make_params(x, key)
    assert set(params) == {"0.ones", "1.angle", "1.tx", "1.ty", "1.scale", "1.shear_x", "1.shear_y",
                           "2.gain", "3.flip", "4.ones"}
    fused = t.apply(x, params)
    assert len(calls) == 2 and fused.shape == (4, 3, 40, 40)
    seq = Compose(list(t.transforms), fuse=False).apply(x, params)
    interior = (slice(None), slice(None), slice(4, -4), slice(4, -4))
    assert (fused - seq)[interior].abs().max() < 0.5  # measured 0.24


def test_fused_is_closer_to_the_ideal_than_sequential():
    H, W = 64, 80
    x = _smooth(n=8, h=H, w=W)
    key = _key(8, seed=11)
    # one warp in the fused run; two interpolations (the flip is exact) in the sequential one
    ts = [Resize((56, 72), antialias=False), RandomAffine(15, (0.05, 0.05), (0.9, 1.1), 5, interpolation="bilinear"),
          RandomHorizontalFlip(), Resize((60, 76), antialias=False)]
    fused_t, seq_t = Compose(ts, fuse=True), Compose(ts, fuse=False)
    params = fused_t.make_params(x, key)
    fused, seq = fused_t.apply(x, params), seq_t.apply(x, params)
    # where every stage samples inside its input: the image of an all-ones batch, eroded 3 px
    ones = torch.ones_like(x[:, :1])
    inside = torch.minimum(fused_t.apply(ones, params), seq_t.apply(ones, params)) > 0.999
    inside = -F.max_pool2d(-inside.float(), 7, stride=1, padding=3) > 0.5
    assert inside.float().mean() > 0.3
    # the ideal: the analytic image at each output pixel's exact preimage
    hw, m = (H, W), torch.eye(3).expand(8, 3, 3)
    for i, t in enumerate(ts):
        m = t.matrix({k.split(".", 1)[1]: v for k, v in params.items() if k.startswith(f"{i}.")}, hw) @ m
        hw = t.output_size(hw)
    oy, ox = torch.meshgrid(torch.arange(hw[0], dtype=torch.float64), torch.arange(hw[1], dtype=torch.float64),
                            indexing="ij")
    pts = torch.stack([ox, oy, torch.ones_like(ox)]).reshape(3, -1)
    pre = torch.linalg.inv(m.double()) @ pts
    ideal = _analytic(pre[:, 0] / pre[:, 2], pre[:, 1] / pre[:, 2], H, W).reshape(8, 1, *hw).float()
    err_fused = (fused - ideal).abs()[inside.expand_as(fused)]
    err_seq = (seq - ideal).abs()[inside.expand_as(seq)]
    # each resampling low-pass filters the image (bilinear weights average neighbours)
    # and, off the pixel grid, shifts it a little; one warp does that once, four warps
    # four times, so the fused result is the closer one to the ideal
    assert err_fused.mean() < 0.5 * err_seq.mean()
    assert err_fused.max() < 0.2 and err_seq.max() < 0.6
    assert (fused - seq).abs()[inside.expand_as(seq)].max() < 0.5


# ------------------------------------------------------------------ argument checks

@pytest.mark.parametrize("make, exc, msg", [
    (lambda: RandomAffine(-5), ValueError, "If degrees is a single number, it must be positive."),
    (lambda: RandomRotation(-1), ValueError, "If degrees is a single number, it must be positive."),
    (lambda: RandomAffine((1, 2, 3)), ValueError, "degrees should be a sequence of length 2."),
    (lambda: RandomAffine(5, translate=(0.1, 1.5)), ValueError, "translation values should be between 0 and 1"),
    (lambda: RandomAffine(5, translate=0.1), TypeError, "translate should be a sequence of length 2."),
    (lambda: RandomAffine(5, scale=(0.0, 1.0)), ValueError, "scale values should be positive"),
    (lambda: RandomAffine(5, shear=-3), ValueError, "If shear is a single number, it must be positive."),
    (lambda: RandomAffine(5, shear=(1, 2, 3)), ValueError, "shear should be a sequence of length 2 or 4."),
    (lambda: RandomHorizontalFlip(1.5), ValueError, r"`p` should be a floating point value in the interval \[0.0, 1.0\]"),
    (lambda: RandomVerticalFlip(-0.1), ValueError, r"`p` should be a floating point value in the interval \[0.0, 1.0\]"),
    (lambda: RandomPerspective(p=2), ValueError, r"`p` should be a floating point value in the interval \[0.0, 1.0\]"),
    (lambda: RandomPerspective(1.5), ValueError, "distortion_scale value should be between 0 and 1"),
    (lambda: Resize("big"), TypeError, "Size should be int or sequence"),
    (lambda: Resize((1, 2, 3)), ValueError, "size can be an integer.*a sequence of one or two integers"),
    (lambda: Resize(0), ValueError, "size should be positive"),
    (lambda: CenterCrop((1, 2, 3)), ValueError, r"Please provide only two dimensions \(h, w\) for size."),
    (lambda: RandomCrop(-4), ValueError, "size should be positive"),
    (lambda: RandomResizedCrop(8, scale=(0.9, 0.1)), ValueError, r"Scale and ratio should be of kind \(min, max\)"),
    (lambda: Compose([RandomHorizontalFlip(), torch.nn.Identity()]), TypeError, "should be a gpupipe Transform"),
])
def test_bad_arguments(make, exc, msg):
    with pytest.raises(exc, match=msg):
        make()


def test_random_crop_larger_than_image():
    with pytest.raises(ValueError, match="Required crop size"):
        RandomCrop(64)(_uint8(), _key(4))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_make_params_does_not_sync_on_cuda():
    """Sampling a pipeline's parameters queues kernels only (no .item(), no copies).
    Only ``make_params`` is checked: Kornia's warp_perspective / get_perspective_transform
    invert / solve with torch.linalg, whose error check may synchronise on CUDA."""
    x = _uint8(n=8, h=50, w=60, device="cuda")
    key = _key(8, "cuda")
    t = _pipeline(True)
    t.apply(x, t.make_params(x, key))  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        t.make_params(x, key)
    finally:
        torch.cuda.set_sync_debug_mode("default")
