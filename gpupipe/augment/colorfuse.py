"""Colour ops, normalize and the dtype cast as one pass over one working buffer.

A run of pointwise transforms (``ToDtype``, ``ColorJitter``, ``RandomGrayscale``,
``RepeatChannels``, ``Normalize``) is lowered to a short list of steps and executed
here on a single float32 buffer, in place:

* ``Affine`` (ToDtype's 1/255, Normalize's 1/std and -mean/std) and ``Repeat``
  (1 → n channels) are per-channel affine maps: they compose algebraically and stay
  *pending* — never a pass of their own. A pending map is folded into the next blend's
  coefficients, and the one left at the end is applied once, where the buffer is
  already being written (one ``addcmul``, then the cast to the output dtype).
* ``Blend`` is torchvision's brightness / contrast / saturation, all of them
  ``clamp(f·x + (1-f)·ref)`` with ref = 0, the mean luma, the luma; ``kind`` is one
  of them for the whole batch or a (B,) tensor choosing per sample. One blend costs
  one luma (a GEMV; brightness needs none, contrast only channel means), one fused
  multiply-add over the image and one clamp. The clamps are why consecutive blends are
  not composed into one colour matrix: torchvision clamps after each op.
* ``Hue`` rotates HSV hue exactly (torchvision's definition; a YIQ rotation would be
  one matrix but lands up to 0.27 away on [0, 1] even for shifts within ±0.05, see
  docs/benchmarks.md): value and chroma are kept and each channel is
  ``min + chroma·clamp(d - 1, 0, 1)``, d the circular distance from the new hue to the
  channel's centre; no HSV image is built.
* On uint8 input (before the cast; the buffer holds 0-255 in float32) blends and hue
  follow torchvision v2's integer rules: clamp to [0, 255] and truncate after each op,
  the luma floored (``top=255`` on the step), so a colour run that ends without a cast
  returns uint8, as torchvision's ops do.

Why this is faster than the op-by-op path in eager PyTorch on a CPU: a 50 MB
allocation costs more than the arithmetic done in it (page faults), and this path
allocates the working buffer once (plus one luma plane and a few hue planes).
Each step is still its own few kernels: single-threaded, the batch goes through in
cache-sized slices (:func:`slice_size`); ``compile=True`` hands the whole pass to
``torch.compile``, which fuses the kernels (opt-in, see :func:`run_steps`).

Agreement with the sequential reference (each op by itself, Kornia's
``adjust_brightness_accumulative`` / ``adjust_hue`` and torchvision's blend formulas)
is float32 rounding only: the same operations in another order, the luma as a
GEMV, the hue in closed form. Every step is a continuous map (clamp included), so
these ~1e-7 differences do not grow into jumps; tests assert 2e-5 on [0, 1] values
(after Normalize: that bound times 1/std).
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .base import Transform

__all__ = ["PointwiseTransform", "Spec", "Affine", "Repeat", "Blend", "Hue", "Step", "run_steps", "slice_size",
           "out_channels", "hue_shift_", "LUMA", "BRIGHTNESS", "CONTRAST", "SATURATION"]

log = logging.getLogger(__name__)

LUMA = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights
BRIGHTNESS, CONTRAST, SATURATION = 0, 1, 2


@dataclass(frozen=True)
class Affine:
    """``x * scale + shift``, each a float or a tensor broadcastable to (B, C, 1, 1)."""
    scale: float | torch.Tensor = 1.0
    shift: float | torch.Tensor = 0.0


@dataclass(frozen=True)
class Repeat:
    """1 channel → ``channels`` channels (a broadcast, materialised only when written)."""
    channels: int


@dataclass(frozen=True)
class Blend:
    """``clamp(f·x + (1-f)·ref, 0, 1)``; ``factor`` (B,); ``kind`` an int or (B,) int tensor;
    ``clamp=False`` leaves the clamp out (a grayscale blend of [0, 1] values needs none).
    ``top`` > 1: the values are integers in [0, top] (a uint8 image): torchvision's
    integer blend, ``trunc(clamp(f·x + (1-f)·ref, 0, top))`` with the luma floored."""
    factor: torch.Tensor
    kind: int | torch.Tensor
    clamp: bool = True
    top: float = 1.0


@dataclass(frozen=True)
class Hue:
    """HSV hue + ``shift`` turns, (B,). ``top`` > 1: integers in [0, top], as torchvision
    does a uint8 hue: to [0, 1], rotate, back with ``trunc(x · (top + 1 - 1e-3))``."""
    shift: torch.Tensor
    top: float = 1.0


Step = Affine | Repeat | Blend | Hue


@dataclass(frozen=True)
class Spec:
    """What reaches a pointwise transform in a fused run: dtype, channel count, device."""
    dtype: torch.dtype
    channels: int
    device: torch.device


class PointwiseTransform(Transform):
    """A transform that maps each pixel (and per-sample statistics of its image) only,
    so a run of them can execute as :func:`run_steps`. ``Compose`` fuses consecutive
    ones where ``fusable`` is true; ``apply`` stays the op's own (reference) path."""

    fusable = True
    keeps_targets = True  # colour: boxes and masks stay

    def steps(self, params: dict[str, torch.Tensor], spec: Spec) -> tuple[list[Step], Spec]:
        """The steps doing this transform on a ``spec`` input, and the output's spec.
        Raises as ``apply`` would on an input it does not accept."""
        raise NotImplementedError


