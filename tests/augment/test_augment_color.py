"""Colour transforms and MixUp/CutMix: torchvision's meaning, per-sample keyed draws."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from gpupipe.augment.base import AugKey
from gpupipe.augment.color import (
    ColorJitter,
    GaussianBlur,
    Grayscale,
    Normalize,
    RandomErasing,
    RandomGrayscale,
    RepeatChannels,
    ToDtype,
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    fused_color,
)
from gpupipe.augment.mix import CutMix, MixUp, sample_beta

_N = 20_000
_CUDA = torch.cuda.is_available()


def _key(n: int, device="cpu", seed: int = 7, epoch: int = 0) -> AugKey:
    return AugKey(seed, epoch, torch.arange(100, 100 + n, device=device))


def _images(n: int, device="cpu", c: int = 3, h: int = 16, w: int = 20) -> torch.Tensor:
    g = torch.Generator().manual_seed(n * 31 + c)
    return torch.rand(n, c, h, w, generator=g).to(device)


def _gray(x: torch.Tensor) -> torch.Tensor:
    """torchvision v2's luma, operation for operation."""
    return x[:, 0].mul(0.2989).add_(x[:, 1], alpha=0.587).add_(x[:, 2], alpha=0.114).unsqueeze(1)


# ----------------------------------------------------------------------------- distributions


@pytest.mark.parametrize("arg, low, high", [(0.4, 0.6, 1.4), (1.5, 0.0, 2.5), ((0.5, 0.9), 0.5, 0.9)])
def test_jitter_factor_distribution(arg, low, high):
    params = ColorJitter(brightness=arg, contrast=arg, saturation=arg).make_params(
        torch.empty(0), _key(_N))
    for name in ("brightness", "contrast", "saturation"):
        f = params[name]
        assert f.min() >= low and f.max() < high
        assert f.min() < low + 0.01 and f.max() > high - 0.01
        assert abs(f.mean().item() - (low + high) / 2) < 0.02 * (high - low)
    assert not torch.equal(params["brightness"], params["contrast"])  # independent draws


def test_hue_shift_distribution_and_order_is_uniform():
    params = ColorJitter(0.2, 0.2, 0.2, hue=0.1).make_params(torch.empty(0), _key(_N))
    h = params["hue"]
    assert h.min() >= -0.1 and h.max() < 0.1 and abs(h.mean().item()) < 0.003
    order = params["order"]
    assert torch.equal(order.sort(dim=1).values, torch.arange(4).expand(_N, 4))
    counts = torch.tensor([(order == torch.tensor(p)).all(dim=1).sum().item()
                           for p in itertools.permutations(range(4))], dtype=torch.float32)
    expected = _N / 24
    assert ((counts - expected).abs() < 5 * math.sqrt(expected)).all()  # all 24 orders, evenly


def test_blur_sigma_and_grayscale_rate():
    sigma = GaussianBlur(3, sigma=(0.1, 2.0)).make_params(torch.empty(0), _key(_N))["sigma"]
    assert sigma.min() >= 0.1 and sigma.max() < 2.0 and abs(sigma.mean().item() - 1.05) < 0.02
    rate = RandomGrayscale(p=0.3).make_params(torch.empty(0), _key(_N))["apply"].float().mean().item()
    assert abs(rate - 0.3) < 0.015


def _tv_erase_params(H, W, scale, ratio, gen):
    """torchvision's RandomErasing.get_params loop (the reference being vectorised)."""
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        area = H * W * torch.empty(1).uniform_(scale[0], scale[1], generator=gen).item()
        aspect = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=gen)).item()
        h, w = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
        if h < H and w < W:
            return h, w
    return 0, 0


def test_erasing_box_distribution_matches_torchvision_loop():
    H, W, scale, ratio = 12, 40, (0.1, 0.6), (0.3, 3.3)  # a wide image: many first attempts fail
    params = RandomErasing(p=1.0, scale=scale, ratio=ratio).make_params(torch.empty(1, 3, H, W), _key(_N))
    gen = torch.Generator().manual_seed(0)
    ref = torch.tensor([_tv_erase_params(H, W, scale, ratio, gen) for _ in range(_N)], dtype=torch.float32)
    ours = torch.stack([params["height"], params["width"]], 1).float()
    assert abs((ours[:, 0] == 0).float().mean() - (ref[:, 0] == 0).float().mean()) < 0.015  # no box found
    assert torch.allclose(ours.mean(0), ref.mean(0), rtol=0.03)
    assert (params["top"] + params["height"] <= H).all() and (params["left"] + params["width"] <= W).all()
    assert (params["top"] >= 0).all() and (params["left"] >= 0).all()


