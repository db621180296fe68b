"""``gpupipe inspect``: what a source is — kind, units, samples, bytes, classes, first keys.

For tar shards the first keys come from one byte-range read (or streaming the first shard
when there is no manifest). An image folder's or Parquet source's manifest (``index.json``, or the one described at
start) already holds what a summary needs — the objects with their sizes and labels, or
the files, row groups and columns — so no image byte is read: the first keys are the
first object names (``c0/img1.jpg``) or the keys the loader gives the first rows
(``part-000.parquet/0``).

With ``--shuffle``, :func:`shuffle_mixing` runs gpupipe's own loader, shuffled as training would
shuffle it, for a few batches and compares how mixed their labels are with a uniform shuffle
(:mod:`gpupipe.loader.mixing`): it reads those batches' samples and no others.
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from gpupipe.core.types import ByteRange
from gpupipe.formats.manifest import Manifest
from gpupipe.formats.tar import group_by_key, iter_members
from gpupipe.sources.source import Source, resolve
from gpupipe.storage.fetch import Fetcher, open_filesystem

__all__ = ["inspect", "in_place_summary", "shuffle_mixing", "shuffle_lines", "SHUFFLE_BATCHES"]

_STREAM_BLOCK = 1 << 20
SHUFFLE_BATCHES = 20  # --batches: enough for a mean within a point of its value on uniform data


def inspect(url: str, *, storage_options: Mapping[str, Any] | None = None, keys: int = 5) -> dict[str, Any]:
    """A JSON-able summary of a dataset: ``kind`` (its container: ``tar``, ``folder``, ``parquet``, ...),
    ``manifest`` (bool), ``shards`` (units), ``samples`` and ``bytes`` (``None`` without a
    manifest), ``classes``, ``first_shard``, ``first_keys`` (up to ``keys``) and the
    ``fields`` of those samples; ``targets``: the target kinds ``index.json`` records every
    shard holds (``None``: it records none), and ``first_targets``: per first key, its box count
    and whether it has a mask (``None`` where it has no ``.json``); for a source read in place
    also the keys of :func:`in_place_summary` (units, files, columns).

    With a manifest the first keys come from one byte-range read; without, the first shard
    is streamed until ``keys`` samples have been seen.
    """
    resolved = resolve(Source(url, dict(storage_options or {})))
    manifest = resolved.manifest
    out: dict[str, Any] = {
        "url": url, "kind": resolved.kind, "manifest": manifest is not None, "shards": len(resolved.shard_urls),
        "samples": manifest.num_samples if manifest else None,
        "bytes": manifest.total_bytes if manifest else None,
        "classes": list(manifest.classes) if manifest else [],
        "first_shard": None, "first_keys": [], "fields": [],
        "targets": list(manifest.targets) if manifest is not None and manifest.targets is not None else None,
        "first_targets": [],
    }
    if manifest is not None and manifest.table is not None:  # read in place: its manifest says it all
        return {**out, **in_place_summary(resolved, keys)}
    if not resolved.shard_urls or keys < 1:
        return out
    fs, _ = open_filesystem(resolved.shard_urls[0], storage_options)
    samples = _first_samples(fs, resolved.shard_urls, manifest, keys)
    out["first_shard"] = samples[0].shard if samples else resolved.shard_urls[0]
    out["first_keys"] = [s.key for s in samples]
    out["fields"] = sorted({ext for s in samples for ext in s.fields})
    out["first_targets"] = [_targets_of(s) for s in samples]
    return out


def _targets_of(sample) -> dict[str, Any] | None:
    """``{"boxes": n, "mask": bool}`` of a sample with a ``.json`` (``"error"``: why it does not
    parse), ``None`` without one."""
    from gpupipe.core.errors import ShardFormatError
    from gpupipe.formats.annotations import BOXES_FIELD, MASK_FIELD, parse_boxes

    if BOXES_FIELD not in sample.fields:
        return None
    try:
        boxes, _ = parse_boxes(sample.fields[BOXES_FIELD], sample.key)
    except ShardFormatError as exc:
        return {"error": exc.reason, "mask": MASK_FIELD in sample.fields}
    return {"boxes": len(boxes), "mask": MASK_FIELD in sample.fields}


def _first_samples(fs, shard_urls: Sequence[str], manifest: Manifest | None, keys: int) -> list:
    if manifest is None:
        url = shard_urls[0]
        with fs.open(fs._strip_protocol(url), "rb") as f:
            chunks = iter(lambda: f.read(_STREAM_BLOCK), b"")
            return list(itertools.islice(group_by_key(iter_members(chunks, shard=url), shard=url), keys))
    for url, entry in zip(shard_urls, manifest.shards):
        if entry.num_samples:
            start, stop = entry.byte_range(0, min(keys, entry.num_samples))
            data = Fetcher(fs).read(ByteRange(url, start, stop))
            return list(group_by_key(iter_members([data], shard=url, base_offset=start), shard=url))
    return []


def in_place_summary(resolved, keys: int) -> dict[str, Any]:
    """The keys :func:`inspect` adds for an image folder or Parquet source:
    ``units`` (images or row groups) and ``unit``, ``files``, ``image_column`` and
    ``label_column`` (Parquet), ``first_shard`` (the first object or file), ``first_keys``
    (up to ``keys``) and ``fields`` (an image folder's: the image extensions and ``cls``
    when labelled; Parquet's are known only once read: ``[]``)."""
    manifest = resolved.manifest
    if manifest.objects is not None:
        return _folder(manifest.objects, resolved.shard_urls, keys)
    if manifest.parquet is not None:
        return _parquet(manifest.parquet, resolved.shard_urls, keys)
    c = manifest.container  # another container: its units and the first unit's URL
    return {"units": manifest.num_units, "unit": c.unit, "files": manifest.num_units,
            "first_shard": resolved.shard_urls[0] if manifest.num_units else None, "first_keys": [], "fields": []}


def _folder(table, urls, keys: int) -> dict[str, Any]:
    from gpupipe.formats.folder import extension

    names = table.names[:max(0, keys)]
    labelled = bool(len(names)) and bool((table.labels[:len(names)] >= 0).any())
    return {"units": len(table), "unit": "image", "files": len(table),
            "first_shard": urls[0] if len(table) else None, "first_keys": names,
            "fields": sorted({extension(n) for n in names} | ({"cls"} if labelled else set()))}


def _parquet(table, urls, keys: int) -> dict[str, Any]:
    from gpupipe.formats.rowgroups import row_key

    first: list[str] = []
    for g in range(len(table)):
        name, row = table.files[int(table.file[g])], int(table.first_row[g])
        first += [row_key(name, row + i) for i in range(min(int(table.rows[g]), keys - len(first)))]
        if len(first) >= keys:
            break
    columns = table.columns
    image = f"{columns.image}.{columns.image_field}" if columns.image_field else columns.image
    return {"units": len(table), "unit": "row group", "files": len(table.files), "first_shard": urls[0] if len(table)
            else None, "first_keys": first, "fields": [], "image_column": image, "label_column": columns.label}


def shuffle_mixing(url: str, *, storage_options: Mapping[str, Any] | None = None, batches: int = SHUFFLE_BATCHES,
                   **settings: Any) -> dict[str, Any]:
    """How mixed the labels of the first ``batches`` batches of a shuffled pass are, beside a
    uniform shuffle of the same labels: :class:`~gpupipe.loader.mixing.Mixing`'s numbers, plus
    ``far_from_uniform`` (the loader's warning would fire), ``batch_size``, ``shuffle_buffer`` and
    ``seed`` as used. ``settings``: ``EncodedLoader`` keywords (``batch_size``, ``shuffle_buffer``,
    ``seed``; ``None``: the default). The loader is gpupipe's own, on one rank without workers, so
    the batches are the ones training on one rank with these settings gets first (epoch 0)."""
    from gpupipe.loader.encoded import EncodedLoader
    from gpupipe.loader.mixing import far_from_uniform, mixing

    given = {k: v for k, v in settings.items() if v is not None}
    loader = EncodedLoader(url, shuffle=True, num_workers=0, rank=0, world_size=1,
                           storage_options=dict(storage_options or {}), **given)
    loader.mixing = None  # this command reports; the loader need not warn as well
    labels = []
    for batch in itertools.islice(loader, max(0, batches)):
        kept = batch.labels[batch.valid & (batch.labels >= 0)]
        if kept.numel():
            labels.append(kept.numpy().copy())
    m = mixing(labels)
    return {"batch_size": loader.split.batch_size, "shuffle_buffer": loader.stream.shuffle_buffer,
            "shuffle_block": loader.spec.block, "seed": loader.split.seed, **m.as_dict(), "far_from_uniform": far_from_uniform(m)}


def shuffle_lines(s: Mapping[str, Any]) -> list[str]:
    """The lines ``gpupipe inspect --shuffle`` prints for :func:`shuffle_mixing`'s ``s``: the two
    numbers beside a uniform shuffle's, and the verdict."""
    head = (f"shuffle:  the first {s['batches']} batches of {s['batch_size']} (shuffle_buffer {s['shuffle_buffer']}, "
            f"shuffle_block {s['shuffle_block']}, seed {s['seed']}): {s['samples']} labelled samples, {s['labels']} distinct labels")
    if not s["batches"]:
        return [head, "  no labels to compare (the samples have none: labels are -1)"]
    from gpupipe.loader.mixing import ADVICE

    verdict = (f"far from uniform (by the loader's warning's measure): {ADVICE} (docs/tuning.md)"
               if s["far_from_uniform"] else "close enough to uniform")
    return [head,
            f"  most common label per batch: {100 * s['top_share']:.1f} % "
            f"(uniform shuffle: {100 * s['uniform_top_share']:.1f} %)",
            f"  labels per batch: {s['labels_per_batch']:.1f} (uniform: {s['uniform_labels_per_batch']:.1f})",
            f"  {verdict}"]
