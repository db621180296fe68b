"""gpupipe.transforms against torchvision v2's contract (tests/tv_contract.py: dtypes and value
ranges, defaults, parameter sampling, application rates, fill, argument validation), and
the same table against torchvision itself wherever ``torchvision.transforms.v2`` imports.

The test venv has the real torchvision (tests/tvshim.py imports its Python transforms on
the CPU torch), so the "torchvision" cases run everywhere and a row that misstates
torchvision fails; they skip only where torchvision is not installed at all. Errors are
compared by type and by message (a regular expression of torchvision's words that both
messages match). Tolerances: sampled draws must stay inside their range (1e-4 slack for
float rounding) and cover 80% of it; rates within 5 standard errors; float outputs
within [0, top] up to 1e-5. Pixels and parameter distributions against torchvision:
test_vs_torchvision.py.
"""
from __future__ import annotations

import inspect
import math

import pytest
import torch
from tv_contract import CONTRACTS, F32, FILL, REQUIRED, SIZE, U8, Bad, Contract

import gpupipe.transforms as G


def _torchvision():
    try:
        import torchvision.transforms.v2 as v2
    except Exception:  # not installed, or built for another torch
        return None
    return v2


TV = _torchvision()
IMPLS = ["gpupipe", pytest.param("torchvision", marks=pytest.mark.skipif(
    TV is None, reason="torchvision.transforms.v2 does not import here (CPU torch without torchvision)"))]


def _cls(impl: str, name: str) -> type:
    if impl == "torchvision" and name == "ToTensor":
        import torchvision.transforms as v1  # v2's ToTensor leaves tensors alone; v1's is the one recipes use
        return v1.ToTensor
    return getattr(G if impl == "gpupipe" else TV, name)


def _make(impl: str, name: str, kwargs):
    ns = G if impl == "gpupipe" else TV
    return _cls(impl, name)(**{k: v(ns) if callable(v) else v for k, v in kwargs.items()})


