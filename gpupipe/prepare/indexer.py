"""``gpupipe index``: the ``index.json`` of tar shards, of an image folder or of Parquet files.

:func:`index` scans tar shards made elsewhere (e.g. by ``webdataset``) in blocks, never whole,
and writes their manifest (sample offsets and sizes). :func:`index_in_place` describes the source afresh (one listing, or one footer read
per file — never an old ``index.json``) and writes the manifest beside it: in the
folder, or in the folder of the Parquet files (for a Delta table: ``_gpupipe_index.json``, with its version). With ``checksums`` it also reads every
byte the stream will read once and stores a CRC-32 per object or row group, which the
stream then checks exactly as it checks shards. Tar shards are left to
:func:`index` (it returns ``None`` for them).
"""
from __future__ import annotations

import logging
import posixpath
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpupipe.core.errors import ConfigError, StorageError
from gpupipe.core.types import ByteRange
from gpupipe.formats.delta import DELTA_INDEX, index_json
from gpupipe.formats.manifest import MANIFEST_NAME, Manifest, ShardEntry, index_shard
from gpupipe.prepare.engines import Job, UnitRange, results_in_order, unit_ranges
from gpupipe.sources.classes import CLASSES_NAME, class_lines
from gpupipe.sources.inplace import unit_crcs, with_crcs
from gpupipe.sources.source import Source, UnitURLs, expand_pattern, resolve
from gpupipe.storage.fetch import FetchConfig, Fetcher, open_filesystem, refuse_commands, storage_errors

__all__ = ["index", "index_in_place"]

log = logging.getLogger(__name__)


def index_in_place(url: str | list[str], *, storage_options: Mapping[str, Any] | None = None, workers: int = 8,
                   checksums: bool = False, image_column: str | None = None, label_column: str | None = None,
                   labels: str | None = None, classes: Sequence[str] | None = None,
                   progress: bool = True, engine: str = "local", processes: int = 1,
                   ray_address: str | None = None) -> Manifest | None:
    """Write ``index.json`` for the image folder or Parquet files at ``url``; returns the
    manifest, or ``None`` when ``url`` names tar shards (nothing is written then).

    ``workers``: requests in flight. ``image_column``, ``label_column``, ``labels`` and
    ``classes`` are as in :class:`~gpupipe.sources.source.Source`; the index remembers them.
    With ``checksums`` and ``processes`` > 1 or ``engine="ray"``, the bytes are read as tasks
    (:mod:`gpupipe.prepare.engines`: 1,000 images or a row group each) where they run: the same
    index. The description itself (a listing, or the footers) is made here.
    """
    if workers < 1 or processes < 1:
        raise ConfigError(f"index: workers and processes must be >= 1, got {workers} and {processes}")
    refuse_commands(expand_pattern(url))
    fetch = FetchConfig(concurrency=workers)
    source = Source(url, dict(storage_options or {}), image_column=image_column, label_column=label_column,
                    labels=labels, classes=None if classes is None else tuple(classes))
    resolved = resolve(source, fetch, use_index=False)
    manifest = resolved.manifest
    if manifest is None or manifest.table is None:  # tar shards: index() scans them
        return None
    assert isinstance(resolved.shard_urls, UnitURLs), "a source read in place names its units so"
    root = resolved.shard_urls.root
    fs, folder = open_filesystem(root, storage_options)
    if checksums:
        from tqdm import tqdm

        with tqdm(total=manifest.total_bytes, disable=not progress, file=sys.stderr, unit="B", unit_scale=True,
                  desc="index") as bar:
            context = ChecksumContext(manifest, resolved.shard_urls, dict(storage_options or {}), workers)
            if engine == "local" and processes == 1:
                crcs = checksum_units(context, None, bar.update)
            else:
                crcs = _checksum_tasks(context, bar.update, engine=engine, processes=processes,
                                       ray_address=ray_address)
        manifest = with_crcs(manifest, crcs)
    name, text = (MANIFEST_NAME, manifest.to_json().encode()) if resolved.delta_version is None else \
        (DELTA_INDEX, index_json(manifest.to_json(), resolved.delta_version))
    fs.pipe_file(posixpath.join(folder.rstrip("/"), name), text)
    log.info("indexed %d samples (%s, %d units) under %s", manifest.num_samples, manifest.kind, manifest.num_units,
             root)
    return manifest


