"""Batch transforms with torchvision's names and argument meanings, on any device.

Each sample of a batch gets its own random parameters, drawn from
(seed, epoch, sample id) on the device (:mod:`gpupipe.augment.keys`). Call a
transform as ``t(images, key)`` with an :class:`AugKey`; :class:`Compose` fuses
consecutive geometric transforms into one warp. ``from_torchvision(compose)``
turns a torchvision ``Compose`` (v1 or v2) of supported transforms into this
pipeline, reading only their documented attributes; torchvision is never imported.
"""
from __future__ import annotations

from typing import Any, Callable

from gpupipe.augment.base import AugKey, Transform
from gpupipe.augment.color import (ColorJitter, GaussianBlur, Grayscale, Normalize, RandomErasing, RandomGrayscale,
                                   RepeatChannels, ToDtype)
from gpupipe.augment.compose import Compose
from gpupipe.augment.geometry import (CenterCrop, RandomAffine, RandomCrop, RandomHorizontalFlip, RandomPerspective,
                                      RandomResizedCrop, RandomRotation, RandomVerticalFlip, Resize)
from gpupipe.augment.mix import CutMix, MixUp

__all__ = ["AugKey", "Transform", "Compose", "Resize", "CenterCrop", "RandomCrop", "RandomResizedCrop",
           "RandomAffine", "RandomRotation", "RandomHorizontalFlip", "RandomVerticalFlip", "RandomPerspective",
           "ColorJitter", "RandomGrayscale", "Grayscale", "GaussianBlur", "RandomErasing", "Normalize", "ToDtype",
           "RepeatChannels", "MixUp", "CutMix", "from_torchvision", "SUPPORTED", "simple_set", "complex_set",
           "IMAGENET_MEAN", "IMAGENET_STD"]

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def simple_set(dtype=None) -> Compose:
    """The docs' simple set after a decode to the output size: RandomAffine(20),
    RandomHorizontalFlip(0.5), to float, repeat to 3 channels, Normalize(ImageNet)."""
    import torch

    return Compose([RandomAffine(20), RandomHorizontalFlip(0.5), ToDtype(dtype or torch.float32, input_range=255.0),
                    RepeatChannels(3), Normalize(list(IMAGENET_MEAN), list(IMAGENET_STD))])


def complex_set(dtype=None) -> Compose:
    """The docs' complex set after a decode to the output size: RandomAffine(20), both
    flips, RandomPerspective(0.5, p=0.5), ColorJitter(0.2, 0.2, 0.2, 0.2), to float,
    repeat to 3 channels, Normalize(ImageNet). Geometry fuses into one warp."""
    import torch

    return Compose([RandomAffine(20), RandomHorizontalFlip(0.5), RandomVerticalFlip(0.5),
                    RandomPerspective(0.5, p=0.5), ToDtype(dtype or torch.float32, input_range=255.0),
                    ColorJitter(0.2, 0.2, 0.2, 0.2), RepeatChannels(3),
                    Normalize(list(IMAGENET_MEAN), list(IMAGENET_STD))])


def _unsupported_if(t, **defaults: Any) -> None:
    """Raise if ``t`` sets an option we do not implement (attribute differs from its default)."""
    for attr, default in defaults.items():
        value = getattr(t, attr, default)
        if value not in (default, None) and not (attr == "fill" and value in (0, [0], (0,))):
            raise ValueError(f"{type(t).__name__}({attr}={value!r}) is not supported by gpupipe.transforms")


def _size(t) -> Any:
    size = t.size
    return size if isinstance(size, int) else tuple(size)


def _fill(t) -> Any:
    """torchvision's ``fill``: v1 a number / sequence / None, v2 also a dict by input type."""
    fill = getattr(t, "fill", 0)
    if isinstance(fill, dict):
        by_name = {getattr(k, "__name__", str(k)): v for k, v in fill.items()}
        fill = next((by_name[n] for n in ("Image", "Tensor") if n in by_name), next(iter(fill.values()), 0))
    return 0 if fill is None else fill


def _interpolation(t) -> Any:
    return getattr(t, "interpolation", "bilinear")


def _crop(t):
    return RandomCrop(_size(t), padding=getattr(t, "padding", None), pad_if_needed=getattr(t, "pad_if_needed", False),
                      fill=_fill(t), padding_mode=getattr(t, "padding_mode", "constant"))


