"""How ``gpupipe validate`` reads samples: tar shards, image folders and Parquet files.

Each reader turns a resolved source into :class:`Good` items (a sample whose bytes were
read and which has an image and an integer label) and :class:`Problem` items, in unit
order; :mod:`gpupipe.tools.validate` then runs the same header checks and decodes on the
images of every kind. Sources read in place are read by the loader's own readers
(:mod:`gpupipe.stream.readers`), so a sample validate passes is one the loader delivers:

* tar shards: whole-shard reads; tar damage ends its shard as one Problem (``key=""``);
* an image folder: ``shard`` is the object's URL (its path, extension included), ``key``
  its sample key (the path without the extension: the key ``batch.keys`` and the loader's
  log give it, and the one it keeps through ``gpupipe ingest``), ``offset`` 0; files the loader does not read as images (``notes.txt`` in a class
  folder) are not samples: :func:`skipped_files` lists them, and they are no problem;
* Parquet: ``shard`` is the file's URL, ``key`` ``row <n>``, ``offset`` the row number
  ``n`` in the file.

With CRC-32s in ``index.json`` every sample, object or row group is checked against them.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from gpupipe.core.errors import GpupipeError, ShardFormatError, StorageError
from gpupipe.formats.containers import container
from gpupipe.formats.rowgroups import PARQUET
from gpupipe.formats.tar import TAR

__all__ = ["Problem", "Good", "read_samples", "skipped_files"]

log = logging.getLogger(__name__)

# (substring of a reader's message, kind) for samples of a source read in place
_READ_KINDS = (("fails its checksum", "checksum"), ("image cell is null", "no image"),
               ("image is empty", "no image"), ("label cell is null", "bad label"),
               ("not a class number", "bad label"), ("not in the class list", "bad label"),
               ("cannot be decoded", "unreadable row group"), ("footer", "unreadable row group"))


@dataclass(frozen=True)
class Problem:
    """One quarantined sample (or the unreadable rest of a shard, with ``key=""``)."""

    shard: str
    key: str
    offset: int
    kind: str
    reason: str

    def to_json(self) -> str:
        return json.dumps({"shard": self.shard, "key": self.key, "offset": self.offset, "kind": self.kind,
                           "reason": self.reason})


@dataclass(frozen=True)
class Good:
    """A sample that passed the checks so far, with its encoded image."""

    shard: str
    key: str
    offset: int
    image: bytes


def read_samples(fetcher, resolved, units: range | None = None) -> Iterator[Good | Problem]:
    """Every sample of ``resolved`` (a :class:`~gpupipe.sources.source.ResolvedSource`) — of its
    ``units`` only (tar shards, images or row groups, by index), when given — in order."""
    kind = container(resolved.kind)
    reader = kind.hooks.get("validate_read", _read_units)  # tar, folder, Parquet: their own below
    return reader(fetcher, resolved, range(len(resolved.shard_urls)) if units is None else units)


# ------------------------------------------------------------------------------- tar shards

def _read_shards(fetcher, resolved, units: range) -> Iterator[Good | Problem]:
    """Whole-shard reads; tar damage ends its shard as a Problem, a sample failing its
    manifest checksum is a Problem."""
    from gpupipe.core.types import ByteRange
    from gpupipe.formats.tar import group_by_key, iter_members

    urls = [resolved.shard_urls[u] for u in units]
    entries = [resolved.manifest.shards[u] for u in units] if resolved.manifest is not None else [None] * len(urls)
    fetched = fetcher.read_many((ByteRange(u), "") for u in urls)
    for url, entry in zip(urls, entries):
        blocks, offset = next(fetched), 0
        try:
            if isinstance(blocks, GpupipeError):
                raise blocks
            for i, sample in enumerate(group_by_key(iter_members(blocks, shard=url), shard=url)):
                offset = sample.offset
                yield _sample_verdict(sample, url, entry, i)
        except GpupipeError as exc:
            yield Problem(url, "", getattr(exc, "offset", None) or offset, "unreadable shard",
                          getattr(exc, "reason", str(exc)))


def _sample_verdict(sample, url: str, entry, index: int) -> Good | Problem:
    from gpupipe.formats.tar import sample_crc32
    from gpupipe.stream.batch import image_field, label_of

    def problem(kind: str, reason: str) -> Problem:
        return Problem(url, sample.key, sample.offset, kind, reason)

    if entry is not None and entry.crc32 is not None and index < entry.num_samples \
            and sample_crc32(sample.key, sample.fields) != int(entry.crc32[index]):
        return problem("checksum", "fails its index.json checksum (damaged, or the shard changed: rerun "
                                   "`gpupipe index`)")
    image = image_field(sample)
    if not image:
        return problem("no image", f"no image member (has {sorted(sample.fields)})")
    try:
        label_of(sample)
    except ShardFormatError as exc:
        return problem("bad label", exc.reason)
    return Good(url, sample.key, sample.offset, bytes(image))


# ------------------------------------------------------------------------- read in place

def _read_rowgroups(fetcher, resolved, units: range) -> Iterator[Good | Problem]:
    """Parquet through the loader's row-group reader: one span per row group."""
    from gpupipe.plan import Span
    from gpupipe.stream.readers import rowgroup_spans

    table = resolved.manifest.parquet
    spans = (Span(g, 0, int(table.rows[g])) for g in units)
    for g, read in zip(units, rowgroup_spans(fetcher, resolved, spans)):
        first = int(table.first_row[g])
        for i in range(len(read.samples)):
            yield _in_place_verdict(read, i, resolved.shard_urls[g], f"row {first + i}", first + i)