def index(url: str | list[str], *, storage_options: Mapping[str, Any] | None = None, workers: int = 4,
          progress: bool = True, engine: str = "local", processes: int = 1,
          ray_address: str | None = None) -> Manifest:
    """Scan existing shards and write their ``index.json``; returns the manifest.

    ``url``: a folder (its ``*.tar``), a brace pattern, a glob or a list of these; all
    shards must sit in one folder, where the manifest goes. Shards are read in blocks
    (``workers`` requests at once, bounded read-ahead), never whole. Class names come from a
    ``classes.txt`` in that folder when there is one. With ``processes`` > 1 or ``engine="ray"``
    each shard is a task (:mod:`gpupipe.prepare.engines`), scanned where it runs: the same index.
    """
    if workers < 1 or processes < 1:
        raise ConfigError(f"index: workers and processes must be >= 1, got {workers} and {processes}")
    urls = expand_pattern(url)
    refuse_commands(urls)
    fs, _ = open_filesystem(urls[0], storage_options)
    with storage_errors(urls[0]):
        paths = _shard_paths(fs, urls)
    folders = {posixpath.dirname(p) for p in paths}
    if len(folders) != 1:
        raise ConfigError(f"index: the shards must share one folder (for its {MANIFEST_NAME}); "
                          f"they are in {sorted(folders)[:3]}; index each folder on its own")
    folder = folders.pop()
    fetcher = Fetcher(fs, FetchConfig(concurrency=workers))
    try:
        sizes = [fetcher.size(p) for p in paths]
        from tqdm import tqdm

        with tqdm(total=sum(sizes), disable=not progress, file=sys.stderr, unit="B", unit_scale=True,
                  desc="index") as bar:
            if engine == "local" and processes == 1:
                entries = _index_shards(fetcher, folder, paths, sizes, bar.update)
            else:
                entries = _index_tasks(ShardsContext(urls[0], dict(storage_options or {}), workers, folder),
                                       paths, sizes, bar.update, engine=engine, processes=processes,
                                       ray_address=ray_address)
    finally:
        fetcher.close()
    manifest = Manifest(shards=tuple(entries), classes=_read_classes(fs, folder))
    fs.pipe_file(f"{folder}/{MANIFEST_NAME}", manifest.to_json().encode())
    log.info("indexed %d samples in %d shards under %s", manifest.num_samples, len(entries), folder)
    return manifest


def _shard_paths(fs, urls: list[str]) -> list[str]:
    """Filesystem paths of the shards that ``urls`` name, globs and folders expanded."""
    out: list[str] = []
    for u in urls:
        p = fs._strip_protocol(u).rstrip("/")
        if any(ch in p for ch in "*?["):
            found = sorted(fs.glob(p))
        elif fs.isdir(p):
            found = sorted(fs.glob(p + "/*.tar"))
        else:
            found = [p]
        if not found:
            raise StorageError("no shards here (no *.tar, or nothing matches)", url=u)
        out.extend(f for f in found if f not in out)
    return out


def _index_shards(fetcher: Fetcher, folder: str, paths: list[str], sizes: list[int],
                  tick: Callable[[int], Any]) -> list[ShardEntry]:
    step = fetcher.config.block_bytes
    spans = [[(s, min(s + step, size)) for s in range(0, size, step)] for size in sizes]
    blocks = fetcher.read_many((ByteRange(p, s, e), "") for p, sp in zip(paths, spans) for s, e in sp)

    def take(n: int) -> Iterator[bytes]:
        for _ in range(n):
            got = next(blocks)
            if isinstance(got, StorageError):
                raise got
            for chunk in got:
                tick(len(chunk))
                yield chunk

    return [index_shard(p[len(folder) + 1:], take(len(sp))) for p, sp in zip(paths, spans)]


