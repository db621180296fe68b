"""Make a shard dataset: ``gpupipe ingest``.

:func:`ingest` turns an image folder (class sub-folders, or flat with a ``labels.csv``),
Parquet files or a Delta table into WebDataset-layout tar shards plus the ``index.json``
manifest, on any fsspec filesystem. It reads the source exactly as the loader reads it in
place -- :func:`~gpupipe.sources.source.resolve` describes it, and the format modules'
readers (:func:`~gpupipe.formats.folder.object_sample`,
:func:`~gpupipe.formats.rowgroups.row_group_samples`) give each sample its key, fields and
label -- so the shards hold the samples (and refuse the sources) that reading in place
gives. Each image's header is then checked with :func:`~gpupipe.formats.imageheader.probe`;
what fails, and every sample the reader finds unusable (a null cell, a label that numbers
no class, an unreadable file), is skipped, logged and listed in the :class:`IngestReport`
-- never dropped silently. The output order is a permutation drawn from ``seed`` (readers
shuffle only within a window, so the order at rest matters) and the same inputs and seed
give byte-identical shards.

:func:`gpupipe.prepare.indexer.index` writes the manifest for shards made elsewhere (e.g. by
``webdataset``) and :func:`gpupipe.tools.sourceinfo.inspect` summarises a dataset. Nothing here prints.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpupipe.core.errors import ConfigError, DecodeError, GpupipeError, ShardFormatError, StorageError
from gpupipe.core.types import ByteRange, Sample
from gpupipe.formats.folder import object_sample
from gpupipe.formats.imageheader import MAX_PIXELS, probe
from gpupipe.formats.manifest import MANIFEST_NAME, Manifest
from gpupipe.formats.rowgroups import Pieces, RowGroupTable, read_footer, row_group_samples
from gpupipe.formats.writer import ShardSink
from gpupipe.plan import shuffle_buffer
from gpupipe.prepare.reencode import Reencode, reencoded
from gpupipe.sources.classes import CLASSES_NAME, check_class_names, class_list
from gpupipe.sources.source import ResolvedSource, Source, resolve
from gpupipe.storage.fetch import FetchConfig, Fetcher, is_plain_local, open_filesystem, storage_errors
from gpupipe.stream.batch import image_field

__all__ = ["IngestReport", "ingest", "in_val_split"]

log = logging.getLogger(__name__)

_READS_AHEAD_PER_WORKER = 4  # image files requested but not yet written, per worker
_PARQUET_SHUFFLE_BUFFER = 2048  # rows mixed across row groups (which are themselves permuted)
_T = TypeVar("_T")
_R = TypeVar("_R")


@dataclass
class IngestReport:
    """What :func:`ingest` wrote, and every input it skipped as ``(path, reason)``."""

    num_samples: int
    num_shards: int
    bytes: int
    classes: tuple[str, ...]
    skipped: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    splits: dict[str, int] = field(default_factory=dict)  # samples per carved split ({} without one)
    indexes: list[str] = field(default_factory=list)  # the index.json files written

    def summary(self, max_skipped: int = 10) -> str:
        """A few lines for people: counts, size, speed, and the first skipped inputs."""
        rate = self.num_samples / self.seconds if self.seconds > 0 else 0.0
        lines = [f"{self.num_samples} samples in {self.num_shards} shards ({self.bytes / 2**20:.1f} MiB), "
                 f"{len(self.classes)} classes, {len(self.skipped)} skipped, "
                 f"{self.seconds:.1f} s ({rate:.0f} samples/s)"]
        if self.splits:
            lines.append("  split: " + ", ".join(f"{name} {n}" for name, n in self.splits.items()))
        lines += [f"  skipped {path}: {reason}" for path, reason in self.skipped[:max_skipped]]
        if len(self.skipped) > max_skipped:
            lines.append(f"  ... and {len(self.skipped) - max_skipped} more skipped")
        return "\n".join(lines)


@dataclass(frozen=True)
class _Item:
    """One input sample: ``where`` it is (for the report), ``rel`` (its path under the source,
    which decides the val split) and the sample as the format's reader gives it -- or
    ``None`` and why it cannot be used."""

    where: str
    rel: str
    sample: Sample | None
    error: str = ""


def ingest(src: str, dst: str, *, shard_size: int = 1000, workers: int = 4,
           storage_options: Mapping[str, Any] | None = None,
           dst_storage_options: Mapping[str, Any] | None = None, seed: int = 0, shuffle: bool = True,
           max_pixels: int | None = MAX_PIXELS, progress: bool = True,
           image_column: str | None = None, label_column: str | None = None, labels: str | None = None,
           classes: Sequence[str] | None = None, classes_from: str | None = None,
           val_fraction: float = 0.0, targets: str | Sequence[str] | None = None,
           annotations: str | None = None, reencode: Reencode | None = None) -> IngestReport:
    """Write the images of ``src`` as shards + ``index.json`` (+ ``classes.txt``) under ``dst``.

    ``src``: whatever the loader reads in place -- an image folder (``<class>/<image>``,
    classes sorted by name give the label index; or flat, labelled by its ``labels.csv`` /
    ``labels.json`` or the mapping file ``labels``), a ``.parquet`` file, a folder of them,
    a glob, or a Delta table (``table@v<N>`` for a version) -- read by the same rules
    (:mod:`gpupipe.formats.folder`, :mod:`gpupipe.formats.rowgroups`), ``image_column`` and
    ``label_column`` naming Parquet columns. ``dst_storage_options=None`` reuses
    ``storage_options`` when ``dst`` has the same protocol. A sample keeps the key and fields
    reading in place gives it: ``<path without extension>`` or ``<file>/<row>``, and
    ``{jpg|png|webp|bmp|gif: bytes, "cls": b"<label>"}`` (no ``cls``: unlabelled), and the
    ``json`` (boxes) and ``mask.png`` members a reader gives (:mod:`gpupipe.formats.annotations`),
    copied as they are; ``index.json`` records the target kinds written.

    ``classes`` (or ``classes_from``: an ``index.json``, its folder or a ``classes.txt``, see
    :func:`~gpupipe.sources.classes.class_list`) fixes the class list and so the numbering, e.g. val's from train's
    index; a class of the source that is not in it is refused.

    ``targets`` (``boxes``, ``masks``, both: :func:`~gpupipe.core.targets.target_kinds`) carries
    each image's boxes and mask as the members ``<key>.json`` and ``<key>.mask.png``
    (:mod:`gpupipe.formats.annotations`): an image folder's from its COCO file (``annotations``,
    or found as :func:`~gpupipe.sources.source.resolve` finds it), Parquet's from its ``boxes`` /
    ``box_labels`` and ``mask`` columns. A sample whose targets are unusable is skipped and listed.

    ``val_fraction`` > 0 carves a validation split: ``dst/train/`` and ``dst/val/`` each get
    shards, ``index.json`` and ``classes.txt`` (one class list). Whether an input goes to val
    is :func:`in_val_split` of ``seed`` and its path under ``src``: the same on every run.

    ``reencode`` (:class:`~gpupipe.prepare.reencode.Reencode`: ``max_side`` or ``short_side``, and
    ``quality``) stores larger images smaller, upright and as JPEG, their boxes and masks scaled;
    images small enough already are copied unchanged; ``index.json`` records it (``prepared``).
    Raises ``StorageError`` for a missing source and ``ConfigError`` for bad arguments or a
    source that reading in place refuses too.
    """
    start = time.perf_counter()
    if shard_size < 1 or workers < 1:
        raise ConfigError(f"ingest: shard_size and workers must be >= 1, got {shard_size} and {workers}")
    if not 0 <= val_fraction < 1:
        raise ConfigError(f"ingest: val_fraction must be in [0, 1) (e.g. 0.1 for 10% validation), got {val_fraction}")
    fs, root = open_filesystem(src, storage_options)
    _check_not_inside(src, dst)
    dst_options = _dst_options(src, dst, storage_options, dst_storage_options)
    given = _given_classes(classes, classes_from, _options_like(classes_from, (dst, dst_options),
                                                                (src, storage_options)))
    source = Source(src, dict(storage_options or {}), image_column=image_column, label_column=label_column,
                    labels=labels, classes=given, targets=targets, annotations=annotations)
    fetcher = Fetcher(fs, FetchConfig(concurrency=workers))
    with storage_errors(src):  # a storage backend's error becomes one line naming src
        resolved = _resolve(fetcher, src, root, source)
    manifest, rng = resolved.manifest, _rng(seed)
    assert manifest is not None, "_resolve gives a source read in place, which a manifest describes"
    classes = manifest.classes
    skipped: list[tuple[str, str]] = []
    for path, reason in resolved.skipped:
        _skip(skipped, path, reason)
    if manifest.objects is not None:
        items = _folder_items(fetcher, resolved, rng, shuffle=shuffle, workers=workers)
    else:
        assert manifest.parquet is not None, "a manifest read in place lists objects or row groups"
        items = _parquet_items(fetcher, manifest.parquet, classes, resolved.shard_urls, rng, shuffle=shuffle,
                               workers=workers)
    splits = ("train", "val") if val_fraction else ("",)
    with storage_errors(dst):  # a storage backend's error (no credentials, say) becomes one line naming dst
        release = _claim(dst, dst_options)  # before anything is written: a second run refuses, naming this one
    try:
        return _write(items, splits, dst, dst_options, shard_size, classes, val_fraction, seed, manifest.num_samples,
                      progress, max_pixels, skipped, reencode, fetcher, start)
    finally:
        release()


def _write(items: Iterable[_Item], splits: tuple[str, ...], dst: str, dst_options: Any, shard_size: int,
           classes: tuple[str, ...], val_fraction: float, seed: int, total: int, progress: bool,
           max_pixels: int | None, skipped: list, reencode: Reencode | None, fetcher: Fetcher,
           start: float) -> IngestReport:
    """The items written as shards and indexes under ``dst`` (one split, or train and val)."""
    sinks = {s: ShardSink(f"{dst.rstrip('/')}/{s}" if s else dst, shard_size=shard_size, classes=classes,
                          storage_options=dst_options) for s in splits}

    def sink_of(item: _Item) -> ShardSink:
        if not val_fraction:
            return sinks[""]
        return sinks["val" if in_val_split(item.rel, seed, val_fraction) else "train"]

    from tqdm import tqdm

    try:
        with tqdm(total=total, disable=not progress, file=sys.stderr, unit="img", desc="ingest") as bar:
            done = _write_items(items, sink_of, max_pixels=max_pixels, skipped=skipped, tick=bar.update,
                                reencode=reencode)
    finally:
        fetcher.close()
    prepared = {"reencode": reencode.record(*done)} if reencode is not None else None
    manifests = {s: _close(sink, classes, prepared) for s, sink in sinks.items()}
    return IngestReport(sum(m.num_samples for m in manifests.values()), sum(len(m.shards) for m in manifests.values()),
                        sum(m.total_bytes for m in manifests.values()), tuple(classes), skipped,
                        time.perf_counter() - start, {s: m.num_samples for s, m in manifests.items() if s},
                        [f"{dst.rstrip('/')}/{s + '/' if s else ''}{MANIFEST_NAME}" for s in manifests])


LOCK_NAME = ".gpupipe-ingest.lock"  # in the destination while a run writes it


def _claim(dst: str, options: Any) -> Callable[[], None]:
    """Make ``dst`` this run's alone, until the returned call: a lock file naming the run (host,
    pid, start) made before anything is written. A lock there already refuses the run, naming
    the one that holds it — unless that run is gone (on this host, its process no longer exists):
    then it is taken over, with a warning. On object storage the check and the put are two
    requests (a run starting in between is not seen); on a local disk the file is made exclusively."""
    fs, root = open_filesystem(dst, options)
    root = root.rstrip("/")
    fs.makedirs(root, exist_ok=True)
    path = f"{root}/{LOCK_NAME}"
    me = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    held = _lock_of(fs, path)
    if held is not None:
        if not _gone(held):
            raise ConfigError(f"ingest: {dst} is being written by another `gpupipe ingest` (pid {held.get('pid')} on "
                              f"{held.get('host')}, since {held.get('started')}); wait for it to end, or delete "
                              f"{path} if that run is gone")
        log.warning("ingest: taking over %s: the run it names (pid %s on %s) is gone", path, held.get("pid"),
                    held.get("host"))
        fs.rm_file(path)
    data = json.dumps(me).encode()
    if is_plain_local(fs):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:  # another run made it since we looked
            return _claim(dst, options)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    else:
        fs.pipe_file(path, data)

    def release() -> None:
        try:
            fs.rm_file(path)
        except OSError:
            log.warning("ingest: could not remove %s; delete it before the next run", path)

    return release


def _lock_of(fs: Any, path: str) -> dict | None:
    """The run a lock file names (``{}`` when it cannot be read), or None when there is none."""
    try:
        raw = fs.cat_file(path)
    except FileNotFoundError:
        return None
    try:
        held = json.loads(raw)
    except ValueError:
        return {}
    return held if isinstance(held, dict) else {}


def _gone(held: Mapping[str, Any]) -> bool:
    """Whether the run a lock names has ended: only knowable on this host (its pid no longer runs)."""
    if held.get("host") != socket.gethostname() or not isinstance(held.get("pid"), int):
        return False
    try:
        os.kill(held["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it runs, as another user
        return False
    return False


def in_val_split(key: str, seed: int, fraction: float) -> bool:
    """Whether the input at ``key`` (its path under the source) belongs to the validation split.

    A pure function of ``(seed, key)``: a re-run gives the same split, and adding inputs never
    moves the others between splits. Each input is in val with probability ``fraction``, so a
    class gets ``fraction`` of its inputs in expectation (not exactly: a class of 3 images may
    get none at 0.2).
    """
    digest = hashlib.blake2b(f"{seed}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < fraction * 2**64


def _close(sink: ShardSink, classes: Sequence[str], prepared: Mapping[str, Any] | None = None) -> Manifest:
    """Write ``classes.txt`` (when there are classes), then the manifest, which ends the dataset."""
    if classes:
        sink.fs.pipe_file(f"{sink.root}/{CLASSES_NAME}", "".join(c + "\n" for c in classes).encode())
    return sink.close(prepared)


def _rng(seed: int):
    import numpy as np

    return np.random.default_rng(seed)


def _protocol(url: str) -> str:
    return url.split("://", 1)[0] if "://" in url else "file"


def _dst_options(src: str, dst: str, src_options, dst_options):
    if dst_options is not None:
        return dst_options
    return src_options if _protocol(src) == _protocol(dst) else None


def _options_like(url: str | None, *known: tuple[str, Mapping[str, Any] | None]) -> Mapping[str, Any] | None:
    """The storage options of the first ``(url, options)`` on ``url``'s protocol."""
    for other, options in known:
        if url is not None and _protocol(url) == _protocol(other):
            return options
    return None


