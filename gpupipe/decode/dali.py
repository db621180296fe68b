"""The DALI backend: nvJPEG on a GPU (``mixed``), DALI's CPU decoders without one.

One pipeline per decoder, built in the training process on first use (never in a
DataLoader worker). DALI gets only what passes the gate (:mod:`gpupipe.decode.gate`):
8-bit baseline, extended and progressive JPEGs with a strictly well-formed header (nvJPEG
decodes nothing else on the GPU anyway; DALI's parser crashes the process on headers
libjpeg recovers from) and, on the CPU, plain PNGs (:mod:`gpupipe.formats.png`: DALI's PNG
decode gives Pillow's pixels with ~20 % less CPU, and torch's resize follows it instead of
Pillow's; on a GPU PNGs stay with Pillow until a GPU check says otherwise). Other PNGs, WebP,
BMP, GIF, the rarer JPEG kinds (lossless, arithmetic-coded, 12-bit) and irregular JPEG
headers go to Pillow, which also
applies every EXIF orientation the header check reads (DALI ignores WebP's) — so the
crop boxes, planned on the upright image, land where they were meant to.

Encoded bytes go in through ``external_source`` as zero-copy numpy views of the batch
buffer; on a GPU each sample's crop box goes in beside it and ``fn.resize`` crops and
resizes in one interpolation; on the CPU torch's uint8 resize does that after DALI's
decode, at a fraction of DALI's CPU resize's cost (:mod:`gpupipe.decode.resize`). For ``random_resized_crop`` and ``shorter`` only the window around the
box is decoded (``decoders.image_slice``, :mod:`gpupipe.decode.roi`), unless every window
of the batch is its whole image, or on a GPU whose nvImageCodec has the region-decode
regression (:func:`gpupipe.decode.gate.gpu_region_decode_safe`); ``fixed`` and ``none`` decode whole images. Rows DALI does not decode are fed a JPEG of the same batch, so the
output is always one dense (B, H, W, 3) tensor (DLPack on the GPU, the numpy buffer on
the CPU); those rows are then overwritten with Pillow's pixels or, for bad images, with
their replacement's pixels and label (:func:`gpupipe.decode.common.finish`).

If DALI still fails on a batch that passed the header checks, the pipeline is rebuilt,
each JPEG of the batch is tried alone, the ones DALI refuses are tried with Pillow before
they count as bad, and the batch is decoded again — one bad image never costs the others.
"""
from __future__ import annotations

import logging
import re
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from gpupipe.core.errors import DecodeError
from gpupipe.decode.base import DecodeConfig, DecodedBatch, DecodeStats, ResizeMode
from gpupipe.decode.common import StandIn, crop_first, decode_threads, finish, prepare
from gpupipe.decode.gate import gpu_region_decode_safe, nvimgcodec_version, route, route_probed
from gpupipe.decode.pil import decode_many, pool
from gpupipe.decode.resize import crop_and_resize
from gpupipe.decode.roi import any_partial, dali_slices
from gpupipe.decode.targets import start_targets

if TYPE_CHECKING:
    from nvidia.dali.pipeline import Pipeline

__all__ = ["DaliDecoder"]

log = logging.getLogger(__name__)

_ROI_MODES = (ResizeMode.SHORTER, ResizeMode.RANDOM_CROP)  # decode the window around the box only
TORCH_RESIZES_ON_CPU = True  # gpupipe.decode.resize; benchmarks switch it off to time DALI's own resize
AHEAD = 2  # batches fed to DALI before the oldest one's outputs are taken (decode_stream)


