"""The auto-augment policies: torchvision v2's op spaces, bins and draws (checked as
distributions over many keyed samples), each op against an independent reference on a
tiny image (numpy formulas, Pillow for the geometry and Equalize), keyed determinism,
and the dense (accelerator) path agreeing with the CPU's and asking the host for nothing."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from gpupipe.augment.autoaugment import AugMix, AutoAugment, RandAugment, TrivialAugmentWide, sub_policies
from gpupipe.augment.base import AugKey
from gpupipe.augment.policyops import OP_IDS, OPS, apply_ops

_N = 20_000
NAMES = {i: name for name, i in OP_IDS.items()}


def _key(n: int, seed: int = 3, epoch: int = 0, start: int = 0) -> AugKey:
    return AugKey(seed, epoch, torch.arange(start, start + n))


def _like(n: int, h: int = 224, w: int = 224) -> torch.Tensor:
    """What Compose hands to make_params: the shape, nothing allocated."""
    return torch.zeros((), dtype=torch.uint8).expand(n, 3, h, w)


def _images(n: int, c: int = 3, h: int = 12, w: int = 10, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, c, h, w), dtype=torch.uint8, generator=g)


def _within(count: int, total: int, p: float, sigmas: float = 5.0) -> bool:
    return abs(count - total * p) <= sigmas * math.sqrt(total * p * (1 - p)) + 1


# ------------------------------------------------------------- torchvision's definitions, written out

def _lin(top, n):
    return [float(v) for v in torch.linspace(0.0, top, n)]


def _tv_space(policy: str, n: int, h: int, w: int) -> dict[str, tuple[list[float] | None, bool]]:
    """torchvision v2's _AUGMENTATION_SPACE of ``policy``: op → (magnitudes of n bins, signed)."""
    colour = 0.99 if policy == "TrivialAugmentWide" else 0.9
    if policy == "TrivialAugmentWide":
        geo = {"ShearX": 0.99, "ShearY": 0.99, "TranslateX": 32.0, "TranslateY": 32.0, "Rotate": 135.0}
        post = [float(round(8 - i / ((n - 1) / 6))) for i in range(n)]
    elif policy == "AugMix":
        geo = {"ShearX": 0.3, "ShearY": 0.3, "TranslateX": w / 3.0, "TranslateY": h / 3.0, "Rotate": 30.0}
        post = [float(round(4 - i / ((n - 1) / 4))) for i in range(n)]
    else:
        geo = {"ShearX": 0.3, "ShearY": 0.3, "TranslateX": 150 / 331 * w, "TranslateY": 150 / 331 * h, "Rotate": 30.0}
        post = [float(round(8 - i / ((n - 1) / 4))) for i in range(n)]
    space = {name: (_lin(top, n), True) for name, top in geo.items()}
    space.update({name: (_lin(colour, n), True) for name in ("Brightness", "Color", "Contrast", "Sharpness")})
    space.update({"Posterize": (post, False), "Solarize": ([float(v) for v in torch.linspace(1.0, 0.0, n)], False),
                  "AutoContrast": (None, False), "Equalize": (None, False)})
    if policy in ("TrivialAugmentWide", "RandAugment"):
        space["Identity"] = (None, False)
    if policy == "AutoAugment":
        space["Invert"] = (None, False)
    return space


IMAGENET = [  # torchvision's AutoAugmentPolicy.IMAGENET
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)), (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, None)), (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)), (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)), (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
    (("Equalize", 0.0, None), ("Equalize", 0.8, None)), (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)), (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)), (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, None)), (("Color", 0.4, 0), ("Equalize", 0.6, None)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)), (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
]
CIFAR10_FIRST_LAST = ((("Invert", 0.1, None), ("Contrast", 0.2, 6)),
                      (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None)))
SVHN_FIRST_LAST = ((("ShearX", 0.9, 4), ("Invert", 0.2, None)), (("ShearX", 0.7, 2), ("Invert", 0.1, None)))


# ------------------------------------------------------------------------------ distributions

