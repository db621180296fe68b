"""``GpuLoader``: encoded batches from the workers → decode → augment, stages that overlap.

The DataLoader workers stream encoded bytes (CPU I/O only). In the training process
two threads (:mod:`gpupipe.loader.stages`) decode batch i+2 while batch i+1 is augmented and
the training step runs on batch i; on a GPU they work on a side CUDA stream and the
consumer's stream waits for it (``wait_stream`` + ``record_stream``), so the copy,
decode and augment overlap the step. Progress for ``state_dict`` counts batches
handed to the training loop, not the ones decoded ahead (:mod:`gpupipe.loader.epoch`).
"""
from __future__ import annotations

import collections
import contextlib
import functools
import logging
import time
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

import torch

from gpupipe.config.keywords import keyword_form, split_from_options
from gpupipe.config.split import SplitConfig
from gpupipe.core.errors import ConfigError
from gpupipe.core.machine import default_num_workers, warn_if_more_workers_than_cores
from gpupipe.core.types import World
from gpupipe.decode import BACKENDS, DecodedBatch, Decoder, make_decoder, preload
from gpupipe.loader.encoded import EncodedLoader
from gpupipe.loader.metrics import Meter
from gpupipe.loader.ranges import nvtx_range, ranged
from gpupipe.loader.stages import END, Stage, Stages
from gpupipe.stream.batch import EncodedBatch

if TYPE_CHECKING:
    from gpupipe.augment.stage import AugmentStage

__all__ = ["GpuLoader", "StageStats"]

log = logging.getLogger(__name__)


@dataclass
class StageStats:
    """Seconds each stage thread was busy, and waiting (stage threads run at once: the busy
    times may add up to more than the wall time; the largest bounds the run)."""

    batches: int = 0
    images: int = 0
    wait_bytes_s: float = 0.0  # the decode thread waiting for encoded batches from the workers
    decode_s: float = 0.0  # decode thread busy
    augment_s: float = 0.0  # augment thread busy
    handoff_wait_s: float = 0.0  # training loop waiting for a ready batch
    skipped: int = 0  # samples replaced (stream + decode)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@keyword_form
