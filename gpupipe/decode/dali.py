"""The DALI backend: nvJPEG on a GPU (``mixed``), DALI's CPU decoders without one.

One pipeline per decoder, built in the training process on first use (never in a
DataLoader worker). Encoded bytes go in through ``external_source`` as zero-copy
numpy views of the batch buffer; each sample's crop box goes in beside it and
``fn.resize`` crops and resizes in one interpolation. Bad images are replaced at
the input by a good image of the same batch, so the output is always one dense
(B, H, W, 3) tensor, handed to torch without a copy (DLPack on the GPU, the numpy
buffer on the CPU) and viewed as NCHW channels_last.

If DALI still fails on a batch that passed the header checks (broken entropy
data), the pipeline is rebuilt, each image of the batch is tried alone, the ones
that fail are handled by ``on_error`` and the batch is decoded again — one bad
image never costs the others.
"""
from __future__ import annotations

import os
import re
import time

import numpy as np
import torch

from gpupipe.decode import DecodeConfig, DecodedBatch, DecodeStats, ResizeMode
from gpupipe.decode.common import account, prepare, record_bad, replacements
from gpupipe.errors import DecodeError

__all__ = ["DaliDecoder"]

_PILLOW_FORMATS = ("gif",)  # DALI's decoders refuse these; they take the Pillow path