@pytest.mark.parametrize("bins", [31, 7])
def test_trivial_augment_draws_op_bin_and_sign_as_torchvision(bins):
    params = TrivialAugmentWide(num_magnitude_bins=bins).make_params(_like(_N), _key(_N))
    op, mag = params["op"][:, 0], params["magnitude"][:, 0]
    space = _tv_space("TrivialAugmentWide", bins, 224, 224)
    counts = Counter(NAMES[int(i)] for i in op)
    assert set(counts) == set(space)
    assert all(_within(c, _N, 1 / len(space)) for c in counts.values()), counts
    for name, (values, signed) in space.items():
        m = mag[op == OP_IDS[name]]
        if values is None:
            assert torch.all(m == 0)
            continue
        assert torch.all(torch.isin(m.abs(), torch.tensor(values))), name  # only torchvision's bin values
        seen = Counter(round(v, 5) for v in m.abs().tolist())
        for value, k in Counter(round(v, 5) for v in values).items():  # every bin equally likely
            assert _within(seen[value], len(m), k / bins), (name, value)
        negative = int((m < 0).sum())
        assert _within(negative, int((m != 0).sum()), 0.5) if signed else negative == 0, name


def test_rand_augment_uses_bin_magnitude_for_every_op_and_independent_slots():
    params = RandAugment(num_ops=2, magnitude=9, num_magnitude_bins=31).make_params(_like(_N, 96, 128), _key(_N))
    op, mag = params["op"], params["magnitude"]
    assert op.shape == mag.shape == (_N, 2)
    space = _tv_space("RandAugment", 31, 96, 128)
    for slot in range(2):
        counts = Counter(NAMES[int(i)] for i in op[:, slot])
        assert set(counts) == set(space) and all(_within(c, _N, 1 / 14) for c in counts.values())
        for name, (values, signed) in space.items():
            m = mag[op[:, slot] == OP_IDS[name], slot]
            expected = 0.0 if values is None else values[9]
            assert torch.allclose(m.abs(), torch.tensor(expected)), (name, m.abs().unique())
            if signed:
                assert _within(int((m < 0).sum()), len(m), 0.5)
    pairs = Counter(zip(op[:, 0].tolist(), op[:, 1].tolist()))
    assert len(pairs) == 14 * 14 and all(_within(c, _N, 1 / 196) for c in pairs.values())


def test_auto_augment_imagenet_subpolicies_and_probabilities():
    assert sub_policies(AutoAugment().policy) == IMAGENET
    assert (sub_policies(AutoAugment("cifar10").policy)[0], sub_policies(AutoAugment("cifar10").policy)[-1]) \
        == CIFAR10_FIRST_LAST
    assert (sub_policies(AutoAugment("svhn").policy)[0], sub_policies(AutoAugment("svhn").policy)[-1]) \
        == SVHN_FIRST_LAST
    n = 50_000
    params = AutoAugment().make_params(_like(n, 64, 64), _key(n))
    space = _tv_space("AutoAugment", 10, 64, 64)
    expected: Counter = Counter()
    for sub in IMAGENET:  # outcome (op0, |m0|, op1, |m1|) with its probability
        options = []
        for name, p, b in sub:
            m = 0.0 if b is None or space[name][0] is None else round(space[name][0][b], 4)
            options.append([((name, m), p), (("Identity", 0.0), 1 - p)])
        for (a, pa) in options[0]:
            for (b, pb) in options[1]:
                expected[a + b] += pa * pb / len(IMAGENET)
    seen = Counter((NAMES[int(o0)], round(abs(float(m0)), 4), NAMES[int(o1)], round(abs(float(m1)), 4))
                   for (o0, o1), (m0, m1) in zip(params["op"].tolist(), params["magnitude"].tolist()))
    assert set(seen) <= {k for k, p in expected.items() if p > 0}
    assert all(_within(seen[k], n, p) for k, p in expected.items()), seen
    rotate = params["magnitude"][params["op"] == OP_IDS["Rotate"]]
    assert _within(int((rotate < 0).sum()), rotate.numel(), 0.5)