def _check_not_inside(src: str, dst: str) -> None:
    """Refuse a destination inside the source: a second run would ingest the shards."""
    if _protocol(src) != _protocol(dst):
        return
    s, d = _bare(src), _bare(dst)
    if d == s or d.startswith(s + "/"):
        raise ConfigError(f"ingest: the destination {dst!r} is inside the source {src!r}; write it elsewhere")


def _bare(url: str) -> str:
    path = url.split("://", 1)[-1].rstrip("/")
    return os.path.abspath(path) if _protocol(url) == "file" else path


def _resolve(fetcher: Fetcher, src: str, root: str, source: Source) -> ResolvedSource:
    """The source as the loader reads it in place, described afresh (an ``index.json`` in it is
    not trusted); tar shards, other files and a missing source are refused."""
    resolved = resolve(source, fetcher.config, use_index=False)
    if resolved.kind != "tar":
        return resolved
    if any(ch in root for ch in "*?["):
        raise ConfigError(f"ingest: a glob source must match .parquet files only ({src!r}); "
                          "for images give the folder that holds them")
    if not fetcher.call(src, "exists"):
        raise StorageError("no such folder or .parquet file", url=src)
    raise ConfigError(f"ingest: {src!r} is not an image folder, Parquet files or a Delta table (it reads as tar "
                      "shards, which is what ingest writes: read them as they are)")


