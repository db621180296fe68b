"""Batch transforms with torchvision's names and argument meanings, on any device.

Each sample of a batch gets its own random parameters, drawn from
(seed, epoch, sample id) on the device (:mod:`gpupipe.augment.keys`). Call a
transform as ``t(images, key)`` with an :class:`AugKey`; :class:`Compose` fuses
consecutive geometric transforms into one warp. ``from_torchvision(compose)``
turns a torchvision ``Compose`` (v1 or v2) of supported transforms into this
pipeline, reading only their documented attributes; torchvision is never imported.

``import gpupipe.transforms as T`` in place of ``import torchvision.transforms.v2 as T`` keeps a
pipeline's lines: torchvision's conversions (``ToImage``, ``PILToTensor``, ``ToPureTensor``) are
no-ops on a batch that is already a tensor on the device, ``ConvertImageDtype`` is ``ToDtype(...,
scale=True)``. A name this module lacks raises ``AttributeError`` naming the close match
(``T.RandomHorizontalFilp``: did you mean 'RandomHorizontalFlip'?), or saying that a torchvision
transform has no counterpart here; a keyword a transform does not take names the close one too.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpupipe.augment.autoaugment import AugMix, AutoAugment, AutoAugmentPolicy, RandAugment, TrivialAugmentWide
from gpupipe.augment.base import AugKey, Transform
from gpupipe.augment.color import (
    ColorJitter,
    GaussianBlur,
    Grayscale,
    Normalize,
    RandomErasing,
    RandomGrayscale,
    RepeatChannels,
    ToDtype,
    ToTensor,
)
from gpupipe.augment.compose import Compose
from gpupipe.augment.containers import RandomApply, RandomChoice, RandomOrder
from gpupipe.augment.convert import ConvertImageDtype, PILToTensor, ToImage, ToPureTensor
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
from gpupipe.augment.ioucrop import RandomIoUCrop
from gpupipe.augment.mix import CutMix, MixUp
from gpupipe.augment.presets import IMAGENET_MEAN, IMAGENET_STD, PRESETS
from gpupipe.augment.registry import build_transform, transform_class
from gpupipe.augment.targets import (
    Boxes,
    ClampBoundingBoxes,
    ConvertBoundingBoxFormat,
    SanitizeBoundingBoxes,
    Targets,
    pack_targets,
    unpack_targets,
)
from gpupipe.core.errors import suggest

__all__ = ["AugKey", "Transform", "Compose", "Resize", "CenterCrop", "RandomCrop", "RandomResizedCrop",
           "RandomAffine", "RandomRotation", "RandomHorizontalFlip", "RandomVerticalFlip", "RandomPerspective",
           "ColorJitter", "RandomGrayscale", "Grayscale", "GaussianBlur", "RandomErasing", "Normalize", "ToDtype",
           "ToTensor", "RepeatChannels", "RandomApply", "RandomChoice", "RandomOrder", "MixUp", "CutMix",
           "AutoAugment", "AutoAugmentPolicy", "RandAugment", "TrivialAugmentWide", "AugMix",
           "from_torchvision", "TORCHVISION", "SUPPORTED", "simple_set", "complex_set", "IMAGENET_MEAN",
           "IMAGENET_STD", "Boxes", "Targets", "SanitizeBoundingBoxes", "RandomIoUCrop", "pack_targets",
           "unpack_targets", "ToImage", "PILToTensor", "ToPureTensor", "ConvertImageDtype", "ClampBoundingBoxes",
           "ConvertBoundingBoxFormat"]

# torchvision.transforms.v2 names with no counterpart here (yet): asked for, they say so rather than
# "no attribute" (a torchvision name that gpupipe has is in __all__)
NOT_HERE = ("ClampKeyPoints", "ElasticTransform", "FiveCrop", "GaussianNoise", "Identity", "JPEG", "Lambda",
            "LinearTransformation", "Pad", "RGB", "RandomAdjustSharpness", "RandomAutocontrast",
            "RandomChannelPermutation", "RandomEqualize", "RandomInvert", "RandomPhotometricDistort", "RandomPosterize",
            "RandomResize", "RandomShortestSize", "RandomSolarize", "RandomZoomOut", "SanitizeKeyPoints", "ScaleJitter",
            "SetClampingMode", "TenCrop", "ToPILImage", "UniformTemporalSubsample")


def __getattr__(name: str) -> Any:
    """A name the module lacks: ``AttributeError`` naming the close match (a typo), or saying that
    torchvision's transform of that name has no gpupipe counterpart (and what to do)."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name == "InterpolationMode":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}: give interpolation= as a string "
                             "('bilinear', 'nearest', 'bicubic'; torchvision's InterpolationMode values are taken too)")
    if name in NOT_HERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}: torchvision's {name} has no batch "
                             f"version in gpupipe (supported: {', '.join(SUPPORTED)}); run it on the batch "
                             "yourself, after the loader, or leave it out")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}{suggest(name, __all__)}")

