"""The operations of the auto-augment policies (torchvision v2's auto-augment op set),
applied per sample: sample ``b`` of a batch gets op ``op[b]`` with the signed magnitude
``magnitude[b]`` — a loop over the ops, never over samples.

Which samples an op computes (:class:`Rows`):

* on the CPU, only those that chose it: an index, ``x[index]`` in and ``index_put_``
  back into one copy of the batch — work in proportion to the samples, and there is
  no device to wait for;
* on an accelerator (``dense``), every sample, ``torch.where`` keeping those that
  chose it: no ``nonzero``, so no host sync and fixed shapes. There the point ops
  (Brightness, Contrast, Posterize, Solarize, AutoContrast, Equalize, Invert) of a
  uint8 batch are one 256-entry table per sample and channel — each op's formula
  evaluated on the values 0..255 — applied by one gather, instead of seven passes.

Both give the same values (the same float32 formulas on the same values). Geometric
ops (ShearX, ShearY, TranslateX, TranslateY, Rotate) are one 3×3 matrix per sample and
one warp (:func:`gpupipe.augment.warp.warp`); Equalize is a histogram of every sample
and channel at once (``scatter_add_`` over (B·C, 256) bins) and a table.

Values are torchvision v2's on the same dtype: uint8 in → uint8 out, a warp rounded,
the colour ops truncated (torchvision's ``.to(uint8)``), all arithmetic in float32 in
torchvision's order; float in [0, 1] → float out. Geometric ops can differ from
torchvision's where a nearest-neighbour sample falls exactly between two pixels.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from .geometry import affine_matrix
from .warp import affine_rows, warp

__all__ = ["OPS", "OP_IDS", "apply_ops", "op_matrix", "equalize_lut", "Rows"]

OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Contrast", "Posterize",
       "Solarize", "AutoContrast", "Equalize", "Invert", "Color", "Sharpness")
OP_IDS = {name: i for i, name in enumerate(OPS)}
_LUMA = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights


class Rows:
    """The samples an op touches: an ``index`` of them (sparse) or the whole batch with
    a ``mask`` (dense). ``take`` narrows a per-sample tensor, ``put`` writes results back
    (sparse: into ``base`` itself)."""

    def __init__(self, mask: torch.Tensor, dense: bool) -> None:
        self.mask = mask
        self.index = None if dense else mask.nonzero().squeeze(1)

    @property
    def empty(self) -> bool:
        return self.index is not None and self.index.numel() == 0

    def take(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.index is None else t[self.index]  # (index_select is several times slower here)

    def put(self, base: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        if self.index is None:
            return torch.where(self.mask.reshape(-1, *([1] * (base.ndim - 1))), values.to(base.dtype), base)
        return base.index_put_((self.index,), values.to(base.dtype))


def apply_ops(images: torch.Tensor, op: torch.Tensor, magnitude: torch.Tensor, interpolation: str = "nearest",
              fill: tuple[float, ...] | None = None, dense: bool | None = None, owned: bool = False) -> torch.Tensor:
    """Sample ``b`` transformed by op ``OPS[op[b]]`` with magnitude ``magnitude[b]``
    (torchvision's signed magnitude: shear factor, pixels, degrees, factor - 1, bits,
    solarize threshold in [0, 1]; ignored by the ops without one).

    ``interpolation`` and ``fill`` (one value or one per channel, in the images' units)
    for the geometric ops; ``dense``: see the module docstring (default: not on the CPU);
    ``owned``: ``images`` may be overwritten. Shape: (B, C, H, W) uint8 | float, C in
    (1, 3), ``op`` (B,) int64, ``magnitude`` (B,) float → (B, C, H, W) of the input dtype.
    """
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"auto-augment ops expect a (B, C, H, W) batch with C in (1, 3), got {tuple(images.shape)}")
    if images.dtype != torch.uint8 and not images.is_floating_point():
        raise TypeError(f"auto-augment ops take uint8 or float images, got {images.dtype}")
    dense = images.device.type != "cpu" if dense is None else dense
    out = images if dense or owned else images.clone()
    m = magnitude.to(torch.float32)
    rows = Rows((op >= OP_IDS["ShearX"]) & (op <= OP_IDS["Rotate"]), dense)
    if not rows.empty:
        out = rows.put(out, _geometric(rows.take(out), rows.take(op), rows.take(m), interpolation, fill))
    if dense and out.dtype == torch.uint8:
        out = _point_table(out, op, m)
    else:
        for name in (*_POINT, "Equalize"):
            out = _on_rows(out, op, m, name, dense)
    for name in ("Color", "Sharpness"):
        out = _on_rows(out, op, m, name, dense)
    return out


def _on_rows(images, op, m, name: str, dense: bool) -> torch.Tensor:
    """Op ``name`` on the samples that chose it."""
    rows = Rows(op == OP_IDS[name], dense)
    if rows.empty:
        return images
    x, mx = rows.take(images), rows.take(m)
    if name in _POINT:
        stats, formula = _POINT[name]
        values = formula(x, mx.reshape(-1, 1, 1, 1), stats(x) if stats else {}, _bound(x))  # promotes to float32
    elif name == "Equalize":
        values = _equalize(x)
    else:
        values = (_color if name == "Color" else _sharpness)(x, mx)
    return rows.put(images, values)


def _bound(images: torch.Tensor) -> float:
    return 1.0 if images.is_floating_point() else 255.0


def _factors(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(f, 1 - f) for the factor ``f = 1 + m`` as torchvision's float32 arithmetic sees
    them (f rounded from float64; 1 - f is -m exactly). ``m`` (B,) or (B, 1, 1, 1)."""
    m = m.reshape(-1, 1, 1, 1)
    return (1.0 + m.to(torch.float64)).to(torch.float32), -m


# ------------------------------------------------------------------------------------ geometric

def _geometric(images, op, magnitude, interpolation, fill) -> torch.Tensor:
    hw = (int(images.shape[-2]), int(images.shape[-1]))
    padding = "zeros" if fill is None or all(v == 0 for v in fill) else "fill"
    out = warp(images, op_matrix(op, magnitude, hw), hw, padding, interpolation, fill, True)
    if not images.is_floating_point() and out.is_floating_point():
        out = out.round_().clamp_(0, 255)  # torchvision rounds a warped integer image
    return out.to(images.dtype)


def op_matrix(op: torch.Tensor, m: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """(B, 3, 3) float64 input→output pixel matrices: torchvision's shears about the
    top-left corner (pixel (-0.5, -0.5)), translations by ``int(magnitude)`` pixels,
    counter-clockwise rotation by ``magnitude`` degrees about the centre; identity for
    the other ops."""
    m = m.to(torch.float64)
    zero, one, t = torch.zeros_like(m), torch.ones_like(m), torch.trunc(m)
    matrices = {
        "ShearX": affine_rows(one, -m, -0.5 * m, zero, one, zero),  # x' = x - m (y + 1/2)
        "ShearY": affine_rows(one, zero, zero, -m, one, -0.5 * m),  # y' = y - m (x + 1/2)
        "TranslateX": affine_rows(one, zero, t, zero, one, zero),
        "TranslateY": affine_rows(one, zero, zero, zero, one, t),
        "Rotate": affine_matrix(-m, zero, zero, one, zero, zero, hw),  # torchvision's rotate passes -angle
    }
    out = affine_rows(one, zero, zero, zero, one, zero)
    for name, matrix in matrices.items():
        out = torch.where((op == OP_IDS[name]).reshape(-1, 1, 1), matrix, out)
    return out


# ------------------------------------------------------------------------------------ point ops

def _mean_luma(x: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"mean": _gray(x).mean(dim=(-3, -2, -1), keepdim=True)}


def _low_and_scale(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """torchvision's autocontrast: per channel min and (max - min) / bound; a flat channel 0 and 1."""
    low, high = torch.aminmax(x.flatten(2), dim=-1)
    low, high = low.to(torch.float32)[..., None, None], high.to(torch.float32)[..., None, None]
    flat = high == low
    return {"low": torch.where(flat, 0.0, low), "scale": torch.where(flat, 1.0, (high - low).mul_(1.0 / _bound(x)))}


def _posterize(v, m, stats, bound) -> torch.Tensor:
    """Keep the top ``m`` bits (uint8: ``x & mask``; float: ``floor(x · 2^m) / 2^m``, at most 2^m - 1 levels)."""
    bits = m.to(torch.int64).clamp(0, 8).to(torch.float32)
    if bound == 255.0:
        step = torch.pow(2.0, 8.0 - bits)
        return torch.floor(v / step) * step
    levels = torch.pow(2.0, bits)
    return torch.floor(v * levels).clamp_(min=0).minimum(levels - 1) / levels


_POINT: dict[str, tuple[Callable | None, Callable]] = {  # name: (statistics of the image, formula on float32 values)
    "Brightness": (None, lambda v, m, s, bound: (v * _factors(m)[0]).clamp_(0, bound)),
    "Contrast": (_mean_luma, lambda v, m, s, bound: (v * _factors(m)[0] + s["mean"] * _factors(m)[1]).clamp_(0, bound)),
    "Posterize": (None, _posterize),
    # torchvision compares with the float32 of ``bound * magnitude`` (magnitude a float64)
    "Solarize": (None, lambda v, m, s, bound: torch.where(v >= (bound * m.to(torch.float64)).to(torch.float32),
                                                          bound - v, v)),
    "AutoContrast": (_low_and_scale, lambda v, m, s, bound: ((v - s["low"]) / s["scale"]).clamp_(0, bound)),
    "Invert": (None, lambda v, m, s, bound: bound - v),
}


def _point_table(images: torch.Tensor, op: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """The dense uint8 path of the point ops: each op's formula on the values 0..255 (with
    the image's statistics, computed for every sample), the chosen one per sample and
    channel kept, Equalize's table where chosen, the rest identity; one gather."""
    n, c = images.shape[:2]
    values = torch.arange(256, dtype=torch.float32, device=images.device).expand(n, c, 1, 256)
    table = values
    for name, (stats, formula) in _POINT.items():
        chosen = (op == OP_IDS[name]).reshape(-1, 1, 1, 1)
        table = torch.where(chosen, formula(values, m.reshape(-1, 1, 1, 1), stats(images) if stats else {}, 255.0),
                            table)
    table = table.to(torch.uint8)[:, :, 0]
    table = torch.where((op == OP_IDS["Equalize"]).reshape(-1, 1, 1), equalize_lut(images), table)
    return _gather(images, table)


def equalize_lut(images: torch.Tensor) -> torch.Tensor:
    """PIL's (and torchvision's) histogram equalization as a table per sample and channel.

    With ``n`` the pixel count, ``last`` the count of the highest value present and
    ``step = (n - last) // 255``: value ``k`` maps to ``(below(k) + step // 2) // step``
    (``below``: pixels darker than ``k``), at most 255; a channel with ``step == 0``
    (one value, or nearly) is unchanged. Shape: (B, C, H, W) uint8 → (B, C, 256) uint8.
    """
    b, c = images.shape[:2]
    index = images.reshape(b * c, -1).to(torch.int64)
    hist = torch.zeros(b * c, 256, dtype=torch.int64, device=images.device)
    hist.scatter_add_(1, index, torch.ones((), dtype=torch.int64, device=images.device).expand_as(index))
    levels = torch.arange(256, device=images.device)
    top = torch.where(hist > 0, levels, 0).amax(dim=1, keepdim=True)  # highest value present
    step = (index.shape[1] - hist.gather(1, top)).div(255, rounding_mode="floor")
    below = hist.cumsum(dim=1) - hist
    table = (below + step // 2).div(step.clamp(min=1), rounding_mode="floor").clamp_(max=255)
    table = torch.where(step > 0, table, levels)
    return table.to(torch.uint8).reshape(b, c, 256)


def _equalize(images: torch.Tensor) -> torch.Tensor:
    """torchvision's equalize: uint8 by the table; float quantised to uint8 as torchvision's
    ``to_dtype`` does (``x · (256 - 1e-3)``, truncated), equalized, back to [0, 1]."""
    if images.dtype == torch.uint8:
        return _gather(images, equalize_lut(images))
    quantized = images.mul(256.0 - 1e-3).to(torch.uint8)
    return _gather(quantized, equalize_lut(quantized)).to(images.dtype) / 255.0


def _gather(images: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``table[b, c, images[b, c, y, x]]``: (B, C, H, W) uint8, (B, C, 256) uint8 → uint8."""
    b, c = images.shape[:2]
    index = images.reshape(b * c, -1).to(torch.int64)
    return table.reshape(b * c, 256).gather(1, index).reshape(images.shape)


# ------------------------------------------------------------------------------------ blends

def _gray(images: torch.Tensor) -> torch.Tensor:
    """torchvision's luma in float32, floored for integer images (as its contrast and
    saturation do); one channel is itself. (B, C, H, W) → (B, 1, H, W) float32."""
    if images.shape[1] == 1:
        return images.to(torch.float32)
    r, g, b = images.unbind(dim=1)
    luma = (r * _LUMA[0]).add_(g, alpha=_LUMA[1]).add_(b, alpha=_LUMA[2]).unsqueeze(1)
    return luma if images.is_floating_point() else luma.floor_()


def _color(images: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """torchvision's ``adjust_saturation(1 + m)``: a blend with the luma; one channel unchanged."""
    if images.shape[1] == 1:
        return images
    f, g = _factors(m)
    return (images * f).add_(_gray(images) * g).clamp_(0, _bound(images)).to(images.dtype)


def _sharpness(images: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """torchvision's ``adjust_sharpness(1 + m)``: inside a one-pixel border, a blend with
    the image smoothed by [[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13 (rounded for integers)."""
    n, c, h, w = images.shape
    if h <= 2 or w <= 2:
        return images
    x = images.to(torch.float32, copy=True)
    kernel = torch.full((c, 1, 3, 3), 1.0 / 13.0, device=images.device)
    kernel[:, :, 1, 1] = 5.0 / 13.0
    smooth = torch.nn.functional.conv2d(x, kernel, groups=c)
    if not images.is_floating_point():
        smooth = smooth.round_()
    inner = x[..., 1:-1, 1:-1]
    inner.add_(smooth.sub_(inner) * _factors(m)[1])  # x + (1 - f)(smooth - x)
    return x.clamp_(0, _bound(images)).to(images.dtype)