def _rotation(t):
    _unsupported_if(t, expand=False, center=None)
    return RandomRotation(tuple(t.degrees), interpolation=_interpolation(t), fill=_fill(t))


def _affine(t):
    _unsupported_if(t, center=None)
    return RandomAffine(tuple(t.degrees), translate=t.translate, scale=t.scale,
                        shear=None if t.shear is None else tuple(t.shear), interpolation=_interpolation(t),
                        fill=_fill(t))


def _to_dtype(t):
    import torch

    dtype = t.dtype if not isinstance(t.dtype, dict) else next(iter(t.dtype.values()))
    return ToDtype(dtype if isinstance(dtype, torch.dtype) else torch.float32, scale=bool(getattr(t, "scale", True)),
                   input_range=255.0)


def _to_tensor(t):
    import torch

    return ToDtype(torch.float32, scale=True, input_range=255.0)  # before it, pixels are 0..255 (uint8 or warped)


_BUILDERS: dict[str, Callable[[Any], Transform | None]] = {
    "Resize": lambda t: (_unsupported_if(t, max_size=None), Resize(_size(t), interpolation=_interpolation(t)))[1],
    "CenterCrop": lambda t: CenterCrop(_size(t)),
    "RandomCrop": _crop,
    "RandomResizedCrop": lambda t: RandomResizedCrop(_size(t), scale=tuple(t.scale), ratio=tuple(t.ratio),
                                                     interpolation=_interpolation(t)),
    "RandomAffine": _affine,
    "RandomRotation": _rotation,
    "RandomHorizontalFlip": lambda t: RandomHorizontalFlip(t.p),
    "RandomVerticalFlip": lambda t: RandomVerticalFlip(t.p),
    "RandomPerspective": lambda t: RandomPerspective(t.distortion_scale, t.p, interpolation=_interpolation(t),
                                                     fill=_fill(t)),
    "ColorJitter": lambda t: ColorJitter(t.brightness, t.contrast, t.saturation, t.hue),
    "RandomGrayscale": lambda t: RandomGrayscale(t.p),
    "Grayscale": lambda t: Grayscale(t.num_output_channels),
    "GaussianBlur": lambda t: GaussianBlur(tuple(t.kernel_size), tuple(t.sigma)),
    "RandomErasing": lambda t: RandomErasing(t.p, tuple(t.scale), tuple(t.ratio), t.value),
    "Normalize": lambda t: Normalize(list(t.mean), list(t.std)),
    "ToTensor": _to_tensor,
    "ConvertImageDtype": _to_dtype,
    "ToDtype": _to_dtype,
    "ToImage": lambda t: None,  # already tensors
    "PILToTensor": lambda t: None,
}
SUPPORTED = tuple(sorted(_BUILDERS))


def from_torchvision(transform) -> Compose:
    """The gpupipe pipeline equivalent to a torchvision transform or ``Compose`` (v1 or v2).

    Reads only documented attributes (``size``, ``degrees``, ``p``, ``mean`` …). An
    unsupported transform (``Lambda`` included: its function cannot be read) raises
    ``ValueError`` naming it and listing what is supported.
    """
    items = list(transform.transforms) if type(transform).__name__ == "Compose" else [transform]
    out: list[Transform] = []
    for i, t in enumerate(items):
        name = type(t).__name__
        builder = _BUILDERS.get(name)
        if builder is None:
            hint = " (for a grayscale-to-RGB Lambda use gpupipe.transforms.RepeatChannels(3))" if name == "Lambda" else ""
            raise ValueError(f"transforms[{i}]: {name} is not supported{hint}; supported: {', '.join(SUPPORTED)}")
        built = builder(t)
        if built is not None:
            out.append(built)
    return Compose(_cast_before_colour(out))


_COLOUR = (ColorJitter, RandomGrayscale, Grayscale, GaussianBlur)


def _cast_before_colour(ts: list[Transform]) -> list[Transform]:
    """torchvision runs colour ops on uint8 images before ``ToTensor``; here colour ops
    work on floats in [0, 1], so the cast moves to just before the first of them
    (the results differ from torchvision's by its uint8 rounding between ops)."""
    cast = next((i for i, t in enumerate(ts) if isinstance(t, ToDtype)), None)
    first = next((i for i, t in enumerate(ts) if isinstance(t, _COLOUR)), None)
    if cast is None or first is None or first > cast:
        return ts
    moved = ts[:first] + [ts[cast]] + [t for i, t in enumerate(ts[first:], first) if i != cast]
    return moved
