"""torchvision v2's ``RandomIoUCrop`` (SSD's crop), per sample on a batch, resized to one size.

torchvision's rule, per image: draw a minimum IoU from ``sampler_options`` (1.0 or more:
leave the image as it is); then up to ``trials`` times a crop — width and height each
``int(side * uniform(min_scale, max_scale))``, aspect ratio within
[``min_aspect_ratio``, ``max_aspect_ratio``], top-left ``int((side - crop) * uniform)`` —
kept if some box has its centre strictly inside it and one of those boxes overlaps it by
at least that IoU; if no trial is kept, draw the IoU again. Boxes are cropped and clamped;
a box whose centre is outside the crop becomes ``[0, 0, 0, 0]``, for a
``SanitizeBoundingBoxes`` after it to remove (torchvision's warning applies: follow it with one).

Here every candidate is drawn up front (``make_params``: 16 rounds of ``trials`` crops a
sample, from the key; only the image size is needed) and the crop is settled by the boxes
that reach the transform (``resolve_targets``): all candidates scored against all boxes of
their image at once, the first kept one in torchvision's order wins. torchvision loops until
it finds one; a sample that finds none in 16 rounds (with the default options, one without
any box inside every crop: torchvision would also end at "leave it") is left as it is.

The size. torchvision returns the crop at its own size, and its detection references resize
afterwards; a batch has one size, so the crop is resized here, as ``RandomResizedCrop``
does: to ``size`` (an int: square; (h, w)) or, by default, back to the input's size (then
``RandomIoUCrop()`` drops into a pipeline unchanged, and a ``Resize`` after it works as in
torchvision). The image is torchvision's ``F.resized_crop`` (crop, then resize with
``antialias``), the masks nearest, the boxes scaled; so the result equals torchvision's
``RandomIoUCrop`` followed by ``Resize(size)`` with the same crop. Not fused into a
neighbour's warp, for ``RandomResizedCrop``'s reason (the resize reads only the crop).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from . import resample
from .keys import draw
from .targets import Targets, move_boxes
from .warp import HW, RESIZE_INTERPOLATIONS, GeometricTransform, box_matrix, check_interpolation, setup_size

__all__ = ["RandomIoUCrop"]

ROUNDS = 16  # IoU draws per sample (torchvision: until one gives a crop)
_NEEDS_BOXES = ("RandomIoUCrop() requires input sample to contain tensor or PIL images and bounding boxes. "
                "Sample can also contain masks.")


class RandomIoUCrop(GeometricTransform):
    """torchvision ``RandomIoUCrop(min_scale, max_scale, min_aspect_ratio, max_aspect_ratio,
    sampler_options, trials)``, then resized to ``size`` (default: the input's size) with
    ``interpolation`` and ``antialias`` (see the module docstring for why and what it equals).
    Needs boxes: called without targets (or with masks alone) it raises torchvision's
    ``TypeError``. Follow it with ``SanitizeBoundingBoxes``.

    Params: ``cand`` (B, 16, trials, 4) float32 candidate crops (top, left, height, width),
    ``drawable`` (B, 16, trials) bool (size and aspect ratio allow it), ``option`` (B, 16)
    float32 minimum IoUs; settled by the boxes: ``top``, ``left``, ``height``, ``width`` (B,)
    float32 and ``crop`` (B,) bool (False: the whole image).

    Shape: (B, C, H, W) → (B, C, *size) of the input's dtype; boxes (N, 4), masks (B, *size)."""

    samples_outside = False
    warps_alone = False

    def __init__(self, min_scale: float = 0.3, max_scale: float = 1.0, min_aspect_ratio: float = 0.5,
                 max_aspect_ratio: float = 2.0, sampler_options: Sequence[float] | None = None, trials: int = 40,
                 *, size=None, interpolation="bilinear", antialias: bool = True) -> None:
        super().__init__()
        if not 0 < float(min_scale) <= float(max_scale):
            raise ValueError(f"RandomIoUCrop: expected 0 < min_scale <= max_scale, got {min_scale}, {max_scale}")
        if not 0 < float(min_aspect_ratio) <= float(max_aspect_ratio):
            raise ValueError(f"RandomIoUCrop: expected 0 < min_aspect_ratio <= max_aspect_ratio, got "
                             f"{min_aspect_ratio}, {max_aspect_ratio}")
        if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
            raise ValueError(f"RandomIoUCrop: trials should be a positive integer, got {trials!r}")
        options = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0] if sampler_options is None else [float(v) for v in sampler_options]
        if not options:
            raise ValueError("RandomIoUCrop: sampler_options should hold at least one minimum IoU")
        self.min_scale, self.max_scale = float(min_scale), float(max_scale)
        self.min_aspect_ratio, self.max_aspect_ratio = float(min_aspect_ratio), float(max_aspect_ratio)
        self.options, self.trials = options, trials
        self.size = None if size is None else setup_size(size)
        self.interpolation = check_interpolation(interpolation, RESIZE_INTERPOLATIONS)
        self.antialias = bool(antialias)

    def output_size(self, in_hw: HW) -> HW:
        return tuple(in_hw) if self.size is None else self.size  # type: ignore[return-value]

    def fuses(self, in_hw: HW) -> bool:
        return False

    def make_params(self, images: torch.Tensor, key) -> dict[str, torch.Tensor]:
        """Every candidate as torchvision draws it (float32 arithmetic, truncated to whole pixels)."""
        H, W = int(images.shape[-2]), int(images.shape[-1])
        B, T = int(key.sample_ids.shape[0]), self.trials
        pick = (draw(key, 0, ROUNDS) * len(self.options)).floor().clamp_(max=len(self.options) - 1).to(torch.int64)
        options = torch.tensor(self.options, dtype=torch.float32).to(pick.device, non_blocking=True)
        u = draw(key, 1, ROUNDS * T * 4).reshape(B, ROUNDS, T, 4)
        r = self.min_scale + (self.max_scale - self.min_scale) * u[..., :2]
        new_w, new_h = (W * r[..., 0]).floor(), (H * r[..., 1]).floor()
        aspect = new_w.double() / new_h.double().clamp(min=1)
        drawable = (new_w > 0) & (new_h > 0) & (aspect >= self.min_aspect_ratio) & (aspect <= self.max_aspect_ratio)
        left, top = ((W - new_w) * u[..., 2]).floor(), ((H - new_h) * u[..., 3]).floor()
        return {"cand": torch.stack([top, left, new_h, new_w], -1), "drawable": drawable, "option": options[pick]}

    def resolve_targets(self, targets: Targets, params: dict[str, torch.Tensor],
                        in_hw: HW) -> tuple[dict[str, torch.Tensor], Targets]:
        """The crop each sample keeps, by the boxes that reach it; the targets cropped and resized."""
        if targets.boxes is None:
            raise TypeError(_NEEDS_BOXES + " (pass targets with boxes)")
        boxes = targets.boxes
        B, T = int(boxes.counts.shape[0]), self.trials
        cand = params["cand"].to(boxes.boxes.device)
        best = torch.full((B, ROUNDS * T), -1.0, dtype=boxes.boxes.dtype, device=cand.device)
        if boxes.boxes.shape[0]:
            score = _within_iou(boxes.boxes, cand[boxes.image_index].reshape(-1, ROUNDS * T, 4))
            best.scatter_reduce_(0, boxes.image_index[:, None].expand_as(score), score, "amax")
        best = best.reshape(B, ROUNDS, T)
        option = params["option"].to(cand.device)
        kept = params["drawable"].to(cand.device) & (best >= 0) & (best >= option[..., None])
        stop = option >= 1.0  # "leave it as it is"
        event = stop | kept.any(-1)
        round_ = event.to(torch.uint8).argmax(1)  # the first round that ends the search (0 if none)
        crop = event.any(1) & ~stop.gather(1, round_[:, None])[:, 0]
        trial = kept.gather(1, round_[:, None, None].expand(B, 1, T))[:, 0].to(torch.uint8).argmax(1)
        chosen = cand.reshape(B, ROUNDS * T, 4).gather(1, (round_ * T + trial)[:, None, None].expand(B, 1, 4))[:, 0]
        top, left, height, width = (torch.where(crop, c, float(v))  # else the whole image (scalars: no copy)
                                    for c, v in zip(chosen.unbind(-1), (0, 0, in_hw[0], in_hw[1])))
        settled = {**params, "top": top, "left": left, "height": height, "width": width, "crop": crop}
        return settled, self._move(targets, settled, in_hw)

    def apply_targets(self, targets: Targets, params: dict[str, torch.Tensor], in_hw: HW) -> Targets:
        return self.resolve_targets(targets, params, in_hw)[1]

    def _move(self, targets: Targets, params: dict[str, torch.Tensor], in_hw: HW) -> Targets:
        """Boxes cropped, resized and clamped, those whose centre left the crop zeroed (as
        torchvision marks them); masks cut out and resized nearest."""
        boxes = targets.boxes
        if boxes is not None:
            moved = move_boxes(boxes, self.matrix(params, in_hw), self.output_size(in_hw))
            box = torch.stack([params[k] for k in ("top", "left", "height", "width")], -1)[boxes.image_index]
            inside = _within_iou(boxes.boxes, box[:, None].to(boxes.boxes.dtype))[:, 0] >= 0
            dropped = params["crop"][boxes.image_index] & ~inside
            boxes = replace(moved, boxes=torch.where(dropped[:, None], 0.0, moved.boxes))
        masks = None if targets.masks is None else self.transform_masks(targets.masks, params, in_hw)
        return Targets(boxes, masks)

    def _settled(self, params: dict[str, torch.Tensor]) -> None:
        if "crop" not in params:
            raise TypeError(_NEEDS_BOXES + " (call it with targets=, holding boxes)")

    def matrix(self, params, in_hw):
        self._settled(params)
        return box_matrix(params["top"], params["left"], params["height"], params["width"], self.output_size(in_hw))

    def transform(self, images, params):
        self._settled(params)
        return resample.resized_crop(images, params["top"], params["left"], params["height"], params["width"],
                                     self.output_size((int(images.shape[-2]), int(images.shape[-1]))),
                                     self.interpolation or "bilinear", self.antialias)

    def transform_masks(self, masks, params, in_hw):
        self._settled(params)
        mode = "nearest-exact" if self.interpolation == "nearest-exact" else "nearest"
        return resample.resized_crop(masks[:, None], params["top"], params["left"], params["height"], params["width"],
                                     self.output_size(in_hw), mode, False)[:, 0]


def _within_iou(boxes: torch.Tensor, crops: torch.Tensor) -> torch.Tensor:
    """(N, K): box n's IoU with each of its K crops (torchvision's ``box_iou``, in the boxes'
    dtype) where its centre lies strictly inside the crop, else -1. ``boxes`` (N, 4) xyxy,
    ``crops`` (N, K, 4) (top, left, height, width)."""
    top, left, h, w = crops.to(boxes.dtype).unbind(-1)
    right, bottom = left + w, top + h
    x1, y1, x2, y2 = (c[:, None] for c in boxes.unbind(-1))
    cx, cy = 0.5 * (x1 + x2), 0.5 * (y1 + y2)
    within = (left < cx) & (cx < right) & (top < cy) & (cy < bottom)
    inter = (torch.minimum(x2, right) - torch.maximum(x1, left)).clamp(min=0) \
        * (torch.minimum(y2, bottom) - torch.maximum(y1, top)).clamp(min=0)
    union = (x2 - x1) * (y2 - y1) + (right - left) * (bottom - top) - inter
    return torch.where(within, inter / union, -1.0)