def _read_units(fetcher, resolved, units: range) -> Iterator[Good | Problem]:
    """A container read in place through its stream reader (``read_spans``: an image folder's reads
    each object, a plugin's its units): one span a unit, each sample by its key (``#<i>`` where the
    reader gave none)."""
    import gpupipe.stream.readers  # noqa: F401  (registers the built-in readers; it imports torch: here, not at the top)
    from gpupipe.plan import Span

    read_spans = resolved.manifest.container.needs("read_spans", "gpupipe validate")
    counts = resolved.manifest.sample_counts()
    spans = (Span(u, 0, counts[u]) for u in units)
    for u, read in zip(units, read_spans(fetcher, resolved, spans)):
        for i in range(len(read.samples)):
            sample = read.samples[i]
            key = sample.key if sample is not None else f"#{i}"
            yield _in_place_verdict(read, i, resolved.shard_urls[u], key, i)


def _in_place_verdict(read, i: int, url: str, key: str, offset: int) -> Good | Problem:
    """Sample ``i`` of a reader's span as a Good (its image, empty or not: the header check
    names an empty one) or the Problem the reader found."""
    sample = read.samples[i]
    if sample is not None and i not in read.problems:
        image = next(v for k, v in sample.fields.items() if k != "cls")
        return Good(url, key, offset, bytes(image))
    exc = read.problems[i]
    reason = getattr(exc, "reason", str(exc))
    kind = "unreadable" if isinstance(exc, StorageError) else \
        next((k for needle, k in _READ_KINDS if needle in reason), "unreadable")
    return Problem(url, key, offset, kind, reason)


def skipped_files(fetcher, resolved) -> list[tuple[str, str]]:
    """``(path, why)`` of the files in an image folder that the loader does not read as
    images (a ``notes.txt`` in a class folder, a hidden file); ``[]`` for other sources.
    One listing of the folder; the loader's warning about them is not repeated."""
    from gpupipe.formats.folder import classify_listing, folder_table

    if resolved.kind != "folder":
        return []
    root = resolved.shard_urls.root
    found = fetcher.call(root, "find", None, False, True)
    listing = classify_listing(fetcher.fs._strip_protocol(root), found)
    if listing.kind != "folder":
        return []
    folder_log = logging.getLogger("gpupipe.formats.folder")
    was, folder_log.disabled = folder_log.disabled, True  # resolve() has warned already, if it listed
    try:
        return folder_table(listing, None)[2]
    except GpupipeError as exc:  # the layout is checked where it is read; here only the extras matter
        log.debug("%s: cannot list the files the loader skips: %s", root, exc)
        return []
    finally:
        folder_log.disabled = was


TAR.hook(validate_read=_read_shards)
PARQUET.hook(validate_read=_read_rowgroups)  # rows named by file and row; an image folder reads by _read_units