@dataclass
class _Work:
    """The buffer and the affine map still pending on it: the image is ``x·scale + shift``
    with ``channels`` channels (``x`` may have 1 where a Repeat is pending)."""
    x: torch.Tensor
    owned: bool
    channels: int
    scale: float | torch.Tensor = 1.0
    shift: float | torch.Tensor = 0.0

    def pending(self) -> bool:
        return not _is(self.scale, 1.0) or not _is(self.shift, 0.0) or self.x.shape[1] != self.channels


def _is(v: float | torch.Tensor, const: float) -> bool:
    return isinstance(v, (int, float)) and v == const


def _per_sample(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return v.to(like.device, like.dtype).reshape(-1, 1, 1, 1)


def _luma_weights(like: torch.Tensor) -> torch.Tensor:
    """(3,) on ``like``'s device (an asynchronous copy of three constants, no sync)."""
    return torch.tensor(LUMA, dtype=like.dtype).to(like.device, non_blocking=True)


def _axpb(x: torch.Tensor, scale, shift, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x * scale + shift`` (floats or tensors; Python floats never become tensors, so
    no host-to-device copy), written to ``out`` when given (may be ``x``)."""
    scale, shift = _per_sample_channel(scale, x), _per_sample_channel(shift, x)
    if isinstance(shift, torch.Tensor) and isinstance(scale, torch.Tensor):
        return torch.addcmul(shift, x, scale, out=out)
    if isinstance(shift, torch.Tensor):
        return torch.add(shift, x, alpha=scale, out=out)
    y = torch.mul(x, scale, out=out)
    return y if _is(shift, 0.0) else y.add_(shift)


def _per_sample_channel(v, x: torch.Tensor):
    """A (1, C, 1, 1) factor as (B, C, 1, 1): CPU kernels broadcast a per-(sample,
    channel) factor about 2x faster than one broadcast over the batch too."""
    if isinstance(v, torch.Tensor) and v.dim() == 4 and v.shape[0] == 1 and v.shape[1] > 1 < x.shape[0]:
        return v.expand(x.shape[0], -1, -1, -1).contiguous()
    return v


def _image_shape(w: _Work) -> tuple[int, ...]:
    return (w.x.shape[0], w.channels, *w.x.shape[-2:])


def _target(w: _Work) -> torch.Tensor | None:
    """Where a step may write: the buffer itself if it is ours and has the image's shape."""
    return w.x if w.owned and tuple(w.x.shape) == _image_shape(w) else None


# ----------------------------------------------------------------------------- luma


def _luma(w: _Work) -> torch.Tensor:
    """(B, 1, H, W) luma of the image ``x·scale + shift`` (the image itself with 1 channel)."""
    x = w.x
    if w.channels == 1:
        return _axpb(x, w.scale, w.shift) if w.pending() else x
    weights: torch.Tensor | list[float]
    if isinstance(w.scale, torch.Tensor):
        weights = _luma_weights(x) * w.scale.reshape(-1)  # (1|3,) on the device
        weights = weights.expand(3)
    else:
        weights = [v * w.scale for v in LUMA]  # Python floats: no tensor, no copy
    gray = x * sum(weights) if x.shape[1] == 1 else _weighted_channels(x, weights)  # 1: a pending Repeat
    if isinstance(w.shift, torch.Tensor):
        return gray.add_((_luma_weights(x) * w.shift.reshape(-1)).sum())
    return gray if _is(w.shift, 0.0) else gray.add_(w.shift * sum(LUMA))


def _weighted_channels(x: torch.Tensor, weights: torch.Tensor | list[float]) -> torch.Tensor:
    """(B, 1, H, W) sum of the 3 channels times ``weights`` (3 floats or a (3,) tensor).
    A large batch is one GEMV (reads the image once); a small one three plane ops, as
    a small GEMV costs milliseconds of BLAS thread start-up on a busy CPU."""
    B, _, H, W = x.shape
    if B * H * W < 1 << 20:
        r, g, b = x.unbind(dim=1)
        if isinstance(weights, torch.Tensor):
            return (r * weights[0]).addcmul_(g, weights[1]).addcmul_(b, weights[2]).unsqueeze(1)
        return (r * weights[0]).add_(g, alpha=weights[1]).add_(b, alpha=weights[2]).unsqueeze(1)
    if not isinstance(weights, torch.Tensor):
        weights = torch.tensor(weights, dtype=x.dtype).to(x.device, non_blocking=True)
    if x.is_contiguous():
        return torch.matmul(weights.reshape(1, 3), x.view(B, 3, H * W)).view(B, 1, H, W)
    xl = x.permute(0, 2, 3, 1).reshape(B, H * W, 3)  # channels_last: a view (anything else: a copy)
    return torch.matmul(xl, weights.reshape(3, 1)).view(B, H, W, 1).permute(0, 3, 1, 2)


def _reference(w: _Work, f: torch.Tensor, kind: int | torch.Tensor, integer: bool = False) -> torch.Tensor | None:
    """``(1 - f)·ref`` for a blend: None (brightness), (B, 1, 1, 1) or (B, 1, H, W).
    ``integer``: torchvision's integer blend, whose luma is floored."""
    if isinstance(kind, int) and kind == BRIGHTNESS:
        return None
    if isinstance(kind, int) and kind == CONTRAST and w.channels == 3 and not w.pending() and not integer:
        means = w.x.mean(dim=(-2, -1))  # (B, 3): the mean luma is the luma of the channel means
        return (1 - f) * (means * _luma_weights(means)).sum(-1).reshape(-1, 1, 1, 1)  # no tiny BLAS call
    gray = _luma(w)
    if integer and w.channels == 3:
        gray = gray.floor() if gray is w.x else gray.floor_()
    mean = gray.mean(dim=(-2, -1), keepdim=True)
    if isinstance(kind, int):
        return (1 - f) * mean if kind == CONTRAST else gray.mul(1 - f)
    k = _per_sample(kind, f)
    return torch.addcmul((1 - f) * (k == CONTRAST) * mean, gray, (1 - f) * (k == SATURATION))


# ----------------------------------------------------------------------------- steps


def _blend(w: _Work, step: Blend) -> None:
    """One blend, the pending affine folded into its coefficients; leaves nothing pending."""
    f = _per_sample(step.factor, w.x)
    ref = _reference(w, f, step.kind, integer=step.top > 1)
    coef = f if _is(w.scale, 1.0) else f * w.scale
    src, dst = w.x.expand(_image_shape(w)), _target(w)
    if not _is(w.shift, 0.0):
        out = _axpb(src, coef, f * w.shift, out=dst)
        if ref is not None:
            out.add_(ref)
    elif ref is None:
        out = torch.mul(src, coef, out=dst)
    else:
        out = torch.addcmul(ref, src, coef, out=dst)
    if step.clamp:
        out = out.clamp_(0.0, step.top)
    w.x, w.owned, w.scale, w.shift = (out.trunc_() if step.top > 1 else out), True, 1.0, 0.0


def _materialise(w: _Work) -> None:
    """Apply the pending affine (and repeat) to the buffer: one pass."""
    if w.pending():
        w.x = _axpb(w.x.expand(_image_shape(w)), w.scale, w.shift, out=_target(w))
        w.owned, w.scale, w.shift = True, 1.0, 0.0


def hue_shift_(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate the HSV hue of (B, 3, H, W) float ``x`` in [0, 1] by ``shift`` (B,) turns,
    in place.

    Value (max) and chroma (max - min) are kept. With ``h`` the new hue in sixths of a
    turn, in [0, 6), channel n (R: centre 3, G: 5, B: 1) is
    ``min + chroma · clamp(d - 1, 0, 1)``, d the circular distance from ``h`` to the
    centre: torchvision's HSV round trip in closed form.
    """
    r, g, b = x.unbind(dim=1)
    top = torch.maximum(torch.maximum(r, g), b)
    low = torch.minimum(torch.minimum(r, g), b)
    chroma = top - low
    is_r = top == r
    is_g = (top == g).logical_and_(~is_r)
    # 6·hue: (g - b) / chroma where red is the max, 2 + (b - r) / chroma green, 4 + (r - g) / chroma blue
    h = torch.where(is_r, g - b, torch.where(is_g, (b - r).add_(chroma, alpha=2), (r - g).add_(chroma, alpha=4)))
    h.div_(chroma.clamp_min(torch.finfo(x.dtype).tiny)).add_(_per_sample(shift, x)[:, 0] * 6).remainder_(6.0)
    d = torch.empty_like(h)
    torch.sub(h, 3.0, out=d).abs_().sub_(1.0).clamp_(0.0, 1.0)  # red: |h - 3| never wraps
    torch.addcmul(low, chroma, d, out=r)
    torch.sub(h, 5.0, out=d).abs_().sub_(1.0)  # green: min(|h - 5|, h + 1) - 1
    torch.minimum(d, h, out=d).clamp_(0.0, 1.0)
    torch.addcmul(low, chroma, d, out=g)
    torch.sub(h, 1.0, out=d).abs_().sub_(1.0)  # blue: min(|h - 1|, 7 - h) - 1
    torch.minimum(d, h.neg_().add_(6.0), out=d).clamp_(0.0, 1.0)
    torch.addcmul(low, chroma, d, out=b)
    return x


def _hue(w: _Work, step: Hue) -> None:
    if w.channels == 1:
        return  # torchvision: hue leaves a 1-channel image as it is
    _materialise(w)
    if not w.owned:
        w.x, w.owned = w.x.clone(memory_format=torch.contiguous_format), True
    elif not w.x.is_contiguous():
        w.x = w.x.contiguous()
    hue_shift_(w.x, step.shift)
    if step.top > 1:  # hue_shift_ is scale-free: x/top rotated, times (top + 1 - 1e-3), truncated
        w.x.mul_((step.top + 1.0 - 1e-3) / step.top).trunc_().clamp_(0.0, step.top)


def _repeat(w: _Work, step: Repeat) -> None:
    if w.channels == step.channels:
        return
    if w.channels != 1:
        raise ValueError(f"RepeatChannels({step.channels}) needs 1 or {step.channels} channels, got {w.channels}")
    w.channels = step.channels


def affine_rows(w: _Work, step: Affine) -> None:
    w.scale = w.scale * step.scale
    w.shift = w.shift * step.scale + step.shift


def _slice(step: Step, lo: int, hi: int) -> Step:
    """The step for samples ``lo:hi`` (per-sample fields sliced, per-channel ones kept)."""
    if isinstance(step, Blend):
        kind = step.kind[lo:hi] if isinstance(step.kind, torch.Tensor) else step.kind
        return Blend(step.factor[lo:hi], kind, step.clamp, step.top)
    return Hue(step.shift[lo:hi], step.top) if isinstance(step, Hue) else step


def out_channels(channels: int, steps: list[Step]) -> int:
    """The channel count after ``steps`` (a Repeat of a 1-channel image changes it)."""
    for step in steps:
        if isinstance(step, Repeat):
            if channels not in (1, step.channels):
                raise ValueError(f"RepeatChannels({step.channels}) needs 1 or {step.channels} channels, got {channels}")
            channels = step.channels
    return channels


# by the step's type (each action takes its own kind of step)
_ACTIONS: dict[type, Callable[[_Work, Any], None]] = {Affine: affine_rows, Repeat: _repeat, Blend: _blend, Hue: _hue}


def _run_slice(x: torch.Tensor, steps: list[Step], out_dtype: torch.dtype, owned: bool) -> torch.Tensor:
    """All ``steps`` on one slice of samples; the result in ``out_dtype`` (cast once, at the end)."""
    work_dtype = torch.float64 if torch.float64 in (x.dtype, out_dtype) else torch.float32
    buf = x if x.dtype == work_dtype else x.to(work_dtype)
    w = _Work(buf, owned=owned or buf is not x, channels=int(x.shape[1]))
    for step in steps:
        _ACTIONS[type(step)](w, step)
    _materialise(w)
    return w.x.to(out_dtype)


def slice_size(images: torch.Tensor, pixels: int = 1 << 17) -> int:
    """Samples per slice. Single-threaded on the CPU: about ``pixels`` pixels, so that a
    slice and its temporaries stay in the L2 cache across all steps and small
    temporaries come from the allocator's free lists instead of fresh zeroed pages
    (about 2x less CPU time at 64 x 256²). With intra-op threads or on an accelerator:
    the whole batch, as every small op would pay a thread barrier (on a busy 2-core
    machine that made slicing 2-6x slower, not faster)."""
    if images.device.type != "cpu" or torch.get_num_threads() > 1:
        return max(1, int(images.shape[0]))
    return max(1, pixels // max(1, int(images.shape[-2] * images.shape[-1])))


@functools.cache
def _compiled_slice():
    """``_run_slice`` through ``torch.compile`` (Inductor: C++ with the system compiler
    on the CPU, Triton on CUDA), built on first use."""
    return torch.compile(_run_slice, dynamic=False)


_compile_failed: list[str] = []  # the first failure's message; compilation is not tried again


def _run_compiled(images: torch.Tensor, steps: list[Step], out_dtype: torch.dtype, owned: bool) -> torch.Tensor:
    if not _compile_failed:
        try:
            return _compiled_slice()(images, steps, out_dtype, owned)
        except Exception as exc:  # no compiler, unsupported backend...: eager is always there
            _compile_failed.append(f"{type(exc).__name__}: {exc}")
            log.warning("torch.compile of the fused colour pass failed, running it eagerly: %s", _compile_failed[0])
    return _run_slice(images, steps, out_dtype, owned)


def run_steps(images: torch.Tensor, steps: list[Step], out_dtype: torch.dtype, *, owned: bool = False,
              slice_samples: int | None = None, compile: bool = False) -> torch.Tensor:
    """Execute ``steps`` on ``images`` (B, C, H, W), any dtype; returns ``out_dtype``
    (``images`` itself where there is nothing to do).

    The batch is processed in slices of ``slice_samples`` samples (default
    :func:`slice_size`): every step is per sample, so slicing changes nothing but where
    the data lives while it is worked on. ``owned``: the caller hands ``images`` over
    (a temporary nobody else holds), so a float32 slice may be written in place.
    ``compile``: run the whole batch through ``torch.compile`` (opt-in: the first call
    per step structure and shape compiles for tens of seconds, later ones fuse every
    step into a few loops, ~3x faster on a 2-core CPU at 64 x 256²); a failure to
    compile logs a warning once and falls back to eager.
    """
    if compile:
        return _run_compiled(images, steps, out_dtype, owned)
    B, C, H, W = images.shape
    step_b = slice_samples or slice_size(images)
    if step_b >= B:
        return _run_slice(images, steps, out_dtype, owned)
    out = _slice_output(images, steps, out_dtype, owned)
    for lo in range(0, B, step_b):
        hi = min(B, lo + step_b)
        part = _run_slice(images[lo:hi], [_slice(s, lo, hi) for s in steps], out_dtype, owned)
        if not _same_memory(part, out[lo:hi]):
            out[lo:hi] = part
    return out


def _slice_output(images: torch.Tensor, steps: list[Step], out_dtype: torch.dtype, owned: bool) -> torch.Tensor:
    """Where the slices' results go: ``images`` itself when it is ours and already of the
    output's dtype and channel count (each slice is then worked on in place: no second
    batch-sized buffer, whose fresh pages cost as much as the pass), else a new buffer."""
    B, C, H, W = images.shape
    channels = out_channels(C, steps)
    if owned and images.dtype == out_dtype and channels == C:
        return images
    cl = C > 1 and images.is_contiguous(memory_format=torch.channels_last)
    return torch.empty((B, channels, H, W), dtype=out_dtype, device=images.device,
                       memory_format=torch.channels_last if cl else torch.contiguous_format)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
