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
import collections
import contextlib
import logging
import queue
import threading
import time
import weakref
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Iterator, Mapping

import torch

from gpupipe.batch import EncodedBatch
from gpupipe.dataset import EncodedLoader, StreamConfig
from gpupipe.decode import DecodeConfig, DecodedBatch, ResizeMode, make_decoder
from gpupipe.errors import ConfigError

__all__ = ["GpuLoader", "StageStats"]

log = logging.getLogger(__name__)
Augment = Callable[[torch.Tensor, DecodedBatch], torch.Tensor]
_END = object()
_JOIN_TIMEOUT_S = 30.0
_MIX_TAG = 7_919  # the batch mix draws from its own child key, apart from the pipeline's transforms


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

    ``len(loader)`` is exact and the same on every rank; ``set_epoch``,
    ``state_dict`` and ``load_state_dict`` work as on :class:`EncodedLoader`.
    ``augment`` is a ``gpupipe.transforms`` pipeline (called with the batch's key:
    seed, epoch and sample ids, so a sample's augmentation is the same whatever the
    batch or resume point) or any callable ``(images uint8 NCHW, batch) -> tensor``;
    ``None`` gives uint8 images. ``mix`` (``MixUp`` / ``CutMix``) runs after ``augment``
    and turns labels into (B, num_classes) float.
    """

    def __init__(self, source, *, batch_size: int, image_size: int | tuple[int, int] | None = None,
                 decode: str | DecodeConfig = "auto", augment: Augment | None = None,
                 device: str | torch.device | None = None, shuffle: bool = True, seed: int = 0,
                 num_workers: int | None = None, storage_options: Mapping[str, Any] | None = None,
                 drop_last: bool = True, rank: int | None = None, world_size: int | None = None,
                 resize: str | ResizeMode = ResizeMode.FIXED, on_error: str = "raise",
                 stream: StreamConfig | None = None, prefetch: int = 1, mix: torch.nn.Module | None = None):
        if isinstance(image_size, int):
            image_size = (image_size, image_size)
        self.decode_config = decode if isinstance(decode, DecodeConfig) else DecodeConfig(
            backend=decode, image_size=image_size, resize=resize, on_error=on_error, seed=seed)
        stream = replace(stream or StreamConfig(), on_error=self.decode_config.on_error)
        self.device = torch.device(device) if device is not None else torch.device(
            "cuda" if torch.cuda.is_available() else "cpu")
        decode_on_cpu = self.device.type == "cpu" or self.decode_config.backend == "pil"
        self.encoded = EncodedLoader(source, batch_size=batch_size, shuffle=shuffle, seed=seed,
                                     num_workers=num_workers, storage_options=storage_options,
                                     drop_last=drop_last, rank=rank, world_size=world_size, stream=stream,
                                     decode_on_cpu=decode_on_cpu)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", self.encoded.world.local_rank)
        if prefetch < 1:
            raise ConfigError(f"loader.prefetch: must be >= 1, got {prefetch}")
        if augment is not None and hasattr(augment, "to") and self.device.type == "cuda":
            augment = augment.to(self.device)  # module constants (Normalize's mean/std) on the device
        self.augment, self.prefetch, self.seed, self.mix = augment, prefetch, seed, mix
        self.stats = StageStats()
        self._decoder = None  # built on first use, in this (the training) process
        self._pending: collections.deque | None = None  # see defer_delivery()
        self._ended = False

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "GpuLoader":
        """Build from a mapping of this constructor's arguments; ``stream`` may be a mapping
        of :class:`StreamConfig` fields. Unknown keys raise ``ConfigError`` naming them."""
        import inspect

        allowed = set(inspect.signature(cls.__init__).parameters) - {"self"}
        unknown = sorted(set(config) - allowed)
        if unknown:
            raise ConfigError(f"loader: unknown key(s) {unknown}; known: {sorted(allowed)}")
        kwargs = dict(config)
        if isinstance(kwargs.get("stream"), Mapping):
            kwargs["stream"] = _stream_config(kwargs["stream"])
        return cls(**kwargs)

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
    def decoder(self):
        if self._decoder is None:
            self._decoder = make_decoder(self.decode_config, self.device)
            log.info("gpupipe: decoding with %s on %s", self._decoder.name, self.device)
        return self._decoder

    def defer_delivery(self) -> None:
        """Count a batch as delivered (the resume state) only when :meth:`commit_delivered`
        says it was used — for consumers that fetch ahead of use, as Lightning's loop does."""
        self._pending = collections.deque()

    def commit_delivered(self) -> None:
        """The oldest batch yielded and not yet committed was used by the training step."""
        if self._pending is None:
            raise RuntimeError("commit_delivered() needs defer_delivery() first")
        if self._pending:
            self.encoded.mark_delivered(self._pending.popleft())
        if self._ended and not self._pending:
            self.encoded.end_epoch()

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
        self.encoded.begin_epoch()
        if self._pending is not None:  # batches yielded but never used by the last iteration do not count
            self._pending.clear()
        self._ended = False
        decoder = self.decoder
        side = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        run = _Producer(self._produce, decoder, side, self.prefetch)
        try:
            while True:
                t0 = time.perf_counter()
                item = run.get()
                self.stats.handoff_wait_s += time.perf_counter() - t0
                if item is _END:
                    break
                if isinstance(item, BaseException):
                    raise item
                out, encoded = item
                if side is not None:
                    torch.cuda.current_stream(self.device).wait_stream(side)
                    out.images.record_stream(torch.cuda.current_stream(self.device))
                if self._pending is None:
                    self.encoded.mark_delivered(encoded)
                else:
                    self._pending.append(encoded)
                self.stats.batches += 1
                self.stats.images += len(out)
                self.stats.skipped += encoded.skipped
                yield out
            self._ended = True
            if not self._pending:
                self.encoded.end_epoch()
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
                if not _put(ready, (out, _metadata(encoded)), stop):
                    return
            _put(ready, _END, stop)
        except BaseException as exc:  # hand it to the training loop, which raises it
            _put(ready, exc, stop)
        finally:
            batches.close()

    def _augment(self, out: DecodedBatch) -> torch.Tensor:
        """A ``gpupipe.transforms`` pipeline gets the batch's key (seed, epoch, sample ids);
        any other callable gets ``(images, batch)``."""
        from gpupipe.augment.base import AugKey, Transform

        if isinstance(self.augment, Transform):
            return self.augment(out.images, AugKey.for_batch(out, self.seed))
        return self.augment(out.images, out)

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
                out.images = self._augment(out)
            if self.mix is not None:
                out.images, out.labels = mix_batch(self.mix, out, self.seed)
            self.stats.augment_s += time.perf_counter() - t1
            out.valid = out.valid.to(self.device, non_blocking=True)
        return out