@pytest.mark.parametrize("all_ops, alpha", [(True, 1.0), (False, 0.5)])
def test_augmix_chains_depths_bins_and_weights(all_ops, alpha):
    n = 8000
    params = AugMix(severity=3, all_ops=all_ops, alpha=alpha).make_params(_like(n, 60, 90), _key(n))
    op, mag, w = params["op"], params["magnitude"], params["weights"]
    assert op.shape == mag.shape == (n, 3, 3) and w.shape == (n, 4)
    depth = (op != OP_IDS["Identity"]).sum(-1)
    assert torch.all(op[..., 0] != OP_IDS["Identity"])  # chains are a prefix of ops
    assert all(_within(int((depth == d).sum()), 3 * n, 1 / 3) for d in (1, 2, 3))
    space = _tv_space("AugMix", 10, 60, 90)
    names = [k for k in space if all_ops or k not in ("Brightness", "Color", "Contrast", "Sharpness")]
    used = op[op != OP_IDS["Identity"]]
    counts = Counter(NAMES[int(i)] for i in used)
    assert set(counts) == set(names) and all(_within(c, used.numel(), 1 / len(names)) for c in counts.values())
    for name in ("Rotate", "TranslateY", "Posterize"):
        m = mag[op == OP_IDS[name]].abs()
        values = space[name][0][:3]  # bins below severity
        assert torch.all(torch.isin(m, torch.tensor(values)))
    assert torch.allclose(w.sum(1), torch.ones(n), atol=1e-5) and torch.all(w >= 0)
    beta_var = alpha * alpha / ((2 * alpha) ** 2 * (2 * alpha + 1))
    assert abs(w[:, 0].mean() - 0.5) < 0.02 and abs(w[:, 0].var() - beta_var) < 0.01
    share = w[:, 1:] / w[:, 1:].sum(1, keepdim=True)
    assert torch.allclose(share.mean(0), torch.full((3,), 1 / 3), atol=0.02)


# ------------------------------------------------------------------------------ ops vs references

def _run(name: str, images: torch.Tensor, magnitude: float, **kw) -> torch.Tensor:
    n = images.shape[0]
    return apply_ops(images, torch.full((n,), OP_IDS[name]), torch.full((n,), magnitude), **kw)


def _np(x: torch.Tensor) -> np.ndarray:
    return x.numpy().astype(np.float64)


def test_posterize_solarize_invert_match_their_formulas():
    x = _images(4)
    for bits in (0, 1, 4, 7, 8):
        mask = (0xFF << (8 - bits)) & 0xFF
        assert torch.equal(_run("Posterize", x, float(bits)), x & mask)
        levels = 2 ** bits
        xf = x.float() / 255
        ref = np.clip(np.floor(_np(xf) * levels), 0, levels - 1) / levels
        assert np.allclose(_run("Posterize", xf, float(bits)).numpy(), ref, atol=1e-6)
    for m in (0.0, 0.3, 1.0):
        ref = np.where(_np(x) >= 255 * m, 255 - _np(x), _np(x))
        assert np.array_equal(_run("Solarize", x, m).numpy(), ref)
    assert torch.equal(_run("Invert", x, 0.0), 255 - x)
    assert torch.allclose(_run("Invert", x.float() / 255, 0.0), 1 - x.float() / 255)


def test_autocontrast_stretches_each_channel_and_keeps_flat_ones():
    x = _images(3) // 2 + 40  # values 40..167
    x[1, 2] = 99  # a flat channel stays as it is
    out = _run("AutoContrast", x, 0.0).numpy()
    v = x.numpy().astype(np.float32)
    lo, hi = v.min(axis=(2, 3), keepdims=True), v.max(axis=(2, 3), keepdims=True)
    span = np.where(hi > lo, (hi - lo) * np.float32(1 / 255), np.float32(1))  # torchvision's float32 steps
    ref = np.where(hi > lo, np.trunc(np.clip((v - lo) / span, 0, 255)), v)
    assert np.array_equal(out, ref)
    exact = np.where(hi > lo, (v - lo) * 255.0 / np.where(hi > lo, hi - lo, 1), v)
    assert np.abs(out - exact).max() <= 1  # the stretch itself, truncated (float32 may land just below)
    assert out[0].min() == 0 and out[0].max() >= 254 and np.all(out[1, 2] == 99)


@pytest.mark.parametrize("c", [3, 1])
def test_equalize_matches_pillow(c):
    x = _images(5, c=c, h=17, w=13)
    x[1] = x[1] // 64 * 60  # few levels
    x[2] = 7  # one level: unchanged
    x[3, :, :3] = 255
    x[4, :, :, :] = torch.where(x[4] > 128, 200, 3).to(torch.uint8)  # two levels
    out = _run("Equalize", x, 0.0)
    for i in range(x.shape[0]):
        hwc = x[i].permute(1, 2, 0).numpy()
        ref = np.asarray(ImageOps.equalize(Image.fromarray(hwc[..., 0] if c == 1 else hwc)))
        assert np.array_equal(out[i].permute(1, 2, 0).numpy().squeeze(-1) if c == 1 else
                              out[i].permute(1, 2, 0).numpy(), ref), i
    quantized = _run("Equalize", x.float() / 255, 0.0)
    assert torch.allclose(quantized, out.float() / 255, atol=1e-6)


