"""gpupipe.transforms as a torchvision user meets it: uint8 keeps torchvision's value range
through every step, ``from_torchvision`` on real recipes, the per-sample containers, and
the small things (``gpupipe.transforms`` after ``import gpupipe``, ``ToTensor``, a
pipeline that cannot work raising when it is built).

Limitation: torchvision cannot be imported with the CPU torch here, so ``from_torchvision``
is fed stand-ins: objects whose class name and documented attributes mirror torchvision's
(``tv(...)`` below; ``module=`` gives the v2 module path where v1 and v2 store an attribute
differently). tests/augment/test_tv_contract.py checks the transforms themselves against real
torchvision wherever it imports.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import gpupipe.transforms as T
from gpupipe.augment.registry import build_transform

IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
V2 = "torchvision.transforms.v2._geometry"


def tv(name: str, module: str = "torchvision.transforms.transforms", **attrs):
    """An object shaped like a torchvision transform: class name + documented attributes."""
    return type(name, (), {"__module__": module, **attrs})()


def tv_compose(*ts, module: str = "torchvision.transforms.transforms"):
    return tv("Compose", module=module, transforms=list(ts))


def _key(n: int, epoch: int = 0) -> T.AugKey:
    return T.AugKey(seed=0, epoch=epoch, sample_ids=torch.arange(n))


def _uint8(n: int = 4, h: int = 64, w: int = 64, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, h, w), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- value ranges (issue 14)

@pytest.mark.parametrize("geometry", [
    [T.RandomHorizontalFlip()], [T.RandomResizedCrop(32)], [T.RandomAffine(20, translate=(0.1, 0.1))],
    [T.Resize(48), T.CenterCrop(32)], [T.RandomCrop(64, padding=4)], [T.RandomPerspective(p=1.0)],
], ids=["flip", "rrc", "affine", "resize-centercrop", "crop-padding", "perspective"])
@pytest.mark.parametrize("fuse", [True, False])
def test_uint8_keeps_its_range_through_geometry_then_todtype_gives_unit(geometry, fuse):
    """The issue's pipeline: torchvision gives at most (1 - 0.406) / 0.225 = 2.64 after Normalize."""
    x, key = _uint8(), _key(4)
    assert T.Compose(geometry, fuse=fuse)(x, key).dtype == torch.uint8
    out = T.Compose([*geometry, T.ToDtype(torch.float32, scale=True), T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD)],
                    fuse=fuse)(x, key)
    assert out.dtype == torch.float32
    assert 2.0 < float(out.max()) <= 2.6401 and -2.1180 <= float(out.min()) < -1.5


def test_colour_ops_on_uint8_return_uint8_like_torchvision():
    """torchvision v2's integer rules, written out: blend in float32, clamp, truncate."""
    x, key = _uint8(6, 16, 16), _key(6)
    jitter = T.ColorJitter(brightness=(1.3, 1.3))
    assert torch.equal(jitter(x, key), (x.float() * 1.3).clamp(0, 255).to(torch.uint8))
    r, g, b = x.unbind(1)
    luma = r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).unsqueeze(1)
    assert torch.equal(T.Grayscale(3)(x, key), luma.to(torch.uint8).expand(-1, 3, -1, -1))
    assert torch.equal(T.RandomGrayscale(1.0)(x, key), luma.to(torch.uint8).expand(-1, 3, -1, -1))
    sat = T.ColorJitter(saturation=(0.5, 0.5))(x, key)
    want = (0.5 * x.float() + 0.5 * luma.floor()).clamp(0, 255).to(torch.uint8)
    assert (sat.int() - want.int()).abs().max() <= 1 and (sat != want).float().mean() < 0.01  # float rounding at .0
    blurred = T.GaussianBlur(3, sigma=(1.0, 1.0))(x, key)
    assert blurred.dtype == torch.uint8


def test_uint8_colour_fused_matches_the_reference():
    """ColorJitter on uint8: the fused pass against the op-by-op reference. Truncation
    turns float rounding differences into whole levels: measured max 3 on 0.03% of values."""
    x, key = _uint8(48, 12, 12, seed=3), _key(48)
    for jitter in (T.ColorJitter(0.5, 0.5, 0.5, 0.2), T.ColorJitter(0.5, 0.5, 0.5, 0.2, random_order=False)):
        params = jitter.make_params(x, key)
        fused, ref = jitter.apply(x, params), jitter.apply_reference(x, params)
        assert fused.dtype == ref.dtype == torch.uint8
        diff = (fused.int() - ref.int()).abs()
        assert diff.max() <= 4 and (diff > 0).float().mean() < 0.002


