"""Per-sample transforms for the CPU baselines: what users write today, one image at a time.

:func:`build_per_sample` turns benchmark steps into a picklable callable
``(PIL image, numpy Generator) -> tensor``. With torchvision importable it is a
torchvision ``Compose`` (v1 API on PIL images; its own random state); otherwise
Pillow/NumPy equivalents with torchvision's parameter definitions and defaults
(``RandomAffine``/``RandomRotation``: nearest; ``RandomPerspective``: bilinear;
``ColorJitter``: a random order of its four adjustments per sample). As users
write them, the image stays a PIL image until ``ToDtype``/``ToTensor``: the
colour steps run before the cast even where the list names them after it.
"""
from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from gpupipe.augment.warp import check_interpolation
from gpupipe.tools.bench.steps import Step, check_supported

__all__ = ["build_per_sample", "PilPipeline"]

_TENSOR_STEPS = ("ToDtype", "ToTensor", "PILToTensor", "RepeatChannels", "Normalize")
_AS_UINT8: Step = ("PILToTensor", {})  # no cast asked for: uint8 (C, H, W), as gpupipe's decoder gives


def build_per_sample(steps: Iterable[Step], image_size: tuple[int, int] | None,
                     prefer: str = "auto") -> tuple[Callable, str]:
    """``(pipeline, kind)``: ``kind`` says what runs ("torchvision X.Y" or "pillow+numpy").
    A Resize to ``image_size`` (height, width) comes first, like the decoder's resize; without
    a ``ToDtype``/``ToTensor`` the result is a uint8 tensor, as gpupipe's without augmentation."""
    steps = tuple(steps)
    check_supported(steps)
    full = ((("Resize", {"size": list(image_size)}),) if image_size else ()) + steps
    if not any(name in ("ToDtype", "ToTensor") for name, _ in full):
        full += (_AS_UINT8,)
    pil_first = tuple(s for s in full if s[0] not in _TENSOR_STEPS) + tuple(s for s in full if s[0] in _TENSOR_STEPS)
    if prefer in ("auto", "torchvision") and _torchvision_ok():
        import torchvision

        return TorchvisionPipeline(pil_first), f"torchvision {torchvision.__version__}"
    if prefer == "torchvision":
        from gpupipe.core.errors import MissingDependencyError

        raise MissingDependencyError("torchvision", extra="bench", feature="--per-sample torchvision")
    return PilPipeline(pil_first), "pillow+numpy"


def _torchvision_ok() -> bool:
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision.transforms  # noqa: F401  (fails with a mismatched torch build)
    except Exception:  # noqa: BLE001
        return False
    return True


# ---------------------------------------------------------------- torchvision


class RepeatTo:
    """A grayscale tensor (1, H, W) repeated to ``n`` channels; others pass (picklable)."""

    def __init__(self, n: int = 3):
        self.n = int(n)

    def __call__(self, x):
        return x.expand(self.n, -1, -1) if x.shape[0] == 1 else x


class TorchvisionPipeline:
    def __init__(self, steps: tuple[Step, ...]):
        import torchvision.transforms as tv

        def make(name: str, args: Mapping[str, Any]):
            args = dict(args)
            if name in ("ToDtype", "ToTensor"):
                return tv.ToTensor()  # scales uint8 to [0, 1] float32
            if name == "RepeatChannels":
                return RepeatTo(args.get("num_channels", 3))
            if isinstance(args.get("interpolation"), str):
                args["interpolation"] = tv.InterpolationMode(args["interpolation"].lower())
            return getattr(tv, name)(**args)

        self.compose = tv.Compose([make(n, a) for n, a in steps])

    def __call__(self, img, rng: np.random.Generator):
        return self.compose(img)  # torchvision draws from torch's generator (seeded per worker)


# ---------------------------------------------------------------- Pillow + NumPy


class PilPipeline:
    """The steps on a PIL image, drawing parameters from the given generator."""

    def __init__(self, steps: tuple[Step, ...]):
        self.steps = tuple((name, dict(args)) for name, args in steps)

    def __call__(self, img, rng: np.random.Generator):
        x: Any = img
        for name, args in self.steps:
            x = _OPS[name](x, rng, **args)
        return x


def _pil():
    from PIL import Image

    return Image


def _resize(img, rng, size, **_):
    Image = _pil()
    if isinstance(size, int):  # shorter side, like torchvision
        w, h = img.size
        s = size / min(w, h)
        return img.resize((round(w * s), round(h * s)), Image.BILINEAR)
    h, w = size
    return img.resize((w, h), Image.BILINEAR)


def _pair(v, centred: bool = True):
    if v is None:
        return None
    if isinstance(v, (int, float)):
        return (-float(v), float(v)) if centred else (float(v), float(v))
    return (float(v[0]), float(v[1]))


def _resample(interpolation: Any):
    """Pillow's resampling filter for a torchvision ``interpolation`` (name, mode or Pillow code)."""
    return getattr(_pil(), check_interpolation(interpolation).upper())


def _affine(img, rng, degrees, translate=None, scale=None, shear=None, interpolation="nearest", **_):
    """torchvision RandomAffine's parameters, applied with one inverse affine map
    (torchvision's default interpolation, nearest, unless the step names one)."""
    Image = _pil()
    w, h = img.size
    angle = rng.uniform(*_pair(degrees))
    tx = ty = 0.0
    if translate is not None:
        tx = float(np.round(rng.uniform(-translate[0] * w, translate[0] * w)))
        ty = float(np.round(rng.uniform(-translate[1] * h, translate[1] * h)))
    s = rng.uniform(*scale) if scale is not None else 1.0
    sx = sy = 0.0
    if shear is not None:
        sh = list(shear) if not isinstance(shear, (int, float)) else [-shear, shear]
        sx = rng.uniform(sh[0], sh[1])
        sy = rng.uniform(sh[2], sh[3]) if len(sh) == 4 else 0.0
    return img.transform(img.size, Image.AFFINE, _inverse_affine((w * 0.5, h * 0.5), angle, (tx, ty), s, (sx, sy)),
                         resample=_resample(interpolation), fillcolor=0)