def _luma(v: np.ndarray, floor: bool) -> np.ndarray:
    g = 0.2989 * v[:, :1] + 0.587 * v[:, 1:2] + 0.114 * v[:, 2:3]
    return np.floor(g) if floor else g


def _blend(v, ref, f, bound, integer):
    out = np.clip(v * f + ref * (1 - f), 0, bound)
    return np.floor(out + 1e-6) if integer else out


@pytest.mark.parametrize("integer", [True, False])
def test_brightness_color_contrast_sharpness_match_torchvision_formulas(integer):
    x = _images(3, h=9, w=11)
    images, bound = (x, 255.0) if integer else (x.float() / 255, 1.0)
    v = _np(images)
    m = 0.45
    refs = {"Brightness": _blend(v, 0.0, 1 + m, bound, integer),
            "Color": _blend(v, _luma(v, integer), 1 + m, bound, integer),
            "Contrast": _blend(v, _luma(v, integer).mean(axis=(1, 2, 3), keepdims=True), 1 + m, bound, integer)}
    padded = np.pad(v, ((0, 0), (0, 0), (1, 1), (1, 1)))
    smooth = sum(padded[:, :, 1 + dy:10 + dy, 1 + dx:12 + dx] * (5 if dx == dy == 0 else 1)
                 for dy in (-1, 0, 1) for dx in (-1, 0, 1)) / 13
    smooth = np.round(smooth) if integer else smooth
    sharp = v.copy()
    sharp[..., 1:-1, 1:-1] = _blend(v, smooth, 1 + m, bound, integer)[..., 1:-1, 1:-1]
    refs["Sharpness"] = sharp
    for name, ref in refs.items():
        out = _np(_run(name, images, m))
        tol = 1.0 if integer else 1e-5
        assert np.abs(out - ref).max() <= tol and (integer is False or (out != ref).mean() < 0.02), name
    assert torch.equal(_run("Color", x[:, :1], m), x[:, :1])  # one channel: saturation does nothing


def _pil_affine(img: np.ndarray, coeffs, fill=0) -> np.ndarray:
    """Pillow's nearest affine (output→input coefficients, pixel corners at integers) per channel."""
    planes = [np.asarray(Image.fromarray(img[c]).transform(img[c].shape[::-1], Image.Transform.AFFINE, coeffs,
                                                          Image.Resampling.NEAREST, fillcolor=fill))
              for c in range(img.shape[0])]
    return np.stack(planes)


@pytest.mark.parametrize("name, m, coeffs", [
    ("ShearX", 0.3, (1, 0.3, 0, 0, 1, 0)), ("ShearX", -0.3, (1, -0.3, 0, 0, 1, 0)),
    ("ShearY", 0.3, (1, 0, 0, 0.3, 1, 0)), ("TranslateX", 3.7, (1, 0, -3, 0, 1, 0)),
    ("TranslateY", -2.2, (1, 0, 0, 0, 1, 2)),
])
def test_shear_and_translate_match_the_pil_definitions(name, m, coeffs):
    x = _images(2, h=8, w=9)
    out = _run(name, x, m).numpy()
    for i in range(2):
        assert np.array_equal(out[i], _pil_affine(x[i].numpy(), coeffs)), i
    filled = _run(name, x, m, fill=(9.0, 50.0, 200.0)).numpy()
    assert np.array_equal(filled[0, 1:2], _pil_affine(x[0, 1:2].numpy(), coeffs, fill=50))


@pytest.mark.parametrize("angle", [37.0, -101.0])
def test_rotate_matches_pillow_counter_clockwise(angle):
    x = _images(2, h=11, w=11)
    out = _run("Rotate", x, angle).numpy()
    for i in range(2):  # (angles whose sources never fall exactly between two pixels: no ties to break)
        ref = np.stack([np.asarray(Image.fromarray(p).rotate(angle, Image.Resampling.NEAREST)) for p in x[i].numpy()])
        assert np.array_equal(out[i], ref)
    assert torch.equal(_run("Rotate", x, 0.0), x) and torch.equal(_run("Identity", x, 5.0), x)


