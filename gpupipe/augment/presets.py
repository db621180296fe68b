"""The docs' transform sets, once, as plain data: ``(name, args)`` steps with the names and
arguments of ``gpupipe.transforms`` (torchvision's), for images decoded to the output size.

Everything that offers a set reads it from here: the config's ``augment: simple``
(:func:`gpupipe.config.augment.preset`), ``gpupipe.transforms.simple_set()`` /
``complex_set()`` and the benchmarks' per-sample baselines.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

__all__ = ["Step", "IMAGENET_MEAN", "IMAGENET_STD", "PRESETS"]

Step = tuple[str, Mapping[str, Any]]

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

_TAIL: tuple[Step, ...] = (("ToDtype", {"dtype": "float32"}), ("RepeatChannels", {"num_channels": 3}),
                           ("Normalize", {"mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)}))
_FLIP: Step = ("RandomHorizontalFlip", {"p": 0.5})

PRESETS: Mapping[str, tuple[Step, ...]] = MappingProxyType({
    "none": (),
    "simple": (("RandomAffine", {"degrees": 20}), _FLIP, *_TAIL),
    "complex": (("RandomAffine", {"degrees": 20}), _FLIP, ("RandomVerticalFlip", {"p": 0.5}),
                ("RandomPerspective", {"distortion_scale": 0.5, "p": 0.5}), _TAIL[0],
                ("ColorJitter", {"brightness": 0.2, "contrast": 0.2, "saturation": 0.2, "hue": 0.2}), *_TAIL[1:]),
    **{preset: (_FLIP, (policy, {"interpolation": "bilinear"}), *_TAIL)  # torchvision's ImageNet recipes
       for preset, policy in (("trivialaugment", "TrivialAugmentWide"), ("randaugment", "RandAugment"),
                              ("autoaugment", "AutoAugment"))},
})