def _inverse_affine(center, angle, translate, scale, shear) -> tuple:
    """Output→input coefficients (PIL's) of: translate ∘ (rotate · shear · scale) about ``center``;
    the rotation is counter-clockwise on screen for positive angles, like torchvision."""
    a, sx, sy = np.radians([-angle, shear[0], shear[1]])
    rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
    sh = np.array([[1.0, -np.tan(sx)], [-np.tan(sy), 1.0]])
    m = np.eye(3)
    m[:2, :2] = rot @ sh * scale
    c = np.array(center)
    m[:2, 2] = c + np.array(translate) - m[:2, :2] @ c
    inv = np.linalg.inv(m)
    return tuple(inv[:2].ravel())


def _rotation(img, rng, degrees, interpolation="nearest", **_):
    return img.rotate(rng.uniform(*_pair(degrees)), resample=_resample(interpolation), fillcolor=0)


def _hflip(img, rng, p=0.5, **_):
    return img.transpose(_pil().FLIP_LEFT_RIGHT) if rng.random() < p else img


def _vflip(img, rng, p=0.5, **_):
    return img.transpose(_pil().FLIP_TOP_BOTTOM) if rng.random() < p else img


def _perspective(img, rng, distortion_scale=0.5, p=0.5, interpolation="bilinear", **_):
    """torchvision RandomPerspective: each corner moves inwards by up to ``distortion_scale``
    of the half size; bilinear, fill 0."""
    if rng.random() >= p:
        return img
    Image = _pil()
    w, h = img.size
    dw, dh = int(distortion_scale * (w // 2)), int(distortion_scale * (h // 2))
    r = lambda hi: int(rng.integers(0, hi + 1))  # noqa: E731
    start = [(0, 0), (w - 1, 0), (w - 1, h - 1), (0, h - 1)]
    end = [(r(dw), r(dh)), (w - 1 - r(dw), r(dh)), (w - 1 - r(dw), h - 1 - r(dh)), (r(dw), h - 1 - r(dh))]
    return img.transform(img.size, Image.PERSPECTIVE, perspective_coeffs(end, start), resample=_resample(interpolation),
                         fillcolor=0)


def perspective_coeffs(src, dst) -> list[float]:
    """The 8 coefficients mapping points ``src`` (output) to ``dst`` (input), PIL's convention."""
    a = []
    for (x, y), (u, v) in zip(src, dst):
        a.append([x, y, 1, 0, 0, 0, -u * x, -u * y])
        a.append([0, 0, 0, x, y, 1, -v * x, -v * y])
    return np.linalg.solve(np.array(a, float), np.array(dst, float).ravel()).tolist()


def _enhance(enhancer, factor: float, img):
    """``enhancer(img).enhance(factor)`` (a Pillow ImageEnhance class)."""
    return enhancer(img).enhance(factor)


def _jitter(img, rng, brightness=0, contrast=0, saturation=0, hue=0, **_):
    """torchvision ColorJitter: factors in [1-x, 1+x] (hue in [-h, h]), in a random order."""
    from PIL import ImageEnhance

    ops: list[Callable[[Any], Any]] = []  # image -> image
    for value, enhancer in ((brightness, ImageEnhance.Brightness), (contrast, ImageEnhance.Contrast),
                            (saturation, ImageEnhance.Color)):
        if value:
            f = rng.uniform(max(0.0, 1 - value), 1 + value)
            ops.append(functools.partial(_enhance, enhancer, f))
    if hue:
        shift = rng.uniform(-hue, hue)
        ops.append(lambda im: _shift_hue(im, shift))
    for i in rng.permutation(len(ops)):
        img = ops[i](img)
    return img


def _shift_hue(img, shift: float):
    Image = _pil()
    hsv = np.array(img.convert("HSV"))
    hsv[..., 0] = (hsv[..., 0].astype(np.int16) + int(round(shift * 255))) % 256
    return Image.fromarray(hsv, "HSV").convert("RGB")


def _to_dtype(img, rng, dtype="float32", scale=True, input_range=255.0, **_):
    import torch

    x = torch.from_numpy(np.asarray(img).copy())
    x = (x[None] if x.ndim == 2 else x.permute(2, 0, 1)).to(getattr(torch, str(dtype).replace("torch.", "")))
    return x / float(input_range) if scale else x


def _pil_to_tensor(img, rng, **_):
    return _to_dtype(img, rng, dtype="uint8", scale=False)


def _repeat(x, rng, num_channels=3, **_):
    return x.expand(int(num_channels), -1, -1) if x.shape[0] == 1 else x


def _normalize(x, rng, mean, std, **_):
    import torch

    m = torch.tensor(mean, dtype=x.dtype).view(-1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype).view(-1, 1, 1)
    return (x - m) / s


_OPS: dict[str, Callable] = {
    "Resize": _resize, "RandomAffine": _affine, "RandomRotation": _rotation, "RandomHorizontalFlip": _hflip,
    "RandomVerticalFlip": _vflip, "RandomPerspective": _perspective, "ColorJitter": _jitter,
    "ToDtype": _to_dtype, "ToTensor": _to_dtype, "RepeatChannels": _repeat, "Normalize": _normalize,
    "PILToTensor": _pil_to_tensor,
}
