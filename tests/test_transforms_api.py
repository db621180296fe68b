"""gpupipe.transforms: the torchvision mapping (from documented attribute names; torchvision
itself cannot be imported with the CPU torch here) and the two transform sets of the docs."""
from __future__ import annotations

import pytest
import torch

import gpupipe.transforms as T

IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])


def tv(name: str, **attrs):
    """An object shaped like a torchvision transform: class name + documented attributes."""
    return type(name, (), attrs)()


def tv_compose(*ts):
    return tv("Compose", transforms=list(ts))


def complex_set():
    return tv_compose(
        tv("Resize", size=[256, 256], max_size=None),
        tv("RandomAffine", degrees=[-20.0, 20.0], translate=None, scale=None, shear=None),
        tv("RandomHorizontalFlip", p=0.5), tv("RandomVerticalFlip", p=0.5),
        tv("RandomPerspective", distortion_scale=0.5, p=0.5),
        tv("ColorJitter", brightness=(0.8, 1.2), contrast=(0.8, 1.2), saturation=(0.8, 1.2), hue=(-0.2, 0.2)),
        tv("ToTensor"), tv("Normalize", mean=IMAGENET[0], std=IMAGENET[1]))


def test_complex_set_maps_and_runs_on_a_uint8_batch():
    pipe = T.from_torchvision(complex_set())
    names = [type(t).__name__ for t in pipe.transforms]
    assert names == ["Resize", "RandomAffine", "RandomHorizontalFlip", "RandomVerticalFlip", "RandomPerspective",
                     "ToDtype", "ColorJitter", "Normalize"]  # the cast moved before the colour op
    x = torch.randint(0, 256, (6, 3, 180, 200), dtype=torch.uint8)
    y = pipe(x, T.AugKey(seed=0, epoch=0, sample_ids=torch.arange(6)))
    assert y.shape == (6, 3, 256, 256) and y.dtype == torch.float32
    mean = torch.tensor(IMAGENET[0]).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET[1]).view(1, 3, 1, 1)
    unit = y * std + mean  # back to [0, 1]
    assert float(unit.min()) >= -1e-5 and float(unit.max()) <= 1 + 1e-5


def test_mapped_arguments_keep_their_meaning():
    aff = T.from_torchvision(tv("RandomAffine", degrees=[-7.0, 7.0], translate=(0.1, 0.2), scale=(0.9, 1.1),
                                shear=[-3.0, 3.0])).transforms[0]
    assert tuple(aff.degrees) == (-7.0, 7.0) and aff.translate == (0.1, 0.2) and aff.scale == (0.9, 1.1)
    rrc = T.from_torchvision(tv("RandomResizedCrop", size=[64, 48], scale=(0.5, 1.0), ratio=(0.75, 1.33))).transforms[0]
    assert isinstance(rrc, T.RandomResizedCrop)


def test_unsupported_transforms_are_named_with_the_supported_list():
    with pytest.raises(ValueError, match=r"transforms\[1\]: Lambda is not supported .*RepeatChannels.*supported: "):
        T.from_torchvision(tv_compose(tv("ToTensor"), tv("Lambda", lambd=None)))
    with pytest.raises(ValueError, match="AutoAugment is not supported"):
        T.from_torchvision(tv("AutoAugment"))
    with pytest.raises(ValueError, match=r"RandomRotation\(expand=True\) is not supported"):
        T.from_torchvision(tv("RandomRotation", degrees=[-5.0, 5.0], expand=True, center=None))


def test_same_key_same_output_and_permutation_invariance():
    pipe = T.from_torchvision(complex_set())
    x = torch.randint(0, 256, (4, 3, 64, 64), dtype=torch.uint8)
    ids = torch.tensor([10, 11, 12, 13])
    a = pipe(x, T.AugKey(1, 2, ids))
    perm = torch.tensor([2, 0, 3, 1])
    b = pipe(x[perm], T.AugKey(1, 2, ids[perm]))
    assert torch.allclose(a[perm], b, atol=1e-4)
    assert not torch.allclose(a, pipe(x, T.AugKey(1, 3, ids)), atol=1e-2)  # another epoch