@dataclass(frozen=True)
class ShardsContext:
    """What every shard's task of an index needs: how to reach the shards, and their folder."""

    url: str
    storage_options: Mapping[str, Any]
    workers: int
    folder: str


@dataclass(frozen=True)
class ShardTask:
    """One shard to scan: its path and size."""

    path: str
    size: int

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    def describe(self, context: ShardsContext) -> str:
        return f"{self.size} bytes in {context.folder}"


def index_one(context: ShardsContext, task: ShardTask) -> ShardEntry:
    """A shard's entry, scanned where the task runs (read in blocks)."""
    fs, _ = open_filesystem(context.url, context.storage_options)
    fetcher = Fetcher(fs, FetchConfig(concurrency=context.workers))
    try:
        return _index_shards(fetcher, context.folder, [task.path], [task.size], lambda n: None)[0]
    finally:
        fetcher.close()


def _index_tasks(context: ShardsContext, paths: list[str], sizes: list[int], tick: Callable[[int], Any], *,
                 engine: str, processes: int, ray_address: str | None) -> list[ShardEntry]:
    return results_in_order(Job(index_one, context, "index", local=context.url.startswith("memory://")),
                            [ShardTask(p, z) for p, z in zip(paths, sizes)], engine=engine, processes=processes,
                            ray_address=ray_address, tick=lambda task, entry: tick(task.size))


@dataclass(frozen=True)
class ChecksumContext:
    """What every checksum task of an ``index --checksums`` needs: the source as described at
    start (its manifest and the URL of each unit) and how to read it."""

    manifest: Manifest
    unit_urls: Sequence[str]
    storage_options: dict
    workers: int


def checksum_units(context: ChecksumContext, task: UnitRange | None,
                   tick: Callable[[int], Any] = lambda n: None) -> list[int]:
    """The CRC-32 of each unit of ``task`` (all, for ``None``), read where the task runs."""
    units = range(context.manifest.num_units) if task is None else range(task.start, task.stop)
    fetcher = Fetcher.for_url(context.unit_urls[0], context.storage_options, FetchConfig(concurrency=context.workers))
    try:
        return unit_crcs(fetcher, context.manifest, context.unit_urls, units, tick)
    finally:
        fetcher.close()


def _checksum_tasks(context: ChecksumContext, tick: Callable[[int], Any], *, engine: str, processes: int,
                    ray_address: str | None) -> list[int]:
    manifest = context.manifest
    parts = results_in_order(Job(checksum_units, context, "index", local=context.unit_urls[0].startswith("memory://")),
                             unit_ranges(manifest.num_units, manifest.kind), engine=engine, processes=processes,
                             ray_address=ray_address, tick=lambda task, crcs: tick(_bytes_of(manifest, task)))
    return [crc for crcs in parts for crc in crcs]


def _bytes_of(manifest: Manifest, task: UnitRange) -> int:
    """Bytes a checksum task reads: its objects, its row groups' column chunks, or for another
    container its share of the whole."""
    if manifest.objects is not None:
        return int(manifest.objects.sizes[task.start:task.stop].sum())
    if manifest.parquet is not None:
        return sum(b - a for g in range(task.start, task.stop) for a, b in manifest.parquet.byte_ranges(g))
    return manifest.total_bytes * (task.stop - task.start) // max(1, manifest.num_units)


def _read_classes(fs, folder: str) -> tuple[str, ...]:
    try:
        return class_lines(fs.cat_file(f"{folder}/{CLASSES_NAME}"))
    except FileNotFoundError:
        return ()
