"""From one split's settings to batches of encoded images, in and out of DataLoader workers.

:class:`EncodedDataset` is the worker side: a torch ``IterableDataset`` of plain
data (source, plan, settings) that builds its filesystem inside the worker and
yields :class:`~gpupipe.stream.batch.EncodedBatch` objects. :class:`EncodedLoader` is the
main-process side: it reads batches from the workers, knows the exact number of
batches, and keeps the epoch and resume position in an
:class:`~gpupipe.loader.epoch.EpochLedger`. ``GpuLoader`` puts decode and augmentation
behind it. Worker supervision lives in :mod:`gpupipe.stream.workers`, machine-derived
defaults in :mod:`gpupipe.core.machine`.
"""
from __future__ import annotations

import collections
import importlib
import itertools
import logging
import pickle
import time
import weakref
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from gpupipe.config.keywords import keyword_form, split_from_options
from gpupipe.config.split import SplitConfig
from gpupipe.core.counts import UnitCounts
from gpupipe.core.errors import ConfigError, GpupipeError, PlanError, WorkerError
from gpupipe.core.machine import default_num_workers, fix_malloc_mmap_threshold, warn_if_more_workers_than_cores
from gpupipe.core.types import World
from gpupipe.decode.base import DecodeConfig
from gpupipe.decode.columns import annotate
from gpupipe.loader.agree import start_in_agreement
from gpupipe.loader.epoch import EpochLedger
from gpupipe.loader.mixing import MixingCheck
from gpupipe.plan import PlanSpec, Progress, draw_sizes, steps_per_rank
from gpupipe.plan_units import Unit, rank_units, unit_spans, worker_units
from gpupipe.sources.classes import agreed_classes
from gpupipe.sources.mixed import MixedSource, per_source, resolve_mixed
from gpupipe.sources.source import ResolvedSource, expand_pattern, resolve
from gpupipe.storage.fetch import Fetcher, FetchStats, refuse_commands
from gpupipe.stream.batch import EncodedBatch, pack, pack_table
from gpupipe.stream.chunks import SkipLog, StreamConfig, iter_units, iter_whole_shards
from gpupipe.stream.slots import SlotBatch, SlotBoard, SlotTaker
from gpupipe.stream.ticket import PassTicket
from gpupipe.stream.workers import dead_workers, describe_dead, start_workers, stop_workers

__all__ = ["LoaderStats", "EncodedDataset", "EncodedLoader"]

log = logging.getLogger(__name__)
# Imported lazily by the first batch of a process's first pass (the shuffle's numpy.random, numpy.ma by
# np.unique): 60-90 ms of CPU inside the first epoch here. A loader imports them when it is made;
# forked workers then inherit them (docs/benchmarks.md, issue 28).
_FIRST_PASS_IMPORTS = ("numpy.random", "numpy.ma")
# A batch for a decoder is packed padded (each image at a multiple of the largest: one array to
# feed) when that takes at most this many times the bytes packed back to back.
PAD_RATIO = 2.0


@dataclass
class LoaderStats:
    """What the workers handed over (read, whether or not delivered yet)."""

    batches: int = 0
    samples: int = 0
    bytes: int = 0
    skipped: int = 0
    fetch: FetchStats = field(default_factory=FetchStats)  # the workers' storage counters, summed
    wait_s: float = 0.0  # in the main process, waiting for a batch from the workers
    # a mix of sources: samples of each source delivered this epoch, in source order (the ledger's
    # count, which state_dict() saves); [] for one source
    per_source: list[int] = field(default_factory=list)


@dataclass
class _Workers:
    """Stream workers kept between passes: what they were forked with (``key``), their DataLoader,
    the flags of their reused batch buffers and where each pass's settings are published."""

    key: tuple
    loader: DataLoader
    board: SlotBoard
    ticket: PassTicket
    stop: weakref.finalize  # stops them when the loader goes (or at exit), or on close()