def mix_batch(mix: torch.nn.Module, out: DecodedBatch, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """MixUp / CutMix over the batch: images mixed, labels become (B, num_classes) float."""
    from gpupipe.augment.base import AugKey

    return mix(out.images, out.labels, AugKey.for_batch(out, seed).child(_MIX_TAG))


def _metadata(b: EncodedBatch) -> EncodedBatch:
    """The batch without its bytes: all ``mark_delivered`` needs, kept while decoding ahead."""
    return replace(b, data=b.data[:0])


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


def _stream_config(mapping: Mapping[str, Any]) -> StreamConfig:
    from gpupipe.storage import FetchConfig

    known = {f.name for f in fields(StreamConfig)}
    unknown = sorted(set(mapping) - known)
    if unknown:
        raise ConfigError(f"loader.stream: unknown key(s) {unknown}; known: {sorted(known)}")
    kwargs = dict(mapping)
    if isinstance(kwargs.get("fetch"), Mapping):
        fetch_known = {f.name for f in fields(FetchConfig)}
        bad = sorted(set(kwargs["fetch"]) - fetch_known)
        if bad:
            raise ConfigError(f"loader.stream.fetch: unknown key(s) {bad}; known: {sorted(fetch_known)}")
        kwargs["fetch"] = FetchConfig(**kwargs["fetch"])
    return StreamConfig(**kwargs)
