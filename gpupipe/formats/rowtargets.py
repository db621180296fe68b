"""Parquet target columns → the members of a sample with targets (:mod:`gpupipe.formats.annotations`).

A Parquet source asked for targets reads ``boxes`` (``list<list<float>>`` of ``[x1, y1, x2, y2]``
absolute pixels, or a flat ``list<float>`` of ``4n`` values) with ``box_labels`` (``list<int>``, a
class index per box), and ``mask`` (binary: an 8-bit PNG of class indices): :data:`TARGET_COLUMNS`.
:func:`check_target_types` refuses a file without them (naming the column and the file);
:func:`row_targets` turns one row's cells into ``json`` / ``mask.png`` members, or says why the row
has none that are usable. :mod:`gpupipe.formats.rowgroups` finds their column chunks and reads them.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gpupipe.core.errors import ConfigError
from gpupipe.formats.annotations import BOXES_FIELD, MASK_FIELD, encode_boxes

__all__ = ["TARGET_COLUMNS", "row_targets", "check_target_types"]

TARGET_COLUMNS = {"boxes": ("boxes", "box_labels"), "masks": ("mask",)}  # the columns of each target kind
_PNG = b"\x89PNG\r\n\x1a\n"


def row_targets(cells: Mapping[str, Any], num_classes: int | None) -> tuple[dict[str, bytes], str]:
    """A row's target members (``json``, ``mask.png``) from its target cells, or why it has none
    that are usable."""
    out: dict[str, bytes] = {}
    if "boxes" in cells:
        boxes, labels = cells["boxes"], cells["box_labels"]
        if boxes is None or labels is None:
            return {}, f"the {'boxes' if boxes is None else 'box_labels'} cell is null (an image without boxes " \
                       "has empty lists)"
        flat = _flat(boxes)
        if flat is None or len(flat) % 4 or any(v is None or not np.isfinite(v) for v in flat):
            return {}, f"boxes {_preview(boxes)} are not [x1, y1, x2, y2] lists of four finite numbers"
        xyxy = np.array(flat, dtype=np.float64).reshape(-1, 4)
        negative = np.flatnonzero((xyxy[:, 2] < xyxy[:, 0]) | (xyxy[:, 3] < xyxy[:, 1]))
        if len(negative):
            return {}, f"box {int(negative[0])} {xyxy[negative[0]].tolist()} has a negative width or height"
        if len(labels) != len(xyxy):
            return {}, f"{len(xyxy)} boxes and {len(labels)} box_labels; give one class index per box"
        bad = [v for v in labels if v is None or v < 0 or (num_classes is not None and v >= num_classes)]
        if bad:
            within = f"0..{num_classes - 1}" if num_classes is not None else ">= 0"
            return {}, f"box label {bad[0]!r} is not a class index ({within})"
        out[BOXES_FIELD] = encode_boxes(xyxy.astype(np.float32), labels)
    if "mask" in cells:
        mask = cells["mask"]
        if mask is None or not bytes(mask[:8]) == _PNG:
            return {}, "the mask cell is null" if mask is None else "the mask cell is not a PNG image"
        out[MASK_FIELD] = mask
    return out, ""


def _flat(boxes: list) -> list | None:
    """The values of a ``boxes`` cell in one list: a flat ``list<float>`` as it is, a
    ``list<list<float>>`` joined when every box has four values (else ``None``)."""
    if all(isinstance(v, (int, float)) for v in boxes):
        return boxes
    if all(isinstance(b, list) and len(b) == 4 for b in boxes):
        return [v for b in boxes for v in b]
    return None  # a box of another length, or a null among the values or boxes


def _preview(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_target_types(schema, wanted: Sequence[str], url: str) -> None:
    import pyarrow as pa

    def numbers(t) -> bool:
        return pa.types.is_floating(t) or pa.types.is_integer(t)

    def is_list(t) -> bool:
        return pa.types.is_list(t) or pa.types.is_large_list(t)

    expect = {"boxes": ("list<list<float>> of [x1, y1, x2, y2], or list<float> of 4n values",
                        lambda t: is_list(t) and (numbers(t.value_type) or (is_list(t.value_type) and
                                                                            numbers(t.value_type.value_type)))),
              "box_labels": ("list<int>, one class index per box",
                             lambda t: is_list(t) and pa.types.is_integer(t.value_type)),
              "mask": ("binary (a PNG)", lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t))}
    for name in wanted:
        what, ok = expect[name]
        if name not in schema.names:
            raise ConfigError(f"source.targets: {url} has no {name!r} column ({what}); its columns are "
                              f"{schema.names}")
        if not ok(schema.field(name).type):
            raise ConfigError(f"source.targets: column {name!r} of {url} is {schema.field(name).type}; it must be "
                              f"{what}")