def _stop_persistent(loader: DataLoader) -> None:
    """Stop the workers of a DataLoader that outlive passes, if it started them."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None:
        stop_workers(iterator)


class EncodedDataset(IterableDataset):
    """The worker side. Everything on it is plain data (a test pickles it)."""

    def __init__(self, source: ResolvedSource, spec: PlanSpec, stream: StreamConfig, world: World,
                 epoch: int = 0, progress: Mapping | None = None, decode: DecodeConfig | None = None,
                 unit_sizes: tuple[int, int] | None = None):
        self.source, self.spec, self.stream, self.world = source, spec, stream, world
        self.epoch, self.progress = epoch, dict(progress) if progress else None
        # (a pass's first chunk, the others): batches a unit of work holds; the loader's own, which
        # its reorder buffer expects (a pass that ends with units missing raises)
        self.unit_sizes = unit_sizes or unit_sizes_for(source, stream, spec)
        self.decode = decode  # set: each batch goes out padded, its headers probed for this decoder
        self.slots: SlotBoard | None = None  # set by the loader for workers: reused shared buffers
        self.ticket: PassTicket | None = None  # set by the loader for persistent workers: each pass's settings
        self._taker: SlotTaker | None = None  # this worker's slots (kept across passes)
        self._fetcher: Fetcher | None = None  # this worker's fetcher, when it outlives passes

    def _finish(self, batch: EncodedBatch, header_ids: np.ndarray | None = None) -> EncodedBatch:
        """What the decoder would otherwise work out per image in the training process, done here
        (:func:`gpupipe.decode.columns.annotate`; ``header_ids``: the images' probe verdicts kept
        by the stream, if it has them)."""
        return batch if self.decode is None else annotate(batch, self.decode, header_ids)

    @property
    def _pad(self) -> float:
        return PAD_RATIO if self.decode is not None else 0.0

    def begin_pass(self) -> None:
        """Take this pass's epoch, plan and progress from the ticket, when the workers outlive
        passes (:mod:`gpupipe.stream.ticket`); else they came with the fork."""
        if self.ticket is not None and torch.utils.data.get_worker_info() is not None:
            self.epoch, self.progress, self.spec, pass_id = self.ticket.read()
            if self.slots is not None:
                self._taker = self._taker or self.slots.taker(self.world.for_current_worker().worker_id)
                self._taker.pass_id = pass_id

    def __iter__(self) -> Iterator[EncodedBatch | SlotBatch]:
        self.begin_pass()
        return self.batches()

    def batches(self) -> Iterator[EncodedBatch | SlotBatch]:
        """The batches of this worker's units of the pass (:meth:`begin_pass` first)."""
        world = self.world.for_current_worker()
        in_worker = torch.utils.data.get_worker_info() is not None
        if in_worker:
            fix_malloc_mmap_threshold()
        # A worker maps local files (its death by SIGBUS, should one shrink meanwhile, is reported as
        # such); one that outlives passes keeps its fetcher, and so its files mapped, from pass to pass.
        kept = in_worker and self.ticket is not None
        fetcher = self._fetcher if kept and self._fetcher is not None else \
            Fetcher.for_url(self.source.shard_urls[0], self.source.storage_options, self.stream.fetch,
                            map_files=in_worker)
        if kept:
            self._fetcher = fetcher
            fetcher.forget_changed_files()
        try:
            if self.source.manifest is not None:
                yield from self._planned(fetcher, world, in_worker)
            else:
                yield from self._whole_shards(fetcher, world)
        finally:
            if not kept:
                fetcher.close()

    def units(self, world: World) -> list[Unit]:
        """The units of work of this worker (``world``: the worker's own), in plan order."""
        progress = Progress.from_dict(self.spec, self.progress) if self.progress else None
        units = rank_units(self.spec, world.rank, progress, self.unit_sizes[1], self.unit_sizes[0])
        return worker_units(units, world.worker_id, world.num_workers)

    def _planned(self, fetcher: Fetcher, world: World, in_worker: bool) -> Iterator[EncodedBatch | SlotBatch]:
        spec, b = self.spec, self.spec.batch_size
        mine = self.units(world)
        skips = SkipLog()
        f = fetcher.stats
        last = f.copy()
        slots = self._taker if in_worker else None  # made by begin_pass: slots come with the ticket
        probe = None if self.decode is None else (self.decode.max_pixels,)
        for unit, table in iter_units(fetcher, self.source, spec, self.epoch, mine,
                                      on_error=self.stream.on_error, skips=skips, probe=probe):
            for i in range(unit.num_batches):
                part = table.take(slice(i * b, (i + 1) * b))
                batch = pack_table(part, shared=in_worker, pad=self._pad, epoch=self.epoch, chunk=unit.chunk.index,
                                   batch=unit.first_batch + i, slots=slots)
                batch = replace(self._finish(batch, part.header_ids), skipped=skips.count, fetched=f.since(last))
                yield slots.crossing(batch) if slots is not None else batch
                skips.count, last = 0, f.copy()

    def _whole_shards(self, fetcher: Fetcher, world: World) -> Iterator[EncodedBatch]:
        spec, b = self.spec, self.spec.batch_size
        part = world.rank * world.num_workers + world.worker_id
        skips = SkipLog()
        f = fetcher.stats
        last = f.copy()
        samples = iter_whole_shards(
            fetcher, self.source.shard_urls, seed=spec.seed, epoch=self.epoch, shuffle=spec.shuffle,
            buffer_size=self.stream.shuffle_buffer, part=part, num_parts=world.world_size * world.num_workers,
            on_error=self.stream.on_error, skips=skips, targets=self.source.targets)
        batch: list = []
        for s in samples:
            batch.append(s)
            if len(batch) == b:
                packed = pack(batch, [True] * b, epoch=self.epoch, kinds=self.source.targets, pad=self._pad)
                yield replace(self._finish(packed), skipped=skips.count, fetched=f.since(last))
                batch, skips.count, last = [], 0, f.copy()
        if batch and not spec.drop_last:
            packed = pack(batch, [True] * len(batch), epoch=self.epoch, kinds=self.source.targets, pad=self._pad)
            yield replace(self._finish(packed), skipped=skips.count, fetched=f.since(last))