class GpuLoader:
    """``for images, labels in loader``: decoded (and augmented) batches on ``device``.

    ``GpuLoader(config.split("train"))`` takes one :class:`~gpupipe.config.split.SplitConfig`;
    ``GpuLoader(url, batch_size=256, image_size=224, augment=..., on_error="skip")`` is the
    keyword form of the same (:func:`~gpupipe.config.keywords.split_from_options`, which also takes
    ``rank``/``world_size``). ``world`` is detected when not given; ``device`` defaults to
    the split's, else CUDA (this rank's local GPU) when present, else the CPU.

    ``len(loader)`` is exact and the same on every rank; passes (every ``for`` starts the
    current epoch afresh, a complete one moves to the next), ``set_epoch``, ``state_dict`` and
    ``load_state_dict`` work as on :class:`EncodedLoader`. The split's augmentation runs
    in the decode thread (:class:`~gpupipe.augment.stage.AugmentStage`: a ``gpupipe.transforms``
    pipeline keyed by seed, epoch and sample ids, or any callable on the image batch);
    without one, images stay uint8.

    Bad images follow ``on_error`` (raise, or skip: replaced, counted, their keys logged).
    What no policy can catch is a native decoder (DALI, nvJPEG) dying by a signal inside its
    C++ code: the process ends (exit 139) with nothing logged. JPEG headers known to do that
    never reach one (:mod:`gpupipe.decode.gate`: only strictly well-formed headers do; the
    rest go to Pillow), but the gate reads headers, not compressed data. If a run ever dies
    that way, ``gpupipe validate --decode dali DATA`` decodes in a child process and names
    the file(s) that kill the decoder; ``decode="pil"`` trains without a native decoder meanwhile.
    """

    def __init__(self, split: SplitConfig | str | list[str], *, world: World | None = None,
                 device: str | torch.device | None = None, **options):
        if not isinstance(split, SplitConfig):
            split, detected = split_from_options(split, caller="GpuLoader", **options)
            world = world or detected
        elif options:
            raise ConfigError(f"GpuLoader(split): the settings are in the SplitConfig; got also {sorted(options)}")
        world = world or World.detect()
        self.device = _device(device if device is not None else split.device, world)
        backend = BACKENDS.get(split.decode.backend)  # (None for auto: DALI or nvJPEG where there is a GPU)
        on_cpu = self.device.type == "cpu" or (backend is not None and backend.on_host)
        workers = split.num_workers
        if workers is None:  # decided here: it depends on where decoding runs
            workers = default_num_workers(world, decode_on_cpu=on_cpu)
            split = replace(split, num_workers=workers)
        warn_if_more_workers_than_cores(workers, world, decode_on_cpu=on_cpu)  # says more than EncodedLoader's would
        split = replace(split, device=str(self.device))  # the ranks' check at start compares GPUs by it
        self.split = split
        self.encoded = EncodedLoader(split, world)
        self.encoded.pin_memory = self.device.type == "cuda"  # encoded bytes reach the GPU from pinned pages
        self.encoded.decode = split.decode  # the workers probe headers and draw crop boxes for the decoder
        stage = split.augment_stage()
        self.augment = stage.to(self.device) if stage is not None else None
        self.stats = StageStats()
        self._meter = Meter(self)  # GpuLoader.metrics(): since the previous call
        self.timeline: list[tuple[str, float, float]] | None = None  # a list: (stage, start, end) per batch
        self.overlap = True  # decode and augment in two threads; False: one thread does both (for A/B runs)
        self.augment_threads: int | None = None  # torch threads in the augment stage's thread (None: torch's)
        self._decoder: Decoder | None = None  # built on first use, in this (the training) process
        preload(split.decode, self.device)  # its imports (DALI: 0.3-0.45 s) now, not in the first epoch
        self._side: torch.cuda.Stream | None = None  # the decode stage's stream, made on first use

    # -- pickling ---------------------------------------------------------------------------------
    def __getstate__(self) -> dict:
        """Everything but what lives in this process: the decoder (a DALI pipeline, a thread pool)
        and the CUDA stream are left out and built again on first use; the stage threads live in
        a pass, not on the loader. The epoch and resume position travel (``ledger``)."""
        state = self.__dict__.copy()
        state["_decoder"], state["_side"] = None, None
        return state

    # -- delegated -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.encoded)

    def close(self) -> None:
        """Stop the stream workers, which otherwise stay between passes (and stop with the loader)."""
        self.encoded.close()

    def set_epoch(self, epoch: int) -> None:
        self.encoded.set_epoch(epoch)

    def state_dict(self) -> dict:
        return self.encoded.state_dict()

    def load_state_dict(self, state: Mapping) -> None:
        self.encoded.load_state_dict(state)

    @property
    def ledger(self):
        """The epoch and resume position (:class:`~gpupipe.loader.epoch.EpochLedger`); Lightning's
        DataModule calls ``ledger.defer()`` and ``ledger.commit()``."""
        return self.encoded.ledger

    def metrics(self) -> dict[str, float]:
        """The data path's numbers since the previous call (the first: since the loader was
        made): images/s, the training loop's wait per step and as a share of the time, the decode
        and augment threads' busy shares, bytes/s from storage, samples skipped so far
        (:mod:`gpupipe.loader.metrics`). For a plain PyTorch loop, e.g. every 100 steps."""
        return self._meter.read()

    @property
    def per_source(self) -> list[int]:
        """A mix of sources: the samples of each (in the order given) delivered this epoch — the
        count ``state_dict()`` saves and a resume continues; ``[]`` for one source."""
        return self.encoded.stats.per_source

    @property
    def classes(self) -> tuple[str, ...]:
        """The class names of the source's index, label order (``()``: the index lists none)."""
        manifest = self.encoded.source.manifest
        return manifest.classes if manifest is not None else ()

    @property
    def decoder(self) -> Decoder:
        if self._decoder is None:
            self._decoder = make_decoder(self.split.decode, self.device)
            log.info("gpupipe: decoding with %s on %s", self._decoder.name, self.device)
        return self._decoder

    def _side_stream(self) -> torch.cuda.Stream | None:
        """The decode stage's CUDA stream: one per loader, kept across passes (a new one per
        pass walks PyTorch's stream pool, and the caching allocator keeps blocks per stream)."""
        if self.device.type != "cuda":
            return None
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        return self._side

    # -- iteration --------------------------------------------------------------------------------
    def __iter__(self) -> Generator[DecodedBatch, None, None]:  # close() stops the stage threads
        ledger = self.ledger
        ledger.begin()
        decoder = self.decoder
        side = self._side_stream()
        timeline = self.timeline is not None
        stages = [Stage("decode", functools.partial(self._decode, decoder, side), timeline=timeline,
                        flow=functools.partial(self._decode_ahead, decoder, side)
                        if hasattr(decoder, "decode_stream") else None)]
        augment = self.augment
        if augment is not None and self.overlap:
            stages.append(Stage("augment", functools.partial(self._augment, augment, side), timeline=timeline,
                                threads=self.augment_threads))
        elif augment is not None:  # one thread decodes, then augments (benchmarks/overlap_bench.py)
            stages = [Stage("decode", _then(functools.partial(self._decode, decoder, side),
                                            functools.partial(self._augment, augment, side)), timeline=timeline)]
        cuda = self.device.type == "cuda"
        run = Stages(ranged(self.encoded.batches, "gpupipe: wait for encoded batch", cuda), stages, self.split.prefetch)
        stats = self.stats  # this pass's stage times go here, even if ``stats`` is replaced meanwhile
        base = (stats.wait_bytes_s, stats.decode_s, stats.augment_s)
        try:
            while True:
                t0 = time.perf_counter()
                with nvtx_range("gpupipe: wait for batch", cuda):
                    item = run.get()
                self.stats.handoff_wait_s += time.perf_counter() - t0
                if item is END:
                    break
                if isinstance(item, BaseException):
                    raise item
                out, place = item
                if side is not None:
                    consumer = torch.cuda.current_stream(self.device)
                    consumer.wait_stream(side)
                    for t in _device_tensors(out):
                        t.record_stream(consumer)
                ledger.yielded(*place)
                self.stats.batches += 1
                self.stats.images += len(out)
                self.stats.skipped = self.encoded.stats.skipped + decoder.stats.skipped
                _account(stats, base, run, stages)  # current at every batch, not only once the pass ends
                yield out
            ledger.finished()
        finally:
            run.stop()
            _account(stats, base, run, stages)
            if self.timeline is not None:
                self.timeline.extend((s.name, a, b) for s in stages for a, b in s.spans)
            self.stats.skipped = self.encoded.stats.skipped + decoder.stats.skipped

    def _decode(self, decoder, side, encoded: EncodedBatch) -> tuple[DecodedBatch, tuple[int, int]]:
        """The decode stage: bytes → uint8 images (and labels, mask) on the device."""
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext(), \
                nvtx_range("gpupipe: decode", side is not None):
            out = decoder.decode(encoded)
            self._to_device(out, side)
        return out, (encoded.chunk, encoded.batch)

    def _decode_ahead(self, decoder, side, encoded: Iterator[EncodedBatch]
                      ) -> Iterator[tuple[DecodedBatch, tuple[int, int]]]:
        """The decode stage for a decoder that works one batch ahead (``decode_stream``): the
        same results as :meth:`_decode` batch by batch."""
        places: collections.deque[tuple[int, int]] = collections.deque()

        def tapped() -> Iterator[EncodedBatch]:
            for batch in encoded:
                places.append((batch.chunk, batch.batch))
                yield batch

        outputs = decoder.decode_stream(tapped())
        try:
            while True:
                with torch.cuda.stream(side) if side is not None else contextlib.nullcontext(), \
                        nvtx_range("gpupipe: decode", side is not None):
                    out = next(outputs, None)
                    if out is None:
                        return
                    self._to_device(out, side)
                yield out, places.popleft()
        finally:
            outputs.close()

    def _to_device(self, out: DecodedBatch, side) -> None:
        if side is not None:
            out.images = out.images.clone(memory_format=torch.channels_last)  # DALI reuses its buffers
        out.labels = out.labels.to(self.device, non_blocking=True)
        out.valid = out.valid.to(self.device, non_blocking=True)

    def _augment(self, augment: AugmentStage, side,
                 item: tuple[DecodedBatch, tuple[int, int]]) -> tuple[DecodedBatch, tuple[int, int]]:
        """The augment stage, on the same side stream (so it runs after its decode on a GPU)."""
        out, place = item
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext(), \
                nvtx_range("gpupipe: augment", side is not None):
            return augment(out), place



