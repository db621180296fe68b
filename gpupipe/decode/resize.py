"""The CPU path's resize: each decoded image's crop box to the output size with torch's
antialiased bilinear resize on uint8.

DALI's CPU ``fn.resize`` takes 4-6x the CPU time of torch's uint8 kernel for the same
antialiased triangle filter (a 64-image batch, 1 thread: 250² → 128² 0.32 vs 0.08 ms an
image, 300² → 224² 0.63 vs 0.13; benchmarks/roi_probes.py ``resize``), and the resize was
half of a random_resized_crop decode. So without a GPU, DALI decodes (the whole image, or
the window of :mod:`gpupipe.decode.roi`) and this module crops and resizes; on a GPU DALI
still resizes on the device.
"""
from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor

import numpy as np
import torch
import torch.nn.functional as F

from gpupipe.core.machine import this_threads_intraop

__all__ = ["crop_and_resize"]


def crop_and_resize(images: Sequence[np.ndarray], start: np.ndarray, end: np.ndarray, relative: bool,
                 size: tuple[int, int], executor: Executor | None = None, parts: int = 1,
                 past_box: bool = False) -> torch.Tensor:
    """(B, h, w, 3) uint8: row i is the box ``start[i]``..``end[i]`` ((y, x), relative to
    ``images[i]``'s extent when ``relative``, else in its pixels) of the (H, W, 3) uint8
    ``images[i]``, resized to ``size`` (h, w) — bilinear, antialiased when reducing, as
    torchvision's resize of a uint8 tensor (the same torch kernel), Pillow's
    ``resize(..., BILINEAR)`` and DALI's ``fn.resize(antialias=True)`` within a level.

    By default a box edge is rounded to the nearest pixel (boxes are whole pixels; relative
    ones carry float error) and clipped to the image, and pixels outside the box are not read:
    the edge rows are interpolated as torchvision's ``resized_crop`` does (crop, then resize).
    ``past_box``: the box is fractional, the crop of a resize of the whole image at the scale
    ``size / box``, and the filter reads past it to the image's edges — torchvision's
    ``Resize(s)`` + ``CenterCrop`` (``shorter``); the resize's pixel grid starts at the
    image's top-left corner, so ``images[i]`` must start where the source image does
    (:func:`_resize_then_cut`).

    The rows are cut into ``parts`` runs of neighbours: the first is resized in the calling
    thread, the others on ``executor``'s threads (torch releases the GIL), each run one row
    after another with torch on one thread. On ~0.1-0.2 ms images torch's own intra-op threads,
    or one pool task per row, spend more CPU waking and spinning than resizing
    (random_resized_crop to 224², 2 cores: 1.08 ms of CPU an image with runs, 1.18-1.37 those
    ways; benchmarks/roi_probes.py ``resize``).
    """
    out = torch.empty((len(images), *size, 3), dtype=torch.uint8)

    def row(i: int) -> None:
        image = images[i]
        extent = np.array(image.shape[:2], np.float64)
        scale = extent if relative else 1.0
        if past_box:
            ends = np.asarray(start[i], np.float64) * scale, np.asarray(end[i], np.float64) * scale
            out[i] = _resize_then_cut(torch.from_numpy(image).permute(2, 0, 1)[None], *ends, size)[0].permute(1, 2, 0)
            return
        (top, left), (bottom, right) = (np.clip(np.rint(np.asarray(v, np.float64) * scale), 0, extent).astype(int)
                                        for v in (start[i], end[i]))
        box = torch.from_numpy(image).permute(2, 0, 1)[None, :, top:max(bottom, top + 1), left:max(right, left + 1)]
        if tuple(box.shape[-2:]) == tuple(size):
            out[i] = box[0].permute(1, 2, 0)
        else:
            out[i] = F.interpolate(box, size=size, mode="bilinear", antialias=True, align_corners=False)[0].permute(1, 2, 0)

    def run(rows: np.ndarray) -> None:
        with this_threads_intraop(1):
            for i in rows:
                row(int(i))

    runs = np.array_split(np.arange(len(images)), max(1, min(parts, len(images))) if executor else 1)
    others = [executor.submit(run, rows) for rows in runs[1:]] if executor else []
    run(runs[0])
    for done in others:
        done.result()
    return out


def _resize_then_cut(image: torch.Tensor, start: np.ndarray, end: np.ndarray, size: tuple[int, int]) -> torch.Tensor:
    """(1, C, h, w): the fractional box ``start``..``end`` ((y, x) pixels) of the (1, C, H, W)
    uint8 ``image``, as torchvision's resize of the whole image to the scale ``size / box``
    followed by a crop: the box's corner lands on a whole pixel of that resize.

    Only the resized rows and columns up to the box's far edge are computed: torch's resize
    with an explicit ``scale_factor`` keeps the sample positions ``(i + 0.5) / scale - 0.5``
    and the filter width of the whole image's resize while covering a prefix of it (a window
    decoded from the image's top-left corner, or the whole image). The scale is nudged up by
    1e-12 so that float error cannot take the last whole row off (``floor(H * scale)``)."""
    scale = [size[k] / (end[k] - start[k]) for k in (0, 1)]
    top, left = (int(round(start[k] * scale[k])) for k in (0, 1))
    resized = F.interpolate(image, scale_factor=[v * (1 + 1e-12) for v in scale], mode="bilinear",
                            recompute_scale_factor=False, antialias=True, align_corners=False)
    cut = resized[:, :, top:top + size[0], left:left + size[1]]
    assert tuple(cut.shape[-2:]) == tuple(size), f"the window ends before the box: {tuple(resized.shape)}"
    return cut
