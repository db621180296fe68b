"""Describe a source read in place — an image folder or Parquet files — as a manifest.

Used at start (:func:`gpupipe.sources.source.resolve`, when there is no ``index.json``) and by
``gpupipe index`` (:func:`index_in_place`, which writes it). Nothing here reads image
bytes unless asked for checksums: a folder is one recursive listing (plus its labels
file), a Parquet source one ranged read of each file's tail (its footer), plus the label
column chunks when labels are strings (to learn the class names).
"""
from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from gpupipe.core.errors import ConfigError, StorageError
from gpupipe.core.types import ByteRange
from gpupipe.formats.folder import FOLDER, LABEL_FILES, FolderListing, ObjectTable, folder_table, parse_label_file
from gpupipe.formats.manifest import Manifest
from gpupipe.formats.rowgroups import (
    PARQUET,
    TAIL_BYTES,
    Pieces,
    RowGroupTable,
    data_files,
    describe_parquet,
    footer_range,
    parquet_classes,
    read_columns,
    read_footer,
    require_pyarrow,
)
from gpupipe.sources.resolved import UnitURLs
from gpupipe.storage.fetch import Fetcher
from gpupipe.storage.identity import ObjectVersion
from gpupipe.storage.objects import fetch_objects

__all__ = ["describe_folder", "parquet_paths", "describe_parquet_files", "with_checksums", "unit_crcs", "with_crcs"]

log = logging.getLogger(__name__)


def describe_folder(fetcher: Fetcher, folder: str, listing: FolderListing, labels: str | None = None,
                    classes: Sequence[str] | None = None, skipped: list | None = None,
                    annotated: bool = False) -> Manifest:
    """The manifest of an image folder (``folder``: its URL, ending in ``/``).

    ``labels``: the URL of a mapping file for a flat folder (default: ``labels.csv`` or
    ``labels.json`` in it, when there). ``classes``: the list that numbers class names
    (default: the names found, sorted). ``skipped`` (a list) gets ``(path, why)`` of each
    file that is not read as an image (:func:`~gpupipe.formats.folder.folder_table`).
    ``annotated``: a flat folder whose objects a COCO file gives (no labels file read, labels -1)."""
    found = [f"{listing.root}/{n}" for n in LABEL_FILES if f"{listing.root}/{n}" in listing.files and not annotated]
    url = labels or (folder + found[0][len(listing.root) + 1:] if found else None)
    mapping = parse_label_file(fetcher.read(ByteRange(url)), url) if url else None
    table, classes, rejected = folder_table(listing, mapping, explicit=labels is not None, classes=classes,
                                            annotated=annotated)
    if skipped is not None:
        skipped.extend(rejected)
    if not len(table):
        seen = f"; not read: {rejected[0][0]} ({rejected[0][1]})" if rejected else ""
        raise StorageError(f"no images here (names ending in .jpg, .jpeg, .png, .webp, .bmp or .gif){seen}", url=folder)
    return Manifest(shards=(), classes=classes, table=table)


def _describe_folder_source(fetcher: Fetcher, folder: str, listing: FolderListing, source: Any,
                            skipped: list) -> Manifest:
    """The image folder container's ``describe`` hook: its manifest from the listing."""
    if source.targets and source.labels is not None:
        raise ConfigError(f"source.labels: {folder} is read with COCO annotations (source.targets), which give "
                          "its objects and classes; a labels file is for classification. Leave source.labels out.")
    return describe_folder(fetcher, folder, listing, source.labels, source.classes, skipped,
                           annotated=bool(source.targets))


def _describe_parquet_source(fetcher: Fetcher, folder: str, listing: FolderListing, source: Any,
                             skipped: list) -> Manifest:
    """The Parquet container's ``describe`` hook: its manifest from the files' footers."""
    paths, sizes = parquet_paths(listing)
    return describe_parquet_files(fetcher, folder, paths, sizes, source.image_column, source.label_column,
                                  source.classes)


def _object_version(table: ObjectTable, i: int, vouched: str) -> ObjectVersion:
    """An object is known by its CRC-32 when indexed with checksums, else by what described it."""
    return ObjectVersion(vouched if table.crc32 is None else f"crc32:{int(table.crc32[i])}", int(table.sizes[i]))


def _group_version(table: RowGroupTable, i: int, vouched: str) -> ObjectVersion:
    """A row group has no size of its own: its CRC-32, else what described it and its file's size."""
    if table.crc32 is not None:
        return ObjectVersion(f"crc32:{int(table.crc32[i])}")
    return ObjectVersion(vouched and f"{vouched};size={int(table.file_sizes[int(table.file[i])])}")


def _parquet_urls(folder: str, table: RowGroupTable) -> UnitURLs:
    require_pyarrow()  # here, not first in each worker: a clear error, and forked workers inherit it
    return UnitURLs(folder, table.files, table.file)


def parquet_paths(listing: FolderListing) -> tuple[list[str], list[int]]:
    """Names (relative to the root) and sizes of the Parquet files of a listing, sorted;
    hidden files and Spark/Delta side folders (``_delta_log``, ``_SUCCESS``) left out."""
    rel = {p[len(listing.root):].lstrip("/"): s for p, s in listing.files.items()}
    names = sorted(data_files(list(rel)))
    return names, [rel[n] for n in names]