def _where(fetcher: Fetcher, url: str) -> str:
    """A URL as the filesystem names it (how listings and the report name files)."""
    return fetcher.fs._strip_protocol(url)


def _folder_items(fetcher: Fetcher, resolved: ResolvedSource, rng, *, shuffle: bool, workers: int
                  ) -> Iterator[_Item]:
    """The images, read concurrently in (shuffled) order, as the in-place reader makes them
    (with the members of their targets from the source's COCO file, when it has one)."""
    assert resolved.manifest is not None and resolved.manifest.objects is not None, "an image folder"
    table, urls, coco = resolved.manifest.objects, resolved.shard_urls, resolved.annotations
    order = rng.permutation(len(table)).tolist() if shuffle else range(len(table))

    def read(i: int) -> _Item:
        name, url = table.names[i], urls[i]
        try:
            data = fetcher.read(ByteRange(url, 0, int(table.sizes[i])))
        except StorageError as exc:
            return _Item(_where(fetcher, url), name, None, f"read failed: {exc}")
        try:
            fields = None if coco is None else coco.fields(i, resolved.targets)
            return _Item(_where(fetcher, url), name, object_sample(name, data, int(table.labels[i]), url, fields,
                                                                   key=table.key(i)))
        except ShardFormatError as exc:  # the reader's verdict (an empty file), as reading in place gives it
            return _Item(_where(fetcher, url), name, None, exc.reason)

    return _ordered_map(read, order, workers, workers * _READS_AHEAD_PER_WORKER)


