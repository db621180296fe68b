"""Detection and segmentation targets as they cross stages: boxes packed in one tensor with
per-image counts (:class:`Boxes`), and a (B, H, W) label map per batch (:class:`Targets`).

The decode stage makes them (from the encoded batch's annotations, moved with the decode's
crop and resize), the augment stage moves them with the images
(:mod:`gpupipe.augment.targets`), and the training step receives them, packed or as
torchvision's list of per-image dicts. Boxes are absolute ``xyxy`` pixels in the image's
frame (pixel edges: an image of width ``W`` spans ``[0, W]``).

``TARGET_KINDS`` are the names a source's ``targets`` setting takes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gpupipe.core.targetkinds import TARGET_KINDS, ragged_rows, target_kinds

__all__ = ["Boxes", "Targets", "TARGET_KINDS", "target_kinds", "ragged_rows"]

@dataclass(frozen=True)
class Boxes:
    """The boxes of a batch of B images, packed: ``boxes`` (N, 4) float xyxy in absolute
    pixels, ``labels`` (N,) int64, ``counts`` (B,) int64 — image i owns the ``counts[i]``
    rows after ``offsets[i]``. An image without boxes has count 0."""

    boxes: torch.Tensor
    labels: torch.Tensor
    counts: torch.Tensor

    def __post_init__(self) -> None:
        if self.boxes.ndim != 2 or self.boxes.shape[-1] != 4:
            raise ValueError(f"boxes should be (N, 4) xyxy, got shape {tuple(self.boxes.shape)}")
        if not self.boxes.is_floating_point():
            raise TypeError(f"boxes should be a float tensor, got {self.boxes.dtype}; convert with .float()")
        if self.labels.shape != self.boxes.shape[:1]:
            raise ValueError(f"labels should be ({self.boxes.shape[0]},), one per box, got {tuple(self.labels.shape)}")
        if self.counts.ndim != 1:
            raise ValueError(f"counts should be (B,), got shape {tuple(self.counts.shape)}")

    @property
    def offsets(self) -> torch.Tensor:
        """(B,) int64: the first row of each image's boxes."""
        return torch.cumsum(self.counts, 0) - self.counts

    @property
    def image_index(self) -> torch.Tensor:
        """(N,) int64: the image each box belongs to (no device sync: N is known)."""
        batch = torch.arange(self.counts.shape[0], device=self.counts.device)
        return torch.repeat_interleave(batch, self.counts, output_size=self.boxes.shape[0])


@dataclass(frozen=True)
class Targets:
    """What moves with a batch of images: ``boxes`` (:class:`Boxes`) and ``masks`` (B, H, W)
    uint8 label maps of the images' size; either may be None."""

    boxes: Boxes | None = None
    masks: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.masks is not None and self.masks.ndim != 3:
            raise ValueError(f"masks should be (B, H, W), one label map per image, got shape {tuple(self.masks.shape)}")

    def __len__(self) -> int:
        if self.boxes is not None:
            return int(self.boxes.counts.shape[0])
        return 0 if self.masks is None else int(self.masks.shape[0])

    def per_image(self) -> list[dict[str, torch.Tensor]]:
        """As torchvision detection models take them: one dict per image with ``"boxes"``
        (n, 4) xyxy, ``"labels"`` (n,) and ``"masks"`` (H, W), plain tensors (views)."""
        out: list[dict[str, torch.Tensor]] = [{} for _ in range(len(self))]
        if self.boxes is not None:
            sizes = self.boxes.counts.tolist()
            for d, b, lab in zip(out, self.boxes.boxes.split(sizes), self.boxes.labels.split(sizes)):
                d["boxes"], d["labels"] = b, lab
        if self.masks is not None:
            for d, m in zip(out, self.masks):
                d["masks"] = m
        return out

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Targets:
        """These targets on ``device``."""
        boxes = None if self.boxes is None else Boxes(*(t.to(device, non_blocking=non_blocking) for t in (
            self.boxes.boxes, self.boxes.labels, self.boxes.counts)))
        masks = None if self.masks is None else self.masks.to(device, non_blocking=non_blocking)
        return Targets(boxes, masks)
