"""What ``gpupipe inspect`` says about a source read in place, from its manifest alone.

An image folder's or Parquet source's manifest (``index.json``, or the one described at
start) already holds what a summary needs — the objects with their sizes and labels, or
the files, row groups and columns — so no image byte is read: the first keys are the
first object names (``c0/img1.jpg``) or the keys the loader gives the first rows
(``part-000.parquet#0``).
"""
from __future__ import annotations

from typing import Any

__all__ = ["KIND_NAMES", "in_place_summary"]

KIND_NAMES = {"tar": "tar shards", "folder": "image folder", "parquet": "Parquet"}


def in_place_summary(resolved, keys: int) -> dict[str, Any]:
    """The keys :func:`gpupipe.ingest.inspect` adds for an image folder or Parquet source:
    ``units`` (images or row groups) and ``unit``, ``files``, ``image_column`` and
    ``label_column`` (Parquet), ``first_shard`` (the first object or file), ``first_keys``
    (up to ``keys``) and ``fields`` (an image folder's: the image extensions and ``cls``
    when labelled; Parquet's are known only once read: ``[]``)."""
    manifest = resolved.manifest
    if manifest.objects is not None:
        return _folder(manifest.objects, resolved.shard_urls, keys)
    return _parquet(manifest.parquet, resolved.shard_urls, keys)


def _folder(table, urls, keys: int) -> dict[str, Any]:
    from gpupipe.formats.imagefolder import extension

    names = table.names[:max(0, keys)]
    labelled = bool(len(names)) and bool((table.labels[:len(names)] >= 0).any())
    return {"units": len(table), "unit": "image", "files": len(table),
            "first_shard": urls[0] if len(table) else None, "first_keys": names,
            "fields": sorted({extension(n) for n in names} | ({"cls"} if labelled else set()))}


def _parquet(table, urls, keys: int) -> dict[str, Any]:
    first: list[str] = []
    for g in range(len(table)):
        name, row = table.files[int(table.file[g])], int(table.first_row[g])
        first += [f"{name}#{row + i}" for i in range(min(int(table.rows[g]), keys - len(first)))]
        if len(first) >= keys:
            break
    columns = table.columns
    image = f"{columns.image}.{columns.image_field}" if columns.image_field else columns.image
    return {"units": len(table), "unit": "row group", "files": len(table.files), "first_shard": urls[0] if len(table)
            else None, "first_keys": first, "fields": [], "image_column": image, "label_column": columns.label}