@pytest.mark.parametrize("alpha", [0.2, 1.0, 4.0])
def test_mix_lambda_is_beta(alpha):
    lam = torch.cat([sample_beta(AugKey(s, 0, torch.arange(4)), alpha) for s in range(3000)])
    assert ((lam >= 0) & (lam <= 1)).all()
    assert abs(lam.mean().item() - 0.5) < 0.02
    assert abs(lam.var().item() - 1 / (4 * (2 * alpha + 1))) < 0.1 / (4 * (2 * alpha + 1))
    with torch.random.fork_rng():  # the reference only; the global RNG is left as it was
        torch.manual_seed(0)
        ref = torch.distributions.Beta(torch.tensor(alpha), torch.tensor(alpha)).sample((20_000,))
    for q in (0.1, 0.25, 0.75, 0.9):
        assert abs(torch.quantile(lam, q) - torch.quantile(ref, q)) < 0.03


# ----------------------------------------------------------------------------- exact ops


def test_deterministic_ops_exact(device):
    x = _images(4, device)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    ref = (x - torch.tensor(mean, device=device).view(1, 3, 1, 1)) / torch.tensor(std, device=device).view(1, 3, 1, 1)
    torch.testing.assert_close(Normalize(mean, std).to(device)(x, _key(4, device)), ref, rtol=0, atol=1e-6)
    k = _key(4, device)
    assert torch.equal(Grayscale()(x, k), _gray(x))
    assert torch.equal(Grayscale(3)(x, k), _gray(x).repeat(1, 3, 1, 1))
    u8 = (x * 255).to(torch.uint8)
    assert torch.equal(ToDtype(torch.float32)(u8, k), u8.float() / 255)
    assert torch.equal(ToDtype(torch.float16)(u8, k), (u8.float() / 255).half())
    assert torch.equal(ToDtype(torch.float32)(u8.double(), k), u8.float())  # float → float: a cast, never rescaled
    assert torch.equal(ToDtype(torch.float32, scale=False)(u8, k), u8.float())
    assert torch.equal(ToDtype(torch.uint8)(u8.float() / 255, k), u8)  # torchvision's float → uint8 rule
    assert torch.equal(RepeatChannels(3)(x[:, :1], k), x[:, :1].repeat(1, 3, 1, 1))
    assert RepeatChannels(3)(x, k) is x


def test_neutral_factors_are_identity(device):
    x = _images(6, device)
    one, zero = torch.ones(6, device=device), torch.zeros(6, device=device)
    for op, f in ((adjust_brightness, one), (adjust_contrast, one), (adjust_saturation, one), (adjust_hue, zero)):
        torch.testing.assert_close(op(x, f), x, rtol=0, atol=1e-5)
    jitter = ColorJitter(brightness=(1, 1), contrast=(1, 1), saturation=(1, 1), hue=(0, 0))
    assert jitter.enabled == [] and torch.equal(jitter(x, _key(6, device)), x)


def test_adjust_ops_follow_torchvision_formulas():
    x = _images(5)
    f = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0])
    fv = f.view(-1, 1, 1, 1)
    torch.testing.assert_close(adjust_brightness(x, f), (x * fv).clamp(0, 1))
    m = _gray(x).mean(dim=(1, 2, 3), keepdim=True)
    torch.testing.assert_close(adjust_contrast(x, f), (fv * x + (1 - fv) * m).clamp(0, 1))
    torch.testing.assert_close(adjust_saturation(x, f), (fv * x + (1 - fv) * _gray(x)).clamp(0, 1))
    # hue: a half turn of pure red is cyan; a full turn is the identity
    red = torch.zeros(1, 3, 2, 2)
    red[:, 0] = 1.0
    torch.testing.assert_close(adjust_hue(red, torch.tensor([0.5])), 1 - red, atol=1e-5, rtol=0)
    torch.testing.assert_close(adjust_hue(red, torch.tensor([1 / 3])), red.roll(1, 1), atol=1e-5, rtol=0)


