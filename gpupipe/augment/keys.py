"""Keyed randomness on the device: random numbers that are a pure function of
(seed, epoch, sample id, draw tag).

Augmentation parameters for a sample must not depend on the batch it lands in,
the worker count or the resume point, and must be drawn without a host sync or a
per-sample Python loop. So there is no generator state at all: each number is a
hash (SplitMix64's finaliser, on int64 tensors) of its key, computed with integer
tensor ops on whatever device the sample ids live on. CPU and CUDA give the same
bits; so does any batch composition.
"""
from __future__ import annotations

import torch

__all__ = ["uniform", "randint", "normal", "draw"]

_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_MASK = (1 << 64) - 1


def _i64(x: int) -> int:
    """An unsigned 64-bit constant as the signed int64 torch stores."""
    x &= _MASK
    return x - (1 << 64) if x >= 1 << 63 else x


def _mix(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser on int64 tensors (wrapping arithmetic, logical shifts)."""
    def shr(v: torch.Tensor, n: int) -> torch.Tensor:
        return (v >> n) & ((1 << (64 - n)) - 1)  # arithmetic shift, then clear the sign copies

    z = (z ^ shr(z, 30)) * _i64(_M1)
    z = (z ^ shr(z, 27)) * _i64(_M2)
    return z ^ shr(z, 31)


def _mix_int(z: int) -> int:
    """:func:`_mix` on one Python int (unsigned 64-bit): the same bits, without a tensor."""
    z &= _MASK
    z = ((z ^ (z >> 30)) * _M1) & _MASK
    z = ((z ^ (z >> 27)) * _M2) & _MASK
    return z ^ (z >> 31)


def _bits(seed: int, epoch: int, sample_ids: torch.Tensor, tag: int, count: int) -> torch.Tensor:
    """(B, count) int64 of 64 random bits each, keyed by (seed, epoch, sample id, tag, index).
    The per-draw part is hashed on the host and enters the kernels as a scalar: a one-element
    tensor built from it would be a host-to-device copy, which synchronises on CUDA."""
    base = _i64(_mix_int(_mix_int(seed * _GOLDEN + epoch) ^ (tag * _M2 & _MASK)))
    ids = sample_ids.to(torch.int64).reshape(-1, 1)
    index = torch.arange(count, dtype=torch.int64, device=sample_ids.device).reshape(1, -1)
    return _mix(_mix(ids * _i64(_GOLDEN) ^ base) + index * _i64(_M1))


def uniform(seed: int, epoch: int, sample_ids: torch.Tensor, tag: int, count: int = 1,
            low: float = 0.0, high: float = 1.0) -> torch.Tensor:
    """(B, count) float32 uniform in [low, high): the top 24 bits of each hash."""
    u = ((_bits(seed, epoch, sample_ids, tag, count) >> 40) & 0xFFFFFF).to(torch.float32) / float(1 << 24)
    return low + (high - low) * u


def randint(seed: int, epoch: int, sample_ids: torch.Tensor, tag: int, high: torch.Tensor | int) -> torch.Tensor:
    """(B,) int64 uniform in [0, high) (``high`` per sample or shared; >= 1)."""
    u = uniform(seed, epoch, sample_ids, tag)[:, 0].to(torch.float64)
    if isinstance(high, int):  # a scalar: no host-to-device copy (it would synchronise on CUDA)
        return (u * high).floor().clamp_max(high - 1).to(torch.int64)
    high_t = high.to(torch.float64)
    return torch.minimum((u * high_t).floor(), high_t - 1).to(torch.int64)


def normal(seed: int, epoch: int, sample_ids: torch.Tensor, tag: int, count: int = 1) -> torch.Tensor:
    """(B, count) float32 standard normal (Box-Muller on two keyed uniforms)."""
    u = uniform(seed, epoch, sample_ids, tag, 2 * count)
    u1, u2 = u[:, :count].clamp_min(1e-7), u[:, count:]
    return torch.sqrt(-2 * torch.log(u1)) * torch.cos(2 * torch.pi * u2)


def draw(key, sub: int, count: int = 1, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
    """(B, count) float32 uniforms in [low, high) for draw ``sub`` of the transform holding
    ``key`` (an :class:`~gpupipe.augment.base.AugKey`): one stream per (seed, epoch, sample, tag)."""
    k = key.child(sub)
    return uniform(k.seed, k.epoch, k.sample_ids, k.tag, count, low, high)
