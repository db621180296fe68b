"""From a resolved source to batches of encoded images, in and out of DataLoader workers.

:class:`EncodedDataset` is the worker side: a torch ``IterableDataset`` of plain
data (source, plan, settings) that builds its filesystem inside the worker and
yields :class:`~gpupipe.batch.EncodedBatch` objects. :class:`EncodedLoader` is
the main-process side: it owns the epoch, counts what was delivered (the resume
state) and knows the exact number of batches. ``GpuLoader`` puts decode and
augmentation behind it.
"""
from __future__ import annotations

import gc
import logging
import os
import signal
import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Mapping

import torch
from torch.utils.data import DataLoader, IterableDataset

from gpupipe.batch import EncodedBatch, pack
from gpupipe.errors import ConfigError, GpupipeError, PlanError, WorkerError
from gpupipe.plan import (PlanSpec, Progress, check_resumable, chunk_spans, plan_identity, rank_chunks,
                          steps_per_rank, worker_chunks)
from gpupipe.sources import ResolvedSource, Source, expand_pattern, resolve
from gpupipe.storage import FetchConfig, Fetcher, refuse_commands
from gpupipe.stream import SkipLog, iter_chunks, iter_whole_shards
from gpupipe.types import ErrorPolicy, World

__all__ = ["StreamConfig", "LoaderStats", "EncodedDataset", "EncodedLoader", "default_num_workers"]

log = logging.getLogger(__name__)
STATE_VERSION = 1


@dataclass(frozen=True)
class StreamConfig:
    """How samples are streamed and split. ``shuffle_buffer`` is the shuffle window in
    samples (rounded to whole batches); ``on_error`` is ``raise`` or ``skip``."""

    shuffle: bool = True
    shuffle_buffer: int = 1024
    drop_last: bool = True
    on_error: ErrorPolicy = ErrorPolicy.RAISE
    fetch: FetchConfig = field(default_factory=FetchConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "on_error", _policy(self.on_error))
        if self.shuffle_buffer < 0:
            raise ConfigError(f"stream.shuffle_buffer: must be >= 0, got {self.shuffle_buffer}")


def _policy(value) -> ErrorPolicy:
    try:
        return ErrorPolicy(value)
    except ValueError:
        raise ConfigError(f"stream.on_error: {value!r} is not one of 'raise', 'skip'") from None