class DaliDecoder:
    name = "dali"

    def __init__(self, config: DecodeConfig, device: torch.device):
        self.config, self.device = config, device
        self.stats = DecodeStats()
        # (window decode?, DALI resizes?) -> the pipeline
        self._pipes: dict[tuple[bool, bool], _Pipe] = {}
        self._pool = pool(config)
        self._stand_in = StandIn()
        self._refcounted = False  # set when a pipeline is built (_build)
        self.region_decode = device.type != "cuda" or gpu_region_decode_safe()
        # what the gate may send to DALI (gpupipe.decode.gate); PNG on a GPU is owed a check there
        self.native_formats = ("jpeg",) if device.type == "cuda" else ("jpeg", "png")
        if not self.region_decode and config.resize in _ROI_MODES:
            log.info("DALI on %s decodes whole images and crops in the resize: GPU region decode is not safe with "
                     "nvImageCodec %s (NVIDIA/nvImageCodec#55; gpupipe.decode.gate)", device,
                     ".".join(map(str, nvimgcodec_version() or ("unknown",))))

    # -- pipeline ------------------------------------------------------------------------------
    def _build(self, max_batch: int, window: bool) -> Pipeline:
        """A pipeline that decodes whole images, or (``window``) the window of each image fed
        as ``win_start``/``win_end``; either then resizes each row's ``roi_start``/``roi_end``."""
        from nvidia.dali import fn, pipeline_def, types

        cfg, gpu = self.config, self.device.type == "cuda"
        threads, size = decode_threads(cfg), cfg.resize_to
        uint8, rgb, f32 = types.DALIDataType.UINT8, types.DALIImageType.RGB, types.DALIDataType.FLOAT

        @pipeline_def(batch_size=max_batch, num_threads=threads, prefetch_queue_depth=1, seed=cfg.seed,
                      # None (CPU only) is what DALI's docs and code take; its overload's annotation says int
                      device_id=self.device.index or 0 if gpu else None)  # type: ignore[arg-type]
        def pipeline():
            # each row's bytes: a row of a padded (B, stride) array, or an array of its own
            # no_copy: the batch's buffer stays alive and unchanged until its outputs are taken (_Job)
            enc = fn.external_source(name="enc", dtype=uint8, no_copy=True)
            if self._cuts:  # cut to its size (fn.slice: ~5-10 % of the CPU decode's own CPU at 250², measured)
                enc = fn.slice(enc, 0, fn.external_source(name="size", dtype=types.DALIDataType.INT32), axes=[0])
            kwargs: dict[str, Any] = {"device": "mixed" if gpu else "cpu", "output_type": rgb,
                                      "adjust_orientation": True,
                                      **({"hw_decoder_load": cfg.hw_decoder_load,  # libjpeg's chroma filter:
                                          "jpeg_fancy_upsampling": cfg.fancy_upsampling} if gpu else {})}
            if window:  # upright (y, x) relative to the image; see gpupipe.decode.roi
                img = fn.decoders.image_slice(enc, rel_start=fn.external_source(name="win_start", dtype=f32),
                                              rel_end=fn.external_source(name="win_end", dtype=f32),
                                              axis_names="HW", **kwargs)
            else:
                img = fn.decoders.image(enc, **kwargs)
            if self._dali_resizes and size is not None:
                start = fn.external_source(name="roi_start", dtype=f32)
                end = fn.external_source(name="roi_end", dtype=f32)
                img = fn.resize(img, size=list(size), roi_start=start, roi_end=end, roi_relative=window,
                                antialias=True, interp_type=types.DALIInterpType.INTERP_LINEAR)
            return img

        pipe = pipeline()
        pipe.build()
        # DALI's dynamic executor reference-counts outputs: a view stays valid after later runs
        self._refcounted = bool(getattr(pipe, "exec_dynamic", False) or getattr(pipe, "_exec_dynamic", False))
        return pipe

    def _placement(self, boxes: np.ndarray, checked) -> dict[str, np.ndarray]:
        """Per-row inputs beside the bytes, each (B, 2) (y, x): the decode window (float32,
        relative) and the box within it (ROI modes, unless every window is its whole image: a
        whole decode costs less than a full-size slice), else the box in the image; nothing for
        ``none``. The box is float32 for DALI's resize, float64 pixels for torch's
        (:attr:`_boxes_in_pixels`)."""
        cfg, size = self.config, self.config.resize_to
        if size is None:
            return {}
        window = {"past_box": not crop_first(cfg), "from_origin": self._boxes_in_pixels}
        if cfg.resize in _ROI_MODES and self.region_decode:
            upright_hw, exists = checked.upright()
            if any_partial(boxes, upright_hw, exists, size, **window):
                slices = dali_slices(boxes, upright_hw, exists, size, **window)
                if self._boxes_in_pixels:  # the window starts at the image's corner: image pixels are window pixels
                    slices["roi_start"], slices["roi_end"] = boxes[:, :2], boxes[:, :2] + boxes[:, 2:]
                return slices
        dtype = np.float64 if self._boxes_in_pixels else np.float32
        return {"roi_start": boxes[:, :2].astype(dtype), "roi_end": (boxes[:, :2] + boxes[:, 2:]).astype(dtype)}

    @property
    def _cuts(self) -> bool:
        """Whether a padded row is cut to its image before the decoder. DALI's CPU decoders stop
        at the image's end (JPEG's EOI, PNG's IEND: the gate lets only complete images through)
        and give the same pixels whatever follows it in the row (tests/decode/test_columns.py fills
        the padding with garbage); on a GPU the rows are cut (nvJPEG's hardware decoder, not checked)."""
        return self.device.type == "cuda"

    @property
    def _boxes_in_pixels(self) -> bool:
        """Whether torch resizes ``shorter`` boxes on the CPU: then they stay float64 image
        pixels and the window starts at the image's corner (:func:`gpupipe.decode.resize.crop_and_resize`,
        ``past_box``), so a fractional box loses nothing to float32."""
        return not self._dali_resizes and self.config.resize is ResizeMode.SHORTER

    def _pipe(self, window: bool, rows: int) -> _Pipe:
        """The pipeline of this kind (window decode or not) for ``rows`` images: built on first
        use, again for a larger batch (a batch it already holds keeps the old one alive)."""
        kind = (window, self._dali_resizes)
        pipe = self._pipes.get(kind)
        if pipe is None or not pipe.ok or rows > pipe.size:
            size = max(rows, pipe.size if pipe is not None and pipe.ok else 0)
            pipe = self._pipes[kind] = _Pipe(self._build(size, window), size)
        return pipe

    def _submit(self, inputs: tuple, placement: dict[str, np.ndarray]) -> _Pipe:
        """Feed one batch (:func:`_encoded`'s bytes and sizes, and the per-row boxes) and start
        its run; the outputs are taken by :meth:`_take` (DALI's executor decodes meanwhile)."""
        enc, sizes = inputs
        pipe = self._pipe("win_start" in placement, len(sizes))
        pipe.pipe.feed_input("enc", enc)
        if self._cuts:
            pipe.pipe.feed_input("size", sizes.reshape(-1, 1))
        for name, rows in placement.items():
            if self._dali_resizes or name.startswith("win_"):  # the box goes to DALI only if DALI resizes
                pipe.pipe.feed_input(name, rows)
        pipe.pipe.schedule_run()
        return pipe

    @staticmethod
    def _take(pipe: _Pipe):
        """The outputs of the oldest run started on ``pipe``; a DALI error marks it broken."""
        try:
            (out,) = pipe.pipe.outputs()
        except RuntimeError:
            pipe.ok = False  # DALI invalidates a pipeline after an error
            raise
        return out

    def _run(self, inputs: tuple, placement: dict[str, np.ndarray]):
        """Feed, run and take one batch (nothing else in flight on the pipeline)."""
        return self._take(self._submit(inputs, placement))

    @property
    def _dali_resizes(self) -> bool:
        """DALI's ``fn.resize`` on a GPU; on the CPU torch resizes (:mod:`gpupipe.decode.resize`)."""
        return self.device.type == "cuda" or not TORCH_RESIZES_ON_CPU

    # -- decode --------------------------------------------------------------------------------
    def decode(self, batch) -> DecodedBatch:
        return next(self.decode_stream([batch]))

    def decode_stream(self, batches: Iterable) -> Iterator[DecodedBatch]:
        """Decode ``batches`` in order, feeding DALI :data:`AHEAD` batches ahead: batches i+1 and
        i+2 are checked and fed (DALI's threads decode them in order) before batch i's outputs are
        taken, so the decoder never waits for this thread's Python — but the first batch, which
        nothing is ahead of yet, comes out as soon as it is decoded (a pass's first batch does not
        wait for the next two to be read). A pass broken off leaves nothing in flight."""
        pending: deque[_Job] = deque()
        try:
            for k, batch in enumerate(batches):
                pending.append(self._start(batch))
                if len(pending) > min(AHEAD, k):
                    yield self._finish_first(pending)
            while pending:
                yield self._finish_first(pending)
        finally:
            for job in pending:  # take what was fed, in order, so that the next pass does not find it
                if job.pipe is not None and job.pipe.ok:
                    try:
                        self._take(job.pipe)
                    except RuntimeError:
                        self._pipes.clear()
                        break

    def _finish_first(self, pending: deque[_Job]) -> DecodedBatch:
        """The oldest job's batch; if DALI failed on it (its pipeline is rebuilt), the jobs fed
        after it are fed again, in order, before a later batch is fed after them."""
        result = self._finish(pending.popleft())
        for job in pending:
            if job.pipe is not None and not job.pipe.ok:
                job.pipe = self._submit(*job.fed)
        return result

    def _start(self, batch) -> _Job:
        """Everything before the decoder's outputs: the columns' verdicts (``on_error`` applied),
        crop boxes, targets, Pillow for the rows DALI does not take, then DALI fed and started.
        Nothing after the feed raises: a batch fed is always taken (:meth:`_finish`, or the
        ``finally`` of :meth:`decode_stream`)."""
        t0 = time.perf_counter()
        cfg = self.config
        checked, boxes = prepare(batch, cfg, self.stats)
        targets = start_targets(self._pool, batch, checked, boxes, cfg, self.stats)
        if checked.probed is not None:
            native, others = route_probed(checked.probed, checked.good_mask(), self.native_formats)
        else:
            native, others = route(checked.headers, checked.good(), self.native_formats)
        job = _Job(batch, checked, boxes, targets, native, self._placement(boxes, checked))
        # Pillow first: under on_error "raise" it may raise, and a batch fed to DALI but never
        # taken would come out of the next batch's ``_take`` (seen: validate's one-image decode
        # after a batch that raised got that batch's 8 rows). Rows Pillow decodes are rare.
        job.side = decode_many(self._pool, batch, others, boxes, checked, cfg, self.stats)
        if native:
            job.fed = self._rows(batch, native, job.placement)
            job.pipe = self._submit(*job.fed)
        job.seconds = time.perf_counter() - t0
        return job

    def _finish(self, job: _Job) -> DecodedBatch:
        """The outputs of ``job``'s run, with the recovery of :meth:`_decode_native` if DALI fails
        on it; then the batch."""
        t0 = time.perf_counter()
        batch, cfg, out = job.batch, self.config, None
        if job.pipe is not None:  # (fed again by decode_stream if an earlier batch's error broke its pipeline)
            try:
                out = self._output(self._take(job.pipe), job.fed[1])
            except RuntimeError:
                self._pipes.clear()
                out, refused = self._decode_native(batch, job.native, job.placement)
                job.side.update(decode_many(self._pool, batch, list(refused), job.boxes, job.checked, cfg,
                                            self.stats, refused))
        side = job.side
        if out is None:  # nothing for DALI in this batch
            h, w = next(iter(side.values())).shape[:2] if side else (self.config.image_size or (1, 1))
            out = torch.zeros((len(batch), h, w, 3), dtype=torch.uint8, device=self.device)
        for i, pixels in side.items():
            if tuple(pixels.shape) != tuple(out.shape[1:]):
                raise DecodeError(f"decoded images have different sizes {tuple(pixels.shape)} and "
                                  f"{tuple(out.shape[1:])}; set decode image_size")
            out[i] = torch.from_numpy(pixels).to(out.device)
        result = finish(out, job.checked, batch, self._stand_in, job.targets)
        self.stats.batches += 1
        self.stats.images += len(batch)
        self.stats.seconds += job.seconds + time.perf_counter() - t0
        return result

    def _decode_native(self, batch, native: list[int], placement) -> tuple[torch.Tensor | None, dict[int, str]]:
        """DALI on rows ``native``, one batch at a time, after DALI failed on them together:
        each image alone to find the ones DALI refuses (and why), then the others together:
        (B, H, W, 3) with those rows decoded (None if none is left)."""
        refused = {}
        for i in native:  # find the culprits one by one
            try:
                self._run(*self._rows(batch, [i], placement, alone=True))
            except RuntimeError as exc:
                self._pipes.clear()
                refused[i] = f"DALI: {_dali_reason(exc)}"
                log.info("DALI refused %s (%s); trying Pillow", batch.keys[i], refused[i])
        kept = [i for i in native if i not in refused]
        if not kept:
            return None, refused
        inputs, rows_placement = self._rows(batch, kept, placement)
        return self._output(self._run(inputs, rows_placement), rows_placement), refused

    def _rows(self, batch, rows: list[int], placement, alone: bool = False) -> tuple[tuple, dict[str, np.ndarray]]:
        """What DALI is fed for rows ``rows`` of ``batch``: every other row gets one of ``rows``
        (so the output is one dense (B, H, W, 3) tensor), or with ``alone`` only ``rows``.
        Returns ((bytes, sizes), the per-row placement of those rows)."""
        n = len(batch)
        if not alone and len(rows) == n:  # every row (the rows are distinct): the batch as it is
            return _encoded(batch, None), placement
        if alone:
            src = np.asarray(rows, dtype=np.int64)
        else:
            src = np.full(n, rows[0], dtype=np.int64)
            src[rows] = rows
        identity = len(src) == n and bool((src == np.arange(n)).all())
        return _encoded(batch, None if identity else src), (placement if identity else
                                                             {k: v[src] for k, v in placement.items()})

    def _output(self, out, placement) -> torch.Tensor:
        """DALI's output as (B, H, W, 3) uint8 on the device, resized by torch on the CPU."""
        size = self.config.resize_to  # None: no boxes were placed
        if self._dali_resizes or "roi_start" not in placement or size is None:
            return _to_torch(out, self.device, self._refcounted)
        decoded = [np.asarray(out[i]) for i in range(len(out))]  # views of DALI's buffer, read before the next run
        return crop_and_resize(decoded, placement["roi_start"], placement["roi_end"],
                            relative="win_start" in placement and not self._boxes_in_pixels, size=size,
                            executor=self._pool, parts=decode_threads(self.config), past_box=self._boxes_in_pixels)

    def close(self) -> None:
        self._pipes.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)


