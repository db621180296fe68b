"""The nvjpeg backend: ``torchvision.io.decode_jpeg(device="cuda")`` on a list of images.

For machines with torchvision and a GPU but no DALI. JPEGs are decoded in one
batched nvJPEG call (EXIF orientation applied); other formats are decoded by
``torchvision.io.decode_image`` on the CPU and moved over. Each image is then
cropped and resized on the GPU (bilinear, antialiased) in one interpolation.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from gpupipe.decode import DecodeConfig, DecodedBatch, DecodeStats, ResizeMode
from gpupipe.decode.common import account, assemble, prepare, record_bad

__all__ = ["NvjpegDecoder"]


class NvjpegDecoder:
    name = "nvjpeg"

    def __init__(self, config: DecodeConfig, device: torch.device):
        self.config, self.device = config, device
        self.stats = DecodeStats()

    def _decode_all(self, batch, checked) -> dict[int, torch.Tensor]:
        from torchvision.io import ImageReadMode, decode_image, decode_jpeg

        good = checked.good()
        jpegs = [i for i in good if checked.headers[i].format == "jpeg"]
        out: dict[int, torch.Tensor] = {}
        data = {i: torch.frombuffer(bytearray(batch.image(i)), dtype=torch.uint8) for i in good}
        if jpegs:
            try:
                decoded = decode_jpeg([data[i] for i in jpegs], mode=ImageReadMode.RGB, device=self.device,
                                      apply_exif_orientation=True)
                out.update(zip(jpegs, decoded))
            except RuntimeError:  # isolate the bad ones
                for i in jpegs:
                    try:
                        out[i] = decode_jpeg(data[i], mode=ImageReadMode.RGB, device=self.device,
                                             apply_exif_orientation=True)
                    except RuntimeError as exc:
                        record_bad(checked, i, f"nvjpeg: {exc}", self.config.on_error, self.stats, batch.keys[i])
        for i in good:
            if i not in jpegs:
                try:
                    out[i] = decode_image(data[i], mode=ImageReadMode.RGB, apply_exif_orientation=True).to(self.device)
                except RuntimeError as exc:
                    record_bad(checked, i, f"torchvision: {exc}", self.config.on_error, self.stats, batch.keys[i])
        return out

    def decode(self, batch) -> DecodedBatch:
        t0 = time.perf_counter()
        cfg = self.config
        checked, boxes = prepare(batch, cfg, self.stats)
        chw = self._decode_all(batch, checked)
        hwc = {}
        for i, img in chw.items():
            if cfg.resize is not ResizeMode.NONE:
                top, left, h, w = (int(v) for v in boxes[i])
                crop = img[None, :, top:top + h, left:left + w].float()
                img = F.interpolate(crop, size=cfg.image_size, mode="bilinear", antialias=True,
                                    align_corners=False)[0].round_().clamp_(0, 255).to(torch.uint8)
            hwc[i] = img.permute(1, 2, 0)
        out = assemble(hwc, checked, batch, self.device, batch.epoch, cfg.image_size)
        account(self.stats, batch, t0)
        return out

    def close(self) -> None:
        pass