def default_num_workers(world: World, *, decode_on_cpu: bool = False) -> int:
    """Workers per rank, chosen from the machine (the rule the docs describe).

    The cores this process may use are shared among the ranks of the node
    (``LOCAL_WORLD_SIZE``). One stays with the training process; the rest stream,
    up to 8 (workers only fetch and parse; raise it for high-latency storage).
    When images are also decoded on the CPU and a rank has 4 cores or fewer, the
    answer is 0: the stream then runs in the decode thread. Worker processes there
    take cores from the decoder, and even an idle one slowed DALI CPU decode in the
    training process (2 cores: 2,050 images/s with 0 workers against 1,376 with 1;
    docs/benchmarks.md, benchmarks/probes.py fork).
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    per_rank = cores // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    if decode_on_cpu and per_rank <= 4:
        return 0
    return max(1, min(8, per_rank - 1))


@dataclass
class LoaderStats:
    batches: int = 0
    samples: int = 0
    bytes: int = 0
    skipped: int = 0
    io_wait_s: float = 0.0  # in workers, waiting for storage
    wait_s: float = 0.0  # in the main process, waiting for a batch from the workers


def _fix_malloc_mmap_threshold(threshold: int = 1 << 20) -> None:
    """Keep large buffers (fetched blocks, batches) out of the glibc heap.

    glibc raises its mmap threshold each time a large mmapped block is freed, after
    which multi-megabyte blocks come from the heap and fragment it: a worker's RSS
    then creeps up over a long epoch. Fixing the threshold stops that. No-op where
    glibc is not the allocator.
    """
    import ctypes

    try:
        ctypes.CDLL(None).mallopt(-3, threshold)  # M_MMAP_THRESHOLD; the process's own libc, no lookup
    except (OSError, AttributeError):
        pass


class EncodedDataset(IterableDataset):
    """The worker side. Everything on it is plain data (a test pickles it)."""

    def __init__(self, source: ResolvedSource, spec: PlanSpec, stream: StreamConfig, world: World,
                 epoch: int = 0, progress: Mapping | None = None):
        self.source, self.spec, self.stream, self.world = source, spec, stream, world
        self.epoch, self.progress = epoch, dict(progress) if progress else None

    def __iter__(self) -> Iterator[EncodedBatch]:
        world = self.world.for_current_worker()
        in_worker = torch.utils.data.get_worker_info() is not None
        if in_worker:
            _fix_malloc_mmap_threshold()
        fetcher = Fetcher.for_url(self.source.shard_urls[0], self.source.storage_options, self.stream.fetch)
        try:
            if self.source.manifest is not None:
                yield from self._planned(fetcher, world, in_worker)
            else:
                yield from self._whole_shards(fetcher, world)
        finally:
            fetcher.close()

    def _planned(self, fetcher: Fetcher, world: World, in_worker: bool) -> Iterator[EncodedBatch]:
        spec, b = self.spec, self.spec.batch_size
        progress = Progress.from_dict(spec, self.progress) if self.progress else None
        mine = worker_chunks(rank_chunks(spec, world.rank, progress), world.worker_id, world.num_workers)
        skips = SkipLog()
        wait0 = 0.0
        for chunk, samples, valid in iter_chunks(fetcher, self.source, spec, self.epoch, mine,
                                                 on_error=self.stream.on_error, skips=skips):
            for i in range(chunk.num_batches - chunk.first_batch):
                batch = pack(samples[i * b:(i + 1) * b], valid[i * b:(i + 1) * b], shared=in_worker,
                             epoch=self.epoch, chunk=chunk.index, batch=chunk.first_batch + i)
                yield replace(batch, skipped=skips.count, io_wait_s=fetcher.stats.wait_s - wait0)
                skips.count, wait0 = 0, fetcher.stats.wait_s

    def _whole_shards(self, fetcher: Fetcher, world: World) -> Iterator[EncodedBatch]:
        spec, b = self.spec, self.spec.batch_size
        part = world.rank * world.num_workers + world.worker_id
        samples = iter_whole_shards(
            fetcher, self.source.shard_urls, seed=spec.seed, epoch=self.epoch, shuffle=spec.shuffle,
            buffer_size=self.stream.shuffle_buffer, part=part, num_parts=world.world_size * world.num_workers,
            on_error=self.stream.on_error)
        batch: list = []
        for s in samples:
            batch.append(s)
            if len(batch) == b:
                yield pack(batch, [True] * b, epoch=self.epoch)
                batch = []
        if batch and not spec.drop_last:
            yield pack(batch, [True] * len(batch), epoch=self.epoch)


def _start_workers(loader: DataLoader):
    """``iter(loader)``, with the garbage collector kept out of the forked workers.

    A worker is a fork of the training process, which holds objects such as DALI
    pipelines whose destructors deadlock outside the process that made them. If
    the child's garbage collector finds one of them in a reference cycle it runs
    that destructor and hangs (seen: ``Pipeline.__del__`` blocking in
    ``pthread_cond_destroy`` inside a DataLoader worker). So: collect here first,
    freeze what is left for the fork, and let the parent collect normally again.
    """
    if loader.num_workers == 0:
        return iter(loader)
    gc.collect()
    gc.freeze()
    try:
        return iter(loader)
    finally:
        gc.unfreeze()


def _no_async_worker_errors(it) -> None:
    """Keep torch's SIGCHLD handler from raising about this iterator's workers.

    It raises a dead worker's ``RuntimeError`` from a signal handler, at whatever line
    the main thread is running (in the training step, or halfway through handling the
    same death). Without it a death still shows, through the iterator: a reset pipe at
    once, or torch's liveness check within its 5 s status interval; ``batches()`` turns
    that into a :class:`WorkerError` naming the worker and its shards.
    """
    try:
        from torch.utils.data._utils import signal_handling

        if getattr(it, "_worker_pids_set", False):
            signal_handling._remove_worker_pids(id(it))
            it._worker_pids_set = False
    except (ImportError, AttributeError, RuntimeError, ValueError):
        pass  # another torch: its handler stays; the error is then torch's own


def _dead_workers(it, wait_s: float = 0.0) -> list:
    """``(worker id, process)`` of the workers of a DataLoader iterator that died,
    waiting up to ``wait_s`` for one (its pipes close before the kernel reports the exit)."""
    deadline = time.monotonic() + wait_s
    while True:
        dead = [(i, p) for i, p in enumerate(getattr(it, "_workers", [])) if p.exitcode not in (None, 0)]
        if dead or time.monotonic() >= deadline:
            return dead
        time.sleep(0.02)


def _stop_workers(it) -> None:
    """Stop and join the worker processes of a DataLoader iterator now, not when it is
    garbage (a traceback holding the frame would keep them alive)."""
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is None:
        return
    try:
        shutdown()
    except RuntimeError:  # torch's SIGCHLD handler reporting a dead worker again as the others exit
        if not _dead_workers(it):
            raise
    for proc in getattr(it, "_workers", []):
        proc.join(timeout=5)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=1)


class EncodedLoader:
    """Batches of still-encoded images for this rank: exact ``len``, ``set_epoch``, resumable.

    ``for batch in loader`` runs one epoch; the next ``for`` runs the next epoch
    unless ``set_epoch`` says otherwise. ``state_dict()`` taken mid-epoch and given
    to ``load_state_dict()`` of a new loader continues with exactly the batches
    not yet delivered (the worker count may differ; the world size may not).
    """

    def __init__(self, source: str | list[str] | Source, *, batch_size: int, shuffle: bool = True, seed: int = 0,
                 num_workers: int | None = None, storage_options: Mapping[str, Any] | None = None,
                 drop_last: bool = True, rank: int | None = None, world_size: int | None = None,
                 stream: StreamConfig | None = None, pin_memory: bool = False, prefetch_factor: int = 2,
                 decode_on_cpu: bool = False):
        src = source if isinstance(source, Source) else Source(url=source, storage_options=dict(storage_options or {}))
        self.stream = replace(stream or StreamConfig(), shuffle=shuffle, drop_last=drop_last)
        self.world = World.detect(rank, world_size)
        refuse_commands(expand_pattern(src.url))  # every URL of a list, not only the first
        self.source = resolve(src, self.stream.fetch)
        counts = self.source.manifest.sample_counts() if self.source.manifest else (0,) * len(self.source.shard_urls)
        self.spec = PlanSpec(counts=counts, batch_size=batch_size, world_size=self.world.world_size, seed=seed,
                             shuffle=shuffle, drop_last=drop_last,
                             chunk_batches=max(1, self.stream.shuffle_buffer // batch_size))
        self.num_workers = (default_num_workers(self.world, decode_on_cpu=decode_on_cpu)
                            if num_workers is None else num_workers)
        if self.num_workers < 0:
            raise ConfigError(f"loader.num_workers: must be >= 0, got {self.num_workers}")
        self.pin_memory, self.prefetch_factor = pin_memory, prefetch_factor
        self.epoch = 0
        self._progress = Progress.for_rank(self.spec)
        self._complete = False
        self.stats = LoaderStats()
        if self.source.manifest is not None and steps_per_rank(self.spec) == 0 and self.spec.num_samples > 0:
            raise ConfigError(
                f"{self.spec.num_samples} samples cannot give one batch of {batch_size} to each of "
                f"{self.world.world_size} rank(s) with drop_last=True; use drop_last=False or a smaller batch_size")

    # -- epoch and length ----------------------------------------------------------------
    def __len__(self) -> int:
        """Batches per epoch on this rank — the same number on every rank."""
        if self.source.manifest is None:
            raise TypeError("len() needs the shards' index.json (run `gpupipe index`); without it the count is unknown")
        return steps_per_rank(self.spec)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` next (keeps mid-epoch progress if it is the current epoch)."""
        if epoch != self.epoch or self._complete:
            self.epoch, self._complete = epoch, False
            self._progress = Progress.for_rank(self.spec)

    # -- iteration -------------------------------------------------------------------------
    def _dataset(self) -> EncodedDataset:
        return EncodedDataset(self.source, self.spec, self.stream, self.world, self.epoch, self._progress.to_dict())

    def __iter__(self) -> Iterator[EncodedBatch]:
        self.begin_epoch()
        for batch in self.batches():
            self.mark_delivered(batch)
            yield batch
        self.end_epoch()

    # The three steps of ``__iter__``, for consumers that run ahead of delivery (GpuLoader
    # decodes batch i+1 while batch i trains): progress counts what was delivered, not read.
    def begin_epoch(self) -> None:
        """Move on to the next epoch if the current one was delivered completely."""
        if self._complete:
            self.set_epoch(self.epoch + 1)

    def batches(self) -> Iterator[EncodedBatch]:
        """The remaining batches of the current epoch, without counting them as delivered."""
        workers = self.num_workers
        if self.source.manifest is not None:
            workers = min(workers, max(1, len(rank_chunks(self.spec, self.world.rank, self._progress))))
        loader = DataLoader(self._dataset(), batch_size=None, num_workers=workers, pin_memory=self.pin_memory,
                            prefetch_factor=self.prefetch_factor if workers > 0 else None,
                            persistent_workers=False)
        chunks = rank_chunks(self.spec, self.world.rank, self._progress) if self.source.manifest else []
        received: dict[int, int] = {}  # batches received per chunk, this pass
        it = _start_workers(loader)
        _no_async_worker_errors(it)
        try:
            while True:
                t0 = time.perf_counter()
                try:
                    batch = next(it, None)
                except Exception as exc:  # a dead worker shows as a reset pipe, a timeout or torch's RuntimeError
                    if isinstance(exc, GpupipeError) or not getattr(it, "_workers", None) \
                            or not _dead_workers(it, wait_s=2.0):
                        raise  # an error a worker sent (re-raised here), or no worker died
                    raise self._worker_died(it, chunks, received, exc) from exc
                self.stats.wait_s += time.perf_counter() - t0
                if batch is None:
                    return
                received[batch.chunk] = received.get(batch.chunk, 0) + 1
                yield batch
        finally:
            _stop_workers(it)

    def _worker_died(self, it, chunks: list, received: dict[int, int], exc: BaseException) -> WorkerError:
        """A ``WorkerError`` naming the dead worker(s), their pids and the shards of the
        chunk each was on (the first of its chunks not yet received whole)."""
        procs = list(getattr(it, "_workers", []))
        parts = []
        for wid, proc in _dead_workers(it):
            how = f"killed by {signal.Signals(-proc.exitcode).name}" if proc.exitcode and proc.exitcode < 0 \
                else f"exit code {proc.exitcode}"
            parts.append(f"DataLoader worker {wid} (pid {proc.pid}, {how}) {self._reading(wid, len(procs), chunks, received)}")
        what = "; ".join(parts) or str(exc)
        return WorkerError(f"{what}. The epoch cannot go on without it (the usual cause is the out-of-memory "
                           "killer: lower num_workers or stream.fetch.readahead_bytes), and a rerun or resume "
                           "from the last state_dict() reads those shards again.")

    def _reading(self, wid: int, workers: int, chunks: list, received: dict[int, int]) -> str:
        if self.source.manifest is None:
            return "was streaming every %d-th shard of the epoch's order (no manifest)" % (workers * self.world.world_size)
        for c in worker_chunks(chunks, wid, workers):
            if received.get(c.index, 0) < c.num_batches - c.first_batch:
                shards = sorted({self.source.shard_urls[s.shard] for s in chunk_spans(self.spec, self.epoch, c)})
                return f"was reading chunk {c.index} from shard(s) {', '.join(shards)}"
        return "had delivered all its chunks"

    def mark_delivered(self, batch: EncodedBatch) -> None:
        """Count ``batch`` as handed to the training loop (the resume state)."""
        self._count(batch)

    def end_epoch(self) -> None:
        self._complete = True

    def _count(self, batch: EncodedBatch) -> None:
        if batch.chunk >= 0:
            self._progress.advance(batch.chunk, batch.batch)
            self._complete = self._complete or self._progress.complete  # consumers may stop at len()
        s = self.stats
        s.batches += 1
        s.samples += len(batch)
        s.bytes += batch.nbytes
        s.skipped += batch.skipped
        s.io_wait_s += batch.io_wait_s

    # -- resume ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "epoch": self.epoch, "complete": self._complete,
                "plan": plan_identity(self.spec), "progress": self._progress.to_dict()}

    def load_state_dict(self, state: Mapping) -> None:
        if state.get("version") != STATE_VERSION:
            raise PlanError(f"loader state version {state.get('version')!r} is not {STATE_VERSION}")
        mid_epoch = not state["complete"] and (state["progress"]["done_below"] or state["progress"]["partial"])
        check_resumable(state["plan"], self.spec, mid_epoch=bool(mid_epoch))
        self.epoch, self._complete = int(state["epoch"]), bool(state["complete"])
        self._progress = Progress.from_dict(self.spec, state["progress"]) if mid_epoch else Progress.for_rank(self.spec)
