"""Detection and segmentation targets that travel with a batch: boxes packed in one tensor
with per-image counts, a (B, H, W) mask, and the functions that move them through a
geometric transform's per-sample 3×3 matrix (:func:`~gpupipe.augment.warp.move_boxes`,
:func:`~gpupipe.augment.warp.move_masks`, beside the warp they follow; named here too).

Boxes are absolute ``xyxy`` in torchvision's frame: pixel *edges*, an image of width ``W``
spans ``[0, W]``. The warp's matrices work on pixel *centres* (``[-0.5, W - 0.5]``), so a box
is moved by ``shift(+0.5) · M · shift(-0.5)``. As torchvision does for every box format, the
four corners are moved, the box around them kept (a rotated box grows to enclose its
rotated corners) and clamped to the output canvas ``[0, w] × [0, h]``.

Masks are one label map per image, (B, H, W) uint8, moved by nearest-neighbour sampling
only (torchvision's ``Mask`` rule), so no label is ever blended with another.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from gpupipe.core.targets import Boxes, Targets

from .base import Transform, check_targets
from .warp import move_boxes, move_masks

__all__ = ["Boxes", "Targets", "check_targets", "move_boxes", "move_masks", "select_targets", "sanitize_boxes",
           "SanitizeBoundingBoxes", "ClampBoundingBoxes", "ConvertBoundingBoxFormat", "pack_targets", "unpack_targets"]

HW = tuple[int, int]


def select_targets(chosen: torch.Tensor, a: Targets, b: Targets) -> Targets:
    """Per image, ``a``'s targets where ``chosen`` (B,) bool, else ``b``'s: how a container keeps
    the branch each sample took. Boxes of the same layout (both branches moved the same boxes:
    one ``counts``) are one ``torch.where``; after a branch that dropped boxes, each image's rows
    are gathered from its branch (a device sync, as any filter)."""
    if (a.boxes is None) != (b.boxes is None) or (a.masks is None) != (b.masks is None):
        raise ValueError("the branches of a container give different target kinds")
    boxes = None if a.boxes is None or b.boxes is None else _select_boxes(chosen, a.boxes, b.boxes)
    masks = None
    if a.masks is not None and b.masks is not None:
        if a.masks.shape != b.masks.shape:
            raise ValueError(f"the branches of a container give masks of {tuple(a.masks.shape)} and "
                             f"{tuple(b.masks.shape)}; the samples of a batch keep one size")
        masks = torch.where(chosen.to(a.masks.device).reshape(-1, 1, 1), a.masks, b.masks)
    return Targets(boxes, masks)


def _select_boxes(chosen: torch.Tensor, a: Boxes, b: Boxes) -> Boxes:
    chosen = chosen.to(a.boxes.device)
    if a.counts is b.counts:  # the same rows, moved two ways
        rows = chosen[a.image_index]
        return Boxes(torch.where(rows[:, None], a.boxes, b.boxes), torch.where(rows, a.labels, b.labels), a.counts)
    keep_a, keep_b = chosen[a.image_index], ~chosen[b.image_index]
    order = torch.sort(torch.cat([a.image_index[keep_a], b.image_index[keep_b]]), stable=True).indices
    return Boxes(torch.cat([a.boxes[keep_a], b.boxes[keep_b].to(a.boxes.dtype)])[order],
                 torch.cat([a.labels[keep_a], b.labels[keep_b]])[order], torch.where(chosen, a.counts, b.counts))


def sanitize_boxes(boxes: Boxes, canvas_hw: HW, min_size: float = 1.0, min_area: float = 1.0) -> Boxes:
    """torchvision's ``SanitizeBoundingBoxes`` rule on packed boxes: keep a box whose width and
    height are ≥ ``min_size``, area ≥ ``min_area``, coordinates ≥ 0 and within the canvas;
    its label goes with it and the counts follow. The result's size depends on the data (one
    device sync on CUDA, as any filter)."""
    b = boxes.boxes
    ws, hs = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    h, w = canvas_hw
    valid = (ws >= min_size) & (hs >= min_size) & (ws * hs >= min_area) & (b >= 0).all(dim=-1)
    valid &= (b[:, 0] <= w) & (b[:, 2] <= w) & (b[:, 1] <= h) & (b[:, 3] <= h)
    counts = torch.zeros_like(boxes.counts).index_add_(0, boxes.image_index, valid.to(boxes.counts.dtype))
    return Boxes(b[valid], boxes.labels[valid], counts)


class _BoxesOnly(Transform):
    """A transform of the boxes alone: images pass unchanged, in their dtype."""

    def output_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return dtype

    def transform(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        return images


class SanitizeBoundingBoxes(_BoxesOnly):
    """torchvision ``SanitizeBoundingBoxes(min_size=1, min_area=1)``: removes degenerate boxes
    and their labels (:func:`sanitize_boxes`); images and masks pass unchanged. Labels are
    always the packed ``Boxes.labels`` (torchvision's ``labels_getter`` has nothing to find)."""

    def __init__(self, min_size: float = 1.0, min_area: float = 1.0) -> None:
        super().__init__()
        if min_size < 1:
            raise ValueError(f"min_size must be >= 1, got {min_size}.")
        if min_area < 1:
            raise ValueError(f"min_area must be >= 1, got {min_area}.")
        self.min_size, self.min_area = float(min_size), float(min_area)

    def apply_targets(self, targets: Targets, params: dict[str, torch.Tensor], in_hw: HW) -> Targets:
        if targets.boxes is None:
            return targets
        return replace(targets, boxes=sanitize_boxes(targets.boxes, in_hw, self.min_size, self.min_area))


class ClampBoundingBoxes(_BoxesOnly):
    """torchvision v2 ``ClampBoundingBoxes()``: each box clamped to its image's canvas ``[0, W] ×
    [0, H]``; images, labels and masks pass unchanged. (Every geometric transform here clamps the
    boxes it moves already, as torchvision's do: this one matters after boxes came in unclamped.)"""

    keeps_targets = False

    def apply_targets(self, targets: Targets, params: dict[str, torch.Tensor], in_hw: HW) -> Targets:
        if targets.boxes is None:
            return targets
        b = targets.boxes.boxes
        h, w = in_hw
        limit = torch.tensor([w, h, w, h], dtype=b.dtype, device=b.device)
        return replace(targets, boxes=replace(targets.boxes, boxes=b.clamp(min=0).minimum(limit)))


class ConvertBoundingBoxFormat(_BoxesOnly):
    """torchvision v2 ``ConvertBoundingBoxFormat(format)`` to ``"XYXY"``: gpupipe's boxes are always
    absolute XYXY (a COCO file's XYWH boxes are converted when it is read; :func:`pack_targets`
    refuses other formats), so the conversion to XYXY passes everything unchanged; any other format
    raises ``ValueError``."""

    keeps_targets = True

    def __init__(self, format: Any = "XYXY") -> None:
        super().__init__()
        name = str(getattr(format, "name", format)).upper()
        if name != "XYXY":
            raise ValueError(f"ConvertBoundingBoxFormat({name!r}): gpupipe's boxes are absolute XYXY throughout "
                             "(a COCO file's XYWH boxes are converted when it is read); convert to another format "
                             "after the loader, e.g. torchvision.ops.box_convert(boxes, 'xyxy', 'xywh')")
        self.format = "XYXY"


def _plain(x: torch.Tensor) -> torch.Tensor:
    """A tv_tensor as a plain tensor (torchvision's subclasses would re-wrap every result)."""
    return x.as_subclass(torch.Tensor) if type(x) is not torch.Tensor else x


def pack_targets(targets: Sequence[Mapping[str, Any]], device: torch.device | str | None = None) -> Targets:
    """torchvision's per-image targets — a list of dicts with ``"boxes"`` ((n, 4) xyxy: a
    plain tensor or ``tv_tensors.BoundingBoxes`` in XYXY format), ``"labels"`` ((n,)) and
    ``"masks"`` ((H, W) or (1, H, W)), each key optional but the same in every dict — packed
    into :class:`Targets` (one concatenation: done once, off the hot path)."""
    if not targets:
        raise ValueError("targets should hold one dict per image, got none")
    keys = set(targets[0])
    if any(set(t) != keys for t in targets):
        raise ValueError(f"every image's targets should have the same keys, got {[sorted(t) for t in targets]}")
    boxes = masks = None
    if "boxes" in keys:
        per_image = []
        for i, t in enumerate(targets):
            fmt = getattr(t["boxes"], "format", None)
            if fmt is not None and getattr(fmt, "name", str(fmt)).upper() != "XYXY":
                raise ValueError(f"targets[{i}]['boxes'] is in {fmt} format; convert it to XYXY first "
                                 "(torchvision.transforms.v2.ConvertBoundingBoxFormat('XYXY'))")
            per_image.append(_plain(t["boxes"]).reshape(-1, 4).to(device=device))
        labels = [_plain(t["labels"]).reshape(-1).to(device=device, dtype=torch.int64) if "labels" in keys
                  else torch.zeros(len(b), dtype=torch.int64, device=device) for t, b in zip(targets, per_image)]
        packed = torch.cat(per_image)
        counts = torch.tensor([len(b) for b in per_image], dtype=torch.int64, device=packed.device)
        boxes = Boxes(packed if packed.is_floating_point() else packed.float(), torch.cat(labels).to(packed.device),
                      counts)
    if "masks" in keys:
        masks = torch.stack([_plain(t["masks"]).reshape(t["masks"].shape[-2:]) for t in targets]).to(device=device)
    return Targets(boxes, masks)


def unpack_targets(targets: Targets) -> list[dict[str, torch.Tensor]]:
    """:class:`Targets` as torchvision detection models take them (:meth:`Targets.per_image`)."""
    return targets.per_image()
