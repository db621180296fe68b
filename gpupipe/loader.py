"""``GpuLoader``: encoded batches from the workers → decode → augment, one batch ahead.

The DataLoader workers stream encoded bytes (CPU I/O only). In the training
process a single producer thread decodes batch i+1 (and augments it) while the
training step runs on batch i; on a GPU it works on a side CUDA stream and the
consumer's stream waits for it (``wait_stream`` + ``record_stream``), so the copy,
decode and augment overlap the step. Progress for ``state_dict`` counts batches
handed to the training loop, not the ones decoded ahead.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import queue
import threading
import time
import weakref
from dataclasses import dataclass, fields, replace
from typing import Callable, Iterator, Mapping

import torch

from gpupipe.batch import EncodedBatch
from gpupipe.dataset import EncodedLoader
from gpupipe.decode import DecodedBatch, make_decoder
from gpupipe.errors import ConfigError
from gpupipe.machine import default_num_workers
from gpupipe.split import SplitConfig, split_from_options
from gpupipe.types import World

__all__ = ["GpuLoader", "StageStats"]

log = logging.getLogger(__name__)
_END = object()
_JOIN_TIMEOUT_S = 30.0


@dataclass
class StageStats:
    """Seconds spent per stage (in the producer thread) and waiting (in the training loop)."""

    batches: int = 0
    images: int = 0
    wait_bytes_s: float = 0.0  # producer waiting for encoded batches from the workers
    decode_s: float = 0.0
    augment_s: float = 0.0
    handoff_wait_s: float = 0.0  # training loop waiting for a ready batch
    skipped: int = 0  # samples replaced (stream + decode)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class GpuLoader:
    """``for images, labels in loader``: decoded (and augmented) batches on ``device``.

    ``GpuLoader(config.split("train"))`` takes one :class:`~gpupipe.split.SplitConfig`;
    ``GpuLoader(url, batch_size=256, image_size=224, augment=..., on_error="skip")`` is the
    keyword form of the same (:func:`~gpupipe.split.split_from_options`, which also takes
    ``rank``/``world_size``). ``world`` is detected when not given; ``device`` defaults to
    the split's, else CUDA (this rank's local GPU) when present, else the CPU.

    ``len(loader)`` is exact and the same on every rank; ``set_epoch``, ``state_dict`` and
    ``load_state_dict`` work as on :class:`EncodedLoader`. The split's augmentation runs
    in the decode thread (:class:`~gpupipe.augment.stage.AugmentStage`: a ``gpupipe.transforms``
    pipeline keyed by seed, epoch and sample ids, or any callable on the image batch);
    without one, images stay uint8.
    """

    def __init__(self, split: SplitConfig | str | list[str], *, world: World | None = None,
                 device: str | torch.device | None = None, **options):
        if not isinstance(split, SplitConfig):
            split, detected = split_from_options(split, **options)
            world = world or detected
        elif options:
            raise ConfigError(f"GpuLoader(split): the settings are in the SplitConfig; got also {sorted(options)}")
        world = world or World.detect()
        self.device = _device(device if device is not None else split.device, world)
        if split.num_workers is None:  # decided here: it depends on where decoding runs
            on_cpu = self.device.type == "cpu" or split.decode.backend == "pil"
            split = replace(split, num_workers=default_num_workers(world, decode_on_cpu=on_cpu))
        self.split = split
        self.encoded = EncodedLoader(split, world)
        stage = split.augment_stage()
        self.augment = stage.to(self.device) if stage is not None else None
        self.stats = StageStats()
        self._decoder = None  # built on first use, in this (the training) process

    # -- delegated -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.encoded)

    def set_epoch(self, epoch: int) -> None:
        self.encoded.set_epoch(epoch)

    def state_dict(self) -> dict:
        return self.encoded.state_dict()

    def load_state_dict(self, state: Mapping) -> None:
        self.encoded.load_state_dict(state)

    @property
    def ledger(self):
        """The epoch and resume position (:class:`~gpupipe.epoch.EpochLedger`); Lightning's
        DataModule calls ``ledger.defer()`` and ``ledger.commit()``."""
        return self.encoded.ledger

    @property
    def decoder(self):
        if self._decoder is None:
            self._decoder = make_decoder(self.split.decode, self.device)
            log.info("gpupipe: decoding with %s on %s", self._decoder.name, self.device)
        return self._decoder

    def time_epochs(self, epochs: int) -> float:
        """Run one warm-up epoch (worker start, decoder build), reset ``stats``, then time
        ``epochs`` epochs; returns their wall seconds (``stats`` holds their stages)."""
        for _ in self:
            pass
        self.stats = StageStats()
        t0 = time.perf_counter()
        for _ in range(epochs):
            for _ in self:
                pass
        return time.perf_counter() - t0

    # -- iteration --------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[DecodedBatch]:
        ledger = self.ledger
        ledger.begin()
        decoder = self.decoder
        side = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        run = _Producer(self._produce, decoder, side, self.split.prefetch)
        try:
            while True:
                t0 = time.perf_counter()
                item = run.get()
                self.stats.handoff_wait_s += time.perf_counter() - t0
                if item is _END:
                    break
                if isinstance(item, BaseException):
                    raise item
                out, place = item
                if side is not None:
                    torch.cuda.current_stream(self.device).wait_stream(side)
                    out.images.record_stream(torch.cuda.current_stream(self.device))
                ledger.yielded(*place)
                self.stats.batches += 1
                self.stats.images += len(out)
                self.stats.skipped = self.encoded.stats.skipped + decoder.stats.skipped
                yield out
            ledger.finished()
        finally:
            run.stop()
            self.stats.skipped = self.encoded.stats.skipped + decoder.stats.skipped

    def _produce(self, decoder, side, ready: queue.Queue, stop: threading.Event) -> None:
        batches = self.encoded.batches()
        try:
            while not stop.is_set():
                t0 = time.perf_counter()
                encoded: EncodedBatch | None = next(batches, None)
                self.stats.wait_bytes_s += time.perf_counter() - t0
                if encoded is None:
                    break
                out = self._process(decoder, side, encoded)
                if not _put(ready, (out, (encoded.chunk, encoded.batch)), stop):
                    return
            _put(ready, _END, stop)
        except BaseException as exc:  # hand it to the training loop, which raises it
            _put(ready, exc, stop)
        finally:
            batches.close()

    def _process(self, decoder, side, encoded: EncodedBatch) -> DecodedBatch:
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            t0 = time.perf_counter()
            out = decoder.decode(encoded)
            if side is not None:
                out.images = out.images.clone(memory_format=torch.channels_last)  # DALI reuses its buffers
            t1 = time.perf_counter()
            self.stats.decode_s += t1 - t0
            out.labels = out.labels.to(self.device, non_blocking=True)
            if self.augment is not None:
                out = self.augment(out)
            self.stats.augment_s += time.perf_counter() - t1
            out.valid = out.valid.to(self.device, non_blocking=True)
        return out


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
        device = torch.device("cuda", world.local_rank)
    return device


class _Producer:
    """The decode thread of one iteration, and the way to stop it.

    Stopped by the iteration's ``finally`` — and, when an exception in the training
    loop leaves the iteration suspended (its ``finally`` would only run at garbage
    collection, after the interpreter has begun tearing down), by :func:`_stop_live`
    as the interpreter shuts down: a daemon thread still inside a DALI or torch call
    at teardown aborts the process ("terminate called without an active exception").
    """

    def __init__(self, target: Callable, decoder, side, prefetch: int):
        _hook_interpreter_exit()
        self.ready: queue.Queue = queue.Queue(maxsize=prefetch)
        self.event = threading.Event()
        self.thread = threading.Thread(target=target, args=(decoder, side, self.ready, self.event), daemon=True,
                                       name="gpupipe-decode")
        _LIVE.add(self)
        self.thread.start()

    def get(self):
        """The next item; raises instead of waiting forever if the thread died without a word."""
        while True:
            try:
                return self.ready.get(timeout=1.0)
            except queue.Empty:
                if not self.thread.is_alive() and self.ready.empty():
                    raise RuntimeError("gpupipe: the decode thread ended without finishing the epoch "
                                       "(see the log)") from None

    def stop(self, timeout_s: float = _JOIN_TIMEOUT_S) -> None:
        """Ask the thread to stop, unblock it if it waits to put, and wait for it."""
        self.event.set()
        deadline = time.monotonic() + timeout_s
        while self.thread.is_alive() and time.monotonic() < deadline:
            try:
                self.ready.get(timeout=0.05)
            except queue.Empty:
                pass
        if self.thread.is_alive():
            log.warning("gpupipe: the decode thread did not stop within %.0f s; leaving it (daemon)", timeout_s)
        _LIVE.discard(self)


_LIVE: "weakref.WeakSet[_Producer]" = weakref.WeakSet()
_HOOKED = False


def _stop_live() -> None:
    for run in list(_LIVE):
        run.stop()


def _hook_interpreter_exit() -> None:
    """Run :func:`_stop_live` when the main thread ends, before ``atexit`` handlers (DALI's
    among them) and before daemon threads are frozen — the hook ``concurrent.futures`` uses."""
    global _HOOKED
    if not _HOOKED:
        register = getattr(threading, "_register_atexit", atexit.register)
        register(_stop_live)
        _HOOKED = True


def _put(q: queue.Queue, item, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False