def describe_parquet_files(fetcher: Fetcher, root: str, names: Sequence[str], sizes: Sequence[int],
                           image_column: str | None = None, label_column: str | None = None,
                           classes: Sequence[str] | None = None) -> Manifest:
    """The manifest of Parquet files ``root + name`` from their footers. ``classes``
    numbers string labels (default: the names found, sorted) and names integer ones."""
    urls = [root + n for n in names]
    footers = _footers(fetcher, urls, sizes)
    metas = [read_footer(s, a, f, u) for u, s, (a, f) in zip(urls, sizes, footers)]
    table, named = describe_parquet(names, sizes, footers, metas, image_column=image_column,
                                    label_column=label_column, root=root)
    strings = _string_classes(fetcher, table, urls, metas) if table.columns.string_labels else None
    return Manifest(shards=(), classes=parquet_classes(table.columns, named, strings, classes, root), table=table)


def _footers(fetcher: Fetcher, urls: Sequence[str], sizes: Sequence[int]) -> list[tuple[int, bytes]]:
    """``(start, bytes)`` of each file's footer and trailer: one read of the file's last
    ``TAIL_BYTES``, and a second only for a longer footer."""
    out = []
    tails = fetcher.read_many((ByteRange(u, max(0, s - TAIL_BYTES), s), "") for u, s in zip(urls, sizes))
    for url, size, got in zip(urls, sizes, tails):
        if isinstance(got, StorageError):
            raise got
        tail = b"".join(got)
        start, stop = footer_range(size, tail, url)
        if start < size - len(tail):
            tail = fetcher.read(ByteRange(url, start, stop))
        out.append((start, tail[len(tail) - (stop - start):]))
    return out


def _string_classes(fetcher: Fetcher, table: RowGroupTable, urls: Sequence[str], metas) -> tuple[str, ...]:
    """The sorted distinct string labels: the label column chunks of every row group."""
    label = table.columns.label
    if label is None:  # string labels need a label column
        return ()
    found: set[str] = set()
    chunks = fetcher.read_many((ByteRange(urls[int(table.file[g])], int(table.ranges[g][2]),
                                          int(table.ranges[g][3])), "") for g in range(len(table)))
    for g, got in enumerate(chunks):
        if isinstance(got, StorageError):
            raise got
        f = int(table.file[g])
        piece = Pieces(int(table.file_sizes[f]), {int(table.ranges[g][2]): b"".join(got)}, urls[f])
        found.update(v for v in read_columns(metas[f], piece, int(table.index[g]), [label]).column(0).to_pylist()
                     if v is not None)
    return tuple(sorted(found))


def with_checksums(fetcher: Fetcher, manifest: Manifest, urls: Sequence[str],
                   tick: Callable[[int], Any] = lambda n: None) -> Manifest:
    """The manifest with a CRC-32 per object or per row group (its fetched column chunks):
    every byte the stream will read, read once now."""
    return with_crcs(manifest, unit_crcs(fetcher, manifest, urls, range(manifest.num_units), tick))


def unit_crcs(fetcher: Fetcher, manifest: Manifest, urls: Sequence[str], units: range,
              tick: Callable[[int], Any] = lambda n: None) -> list[int]:
    """The CRC-32 of each of ``units`` (of the table of ``manifest``, whose URLs are ``urls``):
    what :func:`with_checksums` stores, for a slice of the units — a task's. The container's
    ``unit_crcs`` hook reads them."""
    if manifest.table is None:
        raise ValueError("with_checksums: a tar manifest has its checksums already (gpupipe index writes them)")
    crcs = manifest.container.needs("unit_crcs", "index --checksums")
    return crcs(fetcher, manifest.table, urls, units, tick)


def _object_crcs(fetcher: Fetcher, table: ObjectTable, urls: Sequence[str], units: range,
                 tick: Callable[[int], Any]) -> list[int]:
    crcs = []
    for got in fetch_objects(fetcher, ((ByteRange(urls[i], 0, int(table.sizes[i])), "") for i in units),
                             in_flight=fetcher.config.object_concurrency):
        if isinstance(got, StorageError):
            raise got
        tick(len(got))
        crcs.append(zlib.crc32(got))
    return crcs


def _group_crcs(fetcher: Fetcher, table: RowGroupTable, urls: Sequence[str], units: range,
                tick: Callable[[int], Any]) -> list[int]:
    return [_group_crc(got, tick) for got in _group_bytes(fetcher, table, urls, units)]


def with_crcs(manifest: Manifest, crcs: Sequence[int]) -> Manifest:
    """The manifest with ``crcs`` (one per unit, in order) as its objects' or row groups' CRC-32."""
    if len(crcs) != manifest.num_units:
        raise ValueError(f"with_crcs: {len(crcs)} checksums for {manifest.num_units} units")
    if manifest.table is None:
        raise ValueError("with_crcs: a tar manifest has its checksums already (gpupipe index writes them)")
    return replace(manifest, table=manifest.table.with_crc32(np.array(crcs, dtype=np.int64)))


def _group_bytes(fetcher: Fetcher, table: RowGroupTable, urls: Sequence[str], groups: range) -> Iterator[list]:
    counts = [len(table.byte_ranges(g)) for g in groups]
    got = fetcher.read_many((ByteRange(urls[g], a, b), "") for g in groups for a, b in table.byte_ranges(g))
    for n in counts:
        yield [next(got) for _ in range(n)]


def _group_crc(parts: list, tick: Callable[[int], Any]) -> int:
    crc = 0
    for blocks in parts:
        if isinstance(blocks, StorageError):
            raise blocks
        for block in blocks:
            crc = zlib.crc32(block, crc)
            tick(len(block))
    return crc


# What the rooms above ask these containers for (gpupipe.formats.containers): the built-ins' hooks of this room.
FOLDER.hook(describe=_describe_folder_source, unit_urls=lambda folder, table: UnitURLs(folder, table.names),
            unit_version=_object_version, unit_crcs=_object_crcs)
PARQUET.hook(describe=_describe_parquet_source, unit_urls=_parquet_urls, unit_version=_group_version,
             unit_crcs=_group_crcs)