def _parquet_items(fetcher: Fetcher, table: RowGroupTable, classes: Sequence[str], urls: Sequence[str], rng, *,
                   shuffle: bool, workers: int) -> Iterator[_Item]:
    """The rows: row groups in (permuted) order, each its image and label column chunks read
    and decoded as the in-place reader does, ``workers`` at a time, then mixed by a bounded
    shuffle buffer."""
    groups = rng.permutation(len(table)).tolist() if shuffle else range(len(table))
    footers: dict[int, Any] = {}  # file -> parsed footer (a race only parses one twice)
    # a row's path under the source, for the val split, is "<file>#row<n>" as it always was:
    # a re-run after the keys became "<file>/<n>" splits the rows as before

    def read(g: int) -> list[_Item]:
        f, url = int(table.file[g]), urls[g]
        first, name, size = int(table.first_row[g]), table.files[f], int(table.file_sizes[f])
        rows = range(first, first + int(table.rows[g]))
        try:
            if f not in footers:
                footers[f] = read_footer(size, *table.footer(f), url)
            pieces = {a: fetcher.read(ByteRange(url, a, b)) for a, b in table.byte_ranges(g)}
            file = Pieces(size, pieces, url, fallback=lambda a, b: fetcher.read(ByteRange(url, a, b)))
            samples, problems = row_group_samples(table, classes, g, footers[f], file)
        except GpupipeError as exc:  # a damaged row group or footer, storage that gave up: every row of it
            return [_Item(f"{_where(fetcher, url)}/{r}", f"{name}#row{r}", None, str(exc)) for r in rows]
        return [_Item(f"{_where(fetcher, url)}/{r}", f"{name}#row{r}", s,
                      problems[i].reason if i in problems else "") for i, (r, s) in enumerate(zip(rows, samples))]

    batches = _ordered_map(read, groups, workers, workers)
    items = itertools.chain.from_iterable(batches)
    return shuffle_buffer(items, _PARQUET_SHUFFLE_BUFFER, rng) if shuffle else items