def simple_set(dtype=None) -> Compose:
    """The docs' simple set after a decode to the output size (uint8): RandomAffine(20),
    RandomHorizontalFlip(0.5), to float in [0, 1], repeat to 3 channels, Normalize(ImageNet)."""
    return _preset("simple", dtype)


def complex_set(dtype=None) -> Compose:
    """The docs' complex set after a decode to the output size (uint8): RandomAffine(20),
    both flips, RandomPerspective(0.5, p=0.5), to float in [0, 1], ColorJitter(0.2, 0.2,
    0.2, 0.2), repeat to 3 channels, Normalize(ImageNet). Geometry fuses into one warp."""
    return _preset("complex", dtype)


def _preset(name: str, dtype) -> Compose:
    """A set of :data:`~gpupipe.augment.presets.PRESETS` built, its cast to ``dtype`` (default float32)."""
    import torch

    steps = [build_transform(step, {**args, "dtype": dtype} if step == "ToDtype" and dtype is not None else args)
             for step, args in PRESETS[name]]
    return Compose(steps, input_dtype=torch.uint8)


# ----------------------------------------------------------------------------- from_torchvision
# torchvision is never imported: a transform is recognised by its class name and read through
# its documented attributes. Each TORCHVISION entry turns one torchvision transform into a
# gpupipe one (None: nothing to do on a batch of tensors); adding a transform is one line.


def _size(t) -> Any:
    size = t.size
    return size if size is None or isinstance(size, int) else tuple(size)


def _antialias(t) -> bool:
    """``antialias``: True (the default since torchvision 0.17); None, and 0.15-0.16's "warn",
    mean False for tensors."""
    return getattr(t, "antialias", True) is True


def _fill(t) -> Any:
    """torchvision's ``fill``: v1 a number / sequence / None, v2 also a dict by input type."""
    fill = getattr(t, "fill", 0)
    if isinstance(fill, dict):
        by_name = {getattr(k, "__name__", str(k)): v for k, v in fill.items()}
        fill = next((by_name[n] for n in ("Image", "Tensor") if n in by_name), next(iter(fill.values()), 0))
    return 0 if fill is None else fill


def _v2(t) -> bool:
    return type(t).__module__.startswith("torchvision.transforms.v2")


def _padding(t) -> Any:
    """v1 keeps ``padding`` as given; v2 stores it parsed as [left, right, top, bottom]."""
    padding = t.padding
    if padding is not None and _v2(t) and len(padding) == 4:
        left, right, top, bottom = padding
        return (left, top, right, bottom)
    return padding


_READ: dict[str, Callable[[Any], Any]] = {  # attributes that need more than getattr
    "size": _size,
    "fill": _fill,
    "interpolation": lambda t: getattr(t, "interpolation", "bilinear"),
    "antialias": _antialias,
    "padding": _padding,
    "value": lambda t: "random" if t.value is None else t.value,  # v2 stores "random" as None
}


def _same(name: str, *attrs: str, **unsupported: Any) -> Callable[[Any], Transform]:
    """A builder: gpupipe's ``name`` with the torchvision transform's ``attrs`` as its
    arguments of the same names; ``unsupported``: options gpupipe lacks, with the value
    that means "not used" (any other value raises)."""
    def build(t) -> Transform:
        _unsupported_if(t, **unsupported)
        kwargs = {a: _READ[a](t) if a in _READ else getattr(t, a) for a in attrs}
        built = transform_class(name)(**{a: tuple(v) if isinstance(v, list) else v for a, v in kwargs.items()})
        assert isinstance(built, Transform), f"{name} is registered as a batch transform"
        return built
    return build


def _unsupported_if(t, **defaults: Any) -> None:
    """Raise if ``t`` sets an option we do not implement (attribute differs from its default)."""
    for attr, default in defaults.items():
        value = getattr(t, attr, default)
        if value not in (default, None) and not (attr == "fill" and value in (0, [0], (0,))):
            raise ValueError(f"{type(t).__name__}({attr}={value!r}) is not supported by gpupipe.transforms")


def _to_dtype(t) -> Transform | None:
    """v2 ``ToDtype`` (``scale`` False by default there) and ``ConvertImageDtype`` (always scales)."""
    import torch

    dtype = t.dtype
    if isinstance(dtype, dict):  # v2: {tv_tensors.Image: torch.float32, "others": None}
        by_name = {getattr(k, "__name__", str(k)): v for k, v in dtype.items()}
        dtype = next((by_name[n] for n in ("Image", "Tensor", "others") if n in by_name), None)
    if dtype is None:
        return None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{type(t).__name__}(dtype={dtype!r}): expected a torch.dtype")
    return ToDtype(dtype, scale=bool(getattr(t, "scale", True)))


