"""NVTX ranges around the data path's stages, so that an Nsight Systems timeline reads as the data
flow: ``gpupipe: wait for encoded batch`` (the decode thread waiting for the workers),
``gpupipe: decode``, ``gpupipe: augment`` (in their threads) and ``gpupipe: wait for batch`` (the
training loop waiting for a ready one). Only on CUDA: on the CPU nothing is called (no cost, and
no error where torch has no NVTX)."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["nvtx_range", "ranged"]


def nvtx_range(name: str, on: bool) -> contextlib.AbstractContextManager[Any]:
    """``torch.cuda.nvtx.range(name)`` when ``on`` (a CUDA device), else a no-op."""
    return torch.cuda.nvtx.range(name) if on else contextlib.nullcontext()


def ranged(source: Callable[[], Iterator[Any]], name: str, on: bool) -> Callable[[], Iterator[Any]]:
    """``source`` with each ``next`` inside an NVTX range ``name`` (``source`` itself when off)."""
    if not on:
        return source

    def wrapped() -> Iterator[Any]:
        it = source()
        while True:
            with nvtx_range(name, True):
                item = next(it, _END)
            if item is _END:
                return
            yield item

    return wrapped


_END = object()