def test_bilinear_geometry_rounds_uint8_and_keeps_float():
    x = _images(2, h=8, w=9)
    out = _run("Rotate", x, 17.0, interpolation="bilinear")
    ref = _run("Rotate", x.float(), 17.0, interpolation="bilinear")
    assert out.dtype == torch.uint8 and torch.equal(out, ref.round().to(torch.uint8))


# ------------------------------------------------------------------------------ batches, keys, dtypes

def _all_ops_batch(n: int = 45) -> tuple[torch.Tensor, torch.Tensor]:
    op = torch.arange(n) % len(OPS)
    mag = torch.tensor([0.3, -0.4, 5.0, 0.7, 4.0, -20.0, 0.2, -0.9, 6.0])[torch.arange(n) % 9]
    return op, torch.where(op == OP_IDS["Posterize"], 5.0, mag)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_dense_path_equals_the_indexed_one(dtype):
    x = _images(45, h=10, w=12)
    x = x if dtype == torch.uint8 else x.float() / 255
    before = x.clone()
    op, mag = _all_ops_batch()
    dense, sparse = apply_ops(x, op, mag, dense=True), apply_ops(x, op, mag, dense=False)
    assert dense.dtype == sparse.dtype == dtype and torch.equal(dense, sparse)
    assert torch.equal(x, before)  # the caller's batch is never written