def _given_classes(classes: Sequence[str] | None, classes_from: str | None,
                   options: Mapping[str, Any] | None) -> tuple[str, ...] | None:
    if classes is not None and classes_from is not None:
        raise ConfigError("ingest: give the class list or where to read it from (--classes or --classes-from), "
                          "not both")
    if classes_from is not None:
        return class_list(classes_from, storage_options=options)
    return None if classes is None else check_class_names(classes, "ingest: --classes")


def _ordered_map(fn: Callable[[_T], _R], items: Iterable[_T], workers: int, ahead: int) -> Iterator[_R]:
    """``map(fn, items)`` on ``workers`` threads, in order, with at most ``ahead`` results pending."""
    pool = ThreadPoolExecutor(workers, thread_name_prefix="gpupipe-ingest")
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


def _write_items(items: Iterable[_Item], sink_of: Callable[[_Item], ShardSink], *, max_pixels: int | None,
                 skipped: list, tick: Callable[[int], Any], reencode: Reencode | None = None) -> tuple[int, int]:
    """Probe each sample's image header and write the good ones (re-encoded where ``reencode``
    says); skip (and log) the others. Returns (images re-encoded, images kept as they were)."""
    changed = kept = 0
    for item in items:
        tick(1)
        if item.sample is None:
            _skip(skipped, item.where, item.error)
            continue
        fields = dict(item.sample.fields)  # all of them: the image, its label, boxes (.json), mask (.mask.png)
        try:
            header = probe(image_field(item.sample), max_pixels=max_pixels)
            smaller = reencoded(fields, item.sample.key, header, reencode) if reencode is not None else None
        except (DecodeError, OSError, ValueError, GpupipeError) as exc:  # Pillow's errors, bad boxes
            _skip(skipped, item.where, str(exc))
            continue
        changed, kept = changed + (smaller is not None), kept + (smaller is None)
        sink_of(item).write(item.sample.key, smaller if smaller is not None else fields)
    return changed, kept


def _skip(skipped: list, name: str, reason: str) -> None:
    log.warning("skipping %s: %s", name, reason)
    skipped.append((name, reason))