def test_jitter_applies_each_samples_order():
    x = _images(24)
    jitter = ColorJitter(0.5, 0.5, 0.5, 0.2)
    params = jitter.make_params(x, _key(24))
    out = jitter.apply(x, params)
    ops = {"brightness": adjust_brightness, "contrast": adjust_contrast,
           "saturation": adjust_saturation, "hue": adjust_hue}
    for i in range(24):  # reference: one sample at a time, in its own order
        y = x[i:i + 1]
        for j in params["order"][i].tolist():
            name = jitter.enabled[j]
            y = ops[name](y, params[name][i:i + 1])
        torch.testing.assert_close(out[i:i + 1], y, atol=1e-5, rtol=0)
    fixed = ColorJitter(0.5, 0.5, 0.5, 0.2, random_order=False)
    p = fixed.make_params(x, _key(24))
    assert "order" not in p
    ref = adjust_hue(adjust_saturation(adjust_contrast(adjust_brightness(x, p["brightness"]), p["contrast"]),
                                       p["saturation"]), p["hue"])
    torch.testing.assert_close(fixed.apply(x, p), ref)


def test_blur_matches_kornia_per_sample():
    import kornia
    x = _images(3, h=24, w=24)
    blur = GaussianBlur((3, 7), sigma=(0.5, 2.0))  # (kx, ky) as torchvision
    params = blur.make_params(x, _key(3))
    out = blur.apply(x, params)
    for i, s in enumerate(params["sigma"].tolist()):
        ref = kornia.filters.gaussian_blur2d(x[i:i + 1], (7, 3), (s, s), border_type="reflect")
        torch.testing.assert_close(out[i:i + 1], ref, atol=1e-5, rtol=0)


def test_erasing_fills_one_box():
    x = _images(64, h=32, w=32)
    er = RandomErasing(p=0.5, value=(0.1, 0.2, 0.3))
    params = er.make_params(x, _key(64))
    out = er.apply(x, params)
    changed = (out != x).any(dim=1)
    for i in range(64):
        h, w, t, l = (params[k][i].item() for k in ("height", "width", "top", "left"))
        if not params["erase"][i]:
            assert h == w == 0 and torch.equal(out[i], x[i])
            continue
        assert 0.02 * 1024 * 0.7 <= h * w <= 0.33 * 1024 * 1.3
        assert torch.equal(out[i, :, t:t + h, l:l + w], torch.tensor([0.1, 0.2, 0.3]).view(3, 1, 1).expand(3, h, w))
        assert changed[i].sum() == h * w
    assert 15 < params["erase"].sum() < 50
    noisy = RandomErasing(p=1.0, value="random")(x, _key(64))
    assert (noisy != x).any() and noisy.abs().max() > 1.0  # standard normals, not [0, 1]


# ----------------------------------------------------------------------------- keyed determinism


_RANDOM_OPS = [ColorJitter(0.4, 0.4, 0.4, 0.1), ColorJitter(0.4, 0.4, 0.4, 0.1, random_order=False),
               RandomGrayscale(0.5), GaussianBlur(5), RandomErasing(0.7), RandomErasing(1.0, value="random")]


@pytest.mark.parametrize("op", _RANDOM_OPS, ids=lambda op: type(op).__name__)
def test_same_key_same_output_in_any_batch(op, device):
    x, key = _images(12, device), _key(12, device)
    out = op(x, key)
    assert torch.equal(op(x, key), out)
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(1)).to(device)
    permuted = op(x[perm], AugKey(key.seed, key.epoch, key.sample_ids[perm], key.tag))
    torch.testing.assert_close(permuted, out[perm], atol=1e-6, rtol=0)
    part = op(x[3:7], AugKey(key.seed, key.epoch, key.sample_ids[3:7], key.tag))
    torch.testing.assert_close(part, out[3:7], atol=1e-6, rtol=0)
    other_epoch = op(x, AugKey(key.seed, key.epoch + 1, key.sample_ids, key.tag))
    assert not torch.equal(other_epoch, out)