def test_dense_path_never_reads_a_value_on_the_host(monkeypatch):
    """What the accelerator runs must not sync: no .item(), bool(), nonzero or tolist."""
    x = _images(16, h=10, w=12)
    policies = [TrivialAugmentWide(), RandAugment(), AutoAugment(), AugMix(chain_depth=2)]

    def refuse(*args, **kwargs):
        raise AssertionError("host sync")

    for name in ("item", "__bool__", "nonzero", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    op, mag = _all_ops_batch(16)
    apply_ops(x, op, mag, dense=True)
    for policy in policies:
        policy.make_params(x, _key(16))


def test_same_key_same_output_other_samples_other_ops():
    x = _images(64, h=16, w=16)
    for policy in (TrivialAugmentWide(), RandAugment(), AutoAugment(), AugMix()):
        a, b = policy(x, _key(64)), policy(x, _key(64))
        assert torch.equal(a, b) and a.dtype == torch.uint8 and a.shape == x.shape
        params = policy.make_params(x, _key(64))
        assert len(set(map(tuple, params["op"].reshape(64, -1).tolist()))) > 8, type(policy).__name__
        # a sample's result depends on its id only, not on the batch it is in
        part = policy(x[10:20], AugKey(3, 0, torch.arange(10, 20)))
        assert torch.equal(part, a[10:20])
        assert not torch.equal(policy(x, _key(64, epoch=1)), a)
        floats = policy(x.float() / 255, _key(64))
        assert floats.dtype == torch.float32 and floats.min() >= 0 and floats.max() <= 1 + 1e-6


def test_augmix_output_is_the_truncated_weighted_mix():
    x = _images(6, h=8, w=8)
    policy = AugMix(mixture_width=2, chain_depth=1)
    params = policy.make_params(x, _key(6))
    params["op"] = torch.full_like(params["op"], OP_IDS["Invert"])
    w = params["weights"].numpy().astype(np.float32)[:, :, None, None, None]
    v = x.numpy().astype(np.float32)
    ref = np.floor(w[:, 0] * v + w[:, 1] * (255 - v) + w[:, 2] * (255 - v))
    assert np.abs(policy.apply(x, params).numpy() - ref).max() <= 1


def test_arguments_are_checked_like_torchvision():
    with pytest.raises(ValueError, match="num_ops"):
        RandAugment(num_ops=-1)
    with pytest.raises(ValueError, match="magnitude"):
        RandAugment(magnitude=31)
    with pytest.raises(ValueError, match="severity"):
        AugMix(severity=0)
    with pytest.raises(ValueError, match="not recognized"):
        AutoAugment("cifar100")
    with pytest.raises(ValueError, match="interpolation"):
        TrivialAugmentWide(interpolation="lanczos")
    with pytest.raises(ValueError, match="C in"):
        TrivialAugmentWide()(torch.zeros(2, 4, 8, 8, dtype=torch.uint8), _key(2))
    assert AutoAugment(policy=type("P", (), {"value": "svhn"})()).policy.value == "svhn"


# ------------------------------------------------------------------------------ config and torchvision

def test_policies_are_config_steps_and_presets():
    from gpupipe.augment.compose import Compose
    from gpupipe.config.schema import parse_config

    cfg = parse_config({"source": "x", "augment": [
        {"name": "TrivialAugmentWide", "num_magnitude_bins": 11}, {"name": "RandAugment", "num_ops": 1},
        {"name": "AutoAugment", "policy": "svhn", "fill": [10, 20, 30]}, {"name": "AugMix", "severity": 2},
        {"name": "ToDtype", "dtype": "float32"}]})
    steps = [s.build() for s in cfg.augment]
    assert isinstance(steps[2], AutoAugment) and steps[2].policy.value == "svhn" and steps[2].fill == (10, 20, 30)
    out = Compose(steps)(_images(4, h=16, w=16), _key(4))
    assert out.dtype == torch.float32 and out.min() >= 0 and out.max() <= 1
    for preset, cls in (("trivialaugment", TrivialAugmentWide), ("randaugment", RandAugment),
                        ("autoaugment", AutoAugment)):
        steps = [s.build() for s in parse_config({"source": "x", "augment": preset}).augment]
        policy = next(s for s in steps if isinstance(s, cls))
        assert policy.interpolation == "bilinear"
        assert Compose(steps)(_images(2, h=16, w=16), _key(2)).dtype == torch.float32


def test_from_torchvision_maps_the_policies():
    from gpupipe.transforms import from_torchvision

    mode = type("InterpolationMode", (), {"value": "bilinear"})()

    def tv(name, **attrs):  # a stand-in with torchvision v2's class name and attributes
        return type(name, (), {"__module__": "torchvision.transforms.v2._auto_augment", **attrs})()

    compose = type("Compose", (), {"transforms": [
        tv("TrivialAugmentWide", num_magnitude_bins=31, interpolation=mode, fill=None),
        tv("RandAugment", num_ops=3, magnitude=5, num_magnitude_bins=11, interpolation=mode, fill=None),
        tv("AutoAugment", policy=type("AutoAugmentPolicy", (), {"value": "cifar10"})(), interpolation=mode,
           fill={"Image": 7}),
        tv("AugMix", severity=4, mixture_width=2, chain_depth=1, alpha=0.5, all_ops=False, interpolation=mode,
           fill=None)]})()
    ta, ra, aa, am = from_torchvision(compose).transforms
    assert isinstance(ta, TrivialAugmentWide) and ta.interpolation == "bilinear"
    assert (ra.num_ops, ra.magnitude, ra.num_magnitude_bins) == (3, 5, 11)
    assert aa.policy.value == "cifar10" and aa.fill == (7.0,)
    assert (am.severity, am.mixture_width, am.chain_depth, am.alpha, am.all_ops) == (4, 2, 1, 0.5, False)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_from_torchvision_maps_the_real_policies_with_every_argument(version):
    """docs/migration.md's table of the policies, against the installed torchvision."""
    import torchvision.transforms as v1
    from torchvision.transforms import v2

    from gpupipe.transforms import from_torchvision

    tv = v1 if version == "v1" else v2
    bilinear = tv.InterpolationMode.BILINEAR
    aa, ra, ta, am = from_torchvision(tv.Compose([
        tv.AutoAugment(tv.AutoAugmentPolicy.SVHN, fill=[128, 128, 128]),
        tv.RandAugment(num_ops=3, magnitude=5, num_magnitude_bins=21, interpolation=bilinear),
        tv.TrivialAugmentWide(num_magnitude_bins=11),
        tv.AugMix(severity=2, mixture_width=4, chain_depth=2, alpha=0.5, all_ops=False)])).transforms
    assert aa.policy.value == "svhn" and aa.fill == (128.0,) * 3 and aa.interpolation == "nearest"
    assert (ra.num_ops, ra.magnitude, ra.num_magnitude_bins, ra.interpolation) == (3, 5, 21, "bilinear")
    assert isinstance(ta, TrivialAugmentWide) and ta.num_magnitude_bins == 11 and ta.fill == (0.0,)
    assert (am.severity, am.mixture_width, am.chain_depth, am.alpha, am.all_ops, am.interpolation) == \
        (2, 4, 2, 0.5, False, "bilinear")