class _Pipe:
    """A DALI pipeline, the batch size it was built for, and whether it still works."""

    def __init__(self, pipe: Pipeline, size: int) -> None:
        self.pipe, self.size, self.ok = pipe, size, True


@dataclass
class _Job:
    """One batch between :meth:`DaliDecoder._start` and :meth:`DaliDecoder._finish`."""

    batch: Any
    checked: Any
    boxes: np.ndarray
    targets: Any
    native: list[int]
    placement: dict[str, np.ndarray]
    fed: tuple = ()
    pipe: _Pipe | None = None
    side: dict[int, np.ndarray] = field(default_factory=dict)
    seconds: float = 0.0


def _encoded(batch, src: np.ndarray | None) -> tuple[np.ndarray | list[np.ndarray], np.ndarray]:
    """DALI's ``enc`` and ``size`` inputs for rows ``src`` of ``batch`` (None: all, in order):
    the batch's (B, stride) array when it is packed padded (one array for the whole batch: no
    per-row work here or in DALI's feed), else a numpy view per image; and the sizes, int32."""
    sizes = batch.image_sizes()
    rows = batch.padded_rows()
    if rows is not None:
        if src is None:
            return rows, sizes.astype(np.int32)
        return rows[src], sizes[src].astype(np.int32)
    starts, data = batch.offsets.numpy()[:-1], batch.data.numpy()
    if src is not None:
        starts, sizes = starts[src], sizes[src]
    return [data[a:a + z] for a, z in zip(starts.tolist(), sizes.tolist())], sizes.astype(np.int32)


def _to_torch(out, device: torch.device, refcounted: bool) -> torch.Tensor:
    """DALI's dense output as a torch tensor. On the CPU without a copy where DALI's executor
    reference-counts its outputs (the numpy view holds DALI's buffer: checked to stay intact over
    later runs), else one copy (the older executor reuses its output buffers): the copy was
    ~40-80 us a 250x250 image, a third of the training process's CPU per image."""
    if not out.is_dense_tensor():
        shapes = sorted({tuple(out[i].shape()) for i in range(len(out))})
        raise DecodeError(f"decoded images have different sizes {shapes[:3]}; set decode image_size")
    dense = out.as_tensor()
    if device.type == "cuda":
        return torch.from_dlpack(dense)  # zero-copy; GpuLoader clones it on its side stream
    return torch.from_numpy(np.asarray(dense) if refcounted else np.array(dense))


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
