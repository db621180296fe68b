"""The nvjpeg backend: ``torchvision.io.decode_jpeg(device="cuda")`` on a list of images.

For machines with torchvision and a GPU but no DALI. The JPEGs DALI would get
(:func:`gpupipe.decode.gate.native_decodable`) are decoded in one batched nvJPEG call
(EXIF orientation applied here: torchvision's ``apply_exif_orientation`` is not applied by its
CUDA decode, seen on an H200 with torchvision 0.26), then cropped and resized on the GPU (bilinear,
antialiased) in one interpolation, as torchvision's ops on a CUDA tensor: ``shorter`` resizes the
whole image and cuts the centre out (``Resize(s)`` + ``CenterCrop``), the other modes cut the box
out and resize it. Other formats, and JPEGs nvJPEG refuses, are
decoded by Pillow on the CPU (the same path, and the same orientation handling, as
under the DALI backend) and moved over.

torchvision runs nvJPEG with its default flags: JPEG chroma is upsampled by nearest neighbour,
not libjpeg's filter (``DecodeConfig.fancy_upsampling`` cannot be honoured here), so colour edges
differ from Pillow's (docs/configuration.md gives what was measured); DALI's ``mixed`` decoder does
the filter.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from gpupipe.decode.base import DecodeConfig, DecodedBatch, DecodeStats, ResizeMode
from gpupipe.decode.common import StandIn, account, assemble, prepare, shorter_geometry
from gpupipe.decode.gate import route
from gpupipe.decode.pil import decode_many, pool
from gpupipe.decode.targets import start_targets

__all__ = ["NvjpegDecoder", "upright"]


def upright(chw: torch.Tensor, orientation: int) -> torch.Tensor:
    """A (C, H, W) image as displayed under EXIF ``orientation`` 1..8: the transpose Pillow's
    ``ImageOps.exif_transpose`` applies (other values: unchanged). Views, no copy."""
    h, w = 1, 2
    if orientation in (5, 6, 7, 8):  # the four that swap the sides: a transpose first
        chw = chw.transpose(h, w)
        orientation = {5: 1, 6: 2, 7: 3, 8: 4}[orientation]
    flips = {2: (w,), 3: (h, w), 4: (h,)}.get(orientation, ())
    return chw.flip(flips) if flips else chw


def _resize(img: torch.Tensor, box, mode: ResizeMode, size: tuple[int, int]) -> torch.Tensor:
    """(C, H, W) uint8 → (C, *size): torchvision's ops on a CUDA tensor (float32, antialiased
    bilinear, rounded). ``shorter``: ``Resize(s)`` of the whole image, then ``CenterCrop``
    (:func:`gpupipe.decode.common.shorter_geometry`); otherwise the box cut out, then resized."""
    if mode is ResizeMode.SHORTER:
        rh, rw, top, left = shorter_geometry(int(img.shape[-2]), int(img.shape[-1]), size)
        crop, out_size, cut = img[None].float(), (rh, rw), (top, left)
    else:
        top, left, h, w = (int(v) for v in box)
        crop, out_size, cut = img[None, :, top:top + h, left:left + w].float(), size, (0, 0)
    out = F.interpolate(crop, size=out_size, mode="bilinear", antialias=True, align_corners=False)
    out = out[0, :, cut[0]:cut[0] + size[0], cut[1]:cut[1] + size[1]]
    return out.round_().clamp_(0, 255).to(torch.uint8)


class NvjpegDecoder:
    name = "nvjpeg"

    def __init__(self, config: DecodeConfig, device: torch.device):
        self.config, self.device = config, device
        self.stats = DecodeStats()
        self._pool = pool(config)
        self._stand_in = StandIn()

    def _nvjpeg(self, batch, jpegs: list[int]) -> tuple[dict[int, torch.Tensor], dict[int, str]]:
        """{index: CHW uint8 on the device} for ``jpegs``, and why nvJPEG refused the ones it refused."""
        from torchvision.io import ImageReadMode, decode_jpeg

        data = [torch.frombuffer(bytearray(batch.image(i)), dtype=torch.uint8) for i in jpegs]
        kwargs = {"mode": ImageReadMode.RGB, "device": self.device, "apply_exif_orientation": False}
        try:
            return dict(zip(jpegs, decode_jpeg(data, **kwargs))), {}
        except RuntimeError:  # isolate the ones it refuses
            pass
        out, refused = {}, {}
        for i, d in zip(jpegs, data):
            try:
                out[i] = decode_jpeg(d, **kwargs)
            except RuntimeError as exc:
                refused[i] = f"nvJPEG: {str(exc)[:200]}"
        return out, refused

    def decode(self, batch) -> DecodedBatch:
        t0 = time.perf_counter()
        cfg = self.config
        checked, boxes = prepare(batch, cfg, self.stats)
        targets = start_targets(self._pool, batch, checked, boxes, cfg, self.stats)
        jpegs, others = route(checked.headers, checked.good())
        hwc: dict = decode_many(self._pool, batch, others, boxes, checked, cfg, self.stats)
        chw, refused = self._nvjpeg(batch, jpegs) if jpegs else ({}, {})
        hwc.update(decode_many(self._pool, batch, list(refused), boxes, checked, cfg, self.stats, refused))
        for i, img in chw.items():
            header = checked.headers[i]  # read for every image routed to nvJPEG
            img = upright(img, header.orientation if header is not None else 1)
            if cfg.image_size is not None and cfg.resize is not ResizeMode.NONE:
                img = _resize(img, boxes[i], cfg.resize, cfg.image_size)
            hwc[i] = img.permute(1, 2, 0)
        out = assemble(hwc, checked, batch, self.device, cfg.image_size, self._stand_in, targets)
        account(self.stats, batch, t0)
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