def _in_thread(dataset: EncodedDataset, pin: bool) -> Generator[EncodedBatch | SlotBatch, None, None]:
    """The batches of ``dataset`` made in this thread, pinned where ``pin`` (what torch's
    DataLoader does with 0 workers)."""
    for batch in dataset:
        yield batch.pin_memory() if pin else batch


class _WholeUnits(IterableDataset):
    """The worker side, one item per unit of work: the list of its batches. torch takes its
    workers' items round-robin and units go round-robin to workers, so whole units arrive in the
    plan's order whatever the number of workers (and :meth:`EncodedLoader.batches` puts them in
    order should they not). Batches one by one would interleave the units of the workers.

    The worker's units are the dataset's (:meth:`EncodedDataset.units`): a group is the batches
    of one of them, in order."""

    def __init__(self, dataset: EncodedDataset):
        self.dataset = dataset

    def __iter__(self) -> Iterator[list[EncodedBatch | SlotBatch]]:
        self.dataset.begin_pass()
        return self._groups(self.dataset.batches())

    def _groups(self, batches: Iterator[EncodedBatch | SlotBatch]) -> Iterator[list[EncodedBatch | SlotBatch]]:
        for unit in self.dataset.units(self.dataset.world.for_current_worker()):
            group = list(itertools.islice(batches, unit.num_batches))
            if group:
                yield group