def test_warp_then_colour_keeps_uint8_values_in_the_fused_pass():
    """Between a warp and a colour pass the fused path holds the rounded uint8 values in
    float32; the result equals the reference, where the warp returns uint8."""
    x, key = _uint8(8, 20, 24), _key(8)
    ops = [T.RandomHorizontalFlip(), T.RandomCrop(16, padding=2), T.ColorJitter(0.4, 0.4, 0.4, 0.1),
           T.RandomGrayscale(0.3), T.ToTensor(), T.Normalize(*IMAGENET)]
    pipe = T.Compose(ops)
    params = pipe.make_params(x, key)
    fused, ref = pipe.apply(x, params), T.Compose(ops, fuse=False).apply(x, params)
    assert (fused - ref).abs().max() <= 4 / 255 / 0.224 + 1e-4  # a few levels where truncation flips
    uint8_tail = T.Compose(ops[:4])
    assert uint8_tail(x, key).dtype == torch.uint8


# ----------------------------------------------------------------------------- building a pipeline

def test_normalize_on_uint8_raises_when_built_naming_the_step():
    steps = [T.RandomHorizontalFlip(), T.Normalize(*IMAGENET)]
    with pytest.raises(TypeError, match=r"transforms\[1\] \(Normalize\): .*put ToDtype\(torch.float32, scale=True\) "
                                        r"before Normalize"):
        T.Compose(steps, input_dtype=torch.uint8)
    with pytest.raises(TypeError, match=r"transforms\[1\] \(Normalize\)"):  # without input_dtype: before any work
        T.Compose(steps)(_uint8(), _key(4))
    with pytest.raises(TypeError, match=r"transforms\[1\] \(Normalize\)"):
        T.from_torchvision(tv_compose(tv("RandomHorizontalFlip", p=0.5), tv("Normalize", mean=IMAGENET[0],
                                                                                 std=IMAGENET[1])))
    T.Compose([T.RandomHorizontalFlip(), T.ToDtype(torch.float32), T.Normalize(*IMAGENET)], input_dtype=torch.uint8)
    assert T.simple_set().output_dtype(torch.uint8) == T.complex_set().output_dtype(torch.uint8) == torch.float32