TORCHVISION: dict[str, Callable[[Any], Transform | None]] = {
    "Resize": _same("Resize", "size", "interpolation", "max_size", "antialias"),
    "CenterCrop": _same("CenterCrop", "size"),
    "RandomCrop": _same("RandomCrop", "size", "padding", "pad_if_needed", "fill", "padding_mode"),
    "RandomResizedCrop": _same("RandomResizedCrop", "size", "scale", "ratio", "interpolation", "antialias"),
    "RandomAffine": _same("RandomAffine", "degrees", "translate", "scale", "shear", "interpolation", "fill",
                          center=None),
    "RandomRotation": _same("RandomRotation", "degrees", "interpolation", "fill", expand=False, center=None),
    "RandomHorizontalFlip": _same("RandomHorizontalFlip", "p"),
    "RandomVerticalFlip": _same("RandomVerticalFlip", "p"),
    "RandomPerspective": _same("RandomPerspective", "distortion_scale", "p", "interpolation", "fill"),
    "ColorJitter": _same("ColorJitter", "brightness", "contrast", "saturation", "hue"),
    "RandomGrayscale": _same("RandomGrayscale", "p"),
    "Grayscale": _same("Grayscale", "num_output_channels"),
    "GaussianBlur": _same("GaussianBlur", "kernel_size", "sigma"),
    "RandomErasing": _same("RandomErasing", "p", "scale", "ratio", "value"),
    "Normalize": _same("Normalize", "mean", "std"),
    "AutoAugment": _same("AutoAugment", "policy", "interpolation", "fill"),
    "RandAugment": _same("RandAugment", "num_ops", "magnitude", "num_magnitude_bins", "interpolation", "fill"),
    "TrivialAugmentWide": _same("TrivialAugmentWide", "num_magnitude_bins", "interpolation", "fill"),
    "AugMix": _same("AugMix", "severity", "mixture_width", "chain_depth", "alpha", "all_ops", "interpolation", "fill"),
    "RandomIoUCrop": lambda t: RandomIoUCrop(t.min_scale, t.max_scale, t.min_aspect_ratio, t.max_aspect_ratio,
                                             list(t.options), t.trials),  # torchvision keeps sampler_options as options
    "SanitizeBoundingBoxes": lambda t: SanitizeBoundingBoxes(t.min_size, t.min_area),  # labels: always the packed ones
    "ClampBoundingBoxes": lambda t: ClampBoundingBoxes(),
    "ConvertBoundingBoxFormat": lambda t: ConvertBoundingBoxFormat(t.format),
    "ToTensor": lambda t: ToTensor(),
    "ConvertImageDtype": _to_dtype,
    "ToDtype": _to_dtype,
    "ToImage": lambda t: None,  # a batch is already a tensor
    "PILToTensor": lambda t: None,
    "ToPureTensor": lambda t: None,
}
_CONTAINERS = ("Compose", "RandomApply", "RandomChoice", "RandomOrder")
SUPPORTED = tuple(sorted((*TORCHVISION, *_CONTAINERS)))


def from_torchvision(transform) -> Compose:
    """The gpupipe pipeline equivalent to a torchvision transform or ``Compose`` (v1 or v2).

    Reads only documented attributes (``size``, ``degrees``, ``p``, ``mean`` …); v1 and
    v2 containers (``Compose``, ``RandomApply``, ``RandomChoice``, ``RandomOrder``) are
    converted with their contents, each sample then drawing its own choice. Transforms
    keep their torchvision order and meaning (colour ops before ``ToTensor`` work on
    uint8, as torchvision's do). The pipeline is checked for the loader's uint8 input.
    An unsupported transform (``Lambda`` included: its function cannot be read) raises
    ``ValueError`` naming it and where it is.
    """
    import torch

    items = list(transform.transforms) if type(transform).__name__ == "Compose" else [transform]
    return Compose(_convert_all(items, "transforms"), input_dtype=torch.uint8)


def _convert_all(items: list, where: str) -> list[Transform]:
    """Each item converted; a nested ``Compose``'s steps join the list (so they may fuse)."""
    out: list[Transform] = []
    for i, t in enumerate(items):
        if type(t).__name__ == "Compose":
            out += _convert_all(list(t.transforms), f"{where}[{i}].transforms")
        elif (built := _convert(t, f"{where}[{i}]")) is not None:
            out.append(built)
    return out


def _one(t, where: str) -> Transform:
    """One alternative of a RandomChoice / RandomOrder: a single transform (a Compose for several)."""
    if type(t).__name__ == "Compose":
        steps = _convert_all(list(t.transforms), f"{where}.transforms")
    else:
        steps = [built] if (built := _convert(t, where)) is not None else []
    return steps[0] if len(steps) == 1 else Compose(steps)


def _convert(t, where: str) -> Transform | None:
    name = type(t).__name__
    if name == "RandomApply":
        return RandomApply(_convert_all(list(t.transforms), f"{where}.transforms"), p=t.p)
    if name in ("RandomChoice", "RandomOrder"):
        inner = [_one(c, f"{where}.transforms[{i}]") for i, c in enumerate(t.transforms)]
        return RandomChoice(inner, p=getattr(t, "p", None)) if name == "RandomChoice" else RandomOrder(inner)
    builder = TORCHVISION.get(name)
    if builder is None:
        hint = " (for a grayscale-to-RGB Lambda use gpupipe.transforms.RepeatChannels(3))" if name == "Lambda" else ""
        raise ValueError(f"{where}: {name} is not supported{hint}; supported: {', '.join(SUPPORTED)}")
    return builder(t)