def _account(stats: StageStats, base: tuple[float, float, float], run: Stages, stages: list[Stage]) -> None:
    """The pass's stage times so far, added to what ``stats`` held when it began (``base``)."""
    busy = {s.name: s.busy_s for s in stages}
    stats.wait_bytes_s = base[0] + run.wait_source_s
    stats.decode_s = base[1] + busy["decode"]
    stats.augment_s = base[2] + busy.get("augment", 0.0)


def _device_tensors(out: DecodedBatch) -> list[torch.Tensor]:
    """The tensors the side stream made that the consumer's stream now uses: the images, and the
    boxes and masks that travel with them."""
    tensors = [out.images]
    targets = out.targets
    if targets is not None:
        if targets.boxes is not None:
            tensors += [targets.boxes.boxes, targets.boxes.labels, targets.boxes.counts]
        if targets.masks is not None:
            tensors.append(targets.masks)
    return [t for t in tensors if t.device.type == "cuda"]


def _then(first, second):
    return lambda item: second(first(item))


def _device(device, world: World) -> torch.device:
    """The device to decode onto: as given, else CUDA when present, else the CPU; a bare
    ``cuda`` is this rank's local GPU."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"loader.device: {str(device)!r}, but CUDA is not available on this machine; "
                          "use 'cpu' (or leave it unset to pick CUDA when present)")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", _local_gpu(world.local_rank, torch.cuda.device_count()))
    return device


def _local_gpu(local_rank: int, visible: int) -> int:
    """This rank's GPU among the ``visible`` ones: the local rank's; the only one when each
    process sees one (``CUDA_VISIBLE_DEVICES`` set per rank, Slurm's ``--gpus-per-task``)."""
    if visible == 1:
        return 0
    if local_rank >= visible:
        raise ConfigError(f"local rank {local_rank} has no GPU of its own: this process sees {visible} CUDA devices. "
                          "Start at most that many processes per node, or give each its device (device='cuda:N')")
    return local_rank