class DaliDecoder:
    name = "dali"

    def __init__(self, config: DecodeConfig, device: torch.device):
        self.config, self.device = config, device
        self.stats = DecodeStats()
        self._pipe = None
        self._max_batch = 0

    # -- pipeline ------------------------------------------------------------------------------
    def _build(self, max_batch: int):
        from nvidia.dali import fn, pipeline_def, types

        cfg, gpu = self.config, self.device.type == "cuda"
        threads = cfg.num_threads or max(1, min(8, len(os.sched_getaffinity(0))))
        resize = cfg.resize is not ResizeMode.NONE

        @pipeline_def(batch_size=max_batch, num_threads=threads, device_id=self.device.index or 0 if gpu else None,
                      prefetch_queue_depth=1, seed=cfg.seed)
        def pipeline():
            enc = fn.external_source(name="enc", dtype=types.UINT8, no_copy=False)
            kwargs = {"hw_decoder_load": cfg.hw_decoder_load} if gpu else {}
            img = fn.decoders.image(enc, device="mixed" if gpu else "cpu", output_type=types.RGB,
                                    adjust_orientation=True, **kwargs)
            if resize:
                start = fn.external_source(name="roi_start", dtype=types.FLOAT)
                end = fn.external_source(name="roi_end", dtype=types.FLOAT)
                img = fn.resize(img, size=list(cfg.image_size), roi_start=start, roi_end=end,
                                roi_relative=False, antialias=True, interp_type=types.INTERP_LINEAR)
            return img

        pipe = pipeline()
        pipe.build()
        self._pipe, self._max_batch = pipe, max_batch

    def _run(self, inputs: list[np.ndarray], boxes: np.ndarray):
        if self._pipe is None or len(inputs) > self._max_batch:
            self._build(max(len(inputs), self._max_batch))
        self._pipe.feed_input("enc", inputs)
        if self.config.resize is not ResizeMode.NONE:
            self._pipe.feed_input("roi_start", [b[:2].astype(np.float32) for b in boxes])
            self._pipe.feed_input("roi_end", [(b[:2] + b[2:]).astype(np.float32) for b in boxes])
        (out,) = self._pipe.run()
        return out

    # -- decode --------------------------------------------------------------------------------
    def decode(self, batch) -> DecodedBatch:
        t0 = time.perf_counter()
        cfg = self.config
        checked, boxes = prepare(batch, cfg, self.stats)
        side = self._decode_with_pillow(batch, checked, boxes)
        out = self._decode_checked(batch, checked, boxes, set(side))
        if out is None:  # nothing for DALI in this batch
            h, w = next(iter(side.values())).shape[:2] if side else (self.config.image_size or (1, 1))
            out = torch.zeros((len(batch), h, w, 3), dtype=torch.uint8, device=self.device)
        for i, pixels in side.items():
            if tuple(pixels.shape) != tuple(out.shape[1:]):
                raise DecodeError(f"decoded images have different sizes {tuple(pixels.shape)} and "
                                  f"{tuple(out.shape[1:])}; set decode image_size")
            out[i] = torch.from_numpy(pixels).to(out.device)
        valid = batch.valid.clone()
        for i in replacements(checked.reasons):
            valid[i] = False
        account(self.stats, batch, t0)
        return DecodedBatch(images=out.permute(0, 3, 1, 2), labels=batch.labels, valid=valid,
                            sample_ids=batch.sample_ids, keys=batch.keys, epoch=batch.epoch)

    def _decode_with_pillow(self, batch, checked, boxes) -> dict[int, np.ndarray]:
        """Formats DALI does not decode (GIF) go through the Pillow path, image by image."""
        from gpupipe.decode.pil import decode_one

        size = None if self.config.resize is ResizeMode.NONE else self.config.image_size
        side = {}
        for i in checked.good():
            if checked.headers[i].format in _PILLOW_FORMATS:
                try:
                    side[i] = decode_one(batch.image(i), boxes[i], size)
                except Exception as exc:  # noqa: BLE001 — untrusted bytes
                    record_bad(checked, i, f"{type(exc).__name__}: {exc}", self.config.on_error, self.stats,
                               batch.keys[i])
        return side

    def _decode_checked(self, batch, checked, boxes, elsewhere: set[int]) -> torch.Tensor | None:
        try:
            return self._dense(batch, checked, boxes, elsewhere)
        except RuntimeError:
            self._pipe = None  # DALI invalidates a pipeline after an error
        for i in checked.good():  # find the culprits one by one
            if i in elsewhere:
                continue
            try:
                self._run([np.frombuffer(batch.image(i), np.uint8)], boxes[i:i + 1])
            except RuntimeError as exc:
                self._pipe = None
                record_bad(checked, i, f"DALI: {_dali_reason(exc)}", self.config.on_error, self.stats,
                           batch.keys[i])
        return self._dense(batch, checked, boxes, elsewhere)

    def _dense(self, batch, checked, boxes, elsewhere: set[int]) -> torch.Tensor | None:
        """Decode with bad images (and those decoded elsewhere) replaced at the input by
        a good one; (B, H, W, 3) uint8 on the device, or None if none is left for DALI."""
        reasons = [r if i not in elsewhere else "decoded elsewhere" for i, r in enumerate(checked.reasons)]
        repl = replacements(reasons)
        if repl and all(v is None for v in repl.values()):
            return None
        src = [repl.get(i, i) for i in range(len(batch))]
        inputs = [np.frombuffer(batch.image(j), np.uint8) for j in src]
        out = self._run(inputs, boxes[src])
        return _to_torch(out, self.device, self.config)

    def close(self) -> None:
        self._pipe = None


def _to_torch(out, device: torch.device, config) -> torch.Tensor:
    if not out.is_dense_tensor():
        shapes = sorted({tuple(out[i].shape()) for i in range(len(out))})
        raise DecodeError(f"decoded images have different sizes {shapes[:3]}; set decode image_size")
    dense = out.as_tensor()
    if device.type == "cuda":
        return torch.from_dlpack(dense)  # zero-copy; DALI keeps the buffer until the next run
    return torch.from_numpy(np.array(dense))  # one copy: DALI reuses its output buffer on the next run


def _dali_reason(exc: Exception) -> str:
    """The informative part of a DALI error: what follows "encountered:" (e.g. "Failed to
    decode sample"), without DALI's own batch index, the operator traceback or the
    "pipeline is no longer valid" trailer. libjpeg's detail goes to stderr only."""
    text = str(exc)
    tail = text.split("encountered:", 1)[1] if "encountered:" in text else text
    lines = [ln.strip(" :") for ln in tail.splitlines()
             if ln.strip(" :") and not ln.startswith(("Critical error", "Current pipeline object"))]
    reason = re.sub(r" #\d+", "", lines[0]) if lines else type(exc).__name__
    return reason[:200]