@keyword_form
class EncodedLoader:
    """Batches of still-encoded images for this rank: exact ``len``, ``set_epoch``, resumable.

    Every ``for batch in loader`` is a pass over the current epoch from its first batch, as
    with torch's DataLoader; after a complete pass the next ``for`` runs the next epoch
    (``set_epoch`` chooses one), after a pass broken off the same epoch again. ``state_dict()``
    taken mid-epoch and given to ``load_state_dict()`` of a new loader makes its next pass
    continue with exactly the batches not yet delivered. The batches and their order do not
    depend on the number of workers or on ``stream.unit_batches``. Under another world size, batch size, shuffle window or
    ``drop_last`` (rank 0's state, loaded on every rank) it continues with exactly the samples
    of the epoch not yet delivered, in a new order (:func:`gpupipe.plan.resume_plan`).

    On rank 0 a shuffled pass's first batches are checked for classes mixed far less than a
    uniform shuffle would mix them (:mod:`gpupipe.loader.mixing`): one warning per loader, and
    the numbers in ``mixing.result`` (``mixing`` is ``None`` without shuffle and on other ranks).
    """

    def __init__(self, split: SplitConfig | str | list[str], world: World | None = None, **options):
        """``split``: a :class:`~gpupipe.config.split.SplitConfig`; or a URL with the keyword form
        (``EncodedLoader(url, batch_size=64, shuffle=False, ...)``, see
        :func:`~gpupipe.config.keywords.split_from_options`). ``world``: detected when not given."""
        if not isinstance(split, SplitConfig):
            split, detected = split_from_options(split, caller="EncodedLoader", **options)
            world = world or detected
        elif options:
            raise ConfigError(f"EncodedLoader(split): the settings are in the SplitConfig; got also {sorted(options)}")
        self.split, self.world = split, world or World.detect()
        start_in_agreement(self, lambda: self._start(split))
        for module in _FIRST_PASS_IMPORTS:
            importlib.import_module(module)  # ranks check, in one collective, that they plan alike

    def _start(self, split: SplitConfig) -> None:
        """The source, the plan and the ledger of this rank (run by :func:`start_in_agreement`)."""
        self.stream: StreamConfig = split.stream
        refuse_commands(expand_pattern(split.source.url))  # every URL of a list, not only the first
        mixed = split.source if isinstance(split.source, MixedSource) else None
        self.source: ResolvedSource = resolve_mixed(split.source, self.stream.fetch, on_error=split.decode.on_error) \
            if isinstance(split.source, MixedSource) else \
            resolve(split.source, self.stream.fetch, on_error=split.decode.on_error)
        manifest = self.source.manifest
        if split.classes is not None and manifest is not None:  # the index must number classes as declared
            agreed_classes({split.name: manifest.classes}, split.classes, {split.name: _first(split.source.url)})
        counts = manifest.sample_counts() if manifest else UnitCounts.uniform(0, len(self.source.shard_urls))
        whole = self._per_source(mixed, split.batch_size)
        try:
            self.spec = PlanSpec(counts=counts, batch_size=split.batch_size, world_size=self.world.world_size,
                                 seed=split.seed, shuffle=self.stream.shuffle, drop_last=self.stream.drop_last,
                                 chunk_batches=max(1, self.stream.shuffle_buffer // split.batch_size),
                                 block=block_for(self.source, self.stream, counts.total),
                                 draws=mix_draws(self.source, mixed, whole) if mixed is not None else (),
                                 per_source=self.stream.batching == "per_source")
        except PlanError as exc:
            if mixed is None:
                raise
            raise ConfigError(f"{mixed.setting}: {exc}") from None
        self.num_workers = default_num_workers(self.world) if split.num_workers is None else split.num_workers
        warn_if_more_workers_than_cores(self.num_workers, self.world)
        # prefetch_factor counts items per worker, and with a manifest an item is a unit of work: a
        # worker reads about a window ahead, as when a window was its unit (and held as much).
        self.pin_memory = False
        self.unit_sizes = unit_sizes_for(self.source, self.stream, self.spec)
        self.prefetch_factor = max(1, self.spec.chunk_batches // self.unit_sizes[1])
        # set by GpuLoader: the decoder's settings, for the workers to probe headers and draw crops for
        self.decode: DecodeConfig | None = None
        self.ledger = EpochLedger(self.spec, len(self.source.parts))
        self._workers: _Workers | None = None  # stream workers kept between passes (batches())
        self.stats = LoaderStats(per_source=self.ledger.per_source)  # the ledger's list: current at every batch
        # a shuffled pass's first batches checked for classes mixed far less than a uniform shuffle would
        # (on rank 0: one warning a job, not one a rank)
        self.mixing = MixingCheck(_first(split.source.url), split.batch_size) \
            if self.stream.shuffle and self.world.rank == 0 and not self.spec.per_source else None  # one source a batch: meant
        _warn_short_reads(self.source, self.stream, self.spec)
        if manifest is not None and steps_per_rank(self.spec) == 0 and self.spec.num_samples > 0:
            raise ConfigError(
                f"{self.spec.num_samples} samples cannot give one batch of {split.batch_size} to each of "
                f"{self.world.world_size} rank(s) with drop_last=True; use drop_last=False or a smaller batch_size")

    # -- epoch and length ----------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self.ledger.epoch

    def __len__(self) -> int:
        """Batches per epoch on this rank — the same number on every rank. In an epoch resumed
        under another world size or batch size: its batches before the resume and after."""
        if self.source.manifest is None:
            raise TypeError("len() needs the shards' index.json (run `gpupipe index`); without it the count is unknown")
        return self.ledger.steps

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` next (a position loaded for this very epoch is kept)."""
        self.ledger.set_epoch(epoch)

    # -- iteration -------------------------------------------------------------------------
    def _dataset(self) -> EncodedDataset:
        """The worker side for the rest of the current epoch (plain data: it pickles)."""
        return EncodedDataset(self.source, self.ledger.plan, self.stream, self.world, self.epoch,
                              self.ledger.progress.to_dict(), self.decode, self.unit_sizes)

    def __iter__(self) -> Iterator[EncodedBatch]:
        self.ledger.begin()
        for batch in self.batches():
            self.ledger.yielded(batch.chunk, batch.batch)
            yield batch
        self.ledger.finished()

    def batches(self) -> Iterator[EncodedBatch]:
        """The batches of the current epoch not yet delivered, read from the workers, in the
        plan's order; the consumer reports what it delivers to :attr:`ledger` (see
        :mod:`gpupipe.loader.epoch`)."""
        plan, progress = self.ledger.plan, self.ledger.progress
        units = rank_units(plan, self.world.rank, progress, self.unit_sizes[1], self.unit_sizes[0]) \
            if self.source.manifest is not None else []
        workers = self.num_workers
        if self.source.manifest is not None:
            workers = min(workers, max(1, len(units)))
        whole = workers > 0 and self.source.manifest is not None  # whole units, put in the plan's order
        loader: DataLoader | None = None
        board: SlotBoard | None = None
        if workers > 0:
            loader, board = self._persistent(workers, whole)
        expected = collections.deque(u.key for u in units)
        check = self.mixing.start() if self.mixing is not None else None  # None: nothing to check
        arrived: dict[tuple[int, int], list[EncodedBatch]] = {}  # units that came before their turn
        received: dict[tuple[int, int], int] = {}  # batches received per unit (chunk, first batch), this pass
        if loader is None:  # in this thread: torch's DataLoader adds a profiler range and a fetcher a batch here
            it: Any = _in_thread(self._dataset(), self.pin_memory)
        else:
            try:
                it = start_workers(loader)
            except Exception as exc:  # noqa: BLE001 — torch's error for a worker that died between passes
                log.warning("gpupipe: a stream worker kept from the last pass is gone (%s); starting new ones", exc)
                self.close()
                loader, board = self._persistent(workers, whole)
                it = start_workers(loader)
        if board is not None and self._workers is not None:
            board.reclaim(self._workers.ticket.pass_id)  # what a pass broken off left flagged, torch has dropped
        failed = True
        try:
            while True:
                t0 = time.perf_counter()
                try:
                    item = next(it, None)
                except Exception as exc:  # a dead worker shows as a reset pipe, a timeout or torch's RuntimeError
                    if isinstance(exc, GpupipeError) or not getattr(it, "_workers", None) \
                            or not dead_workers(it, wait_s=2.0):
                        raise  # an error a worker sent (re-raised here), or no worker died
                    raise self._worker_died(it, units, received, exc) from exc
                self.stats.wait_s += time.perf_counter() - t0
                if item is None:
                    if whole and (expected or arrived):  # never silently short: the workers' units are the plan's
                        raise GpupipeError(f"the workers ended the pass with units {list(expected)[:3]} not delivered "
                                           f"and {sorted(arrived)[:3]} out of order: a gpupipe bug, please report it")
                    if check is not None:
                        check.finish()
                    if self.source.parts:
                        log.info("gpupipe: epoch %d, samples delivered per source: %s", self.epoch, ", ".join(
                            f"{p.url} {n}" for p, n in zip(self.source.parts, self.ledger.per_source)))
                    failed = False
                    return
                group = item if isinstance(item, list) else [item]
                if board is not None:
                    group = [board.receive(b) for b in group]  # a batch in a slot whose storage is kept here
                    board.release()  # the batches the consumer has let go since: their slots to reuse
                    for batch in group:
                        board.hold(batch.data, batch.slot)
                key = (group[0].chunk, group[0].batch)
                received[key] = received.get(key, 0) + len(group)
                if whole:
                    arrived[key] = group
                    group = []
                    while expected and expected[0] in arrived:
                        group += arrived.pop(expected.popleft())
                for batch in group:
                    self._count(batch)
                    if check is not None and not check.add(batch.labels, batch.valid, batch.targets is not None):
                        check = None  # checked (or nothing to check) for this pass
                    yield batch
        except GeneratorExit:  # the consumer broke off: the workers stay for the next pass (torch drains them)
            failed = False
            raise
        finally:
            if loader is None:
                it.close()  # the dataset's own generator: its reader closes now
            elif failed:
                self.close()

    def _persistent(self, workers: int, whole: bool) -> tuple[DataLoader, SlotBoard]:
        """The DataLoader of workers that outlive passes (made again when what they were forked
        with changed), with this pass's epoch, plan and progress published for them."""
        key = (workers, whole, id(self.source), self.stream, self.world, self.decode, self.unit_sizes,
               self.prefetch_factor, self.pin_memory)
        ticket = (self.epoch, self.ledger.progress.to_dict(), self.ledger.plan)
        held = self._workers
        if held is None or held.key != key or not held.ticket.write((*ticket, held.ticket.pass_id + 1)):
            self.close()
            side = self._dataset()
            # a worker may have out: the items torch prefetches, the one it builds, those the consumer holds
            side.slots = SlotBoard(workers, (self.prefetch_factor + 2) * max(self.unit_sizes) + 2)
            size = len(pickle.dumps((*ticket, 1), protocol=pickle.HIGHEST_PROTOCOL))
            side.ticket = PassTicket(max(1 << 20, 2 * size))
            side.ticket.write((*ticket, 1))
            loader = DataLoader(_WholeUnits(side) if whole else side, batch_size=None, num_workers=workers,
                                pin_memory=self.pin_memory, prefetch_factor=self.prefetch_factor,
                                persistent_workers=True)
            # Stopped by a finalizer that holds the DataLoader: when the loader becomes garbage (a reference
            # cycle, say) the DataLoader and its queues stay out of the garbage, so the workers are told to
            # stop through queues still open (torch's own __del__ on a collected cycle found them closed
            # and waited 5 s a worker).
            held = self._workers = _Workers(key, loader, side.slots, side.ticket,
                                            weakref.finalize(self, _stop_persistent, loader))
        held.board.release()  # batches let go since the last pass: their slots free before the workers start
        return held.loader, held.board

    def __getstate__(self) -> dict:
        """Everything but the stream workers, which live in this process (a copy starts its own)."""
        state = self.__dict__.copy()
        state["_workers"] = None
        return state

    def close(self) -> None:
        """Stop the stream workers kept between passes (they also stop with the loader, or at exit)."""
        held, self._workers = self._workers, None
        if held is not None:
            held.stop()

    def _worker_died(self, it, units: list[Unit], received: dict[tuple[int, int], int],
                     exc: BaseException) -> WorkerError:
        """A ``WorkerError`` naming the dead worker(s), their pids and the shards of the
        unit each was on (the first of its units not yet received)."""
        workers = len(getattr(it, "_workers", []))
        parts = [f"{who} {self._reading(wid, workers, units, received)}" for wid, who in describe_dead(it)]
        what = "; ".join(parts) or str(exc)
        if "SIGBUS" in what:  # workers read local files mapped in memory (Fetcher map_files)
            cause = ("SIGBUS: reading a shard it had mapped failed — the file shrank while it was read (shards "
                     "rewritten in place under a running job: write new files and rename them over the old "
                     "ones), or the disk gave an I/O error")
        else:
            cause = "the usual cause is the out-of-memory killer: lower num_workers or stream.fetch.readahead_bytes"
        return WorkerError(f"{what}. The epoch cannot go on without it ({cause}), and a rerun or resume "
                           "from the last state_dict() reads those shards again.")

    def _reading(self, wid: int, workers: int, units: list[Unit], received: dict[tuple[int, int], int]) -> str:
        if self.source.manifest is None:
            return f"was streaming every {workers * self.world.world_size}-th shard of the epoch's order (no manifest)"
        for u in worker_units(units, wid, workers):
            if received.get(u.key, 0) < u.num_batches:
                spans, _ = unit_spans(self.ledger.plan, self.epoch, u)
                shards = sorted({self.source.shard_urls[s.shard] for s in spans})
                last = u.first_batch + u.num_batches - 1
                which = f"batch {last}" if u.num_batches == 1 else f"batches {u.first_batch}-{last}"
                return f"was reading {which} of chunk {u.chunk.index} from shard(s) {', '.join(shards)}"
        return "had delivered all its units"

    def _count(self, batch: EncodedBatch) -> None:
        if self.source.parts:  # counted when the batch is delivered (the ledger knows when)
            counts = per_source(self.source.parts, batch.sample_ids.numpy(), batch.valid.numpy())
            self.ledger.noted(batch.chunk, batch.batch, counts.tolist())
        s = self.stats
        s.batches += 1
        s.samples += len(batch)
        s.bytes += batch.nbytes
        s.skipped += batch.skipped
        if batch.fetched is not None:
            s.fetch.add(batch.fetched)

    def _per_source(self, mixed: MixedSource | None, batch_size: int) -> int:
        """The multiple each source's epoch count is rounded down to: a batch for
        ``stream.batching: per_source`` (which needs a mix), else 1."""
        if self.stream.batching != "per_source":
            return 1
        if mixed is None:
            raise ConfigError("stream.batching: per_source needs several sources (source.train a list of "
                              "{url, weight | repeat | samples})")
        return batch_size

    # -- resume ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return self.ledger.state_dict()

    def load_state_dict(self, state: Mapping) -> None:
        self.ledger.load_state_dict(state)


def mix_draws(source: ResolvedSource, mixed: MixedSource, whole: int = 1) -> tuple[tuple[int, int], ...]:
    """``PlanSpec.draws`` of a mix: per source, its units and the samples an epoch takes of it
    (:func:`gpupipe.plan.draw_sizes`, from its size and its weight, repeat or samples), rounded
    down to a multiple of ``whole`` (per-source batches: whole batches of each source)."""
    sizes = draw_sizes([p.samples for p in source.parts], weight=[d.weight for d in mixed.draws],
                       repeat=[d.repeat for d in mixed.draws], samples=[d.samples for d in mixed.draws])
    for p, n in zip(source.parts, sizes):
        if 0 < n < whole:
            raise ConfigError(f"stream.batching: per_source: {p.url} gives {n} samples an epoch, fewer than one "
                              f"batch of {whole}; raise its weight, repeat or samples, or lower the batch size")
    return tuple((p.units, n // whole * whole) for p, n in zip(source.parts, sizes))


def _first(url) -> str:
    return url if isinstance(url, str) else url[0]


def _remote(source: ResolvedSource) -> bool:
    url = source.shard_urls[0] if source.shard_urls else ""
    return "://" in url and not url.startswith(("file://", "local://", "memory://"))


DEFAULT_BLOCK = 4  # samples: a window of 1,024 holds 256 places of the data (docs/tuning.md, shuffle_block)
MAX_BLOCKS = 1 << 22  # an epoch's layout holds every block: 4M blocks plan in ~1.5 s and ~0.3 GB per process


def block_for(source: ResolvedSource, stream: StreamConfig, num_samples: int = 0) -> int:
    """The plan's ``block``: ``stream.shuffle_block`` when set. Else tar shards where short reads
    are cheap (on this machine, or behind ``fetch.cache_dir``), whose samples are byte ranges of
    the manifest, in blocks of :data:`DEFAULT_BLOCK`: a window then reads 256 short ranges instead
    of one or two long ones. Shards whole (0) elsewhere: on object storage without the cache each
    range is a request (an epoch of class-ordered shards on loopback S3 at +20 ms: 5,320 samples/s
    whole, 1,222 in blocks of 8; docs/benchmarks.md, issue 35); Parquet row groups are decoded
    whole; an image folder's units are single images already. Past 16M samples the default block
    grows so that an epoch has at most :data:`MAX_BLOCKS` blocks (the layout of 100M samples in
    blocks of 4: ~8 s and ~2 GB in every worker, extrapolated from 10M; in blocks of 24, 1.5 s and 0.3 GB)."""
    if stream.shuffle_block is not None:
        return stream.shuffle_block
    reads = source.manifest.container.reads if source.manifest is not None else None
    if reads != "ranges" or (_remote(source) and stream.fetch.cache_dir is None):
        return 0
    return default_block(num_samples)


def default_block(num_samples: int) -> int:
    """The default ``block`` of tar shards read cheaply: :data:`DEFAULT_BLOCK`, or more past 16M
    samples so that an epoch has at most :data:`MAX_BLOCKS` blocks."""
    return max(DEFAULT_BLOCK, -(-num_samples // MAX_BLOCKS))


def unit_sizes_for(source: ResolvedSource, stream: StreamConfig, spec: PlanSpec) -> tuple[int, int]:
    """A worker's unit of work in batches, (in a pass's first chunk, in the others):
    ``stream.unit_batches`` for both when set. Else: an image folder, one batch (an image is a
    request either way); tar shards where short reads are cheap (on this machine, or on object
    storage behind the block cache), one batch in the first chunk — the pass's first batch waits
    for its own samples only — and the window after it: a unit of one batch of a shuffled window
    reads ~190 short ranges, +12-18 us of CPU a sample on the host path here; where they are not
    (object storage without ``fetch.cache_dir``: an epoch 0.52 s became 28.7 s on loopback S3)
    and for Parquet (a unit needs every row group of its window anyway), the window throughout
    (docs/benchmarks.md, "Units of work")."""
    if stream.unit_batches is not None:
        return stream.unit_batches, stream.unit_batches
    window = spec.chunk_batches
    reads = source.manifest.container.reads if source.manifest is not None else None
    if reads == "objects":
        return 1, 1
    if reads == "whole" or (_remote(source) and stream.fetch.cache_dir is None):
        return window, window
    return 1, window


def _warn_short_reads(source: ResolvedSource, stream: StreamConfig, spec: PlanSpec) -> None:
    """Say so when tar shards on remote storage, without a block cache, will be read a sample or
    two per request: a unit of work smaller than a shuffled window reads only its own samples."""
    url = source.shard_urls[0] if source.shard_urls else ""
    if (_remote(source) and source.manifest is not None and source.manifest.container.reads == "ranges" and stream.shuffle
            and stream.fetch.cache_dir is None and stream.unit_batches is not None
            and stream.unit_batches < spec.chunk_batches):
        log.warning("stream.unit_batches=%d of a window of %d batches: each unit reads its own samples from %s, "
                    "a request per sample or two, without stream.fetch.cache_dir. On object storage set cache_dir "
                    "(a block cache on local disk), or unit_batches=%d to read whole windows (docs/tuning.md, "
                    "unit_batches)", stream.unit_batches, spec.chunk_batches, url, spec.chunk_batches)