def test_gpupipe_transforms_after_a_plain_import_gpupipe():
    code = ("import sys, gpupipe; assert 'gpupipe.transforms' not in sys.modules; "
            "print(gpupipe.transforms.Compose.__name__, gpupipe.transforms is sys.modules['gpupipe.transforms'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["Compose", "True"]


def test_to_tensor_is_torchvisions_on_a_batch():
    x = _uint8()
    out = T.ToTensor()(x, _key(4))
    assert out.dtype == torch.float32 and torch.equal(out, x.float() / 255)
    assert isinstance(build_transform("ToTensor", {}), T.ToTensor)
    with pytest.raises(ValueError, match="ToTensor takes no arguments"):
        build_transform("ToTensor", {"dtype": "float16"})


# ----------------------------------------------------------------------------- from_torchvision

def complex_set(module: str = "torchvision.transforms.transforms"):
    return tv_compose(
        tv("Resize", size=[256, 256], max_size=None),
        tv("RandomAffine", degrees=[-20.0, 20.0], translate=None, scale=None, shear=None),
        tv("RandomHorizontalFlip", p=0.5), tv("RandomVerticalFlip", p=0.5),
        tv("RandomPerspective", distortion_scale=0.5, p=0.5),
        tv("ColorJitter", brightness=(0.8, 1.2), contrast=(0.8, 1.2), saturation=(0.8, 1.2), hue=(-0.2, 0.2)),
        tv("ToTensor"), tv("Normalize", mean=IMAGENET[0], std=IMAGENET[1]), module=module)


def test_complex_set_maps_in_torchvisions_order_and_runs_on_a_uint8_batch():
    pipe = T.from_torchvision(complex_set())
    names = [type(t).__name__ for t in pipe.transforms]
    assert names == ["Resize", "RandomAffine", "RandomHorizontalFlip", "RandomVerticalFlip", "RandomPerspective",
                     "ColorJitter", "ToTensor", "Normalize"]  # the jitter works on uint8, as torchvision's
    y = pipe(_uint8(6, 180, 200), _key(6))
    assert y.shape == (6, 3, 256, 256) and y.dtype == torch.float32
    unit = y * torch.tensor(IMAGENET[1]).view(1, 3, 1, 1) + torch.tensor(IMAGENET[0]).view(1, 3, 1, 1)
    assert float(unit.min()) >= -1e-5 and float(unit.max()) <= 1 + 1e-5


def test_real_recipes_with_type_conversions_and_containers():
    """v2 recipe: ToImage, RandomApply(ColorJitter), RandomChoice, RandomOrder, ToDtype(dict,
    scale=True), a nested v1 Compose with PILToTensor and ConvertImageDtype."""
    image_t = type("Image", (), {})
    v2 = "torchvision.transforms.v2._container"
    recipe = tv_compose(
        tv("ToImage"), tv("RandomResizedCrop", size=[32, 32], scale=(0.5, 1.0), ratio=(0.75, 1.33)),
        tv("RandomApply", module=v2, transforms=[tv("ColorJitter", brightness=(0.6, 1.4), contrast=None,
                                                    saturation=None, hue=None)], p=0.8),
        tv("RandomChoice", module=v2, transforms=[tv("RandomHorizontalFlip", p=1.0),
                                                  tv_compose(tv("RandomVerticalFlip", p=1.0))], p=[0.25, 0.75]),
        tv("RandomOrder", module=v2, transforms=[tv("RandomGrayscale", p=0.2), tv("RandomHorizontalFlip", p=0.5)]),
        tv("ToDtype", module="torchvision.transforms.v2._misc", dtype={image_t: torch.float32, "others": None},
           scale=True),
        tv("Normalize", mean=IMAGENET[0], std=IMAGENET[1]), module="torchvision.transforms.v2._container")
    pipe = T.from_torchvision(recipe)
    assert [type(t).__name__ for t in pipe.transforms] == ["RandomResizedCrop", "RandomApply", "RandomChoice",
                                                           "RandomOrder", "ToDtype", "Normalize"]
    apply, choice = pipe.transforms[1], pipe.transforms[2]
    assert apply.p == 0.8 and choice.p == [0.25, 0.75]
    assert type(choice.transforms[1]).__name__ == "RandomVerticalFlip"  # a one-step Compose is that step
    assert pipe.transforms[4].scale and pipe.transforms[4].dtype == torch.float32
    out = pipe(_uint8(), _key(4))
    assert out.shape == (4, 3, 32, 32) and out.dtype == torch.float32 and float(out.max()) <= 2.6401
    v1 = T.from_torchvision(tv_compose(tv("PILToTensor"), tv_compose(tv("ConvertImageDtype", dtype=torch.float16))))
    assert [(type(t).__name__, t.dtype, t.scale) for t in v1.transforms] == [("ToDtype", torch.float16, True)]
    plain = T.from_torchvision(tv("ToDtype", module="torchvision.transforms.v2._misc", dtype=torch.float32,
                                  scale=False)).transforms[0]
    assert not plain.scale  # v2's default: no rescaling, as torchvision


def test_v2_stores_some_arguments_parsed():
    crop = T.from_torchvision(tv("RandomCrop", module=V2, size=[8, 8], padding=[1, 2, 3, 4], pad_if_needed=False,
                                 fill=0, padding_mode="constant")).transforms[0]
    assert crop.padding == (1, 3, 2, 4)  # v2 keeps [left, right, top, bottom]; gpupipe (left, top, right, bottom)
    v1 = T.from_torchvision(tv("RandomCrop", size=[8, 8], padding=[1, 2, 3, 4], pad_if_needed=False, fill=0,
                               padding_mode="constant")).transforms[0]
    assert v1.padding == (1, 2, 3, 4)
    erasing = T.from_torchvision(tv("RandomErasing", module="torchvision.transforms.v2._augment", p=0.5,
                                    scale=(0.02, 0.33), ratio=(0.3, 3.3), value=None, inplace=False)).transforms[0]
    assert erasing.value == "random"  # v2 stores value="random" as None


def test_mapped_arguments_keep_their_meaning():
    aff = T.from_torchvision(tv("RandomAffine", degrees=[-7.0, 7.0], translate=(0.1, 0.2), scale=(0.9, 1.1),
                                shear=[-3.0, 3.0])).transforms[0]
    assert tuple(aff.degrees) == (-7.0, 7.0) and aff.translate == (0.1, 0.2) and aff.scale == (0.9, 1.1)
    rrc = T.from_torchvision(tv("RandomResizedCrop", size=[64, 48], scale=(0.5, 1.0), ratio=(0.75, 1.33))).transforms[0]
    assert isinstance(rrc, T.RandomResizedCrop)


def test_unsupported_transforms_are_named_with_where_they_are():
    with pytest.raises(ValueError, match=r"transforms\[1\]: Lambda is not supported .*RepeatChannels.*supported: "):
        T.from_torchvision(tv_compose(tv("ToTensor"), tv("Lambda", lambd=None)))
    with pytest.raises(ValueError, match=r"transforms\[0\]\.transforms\[1\]: Pad is not supported"):
        T.from_torchvision(tv("RandomApply", transforms=[tv("ToTensor"), tv("Pad", padding=2)], p=0.5))
    with pytest.raises(ValueError, match=r"RandomRotation\(expand=True\) is not supported"):
        T.from_torchvision(tv("RandomRotation", degrees=[-5.0, 5.0], expand=True, center=None))
    assert {"Compose", "RandomApply", "RandomChoice", "RandomOrder", "ToImage", "PILToTensor", "ToTensor",
            "ConvertImageDtype", "ToDtype"} <= set(T.SUPPORTED)


def test_same_key_same_output_and_permutation_invariance():
    pipe = T.from_torchvision(complex_set())
    x = _uint8(4, 64, 64)
    ids = torch.tensor([10, 11, 12, 13])
    a = pipe(x, T.AugKey(1, 2, ids))
    perm = torch.tensor([2, 0, 3, 1])
    b = pipe(x[perm], T.AugKey(1, 2, ids[perm]))
    assert torch.allclose(a[perm], b, atol=1e-4)
    assert not torch.allclose(a, pipe(x, T.AugKey(1, 3, ids)), atol=1e-2)  # another epoch


# ----------------------------------------------------------------------------- containers, per sample

def test_random_apply_draws_per_sample():
    x, key = _uint8(400, 8, 8), _key(400)
    t = T.RandomApply([T.RandomGrayscale(1.0)], p=0.3)
    params = t.make_params(x, key)
    out = t.apply(x, params)
    changed = (out != x).flatten(1).any(1)
    assert torch.equal(changed, params["apply"])
    assert torch.equal(out[changed], T.Grayscale(3)(x, key)[changed])
    assert 0.22 < changed.float().mean() < 0.38
    perm = torch.randperm(400, generator=torch.Generator().manual_seed(0))
    assert torch.equal(t(x[perm], T.AugKey(0, 0, key.sample_ids[perm])), t(x, key)[perm])  # keyed by sample id


def test_random_choice_each_sample_takes_its_own_transform():
    x, key = _uint8(600, 8, 8), _key(600)
    t = T.RandomChoice([T.RandomHorizontalFlip(1.0), T.RandomVerticalFlip(1.0), T.RandomGrayscale(1.0)],
                       p=[2.0, 1.0, 1.0])
    params = t.make_params(x, key)
    out = t.apply(x, params)
    choice = params["choice"]
    assert torch.equal(out[choice == 0], x[choice == 0].flip(-1))
    assert torch.equal(out[choice == 1], x[choice == 1].flip(-2))
    assert torch.equal(out[choice == 2], T.Grayscale(3)(x, key)[choice == 2])
    freq = torch.bincount(choice, minlength=3).float() / 600
    assert (freq - torch.tensor([0.5, 0.25, 0.25])).abs().max() < 0.07


def test_random_order_each_sample_applies_its_own_order():
    x, key = _uint8(64, 8, 8), _key(64)
    a, b = T.RandomCrop(8, padding=2), T.ColorJitter(brightness=(0.5, 1.5))
    t = T.RandomOrder([a, b])
    params = t.make_params(x, key)
    out = t.apply(x, params)
    pa = {k[2:]: v for k, v in params.items() if k.startswith("0.")}
    pb = {k[2:]: v for k, v in params.items() if k.startswith("1.")}
    ab, ba = b.apply(a.apply(x, pa), pb), a.apply(b.apply(x, pb), pa)
    first_a = params["order"][:, 0] == 0
    assert torch.equal(out[first_a], ab[first_a]) and torch.equal(out[~first_a], ba[~first_a])
    assert 0.25 < first_a.float().mean() < 0.75


def test_containers_refuse_what_a_batch_cannot_hold():
    x, key = _uint8(4, 16, 16), _key(4)
    with pytest.raises(ValueError, match=r"RandomApply: with its transforms, the image size \(16, 16\) becomes \(8, 8\)"):
        T.RandomApply([T.RandomResizedCrop(8)])(x, key)
    with pytest.raises(TypeError, match="RandomApply: with its transforms, torch.uint8 becomes torch.float32"):
        T.Compose([T.RandomApply([T.ToTensor()])], input_dtype=torch.uint8)
    with pytest.raises(ValueError, match="RandomChoice: its transforms give different sizes"):
        T.RandomChoice([T.Resize(8), T.Resize(12)])(x, key)
    with pytest.raises(TypeError, match="RandomOrder: with ToTensor, torch.uint8 becomes"):
        T.RandomOrder([T.RandomHorizontalFlip(), T.ToTensor()]).output_dtype(torch.uint8)
    with pytest.raises(ValueError, match="doesn't match the number of transforms"):
        T.RandomChoice([T.RandomHorizontalFlip()], p=[0.5, 0.5])
    same_size = T.Compose([T.RandomChoice([T.Resize((8, 8)), T.RandomResizedCrop(8)]), T.RandomHorizontalFlip()])
    assert same_size(x, key).shape == (4, 3, 8, 8)


def test_containers_from_a_config():
    t = build_transform("RandomApply", {"transforms": [{"name": "ColorJitter", "brightness": 0.4},
                                                       "RandomGrayscale"], "p": 0.8})
    assert isinstance(t, T.RandomApply) and [type(s).__name__ for s in t.transforms] == ["ColorJitter",
                                                                                          "RandomGrayscale"]
    with pytest.raises(ValueError, match=r"transforms\[0\] \(ColourJitter\): unknown transform"):
        build_transform("RandomChoice", {"transforms": [{"name": "ColourJitter"}]})


def test_a_model_holding_transforms_can_still_apply_a_function_to_its_modules():
    """``nn.Module.apply(fn)`` calls ``apply(fn)`` on every submodule: a transform's ``apply``
    (images, params) used to take that call and raise, so ``model.apply(init_weights)`` failed."""
    model = torch.nn.Module()
    model.augment = T.Compose([T.RandomHorizontalFlip(), T.RandomApply([T.RandomGrayscale(1.0)]),
                               T.Normalize([0.5], [0.2])], compile=False)
    model.mix = T.MixUp(num_classes=3)
    seen = []
    assert model.apply(lambda m: seen.append(type(m).__name__)) is model
    assert {"Compose", "RandomHorizontalFlip", "RandomApply", "RandomGrayscale", "Normalize", "MixUp"} <= set(seen)
    x, key = _uint8(2, 8, 8).float() / 255, _key(2)
    torch.testing.assert_close(model.augment.apply(x, model.augment.make_params(x, key)), model.augment(x, key))
    assert callable(model.augment.compile)  # Compose(compile=...) no longer hides nn.Module.compile()


def test_a_torchvision_transform_on_the_batch_is_warned_about(caplog):
    """A torchvision transform given as ``augment`` runs on the whole batch: one random draw
    for all its images. The stage says so and names from_torchvision. (Recognised by the
    class's module, so a stand-in defined under torchvision's name exercises it here, where
    torchvision is not installed; any other callable passes quietly.)"""
    from gpupipe.augment.stage import AugmentStage

    class Compose:
        def __call__(self, images):
            return images

    Compose.__module__ = "torchvision.transforms.v2._container"
    with caplog.at_level("WARNING", logger="gpupipe.augment.stage"):
        AugmentStage(Compose(), None, seed=0)
    assert "one set of random parameters for all its images" in caplog.text and "from_torchvision" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="gpupipe.augment.stage"):
        AugmentStage(lambda images: images, None, seed=0)
        AugmentStage(T.Compose([T.RandomHorizontalFlip()]), None, seed=0)
    assert caplog.text == ""