def test_fused_equals_sequential(device):
    u8 = (_images(8, device) * 255).to(torch.uint8)
    key = _key(8, device)
    ops = [ToDtype(torch.float32), ColorJitter(0.4, 0.4, 0.4, 0.1), RandomGrayscale(0.3),
           GaussianBlur(3), Normalize((0.5, 0.4, 0.3), (0.2, 0.25, 0.3)).to(device)]
    seq = u8
    for i, op in enumerate(ops):
        seq = op(seq, key.child(i))
    torch.testing.assert_close(fused_color(u8, ops, key), seq, atol=1e-5, rtol=0)
    ops[0] = ToDtype(torch.bfloat16)
    fused = fused_color(u8, ops, key)
    assert fused.dtype == torch.bfloat16
    torch.testing.assert_close(fused.float(), seq, atol=0.05, rtol=0.01)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_no_host_sync_on_cuda():
    x, key = _images(8, "cuda"), _key(8, "cuda")
    ops = [ToDtype(torch.float16), ColorJitter(0.4, 0.4, 0.4, 0.1), RandomGrayscale(0.3), GaussianBlur(5),
           Normalize((0.5,) * 3, (0.2,) * 3).cuda()]
    labels = torch.arange(8, device="cuda")
    fused_color(x, ops, key), RandomErasing(1.0)(x, key), MixUp(num_classes=8)(x, labels, key)  # warm up
    torch.cuda.set_sync_debug_mode("error")
    try:
        fused_color((x * 255).to(torch.uint8), ops, key)
        RandomErasing(1.0)(x, key)
        MixUp(num_classes=8)(x, labels, key)
        CutMix(num_classes=8)(x, labels, key)
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ----------------------------------------------------------------------------- MixUp / CutMix


def test_mixup_mixes_images_and_labels(device):
    x, key = _images(6, device), _key(6, device)
    labels = torch.tensor([0, 1, 2, 3, 4, 0], device=device)
    mix = MixUp(alpha=1.0, num_classes=5)
    lam = mix.make_params(x, key)["lam"]
    out, soft = mix(x, labels, key)
    torch.testing.assert_close(out, lam * x + (1 - lam) * x.roll(1, 0))
    assert soft.shape == (6, 5) and soft.dtype == torch.float32
    torch.testing.assert_close(soft.sum(1), torch.ones(6, device=device))
    torch.testing.assert_close(soft[1, 1], lam[0])
    torch.testing.assert_close(soft[1, 0], 1 - lam[0])
    torch.testing.assert_close(soft[0, 0], torch.tensor(1.0, device=device))  # partner has the same class
    shuffled = AugKey(key.seed, key.epoch, key.sample_ids.flip(0))
    torch.testing.assert_close(mix.make_params(x, shuffled)["lam"], lam)  # one lambda per set of ids


def test_cutmix_labels_follow_box_area(device):
    B, H, W = 8, 20, 30
    x = torch.arange(B, dtype=torch.float32, device=device).view(B, 1, 1, 1).expand(B, 3, H, W).contiguous()
    labels = torch.arange(B, device=device)
    cut = CutMix(alpha=1.0, num_classes=B)
    for seed in range(20):
        key = _key(B, device, seed=seed)
        params = cut.make_params(x, key)
        out, soft = cut.apply(x, labels, params)
        own = (out == x).all(dim=1).float().mean(dim=(1, 2))  # fraction of own pixels
        assert ((out == x) | (out == x.roll(1, 0))).all()
        torch.testing.assert_close(soft.sum(1), torch.ones(B, device=device))
        torch.testing.assert_close(soft[labels, labels], own)
        torch.testing.assert_close(soft[labels, labels.roll(1)], 1 - own)
        x1, y1, x2, y2 = params["box"].tolist()
        assert 0 <= x1 <= x2 <= W and 0 <= y1 <= y2 <= H


# ----------------------------------------------------------------------------- arguments


