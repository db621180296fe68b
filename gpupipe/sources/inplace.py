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

from gpupipe.core.errors import StorageError
from gpupipe.core.types import ByteRange
from gpupipe.formats.folder import LABEL_FILES, FolderListing, folder_table, parse_label_file
from gpupipe.formats.manifest import Manifest
from gpupipe.formats.rowgroups import (
    TAIL_BYTES,
    Pieces,
    RowGroupTable,
    describe_parquet,
    footer_range,
    parquet_classes,
    read_columns,
    read_footer,
)
from gpupipe.storage.fetch import Fetcher
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
    return Manifest(shards=(), classes=classes, objects=table)


def parquet_paths(listing: FolderListing) -> tuple[list[str], list[int]]:
    """Names (relative to the root) and sizes of the Parquet files of a listing, sorted;
    hidden files and Spark/Delta side folders (``_delta_log``, ``_SUCCESS``) left out."""
    rel = sorted((p[len(listing.root):].lstrip("/"), s) for p, s in listing.files.items() if p.endswith(".parquet"))
    rel = [(r, s) for r, s in rel if not any(part.startswith((".", "_")) for part in r.split("/"))]
    return [r for r, _ in rel], [s for _, s in rel]


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
    return Manifest(shards=(), classes=parquet_classes(table.columns, named, strings, classes, root), parquet=table)


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
    """The CRC-32 of each of ``units`` (objects or row groups of ``manifest``, whose URLs are
    ``urls``): what :func:`with_checksums` stores, for a slice of the units — a task's."""
    if manifest.objects is not None:
        sizes = manifest.objects.sizes
        crcs = []
        for got in fetch_objects(fetcher, ((ByteRange(urls[i], 0, int(sizes[i])), "") for i in units),
                                 in_flight=fetcher.config.object_concurrency):
            if isinstance(got, StorageError):
                raise got
            tick(len(got))
            crcs.append(zlib.crc32(got))
        return crcs
    table = manifest.parquet
    if table is None:
        raise ValueError("with_checksums: a tar manifest has its checksums already (gpupipe index writes them)")
    return [_group_crc(got, tick) for got in _group_bytes(fetcher, table, urls, units)]


def with_crcs(manifest: Manifest, crcs: Sequence[int]) -> Manifest:
    """The manifest with ``crcs`` (one per unit, in order) as its objects' or row groups' CRC-32."""
    if len(crcs) != manifest.num_units:
        raise ValueError(f"with_crcs: {len(crcs)} checksums for {manifest.num_units} units")
    column = np.array(crcs, dtype=np.int64)
    if manifest.objects is not None:
        return replace(manifest, objects=replace(manifest.objects, crc32=column))
    if manifest.parquet is None:
        raise ValueError("with_crcs: a tar manifest has its checksums already (gpupipe index writes them)")
    return replace(manifest, parquet=replace(manifest.parquet, crc32=column))


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