def _images(dtype: torch.dtype, n: int = 4, hw=SIZE, seed: int = 0) -> torch.Tensor:
    u8 = torch.randint(0, 256, (n, 3, *hw), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    return u8 if dtype == U8 else u8.to(dtype) / 255


def _run(impl: str, t, images: torch.Tensor, contract: Contract | None = None) -> torch.Tensor:
    if impl == "gpupipe":
        return t(images, G.AugKey(seed=0, epoch=0, sample_ids=torch.arange(images.shape[0])))
    if contract is not None and contract.tv_input == "hwc":
        return t(images[0].permute(1, 2, 0).numpy())
    return t(images)


def _rows(attr: str):
    return [pytest.param(c, row, id=f"{c.id}-{i}") for c in CONTRACTS for i, row in enumerate(getattr(c, attr))]


# ------------------------------------------------------------------ dtypes and value ranges

@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("contract, case", [
    pytest.param(c, (dtype, want), id=f"{c.id}-{dtype}") for c in CONTRACTS for dtype, want in c.outputs.items()])
def test_output_dtype_and_range(contract, case, impl):
    dtype, want = case
    torch.manual_seed(0)
    t = _make(impl, contract.name, contract.example)
    images = _images(dtype)
    if isinstance(want, type):
        with pytest.raises(want):
            _run(impl, t, images, contract)
        return
    out = torch.as_tensor(_run(impl, t, images, contract))
    out_dtype, top = want
    assert out.dtype == out_dtype
    if top is not None:
        assert float(out.min()) >= -1e-5 and float(out.max()) <= top + 1e-5, (float(out.min()), float(out.max()))
        assert float(out.max()) >= 0.5 * top, f"values span [0, {float(out.max())}], not the range [0, {top}]"


# ------------------------------------------------------------------ defaults

def _plain(v):
    v = getattr(v, "value", v)  # InterpolationMode → its string
    return tuple(_plain(x) for x in v) if isinstance(v, (list, tuple)) else v


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("contract", [pytest.param(c, id=c.id) for c in CONTRACTS if c.defaults])
def test_defaults(contract, impl):
    params = inspect.signature(_cls(impl, contract.name).__init__).parameters
    for arg, default in contract.defaults.items():
        want = contract.differs.get(arg, default) if impl == "gpupipe" else default
        assert arg in params, f"{contract.name} has no argument {arg}"
        got = params[arg].default
        assert got is REQUIRED if want is REQUIRED else _plain(got) == _plain(want), (arg, got, want)


# ------------------------------------------------------------------ argument validation

@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("contract, row", _rows("invalid"))
def test_bad_arguments_raise(contract, row: Bad, impl):
    """torchvision's exception type, and a message with torchvision's words (row.match)."""
    with pytest.raises(row.error, match=row.match):  # at construction, or at the latest on the first batch
        _run(impl, _make(impl, contract.name, row.kwargs), _images(row.input))


# ------------------------------------------------------------------ sampling

def _draws(impl: str, contract: Contract, sampled, n: int) -> torch.Tensor:
    t = _make(impl, contract.name, sampled.kwargs)
    if impl == "gpupipe":
        placeholder = torch.zeros((), dtype=U8).expand(n, 3, *SIZE)
        params = t.make_params(placeholder, G.AugKey(seed=1, epoch=0, sample_ids=torch.arange(n)))
        return torch.as_tensor(sampled.gpupipe(params)).to(torch.float64)
    torch.manual_seed(0)
    make = getattr(t, "make_params", None) or t._get_params
    image = _images(U8, n=1)[0]
    return torch.tensor([float(sampled.torchvision(make([image]))) for _ in range(n)], dtype=torch.float64)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("contract, sampled", _rows("sampling"))
def test_parameter_sampling(contract, sampled, impl):
    v = _draws(impl, contract, sampled, 4000 if impl == "gpupipe" else 400)
    lo, hi, slack = sampled.low, sampled.high, 1e-4
    assert float(v.min()) >= lo - slack and float(v.max()) <= hi + slack, (sampled.what, float(v.min()), float(v.max()))
    span = hi - lo
    assert float(v.min()) <= lo + 0.1 * span and float(v.max()) >= hi - 0.1 * span, (sampled.what, "does not cover")
    if sampled.integer:
        assert torch.equal(v, v.round()), f"{sampled.what} should be whole numbers"


# ------------------------------------------------------------------ how often a sample is changed

def _changed_rate(impl: str, contract: Contract) -> tuple[float, int]:
    kwargs, _ = contract.applied
    t = _make(impl, contract.name, kwargs)
    if impl == "gpupipe":
        x = _images(U8, n=2000, hw=(16, 24))
        out = _run(impl, t, x)
        return float((out != x).flatten(1).any(dim=1).float().mean()), 2000
    torch.manual_seed(0)
    x = _images(U8, n=1)[0]
    return sum(bool((t(x) != x).any()) for _ in range(400)) / 400, 400


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("contract", [pytest.param(c, id=c.id) for c in CONTRACTS if c.applied])
def test_application_rate(contract, impl):
    rate, n = _changed_rate(impl, contract)
    p = contract.applied[1]
    assert abs(rate - p) <= 5 * math.sqrt(p * (1 - p) / n), (rate, p)


# ------------------------------------------------------------------ fill

@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [U8, F32])
@pytest.mark.parametrize("contract", [pytest.param(c, id=c.id) for c in CONTRACTS if c.fill])
def test_fill_is_in_the_images_units(contract, dtype, impl):
    kwargs, (y, x) = contract.fill
    out = _run(impl, _make(impl, contract.name, {**kwargs, "fill": FILL[dtype]}), _images(dtype))
    want = torch.tensor(FILL[dtype], dtype=dtype).view(1, 3).expand(out.shape[0], 3)
    torch.testing.assert_close(out[:, :, y, x], want, atol=1e-6, rtol=0)
