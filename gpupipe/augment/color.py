"""Colour and intensity transforms on batches, named and parameterised like
torchvision's, with one random draw per sample from the key.

Images are (B, C, H, W), C = 3 (or 1 where torchvision accepts grayscale), float in
[0, 1] or uint8 in [0, 255]: as in torchvision v2, a colour op on uint8 returns uint8
(computed in float, clamped and truncated back, torchvision's integer rules), and
``ToDtype(torch.float32, scale=True)`` takes uint8 to [0, 1]; ``Normalize`` needs float.
Parameters are drawn with :mod:`gpupipe.augment.keys` on the ids' device: no
``.item()``, no per-sample loop, no host sync.

Every transform here is a :class:`~gpupipe.augment.colorfuse.PointwiseTransform`:
besides its own ``apply`` (the sequential reference, built on the functions of
:mod:`gpupipe.augment.colorfn`) it lowers to steps of the fused colour pass, which
``Compose`` and :func:`fused_color` use. ``ColorJitter.apply`` itself runs the fused
pass (its reference is ``apply_reference``).

Differences from torchvision are listed in the class docstrings; the common one:
torchvision v2 draws one set of parameters per call, here every sample has its own.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import AugKey, Transform, check_dtype, check_probability
from .colorfn import adjust_brightness, adjust_contrast, adjust_hue, adjust_saturation, check_image, rgb_to_grayscale
from .colorfuse import (
    BRIGHTNESS,
    CONTRAST,
    SATURATION,
    Affine,
    Blend,
    Hue,
    PointwiseTransform,
    Repeat,
    Spec,
    Step,
    run_steps,
)
from .filters import GaussianBlur, RandomErasing
from .keys import draw

__all__ = [
    "adjust_brightness", "adjust_contrast", "adjust_saturation", "adjust_hue", "rgb_to_grayscale",
    "ToDtype", "ToTensor", "Normalize", "RepeatChannels", "ColorJitter", "RandomGrayscale", "Grayscale",
    "GaussianBlur", "RandomErasing", "fused_color", "DTYPES", "dtype_named",
]


def _check_spec(spec: Spec, name: str) -> float:
    """``check_image``'s messages for a fused run's input; returns the top of its value
    range (1 for float, 255 for uint8: the steps then follow torchvision's integer rules)."""
    if spec.channels not in (1, 3):
        raise ValueError(f"{name} expects a (B, C, H, W) batch with C in (1, 3), got {spec.channels} channels")
    check_dtype(spec.dtype, name)
    return 1.0 if spec.dtype.is_floating_point else 255.0


# ----------------------------------------------------------------------------- deterministic


class ToDtype(PointwiseTransform):
    """torchvision v2's ``ToDtype(dtype, scale)`` on a batch.

    Shape: (B, C, H, W) any dtype → (B, C, H, W) ``dtype``. With ``scale`` values are
    rescaled between the dtypes' ranges: integer → float divides by the integer maximum
    (uint8 → [0, 1]); float → uint8 is torchvision's ``x · (256 - 1e-3)`` truncation
    (not fusable); float → float and int → same int only cast. The input's range comes
    from its dtype alone: every gpupipe transform keeps uint8 as uint8, as torchvision's
    do. Differs from torchvision: ``dtype`` defaults to float32 and ``scale`` to True.
    """

    def __init__(self, dtype: torch.dtype = torch.float32, scale: bool = True) -> None:
        super().__init__()
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"dtype must be a torch.dtype, got {dtype!r}")
        self.dtype, self.scale = dtype, bool(scale)
        self.fusable = dtype.is_floating_point

    def output_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return self.dtype

    def _divisor(self, dtype: torch.dtype) -> float:
        """What a value of ``dtype`` is divided by on the way to a float ``self.dtype``."""
        return 1.0 if dtype.is_floating_point or not self.scale else float(torch.iinfo(dtype).max)

    def transform(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        if not self.scale or images.dtype == self.dtype:
            return images.to(self.dtype)
        if self.dtype.is_floating_point:
            work = torch.float64 if self.dtype == torch.float64 else torch.float32
            return (images.to(work) / self._divisor(images.dtype)).to(self.dtype)
        top = float(torch.iinfo(self.dtype).max)
        if not images.is_floating_point():
            raise TypeError(f"ToDtype({self.dtype}, scale=True) from {images.dtype}: integer to integer "
                            "rescaling is not supported; go through ToDtype(torch.float32)")
        return images.to(torch.float32).mul(top + 1.0 - 1e-3).clamp(0, top).to(self.dtype)

    def steps(self, params, spec):
        out = Spec(self.dtype, spec.channels, spec.device)
        scale = self._divisor(spec.dtype)
        return ([Affine(1.0 / scale)] if scale != 1.0 else []), out


    @classmethod
    def from_config(cls, dtype: str | torch.dtype = "float32", scale: bool = True) -> ToDtype:  # type: ignore[override]
        """``dtype`` by name (``float32``, ``bfloat16``, ...; :data:`DTYPES`) or a torch dtype."""
        return cls(dtype_named(dtype), scale)


DTYPES = ("float32", "float16", "bfloat16", "float64", "uint8")  # the dtypes a config may name


def dtype_named(dtype: str | torch.dtype) -> torch.dtype:
    """A torch dtype from its name in :data:`DTYPES` (``torch.`` prefix allowed), or itself."""
    if isinstance(dtype, str):
        if dtype.removeprefix("torch.") not in DTYPES:
            raise ValueError(f"dtype: unknown {dtype!r}; choose from {', '.join(DTYPES)}")
        return getattr(torch, dtype.removeprefix("torch."))
    return dtype


class ToTensor(ToDtype):
    """torchvision's ``ToTensor`` on a batch: uint8 (B, C, H, W) → float32 in [0, 1]
    (``ToDtype(torch.float32, scale=True)``); float input is only cast to float32.
    torchvision's converts a PIL image or HWC array; here images are already tensors."""

    def __init__(self) -> None:
        super().__init__(torch.float32, scale=True)

    @classmethod
    def from_config(cls, dtype: str | None = None) -> ToTensor:  # type: ignore[override]
        """No arguments; a ``dtype`` is refused, saying what to use instead."""
        if dtype is not None:
            raise ValueError("ToTensor takes no arguments (it gives float32 in [0, 1], as torchvision's); "
                             "for another dtype use ToDtype")
        return cls()


class Normalize(PointwiseTransform):
    """``(x - mean[c]) / std[c]``; float in, same dtype out (torchvision's Normalize).

    Call ``.to(device)`` on the module so the per-channel constants live with the images.
    """

    mean: torch.Tensor  # buffers (register_buffer in __init__)
    std: torch.Tensor

    def __init__(self, mean: Sequence[float], std: Sequence[float], inplace: bool = False) -> None:
        super().__init__()
        mean_t = torch.as_tensor(mean, dtype=torch.float32).reshape(-1)
        std_t = torch.as_tensor(std, dtype=torch.float32).reshape(-1)
        if (std_t == 0).any():
            raise ValueError(f"std evaluated to zero after conversion to {std_t.dtype}, "
                             f"leading to division by zero (std={list(std)}).")
        self.register_buffer("mean", mean_t, persistent=False)
        self.register_buffer("std", std_t, persistent=False)
        self.inplace = inplace

    def output_dtype(self, dtype: torch.dtype) -> torch.dtype:
        if not dtype.is_floating_point:
            raise TypeError(f"Input tensor should be a float tensor. Got {dtype}. Normalize needs float "
                            f"images in [0, 1]: put ToDtype(torch.float32, scale=True) before Normalize")
        return dtype

    def check_channels(self, channels: int) -> None:
        """Raises ``ValueError`` unless ``mean`` and ``std`` each give 1 or ``channels`` values."""
        bad = [f"{n} {name}" for name, n in (("mean", self.mean.numel()), ("std", self.std.numel()))
               if n not in (1, channels)]
        if bad:
            raise ValueError(f"Normalize has {' and '.join(bad)} values for images of {channels} channel(s); "
                             f"give 1 or {channels} of each")

    def transform(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        self.output_dtype(images.dtype)
        if images.ndim < 3:
            raise ValueError(f"Normalize expects (..., C, H, W) images, got shape {tuple(images.shape)}")
        self.check_channels(images.shape[-3])
        mean = self.mean.to(images.device, images.dtype, non_blocking=True).reshape(-1, 1, 1)
        std = self.std.to(images.device, images.dtype, non_blocking=True).reshape(-1, 1, 1)
        out = images if self.inplace else images.clone()
        return out.sub_(mean).div_(std)

    def steps(self, params, spec):
        self.output_dtype(spec.dtype)
        self.check_channels(spec.channels)
        inv = 1.0 / self.std.to(spec.device, non_blocking=True).reshape(1, -1, 1, 1)
        return [Affine(inv, -self.mean.to(spec.device, non_blocking=True).reshape(1, -1, 1, 1) * inv)], spec


class RepeatChannels(PointwiseTransform):
    """(B, 1, H, W) → (B, n, H, W) by repetition; (B, n, H, W) passes unchanged."""

    def __init__(self, num_channels: int = 3) -> None:
        super().__init__()
        if int(num_channels) < 1:
            raise ValueError(f"num_channels must be >= 1, got {num_channels}")
        self.num_channels = int(num_channels)

    def _check(self, c: int) -> None:
        if c not in (1, self.num_channels):
            raise ValueError(f"RepeatChannels({self.num_channels}) needs 1 or {self.num_channels} channels, got {c}")

    def transform(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        self._check(images.shape[-3])
        return images if images.shape[-3] == self.num_channels else images.repeat_interleave(self.num_channels, -3)

    def steps(self, params, spec):
        self._check(spec.channels)
        return [Repeat(self.num_channels)], Spec(spec.dtype, self.num_channels, spec.device)


class Grayscale(Transform):
    """(B, 3, H, W) → (B, n, H, W), n = ``num_output_channels`` in {1, 3}; torchvision's
    weights; uint8 stays uint8 (the luma truncated, as torchvision's)."""

    keeps_targets = True  # colour: boxes and masks stay

    def __init__(self, num_output_channels: int = 1) -> None:
        super().__init__()
        if num_output_channels not in (1, 3):
            raise ValueError(f"num_output_channels must be 1 or 3, got {num_output_channels}.")
        self.num_output_channels = num_output_channels

    def transform(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        check_image(images, "Grayscale")
        gray = rgb_to_grayscale(images)
        return gray.repeat_interleave(self.num_output_channels, dim=-3) if self.num_output_channels == 3 else gray


class RandomGrayscale(PointwiseTransform):
    """Grayscale (kept at the input's channel count) with probability ``p`` per sample."""

    def __init__(self, p: float = 0.1) -> None:
        super().__init__()
        self.p = check_probability(p)

    def make_params(self, images: torch.Tensor, key: AugKey) -> dict[str, torch.Tensor]:
        return {"apply": draw(key, 0)[:, 0] < self.p}

    def transform(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        check_image(images, "RandomGrayscale")
        gray = rgb_to_grayscale(images).expand_as(images)
        return torch.where(params["apply"].to(images.device).reshape(-1, 1, 1, 1), gray, images)

    def steps(self, params, spec):
        top = _check_spec(spec, "RandomGrayscale")
        keep = (~params["apply"].to(spec.device)).to(torch.float32)  # saturation 0 where applied, else 1
        return [Blend(keep, SATURATION, clamp=False, top=top)], spec


# ----------------------------------------------------------------------------- ColorJitter


def _check_jitter(value, name: str, center: float = 1.0, bound: tuple[float, float] = (0, float("inf")),
                  clip_first_on_zero: bool = True) -> tuple[float, float] | None:
    """torchvision's ``ColorJitter._check_input``, messages included."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"If {name} is a single number, it must be non negative.")
        value = [center - float(value), center + float(value)]
        if clip_first_on_zero:
            value[0] = max(value[0], 0.0)
    elif isinstance(value, Sequence) and len(value) == 2:
        value = [float(v) for v in value]
    else:
        raise TypeError(f"{name}={value} should be a single number or a sequence with length 2.")
    if not bound[0] <= value[0] <= value[1] <= bound[1]:
        raise ValueError(f"{name} values should be between {bound} and increasing, but got {value}.")
    return None if value[0] == value[1] == center else (value[0], value[1])


_NAMES = ("brightness", "contrast", "saturation", "hue")
_KIND = {"brightness": BRIGHTNESS, "contrast": CONTRAST, "saturation": SATURATION, "hue": 3}
_JITTER_OPS = {"brightness": adjust_brightness, "contrast": adjust_contrast,
               "saturation": adjust_saturation, "hue": adjust_hue}


class ColorJitter(PointwiseTransform):
    """torchvision's ColorJitter with a factor per sample and a random order per sample.

    Shape: (B, 3|1, H, W) float in [0, 1] or uint8 → same. Factors: brightness/contrast/
    saturation ``b`` → uniform in [max(0, 1 - b), 1 + b] (or the given (min, max));
    hue ``h`` → shift uniform in [-h, h] turns. The enabled ops run in an order drawn
    per sample (``random_order=True``, torchvision's distribution); ``random_order=False``
    runs brightness, contrast, saturation, hue in that order.

    ``apply`` runs the fused colour pass: with n ops enabled and hue among them, n - 1
    blend slots before one batch-wide hue rotation and n - 1 after it, each sample's
    blends placed on its side of its hue (an unused slot is ``f = 1``, the identity on
    [0, 1]); hue is computed once. ``apply_reference`` is the literal definition: at
    every slot each of the four ops runs on the whole batch (Kornia's
    brightness and hue) and each sample keeps the one its order names.
    """

    def __init__(self, brightness=None, contrast=None, saturation=None, hue=None, random_order: bool = True) -> None:
        super().__init__()
        self.ranges = {
            "brightness": _check_jitter(brightness, "brightness"),
            "contrast": _check_jitter(contrast, "contrast"),
            "saturation": _check_jitter(saturation, "saturation"),
            "hue": _check_jitter(hue, "hue", center=0, bound=(-0.5, 0.5), clip_first_on_zero=False),
        }
        self.enabled = [name for name, rng in self.ranges.items() if rng is not None]
        self.random_order = random_order

    def make_params(self, images: torch.Tensor, key: AugKey) -> dict[str, torch.Tensor]:
        params = {name: draw(key, i, 1, *rng)[:, 0]  # the enabled ops: those with a range
                  for i, name in enumerate(_NAMES) if (rng := self.ranges[name]) is not None}
        n = len(self.enabled)
        if self.random_order and n > 1:
            params["order"] = draw(key, 4, n).argsort(dim=1)  # (B, n): slot → index into self.enabled
        return params

    def transform(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        check_image(images, "ColorJitter")
        if not self.enabled:
            return images
        steps, _ = self.steps(params, Spec(images.dtype, int(images.shape[1]), images.device))
        return run_steps(images, steps, images.dtype)

    def apply_reference(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        check_image(images, "ColorJitter")
        if "order" not in params:
            for name in self.enabled:
                images = _JITTER_OPS[name](images, params[name])
            return images
        order = params["order"].to(images.device)
        for slot in range(order.shape[1]):
            out = images
            for j, name in enumerate(self.enabled):
                chosen = (order[:, slot] == j).reshape(-1, 1, 1, 1)
                out = torch.where(chosen, _JITTER_OPS[name](images, params[name]), out)
            images = out
        return images

    def steps(self, params, spec):
        top = _check_spec(spec, "ColorJitter")
        if "order" not in params:
            steps: list[Step] = [Blend(params[n], _KIND[n], top=top) for n in self.enabled if n != "hue"]
            return steps + ([Hue(params["hue"], top)] if "hue" in self.enabled else []), spec
        order = params["order"].to(spec.device)
        factors = torch.stack([params[name] for name in self.enabled], dim=1).to(spec.device)
        kind_of = torch.tensor([_KIND[name] for name in self.enabled]).to(spec.device, non_blocking=True)
        kinds, slot_factor = kind_of[order], factors.gather(1, order)  # (B, n) each: the op and factor at a slot
        n = order.shape[1]
        if "hue" not in self.enabled:
            return [Blend(slot_factor[:, s], kinds[:, s], top=top) for s in range(n)], spec
        hue_slot = (kinds == _KIND["hue"]).int().argmax(dim=1, keepdim=True)  # (B, 1)
        steps = []
        for j in range(n - 1):  # blend j of a sample's blends before its hue, or none
            steps.append(_slot_blend(slot_factor, kinds, hue_slot.new_full(hue_slot.shape, j), j < hue_slot, top))
        steps.append(Hue(params["hue"], top))
        for j in range(n - 1):  # blend j after its hue: slot hue_slot + 1 + j
            slot = hue_slot + 1 + j
            steps.append(_slot_blend(slot_factor, kinds, slot.clamp(max=n - 1), slot < n, top))
        return steps, spec


def _slot_blend(slot_factor: torch.Tensor, kinds: torch.Tensor, slot: torch.Tensor, active: torch.Tensor,
                top: float) -> Blend:
    """The blend at ``slot`` (B, 1) of each sample where ``active`` (B, 1), else the identity."""
    factor = torch.where(active, slot_factor.gather(1, slot), 1.0)[:, 0]
    return Blend(factor, torch.where(active, kinds.gather(1, slot), BRIGHTNESS)[:, 0], top=top)


# ----------------------------------------------------------------------------- fused


def fused_color(images: torch.Tensor, ops: Sequence[Transform], key: AugKey) -> torch.Tensor:
    """Run ``ops`` (an optional leading ``ToDtype``, colour transforms, ``Normalize``)
    as ``Compose(ops)`` does: runs of pointwise ops as one fused pass each, in float32,
    one conversion in and one cast out (to the ``ToDtype``'s dtype; float32 without one).

    The op at position ``i`` draws from ``key.child(i)``, as a sequential pipeline
    would, so the result equals running the ops one by one up to float32 rounding
    (see :mod:`gpupipe.augment.colorfuse` for the tolerance) and the rounding of the
    sequential path's intermediate dtype. Shape: (B, C, H, W) uint8|float → same.
    """
    from .compose import Compose

    ops = list(ops)
    to_dtype = [op for op in ops if isinstance(op, ToDtype)]
    if len(to_dtype) > 1 or (to_dtype and ops[0] is not to_dtype[0]):
        raise ValueError("fused_color takes at most one ToDtype, as the first op")
    if to_dtype and not to_dtype[0].dtype.is_floating_point:
        raise ValueError(f"fused_color casts to a float dtype, got ToDtype({to_dtype[0].dtype})")
    if not to_dtype:  # float32 in (uint8 scaled to [0, 1]); op i keeps key.child(i)
        return Compose(ops)(ToDtype(torch.float32)(images, key), key)
    if all(isinstance(op, PointwiseTransform) and op.fusable for op in ops):
        return Compose(ops)(images, key)
    conv = to_dtype[0]  # float32 in between, the requested dtype once at the end
    work = ToDtype(torch.float32, conv.scale)
    return Compose([work, *ops[1:]])(images, key).to(conv.dtype)