@pytest.mark.parametrize("make, exc, msg", [
    (lambda: ColorJitter(brightness=-0.1), ValueError, "If brightness is a single number, it must be non negative"),
    (lambda: ColorJitter(contrast=(1.5, 0.5)), ValueError, r"contrast values should be between \(0, inf\)"),
    (lambda: ColorJitter(saturation=(1, 2, 3)), TypeError, "should be a single number or a sequence with length 2"),
    (lambda: ColorJitter(hue=0.6), ValueError, r"hue values should be between \(-0.5, 0.5\)"),
    (lambda: ColorJitter(hue=-0.1), ValueError, "If hue is a single number, it must be non negative"),
    (lambda: Normalize((0.5, 0.5, 0.5), (0.2, 0.0, 0.2)), ValueError, "std evaluated to zero"),
    (lambda: Grayscale(2), ValueError, "num_output_channels must be 1 or 3"),
    (lambda: GaussianBlur(4), ValueError, "Kernel size value should be an odd and positive number"),
    (lambda: GaussianBlur(3, sigma=-1.0), ValueError, r"sigma values should be positive and of the form \(min, max\)"),
    (lambda: GaussianBlur(3, sigma=(2.0, 1.0)), ValueError, r"sigma values should be positive and of the form"),
    (lambda: GaussianBlur(3, sigma="x"), ValueError, "sigma should be a sequence of numbers"),
    (lambda: GaussianBlur(3, sigma=None), TypeError, "sigma should be a number or a sequence of numbers"),
    (lambda: GaussianBlur(3, sigma=(1.0, 2.0, 3.0)), ValueError, "If sigma is a sequence its length should be 1 or 2"),
    (lambda: RandomErasing(p=1.5), ValueError, r"`p` should be a floating point value in the interval \[0.0, 1.0\]"),
    (lambda: RandomErasing(scale=(0.1, 1.5)), ValueError, "Scale should be between 0 and 1"),
    (lambda: RandomErasing(value="noise"), ValueError, "If value is str, it should be 'random'"),
    (lambda: RandomGrayscale(p=-0.1), ValueError, r"`p` should be a floating point value in the interval \[0.0, 1.0\]"),
    (lambda: MixUp(alpha=0.0, num_classes=3), ValueError, "alpha should be a positive float"),
    (lambda: CutMix(num_classes=0), ValueError, "num_classes should be a positive integer"),
])
def test_bad_arguments(make, exc, msg):
    with pytest.raises(exc, match=msg):
        make()


def test_bad_inputs():
    key, x = _key(2), _images(2)
    with pytest.raises(TypeError, match="Input tensor should be a float tensor"):
        Normalize((0.5,) * 3, (0.2,) * 3)((x * 255).to(torch.uint8), key)
    with pytest.raises(TypeError, match=r"ColorJitter takes uint8 \(0-255\) or float \(0-1\) images, got torch.int16"):
        ColorJitter(0.4)((x * 255).to(torch.int16), key)
    with pytest.raises(ValueError, match="either a single value or 3"):
        RandomErasing(p=1.0, value=(0.1, 0.2))(x, key)
    with pytest.raises(ValueError, match=r"labels should be tensor of shape \(batch_size,\)"):
        MixUp(num_classes=3)(x, torch.zeros(3, dtype=torch.int64), key)
    with pytest.raises(ValueError, match="at most one ToDtype, as the first op"):
        fused_color(x, [ColorJitter(0.4), ToDtype()], key)


def test_random_order_jitter_equals_applying_each_samples_order_one_by_one():
    """The vectorised per-sample order (hue run once, blends split around it) gives what
    applying each sample's own order, op by op, gives."""
    from gpupipe.augment.base import AugKey
    from gpupipe.augment.color import _JITTER_OPS, ColorJitter

    jitter = ColorJitter(0.4, 0.4, 0.4, 0.2)
    x = torch.rand(24, 3, 9, 11, generator=torch.Generator().manual_seed(0))
    key = AugKey(seed=5, epoch=1, sample_ids=torch.arange(24))
    params = jitter.make_params(x, key)
    out = jitter.apply(x, params)
    for i in range(24):
        ref = x[i:i + 1]
        for j in params["order"][i].tolist():
            name = jitter.enabled[j]
            ref = _JITTER_OPS[name](ref, params[name][i:i + 1])
        torch.testing.assert_close(out[i:i + 1], ref, atol=2e-5, rtol=0)
