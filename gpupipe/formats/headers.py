"""The headers of a batch of encoded images, probed once, as columns.

:func:`probe_batch` runs :func:`~gpupipe.formats.imageheader.probe` and
:func:`~gpupipe.formats.imageheader.check_complete` on every image of a batch — in a DataLoader
worker, where the bytes are read — and keeps the verdicts as a :class:`ProbedHeaders`: the
batch's *distinct* headers and, per image, which one it has (or why it was refused). Images of
one encoder share their header byte for byte, and the probe hands out one header object per
distinct header (:mod:`gpupipe.formats.jpeg` remembers whole walks), so a batch of 256 usually
carries a handful of headers and an index: cheap to send to the training process, and every
per-image question there (sizes, orientation, which decoder) is a lookup in a small table
indexed by a numpy array, not a Python call per image.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpupipe.core.errors import DecodeError
from gpupipe.formats.imageheader import ImageHeader, check_complete, probe

__all__ = ["ProbedHeaders", "probe_batch", "upright_hw"]


@dataclass(frozen=True)
class ProbedHeaders:
    """The probe's verdict on B images.

    ``table``: the distinct headers; ``index`` (B,) int32: image i's header is
    ``table[index[i]]``, -1 where it was refused, and ``reasons[i]`` says why (the
    :class:`~gpupipe.core.errors.DecodeError`'s text). ``max_pixels``: the limit the probe
    checked (a decoder with another limit probes again).
    """

    table: tuple[ImageHeader, ...]
    index: np.ndarray
    reasons: Mapping[int, str]
    max_pixels: int | None

    def __len__(self) -> int:
        return len(self.index)

    def headers(self) -> list[ImageHeader | None]:
        """Image i's header, or None where it was refused (a list lookup per image, in C)."""
        table: tuple[ImageHeader | None, ...] = (*self.table, None)
        return [table[j] for j in self.index.tolist()]

    def per_header(self, values: Sequence, missing) -> np.ndarray:
        """``values[j]`` for each distinct header j, spread to the images: (B, ...) with
        ``missing`` where an image was refused."""
        table = np.asarray([*values, missing])
        return table[self.index]


def upright_hw(header: ImageHeader) -> tuple[int, int]:
    """(height, width) as displayed, after the EXIF orientation is applied."""
    if header.orientation in (5, 6, 7, 8):
        return header.width, header.height
    return header.height, header.width


def probe_batch(images: Sequence, max_pixels: int | None) -> ProbedHeaders:
    """Probe every image of ``images`` (bytes-like, one per image): magic bytes, header,
    ``max_pixels`` and completeness, as :func:`~gpupipe.formats.imageheader.probe` and
    :func:`~gpupipe.formats.imageheader.check_complete` do one image at a time."""
    index = np.empty(len(images), dtype=np.int32)
    table: list[ImageHeader] = []
    seen: dict[int, int] = {}  # id of a header object -> its place in the table
    reasons: dict[int, str] = {}
    for i, data in enumerate(images):
        try:
            header = probe(data, max_pixels=max_pixels)
            check_complete(data, header)
        except DecodeError as exc:
            index[i], reasons[i] = -1, str(exc)
            continue
        j = seen.get(id(header))
        if j is None:
            j = seen[id(header)] = len(table)
            table.append(header)
        index[i] = j
    return ProbedHeaders(tuple(table), index, reasons, max_pixels)
