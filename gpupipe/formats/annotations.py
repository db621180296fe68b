"""Detection and segmentation annotations at rest: one place that reads and writes them.

A sample with targets carries, beside its image (WebDataset members ``<key>.<ext>``):

* ``<key>.json`` — its boxes: ``{"boxes": [[x1, y1, x2, y2], ...], "labels": [c, ...]}``.
  Boxes are absolute pixels of the image as decoded (upright: after its EXIF orientation),
  in ``xyxy`` unless ``"box_format": "xywh"`` says COCO's ``[x, y, width, height]``.
  ``labels`` are class indices (``0 <= c < len(classes)`` when the index lists classes), one
  per box. An image without objects is ``{"boxes": [], "labels": []}``. Other keys are kept
  at rest and ignored here (a caption, an image id).
* ``<key>.mask.png`` — its segmentation mask: an 8-bit grayscale (or palette) PNG of the
  image's size whose pixel values are class indices (the palette's indices, not its colours).

Parquet rows and COCO files are turned into these two fields by their readers
(:mod:`gpupipe.formats.rowgroups`, :mod:`gpupipe.formats.coco`), so every source gives the
same samples and ``gpupipe ingest`` writes what it read.

A bad annotation raises :class:`~gpupipe.core.errors.ShardFormatError` naming the sample:
JSON that does not parse, a box that is not four finite numbers, a negative width or
height, a label count that is not the box count, a label outside the class list. (A box
outside its image and a mask of another size are found where the image's size is known,
in the decode stage.)
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np

from gpupipe.core.errors import ShardFormatError

__all__ = ["BOXES_FIELD", "MASK_FIELD", "BOX_FORMATS", "parse_boxes", "encode_boxes"]

BOXES_FIELD = "json"  # the sample member holding its boxes
MASK_FIELD = "mask.png"  # the sample member holding its mask
BOX_FORMATS = ("xyxy", "xywh")


def parse_boxes(data: bytes | memoryview, key: str, num_classes: int | None = None, *, shard: str = "",
                offset: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(boxes, labels)`` of a sample's ``.json``: (n, 4) float32 absolute ``xyxy``, (n,) int64.
    ``num_classes``: labels must be below it (``None``: any label >= 0)."""

    def bad(what: str) -> ShardFormatError:
        return ShardFormatError(f"sample {key!r}: .{BOXES_FIELD} {what}", shard=shard, offset=offset)

    try:
        doc = json.loads(bytes(data))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad(f"does not parse as JSON ({exc})") from None
    if not isinstance(doc, dict) or "boxes" not in doc:
        raise bad('should be an object with "boxes" and "labels", e.g. {"boxes": [[x1, y1, x2, y2]], '
                  f'"labels": [0]}}; got {_preview(doc)}')
    boxes, labels = doc["boxes"], doc.get("labels")
    fmt = doc.get("box_format", "xyxy")
    if fmt not in BOX_FORMATS:
        raise bad(f"box_format {fmt!r} is not one of {', '.join(BOX_FORMATS)}")
    if not isinstance(boxes, list):
        raise bad(f'"boxes" should be a list of [x1, y1, x2, y2], got {_preview(boxes)}')
    if labels is None or not isinstance(labels, list) or len(labels) != len(boxes):
        given = "none" if labels is None else (f"{len(labels)}" if isinstance(labels, list) else _preview(labels))
        raise bad(f'has {len(boxes)} boxes and {given} labels; "labels" should give one class index per box')
    out = np.empty((len(boxes), 4), dtype=np.float64)
    for i, box in enumerate(boxes):
        if not (isinstance(box, list) and len(box) == 4
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in box)):
            raise bad(f"box {i} is {_preview(box)}, not four finite numbers")
        out[i] = box
    if fmt == "xywh":
        out[:, 2:] += out[:, :2]
    negative = np.flatnonzero((out[:, 2] < out[:, 0]) | (out[:, 3] < out[:, 1]))
    if len(negative):
        i = int(negative[0])
        raise bad(f"box {i} {boxes[i]} ({fmt}) has a negative width or height")
    cls = np.empty(len(labels), dtype=np.int64)
    for i, label in enumerate(labels):
        if not isinstance(label, int) or isinstance(label, bool) or label < 0 or (
                num_classes is not None and label >= num_classes):
            within = f"0..{num_classes - 1}" if num_classes is not None else ">= 0"
            raise bad(f"label {i} is {label!r}, not a class index ({within})")
        cls[i] = label
    return out.astype(np.float32), cls


def encode_boxes(boxes: np.ndarray | Sequence[Sequence[float]], labels: np.ndarray | Sequence[int]) -> bytes:
    """The ``.json`` member for (n, 4) absolute ``xyxy`` boxes and their (n,) class indices:
    what :func:`parse_boxes` reads back exactly (float32 values written in full)."""
    b = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    lab = np.asarray(labels, dtype=np.int64).reshape(-1)
    if len(lab) != len(b):
        raise ValueError(f"{len(b)} boxes and {len(lab)} labels; give one label per box")
    doc = {"boxes": [[_number(v) for v in row] for row in b.tolist()], "labels": [int(v) for v in lab]}
    return json.dumps(doc, separators=(",", ":")).encode()


def _number(v: float) -> float | int:
    return int(v) if float(v).is_integer() else v


def _preview(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
