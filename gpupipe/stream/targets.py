"""A sample's boxes and masks on the worker side: read from its fields, kept as columns.

:func:`read_targets` takes what a source's ``targets`` name from a sample's fields (the layout
at rest is :mod:`gpupipe.formats.annotations`'): its boxes from the ``json`` member, parsed and
checked, and its ``mask.png`` member, still encoded. A sample without a requested member, or
with boxes that do not parse, raises :class:`~gpupipe.core.errors.ShardFormatError` naming it;
the stream then follows ``on_error`` as for an unreadable image.

:class:`TargetColumns` keeps them beside a :class:`~gpupipe.stream.batch.SampleTable`'s other
columns: the boxes of all samples in one ``(N, 4)`` array with a count per sample, and where each
encoded mask lies in the table's buffers, as for the images. Shuffling and batching reindex the
columns (the ragged boxes with one ``np.repeat``), never an object per sample.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpupipe.core.errors import ShardFormatError
from gpupipe.core.targetkinds import ragged_rows
from gpupipe.core.types import Sample
from gpupipe.formats.annotations import BOXES_FIELD, MASK_FIELD, parse_boxes

__all__ = ["SampleTargets", "TargetColumns", "read_targets", "member_fields"]

_NO_BOXES = np.zeros((0, 4), np.float32)
_NO_LABELS = np.zeros(0, np.int64)


@dataclass(frozen=True)
class SampleTargets:
    """One sample's targets: ``boxes`` (n, 4) float32 absolute ``xyxy`` and ``labels`` (n,) int64
    (``None``: boxes not carried), ``mask`` its encoded PNG (``None``: masks not carried; empty
    for a placeholder)."""

    boxes: np.ndarray | None = None
    labels: np.ndarray | None = None
    mask: bytes | memoryview | np.ndarray | None = None


def member_fields(kinds: Sequence[str]) -> tuple[str, ...]:
    """The sample members holding ``kinds`` (``"boxes"`` → ``json``, ``"masks"`` → ``mask.png``)."""
    return tuple(f for k, f in (("boxes", BOXES_FIELD), ("masks", MASK_FIELD)) if k in kinds)


def read_targets(sample: Sample, kinds: Sequence[str], num_classes: int | None = None) -> SampleTargets:
    """The ``kinds`` of ``sample`` from its fields; ``ShardFormatError`` naming the sample when a
    member is missing or empty, or its boxes do not parse (:func:`~gpupipe.formats.annotations.parse_boxes`).
    A placeholder (no fields) has no boxes and an empty mask."""
    placeholder = not sample.fields
    boxes = labels = mask = None

    def member(field: str, kind: str):
        data = sample.fields.get(field)
        if data is None or not len(data):
            what = "is empty" if data is not None else f"is missing (has {sorted(sample.fields)})"
            raise ShardFormatError(f"sample {sample.key!r}: .{field} member ({kind}) {what}", shard=sample.shard,
                                   offset=sample.offset)
        return data

    if "boxes" in kinds:
        if placeholder:
            boxes, labels = _NO_BOXES, _NO_LABELS
        else:
            boxes, labels = parse_boxes(member(BOXES_FIELD, "boxes"), sample.key, num_classes, shard=sample.shard,
                                        offset=sample.offset)
    if "masks" in kinds:
        mask = b"" if placeholder else member(MASK_FIELD, "masks")
    return SampleTargets(boxes, labels, mask)


@dataclass(frozen=True)
class TargetColumns:
    """The targets of a table's n samples, as columns (a kind not carried is ``None``).

    Boxes: ``box_counts`` (n,) int64 — sample i owns the ``box_counts[i]`` rows of ``boxes``
    (N, 4) float32 and ``box_labels`` (N,) int64 after those of the samples before it. Masks:
    encoded mask i is bytes ``[mask_start[i], mask_start[i] + mask_size[i])`` of the table's
    ``buffers[mask_buffer[i]]`` (size 0: none, a placeholder).
    """

    box_counts: np.ndarray | None = None
    boxes: np.ndarray | None = None
    box_labels: np.ndarray | None = None
    mask_buffer: np.ndarray | None = None
    mask_start: np.ndarray | None = None
    mask_size: np.ndarray | None = None

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(k for k, c in (("boxes", self.box_counts), ("masks", self.mask_size)) if c is not None)

    @classmethod
    def from_parsed(cls, parsed: Sequence[SampleTargets], kinds: Sequence[str], first_buffer: int
                    ) -> tuple[TargetColumns, tuple]:
        """Columns of the samples' parsed targets, and the buffers their masks are in (one
        each, numbered from ``first_buffer`` in the table's buffers)."""
        n = len(parsed)
        out: dict[str, np.ndarray] = {}
        masks: tuple = ()
        if "boxes" in kinds:
            out["box_counts"] = np.fromiter((len(p.boxes) for p in parsed), np.int64, count=n)  # type: ignore[arg-type]
            out["boxes"] = np.concatenate([_NO_BOXES] + [p.boxes for p in parsed]).astype(np.float32, copy=False)
            out["box_labels"] = np.concatenate([_NO_LABELS] + [p.labels for p in parsed]).astype(np.int64, copy=False)
        if "masks" in kinds:
            masks = tuple(p.mask for p in parsed)
            out["mask_buffer"] = np.arange(first_buffer, first_buffer + n, dtype=np.int64)
            out["mask_start"] = np.zeros(n, np.int64)
            out["mask_size"] = np.fromiter((len(m) for m in masks), np.int64, count=n)
        return cls(**out), masks

    def take(self, index: np.ndarray | slice) -> TargetColumns:
        """The targets of the samples at ``index``, in that order."""
        out: dict[str, np.ndarray | None] = {}
        if self.box_counts is not None:
            assert self.boxes is not None and self.box_labels is not None, "boxes come together"
            out["box_counts"], rows = ragged_rows(self.box_counts, index)
            out["boxes"], out["box_labels"] = self.boxes[rows], self.box_labels[rows]
        if self.mask_size is not None:
            assert self.mask_buffer is not None and self.mask_start is not None, "masks come together"
            out.update(mask_buffer=self.mask_buffer[index], mask_start=self.mask_start[index],
                       mask_size=self.mask_size[index])
        return TargetColumns(**out)

    def only(self, keep: np.ndarray) -> TargetColumns:
        """The same samples, those where ``keep`` is false without boxes and with an empty mask."""
        if keep.all():
            return self
        out: dict[str, np.ndarray | None] = {}
        if self.box_counts is not None:
            assert self.boxes is not None and self.box_labels is not None, "boxes come together"
            rows = np.repeat(keep, self.box_counts)
            out.update(box_counts=np.where(keep, self.box_counts, 0), boxes=self.boxes[rows],
                       box_labels=self.box_labels[rows])
        if self.mask_size is not None:
            out.update(mask_buffer=self.mask_buffer, mask_start=self.mask_start,
                       mask_size=np.where(keep, self.mask_size, 0))
        return TargetColumns(**out)

    @classmethod
    def concat(cls, columns: Sequence[TargetColumns], first_buffers: Sequence[int]) -> TargetColumns:
        """One after another; the mask buffers of ``columns[i]`` are numbered from ``first_buffers[i]``."""
        kinds = {c.kinds for c in columns}
        if len(kinds) != 1:
            raise ValueError(f"tables with different target kinds {sorted(kinds)} cannot be joined")
        out: dict[str, np.ndarray] = {}
        if columns[0].box_counts is not None:
            for name in ("box_counts", "boxes", "box_labels"):
                out[name] = np.concatenate([getattr(c, name) for c in columns])
        if columns[0].mask_size is not None:
            out["mask_buffer"] = np.concatenate([c.mask_buffer + f for c, f in zip(columns, first_buffers)])  # type: ignore[operator]
            out["mask_start"] = np.concatenate([c.mask_start for c in columns])
            out["mask_size"] = np.concatenate([c.mask_size for c in columns])
        return cls(**out)
