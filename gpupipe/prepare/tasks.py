"""``gpupipe ingest`` cut into tasks that need nothing from each other.

:func:`plan_tasks` lays the inputs out as the ingest always did — the source's images (or Parquet
rows) in an order drawn from the seed, each split's (``train``/``val``) on its own — and cuts each
split's sequence into slices of ``shard_size``: a task per slice, which reads its inputs straight
from storage and writes one shard, ``<split>/shard-<number>.tar``, straight to the destination
(:func:`run_task`); then a small *part* file with what the index needs of that shard (offsets,
checksums, what it skipped). A part is written last, so a part means a whole shard; a task that
dies leaves no shard under its final name (:class:`~gpupipe.formats.writer.ShardSink`). The driver
(:func:`gpupipe.prepare.ingest.ingest`) runs the tasks on an engine (:mod:`gpupipe.prepare.engines`:
this machine, or Ray), skipping those whose part an interrupted run left, and merges the parts
into ``index.json`` (:func:`merge`). The same task, given the same context, writes the same bytes
wherever it runs.

A task fits a user's own job too (a Ray Data or Spark ``map`` over :func:`plan_tasks`'s list):
:func:`run_task` takes the :class:`IngestContext` and a task, and returns its :class:`TaskResult`.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from gpupipe.core.errors import DecodeError, GpupipeError, ShardFormatError, StorageError
from gpupipe.core.types import ByteRange, Sample
from gpupipe.formats.folder import object_sample
from gpupipe.formats.imageheader import image_extensions, probe
from gpupipe.formats.manifest import ShardEntry, shard_entry_from_json, shard_entry_json
from gpupipe.formats.rowgroups import Pieces, read_footer, row_group_samples
from gpupipe.formats.writer import ShardSink
from gpupipe.plan import Span
from gpupipe.prepare.reencode import Reencode, reencoded
from gpupipe.sources.source import ResolvedSource
from gpupipe.storage.fetch import FetchConfig, Fetcher, open_filesystem

__all__ = ["IngestContext", "IngestTask", "TaskResult", "plan_tasks", "run_task", "fingerprint", "in_val_split",
           "PARTS_DIR"]

log = logging.getLogger(__name__)

PARTS_DIR = ".gpupipe-ingest"  # under the destination while a job runs: its plan and the finished tasks' parts
_READS_AHEAD_PER_WORKER = 4  # inputs requested but not yet written, per read thread
_T = TypeVar("_T")
_R = TypeVar("_R")


@dataclass(frozen=True)
class IngestContext:
    """What every task of one ingest needs: the source as described at start (its listing), where
    and how to write, and the per-image rules. Plain data: it pickles to a process or a Ray worker once."""

    src: str
    resolved: ResolvedSource
    dst: str
    dst_options: Mapping[str, Any] | None
    classes: tuple[str, ...]
    seed: int = 0
    shuffle: bool = True
    max_pixels: int | None = None
    reencode: Reencode | None = None
    reads: int = 4  # concurrent reads within a task
    fingerprint: str = ""  # the job's (:func:`fingerprint`), written into each part file; "": no part files


@dataclass(frozen=True)
class IngestTask:
    """One shard's worth of inputs: ``refs`` are object indices (an image folder) or ``(row group,
    row in it)`` pairs (Parquet), in the order they are written; ``split`` is ``""`` without a
    validation split."""

    split: str
    number: int
    refs: np.ndarray

    @property
    def name(self) -> str:
        return task_name(self.split, self.number)

    def __len__(self) -> int:
        return len(self.refs)

    def describe(self, context: IngestContext) -> str:
        """Its slice of the plan, for people: how many inputs, the first and the last."""
        first, last = (_input_name(context.resolved, ref) for ref in (self.refs[0], self.refs[-1]))
        return f"{len(self)} inputs of the plan, from {first} to {last}"


@dataclass
class TaskResult:
    """What a task wrote: its shard's entry (``None`` when every input was skipped), the inputs it
    skipped as ``(path, reason)``, images re-encoded and kept, and how long it took."""

    split: str
    number: int
    entry: ShardEntry | None
    inputs: int
    skipped: list[tuple[str, str]] = field(default_factory=list)
    changed: int = 0
    kept: int = 0
    seconds: float = 0.0

    @property
    def name(self) -> str:
        return task_name(self.split, self.number)

    def to_json(self, plan: str) -> str:
        return json.dumps({"plan": plan, "split": self.split, "number": self.number, "inputs": self.inputs,
                           "entry": None if self.entry is None else shard_entry_json(self.entry),
                           "skipped": self.skipped, "changed": self.changed, "kept": self.kept,
                           "seconds": round(self.seconds, 3)})

    @classmethod
    def from_json(cls, text: str | bytes) -> tuple[str, TaskResult]:
        """``(plan fingerprint, result)`` of a part file; ``ValueError`` when it is not one."""
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError("not a part file")
        entry = None if doc["entry"] is None else shard_entry_from_json(doc["entry"])
        return str(doc["plan"]), cls(str(doc["split"]), int(doc["number"]), entry, int(doc["inputs"]),
                                     [(str(a), str(b)) for a, b in doc["skipped"]], int(doc["changed"]),
                                     int(doc["kept"]), float(doc["seconds"]))


# -- the plan ------------------------------------------------------------------------------------
def in_val_split(key: str, seed: int, fraction: float) -> bool:
    """Whether the input at ``key`` (its path under the source) belongs to the validation split.

    A pure function of ``(seed, key)``: a re-run gives the same split, and adding inputs never
    moves the others between splits. Each input is in val with probability ``fraction``, so a
    class gets ``fraction`` of its inputs in expectation (not exactly: a class of 3 images may
    get none at 0.2).
    """
    digest = hashlib.blake2b(f"{seed}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < fraction * 2**64


def plan_tasks(resolved: ResolvedSource, *, seed: int, shuffle: bool, shard_size: int,
               val_fraction: float = 0.0) -> list[IngestTask]:
    """The tasks of an ingest of ``resolved`` (an image folder or Parquet read in place): its
    inputs in the order drawn from ``seed`` — images permuted; Parquet row groups permuted, each
    its rows — split into train and val by :func:`in_val_split`, each split's cut into slices of
    ``shard_size``, numbered per split."""
    manifest = resolved.manifest
    assert manifest is not None and manifest.table is not None, "a source read in place, which a manifest describes"
    rng = np.random.default_rng(seed)
    if manifest.objects is not None:
        table = manifest.objects
        n = len(table)
        refs = rng.permutation(n) if shuffle else np.arange(n)
        names = [table.names[int(i)] for i in refs] if val_fraction else []
    else:  # Parquet row groups, or another container's units: (unit, sample in it), units permuted
        order = rng.permutation(manifest.num_units) if shuffle else np.arange(manifest.num_units)
        counts = manifest.sample_counts().array[order]
        refs = np.stack([np.repeat(order, counts), np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts,
                                                                                          counts)], axis=1)
        names = [_input_name(resolved, ref) for ref in refs] if val_fraction else []
    splits: list[tuple[str, np.ndarray]] = [("", refs)]
    if val_fraction:
        val = np.fromiter((in_val_split(k, seed, val_fraction) for k in names), dtype=bool, count=len(names))
        splits = [("train", refs[~val]), ("val", refs[val])]
    return [IngestTask(split, number, seq[a:a + shard_size])
            for split, seq in splits for number, a in enumerate(range(0, len(seq), shard_size))]


def fingerprint(resolved: ResolvedSource, settings: Mapping[str, Any], tasks: Sequence[IngestTask]) -> str:
    """What an interrupted job's parts must match to be kept: the settings that decide the bytes,
    the source's listing (names, sizes and labels of its files; not the listing's identity tag,
    which a file modified moments before it was listed leaves out) and the plan itself."""
    digest = hashlib.sha256(json.dumps(dict(settings), sort_keys=True, default=repr).encode())
    manifest = resolved.manifest
    assert manifest is not None, "a source read in place"
    if manifest.objects is not None:
        objects = manifest.objects
        blob, cuts = objects.names.packed()  # the names as stored: no Python string each
        digest.update(blob + np.ascontiguousarray(cuts).tobytes())
        digest.update(np.ascontiguousarray(objects.sizes).tobytes() + np.ascontiguousarray(objects.labels).tobytes())
    elif manifest.parquet is not None:
        g = manifest.parquet
        blob, cuts = g.files.packed()
        digest.update(blob + np.ascontiguousarray(cuts).tobytes())
        digest.update(np.ascontiguousarray(g.file_sizes).tobytes() + np.ascontiguousarray(g.rows).tobytes())
    elif manifest.table is not None:  # another container: its table as index.json holds it
        digest.update(json.dumps(manifest.table.to_dict(), sort_keys=True, default=repr).encode())
    for t in tasks:
        digest.update(f"{t.split}\0{t.number}\0".encode())
        digest.update(np.ascontiguousarray(t.refs, dtype=np.int64).tobytes())
    return digest.hexdigest()[:32]


# -- a task --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Item:
    """One input sample: ``where`` it is (for the report) and the sample as the format's reader
    gives it -- or ``None`` and why it cannot be used."""

    where: str
    sample: Sample | None
    error: str = ""


def run_task(context: IngestContext, task: IngestTask) -> TaskResult:
    """Read the task's inputs, check (and re-encode) each, write its shard and then (a context with a
    fingerprint: the ingest driver's) its part file; what it did. Raises what the destination's storage raises (the shard is then not there)."""
    start = time.perf_counter()
    resolved = context.resolved
    fs, _ = open_filesystem(context.src, resolved.storage_options)
    fetcher = Fetcher(fs, FetchConfig(concurrency=context.reads))
    root = context.dst.rstrip("/") + (f"/{task.split}" if task.split else "")
    sink = ShardSink(root, shard_size=len(task) + 1, storage_options=context.dst_options, classes=context.classes,
                     first_number=task.number)
    result = TaskResult(task.split, task.number, None, len(task))
    try:
        assert resolved.manifest is not None, "plan_tasks planned it"
        items = _object_items(fetcher, resolved, task) if resolved.manifest.objects is not None \
            else _row_items(fetcher, context, task) if resolved.manifest.parquet is not None \
            else _unit_items(fetcher, context, task)
        result.changed, result.kept = _write_items(items, sink, max_pixels=context.max_pixels,
                                                   skipped=result.skipped, reencode=context.reencode)
    finally:
        fetcher.close()
    sink.flush()
    result.entry = sink.entries[0] if sink.entries else None
    result.seconds = time.perf_counter() - start
    if context.fingerprint:  # the ingest driver's job: the part file that says this task is done
        parts = ShardSink(f"{context.dst.rstrip('/')}/{PARTS_DIR}", storage_options=context.dst_options)
        parts.put(part_name(task.split, task.number), result.to_json(context.fingerprint).encode())
    return result


def task_name(split: str, number: int) -> str:
    """A task by its shard, for people: ``train/shard-000003``."""
    return f"{split + '/' if split else ''}shard-{number:06d}"


def part_name(split: str, number: int) -> str:
    return f"{split or 'all'}-{number:06d}.json"


def _input_name(resolved: ResolvedSource, ref: Any) -> str:
    """An input of the plan by its path under the source (a Parquet row: ``<file>#row<n>``; a sample
    of another container: ``<unit>#<n>``, the unit's URL under the source's root)."""
    manifest = resolved.manifest
    assert manifest is not None, "plan_tasks planned it"
    if manifest.objects is not None:
        return manifest.objects.names[int(ref)]
    g, r = int(ref[0]), int(ref[1])
    t = manifest.parquet
    if t is not None:
        return f"{t.files[int(t.file[g])]}#row{int(t.first_row[g]) + r}"
    url = resolved.shard_urls[g]
    root = getattr(resolved.shard_urls, "root", "")
    return f"{url[len(root):] if root and url.startswith(root) else url}#{r}"


def _where(fetcher: Fetcher, url: str) -> str:
    """A URL as the filesystem names it (how listings and the report name files)."""
    return fetcher.fs._strip_protocol(url)


def _object_items(fetcher: Fetcher, resolved: ResolvedSource, task: IngestTask) -> Iterator[_Item]:
    """The task's images, read concurrently, in order, as the in-place reader makes them (with the
    members of their targets from the source's COCO file, when it has one)."""
    assert resolved.manifest is not None and resolved.manifest.objects is not None, "an image folder"
    table, urls, coco = resolved.manifest.objects, resolved.shard_urls, resolved.annotations

    def read(i: int) -> _Item:
        name, url = table.names[i], urls[i]
        try:
            data = fetcher.read(ByteRange(url, 0, int(table.sizes[i])))
        except StorageError as exc:
            return _Item(_where(fetcher, url), None, f"read failed: {exc}")
        try:
            fields = None if coco is None else coco.fields(i, resolved.targets)
            return _Item(_where(fetcher, url), object_sample(name, data, int(table.labels[i]), url, fields,
                                                             key=table.key(i)))
        except ShardFormatError as exc:  # the reader's verdict (an empty file), as reading in place gives it
            return _Item(_where(fetcher, url), None, exc.reason)

    workers = fetcher.config.concurrency
    return _ordered_map(read, task.refs.tolist(), workers, workers * _READS_AHEAD_PER_WORKER)


def _row_items(fetcher: Fetcher, context: IngestContext, task: IngestTask) -> Iterator[_Item]:
    """The task's Parquet rows: each row group it draws from read once (its image and label column
    chunks, decoded as the in-place reader does), then its rows in an order drawn from the seed and
    the task (a shard mixes the row groups it holds)."""
    resolved = context.resolved
    assert resolved.manifest is not None and resolved.manifest.parquet is not None, "Parquet"
    table, urls = resolved.manifest.parquet, resolved.shard_urls
    footers: dict[int, Any] = {}  # file -> parsed footer (a race only parses one twice)

    def read(g: int) -> list[_Item]:
        f, url = int(table.file[g]), urls[g]
        first, size = int(table.first_row[g]), int(table.file_sizes[f])
        rows = range(first, first + int(table.rows[g]))
        try:
            if f not in footers:
                footers[f] = read_footer(size, *table.footer(f), url)
            pieces = {a: fetcher.read(ByteRange(url, a, b)) for a, b in table.byte_ranges(g)}
            file = Pieces(size, pieces, url, fallback=lambda a, b: fetcher.read(ByteRange(url, a, b)))
            samples, problems = row_group_samples(table, context.classes, g, footers[f], file)
        except GpupipeError as exc:  # a damaged row group or footer, storage that gave up: every row of it
            return [_Item(f"{_where(fetcher, url)}/{r}", None, str(exc)) for r in rows]
        return [_Item(f"{_where(fetcher, url)}/{r}", s, problems[i].reason if i in problems else "")
                for i, (r, s) in enumerate(zip(rows, samples))]

    return _drawn(fetcher, context, task, read)


def _unit_items(fetcher: Fetcher, context: IngestContext, task: IngestTask) -> Iterator[_Item]:
    """The task's samples of another container read in place: each unit it draws from read whole by
    the container's stream reader (``read_spans``), then its samples in an order drawn from the seed
    and the task, as Parquet rows are."""
    resolved = context.resolved
    assert resolved.manifest is not None, "a source read in place"
    read_spans = resolved.manifest.container.needs("read_spans", "ingest")
    counts = resolved.manifest.sample_counts()

    def read(u: int) -> list[_Item]:
        where = _where(fetcher, resolved.shard_urls[u])
        (got,) = read_spans(fetcher, resolved, [Span(u, 0, counts[u])])
        return [_Item(f"{where}#{i}", None if i in got.problems else s,
                      str(got.problems[i]) if i in got.problems else "") for i, s in enumerate(got.samples)]

    return _drawn(fetcher, context, task, read)


def _drawn(fetcher: Fetcher, context: IngestContext, task: IngestTask, read: Callable[[int], list[_Item]]
           ) -> Iterator[_Item]:
    """A task of (unit, sample) inputs: each unit it draws from read once (``read``: its items, in
    order), then its samples in an order drawn from the seed and the task (a shard mixes its units)."""
    units = list(dict.fromkeys(task.refs[:, 0].tolist()))  # each once, in order of first use
    read_units = dict(zip(units, _ordered_map(read, units, fetcher.config.concurrency, fetcher.config.concurrency)))
    order = np.arange(len(task))
    if context.shuffle:
        order = np.random.default_rng([context.seed, 1 + (task.split == "val"), task.number]).permutation(len(task))
    for u, r in task.refs[order].tolist():
        yield read_units[u][r]


def _ordered_map(fn: Callable[[_T], _R], items: Iterable[_T], workers: int, ahead: int) -> Iterator[_R]:
    """``map(fn, items)`` on ``workers`` threads, in order, with at most ``ahead`` results pending."""
    pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="gpupipe-ingest")
    try:
        it = iter(items)
        pending = deque(pool.submit(fn, x) for x in itertools.islice(it, max(ahead, 1)))
        while pending:
            done = pending.popleft()
            for nxt in itertools.islice(it, 1):  # the next item, if any
                pending.append(pool.submit(fn, nxt))
            yield done.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _write_items(items: Iterable[_Item], sink: ShardSink, *, max_pixels: int | None, skipped: list,
                 reencode: Reencode | None = None) -> tuple[int, int]:
    """Probe each sample's image header and write the good ones (re-encoded where ``reencode``
    says); skip (and log) the others. Returns (images re-encoded, images kept as they were)."""
    changed = kept = 0
    for item in items:
        if item.sample is None:
            _skip(skipped, item.where, item.error)
            continue
        fields = dict(item.sample.fields)  # all of them: the image, its label, boxes (.json), mask (.mask.png)
        try:
            header = probe(_image(item.sample), max_pixels=max_pixels)
            smaller = reencoded(fields, item.sample.key, header, reencode) if reencode is not None else None
        except (DecodeError, OSError, ValueError, GpupipeError) as exc:  # Pillow's errors, bad boxes
            _skip(skipped, item.where, str(exc))
            continue
        changed, kept = changed + (smaller is not None), kept + (smaller is None)
        sink.write(item.sample.key, smaller if smaller is not None else fields)
    return changed, kept


def _image(sample: Sample) -> bytes:
    """The sample's encoded image (its first image member; a reader gives every sample one)."""
    return next((sample.fields[ext] for ext in image_extensions() if ext in sample.fields), b"")


def _skip(skipped: list, name: str, reason: str) -> None:
    log.warning("skipping %s: %s", name, reason)
    skipped.append((name, reason))
