"""Worker-side readers of the sources read in place: plan spans → parsed samples.

:mod:`gpupipe.stream.chunks` cuts a chunk into spans (unit, sample range) and asks the reader
of the source's kind for each span's samples, in order, as a :class:`ReadSpan`: one
entry per planned sample, ``None`` where it could not be read, and the reason by index.
The stream then checks, replaces (``on_error: skip``) and shuffles them exactly as for
tar shards.

* :func:`object_spans` — an image folder: a unit is one object. Objects are fetched many
  at a time (:func:`~gpupipe.storage.objects.fetch_objects`); with CRC-32s in the index each is
  checked and, when damaged, read again up to ``fetch.refetch`` times.
* :func:`rowgroup_spans` — Parquet: a unit is a row group. Each row group is one or two
  ranged requests (its image and label column chunks, pipelined through
  :meth:`Fetcher.read_many`), decoded with the file's footer from the table (read once,
  when the source was described); consecutive spans of one row group decode it once.

A sample looks like a WebDataset sample: ``{<ext>: image bytes, "cls": b"<label>"}``,
keyed by the object's name without its extension, or ``<file>/<row>``; with targets, also
``json`` (boxes) and ``mask.png`` (:mod:`gpupipe.formats.annotations`) — an image folder's
from its COCO file (``source.annotations``, row = unit), Parquet's from its target columns,
whose chunks are fetched with the image's. What a sample is —
its key, fields, label and the problems of a row — is the format module's
(:func:`~gpupipe.formats.folder.object_sample`,
:func:`~gpupipe.formats.rowgroups.row_group_samples`), which ``gpupipe ingest`` calls too:
the same bytes give the same samples on both paths.
"""
from __future__ import annotations

import itertools
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from gpupipe.core.checksum import crc32
from gpupipe.core.errors import GpupipeError, ShardFormatError, StorageError
from gpupipe.core.types import ByteRange, Sample
from gpupipe.formats.folder import FOLDER, object_sample
from gpupipe.formats.rowgroups import PARQUET, Pieces, read_footer, row_group_samples
from gpupipe.plan import Span
from gpupipe.storage.fetch import Fetcher, ObjectVersion
from gpupipe.storage.objects import fetch_objects, read_object_fresh
from gpupipe.stream.batch import SampleTable

__all__ = ["ReadSpan", "object_spans", "rowgroup_spans"]

log = logging.getLogger(__name__)
_FOOTERS_KEPT = 64  # parsed Parquet footers a worker keeps (LRU)
_GROUPS_KEPT_BYTES = 64 << 20  # row groups a worker keeps decoded (their bytes in the file), the latest asked for


@dataclass
class ReadSpan:
    """One planned span, read: one entry per expected sample (``None`` where unreadable; an
    image-folder object that gives none is its key alone, a sample without fields) and, by
    index, why a sample is missing or failed its checksum. A span read whole and
    checked by the vectorized tar scan comes as ``table`` instead (``samples`` empty; its
    sample ids count from 0 within the span)."""

    samples: list[Sample | None]
    problems: dict[int, GpupipeError]
    table: SampleTable | None = None


# ------------------------------------------------------------------------------- folders

def object_spans(fetcher: Fetcher, source, spans: Iterable[Span]) -> Iterator[ReadSpan]:
    """The samples of each span of an image-folder source (every unit holds one)."""
    table = source.manifest.objects
    urls = source.shard_urls
    ahead, mine = itertools.tee(spans)
    fetched = fetch_objects(fetcher, ((ByteRange(urls[s.shard], 0, int(table.sizes[s.shard])),
                                       source.unit_version(s.shard)) for s in ahead),
                            in_flight=fetcher.config.object_concurrency)
    for s, got in zip(mine, fetched):
        yield _object(fetcher, table, s.shard, urls[s.shard], got, source.unit_version(s.shard),
                      _targets(source, s.shard))


def _targets(source, i: int):
    """The target members of object ``i`` (its boxes, its mask from the source's COCO file), or
    the ``ShardFormatError`` saying why it has none (an RLE mask); ``None`` without targets."""
    coco = getattr(source, "annotations", None)
    if coco is None:
        return None
    try:
        return coco.fields(i, source.targets)
    except ShardFormatError as exc:
        return exc


def _object(fetcher: Fetcher, table, i: int, url: str, got: bytes | StorageError, version: ObjectVersion,
            targets: dict | ShardFormatError | None = None) -> ReadSpan:
    name, key = table.names[i], table.key(i)
    if isinstance(targets, ShardFormatError):
        return _unusable(key, url, targets)
    expected = None if table.crc32 is None else int(table.crc32[i])
    for attempt in range(fetcher.config.refetch + 1):
        if isinstance(got, StorageError):
            return _unusable(key, url, got)
        if expected is None or crc32(got) == expected:
            try:
                return ReadSpan([object_sample(name, got, int(table.labels[i]), url, targets, key=key)], {})
            except ShardFormatError as exc:  # an empty file
                return _unusable(key, url, exc)
        if attempt < fetcher.config.refetch:
            got = read_object_fresh(fetcher, ByteRange(url, 0, int(table.sizes[i])), version)
    return _unusable(key, url, ShardFormatError(
        "object fails its checksum on every read (it changed after index.json was written: rerun `gpupipe index`)",
        shard=url))


def _unusable(key: str, url: str, problem: GpupipeError) -> ReadSpan:
    """An object that gives no sample: its key (known from the listing, so that the placeholder the
    stream puts in its place, the log and ``gpupipe validate`` all name it by its key) and why."""
    return ReadSpan([Sample(key=key, fields={}, shard=url, offset=0)], {0: problem})


# ------------------------------------------------------------------------------- Parquet

@dataclass
class _Group:
    """A decoded row group: its samples (``None`` where unusable) and the reasons."""

    index: int
    samples: list[Sample | None]
    problems: dict[int, GpupipeError]


def rowgroup_spans(fetcher: Fetcher, source, spans: Iterable[Span]) -> Iterator[ReadSpan]:
    """The samples of each span of a Parquet source (a unit is a row group). A row group is read
    and decoded once while it is among the latest seen (``_GROUPS_KEPT_BYTES`` of them, the last
    always): the units of work of one shuffle window each hold a few of its samples."""
    table, urls, classes = source.manifest.parquet, source.shard_urls, source.manifest.classes
    ahead, mine = itertools.tee(spans)
    order: deque = deque()  # (group, requests for it), in request order
    footers: OrderedDict = OrderedDict()  # file -> parsed footer, most recent last

    def requests() -> Iterator[tuple[ByteRange, ObjectVersion]]:
        kept = _Recent(_GROUPS_KEPT_BYTES, size)
        for s in ahead:
            if kept.new(s.shard):  # the reading loop below keeps the same groups
                ranges = table.byte_ranges(s.shard)
                order.append((s.shard, len(ranges)))  # before its first request is yielded
                yield from ((ByteRange(urls[s.shard], a, b), source.unit_version(s.shard)) for a, b in ranges)

    def size(g: int) -> int:
        return sum(b - a for a, b in table.byte_ranges(g))

    fetched = fetcher.read_many(requests())
    kept, groups = _Recent(_GROUPS_KEPT_BYTES, size), {}
    for s in mine:
        if kept.new(s.shard):
            first = next(fetched)  # pulls the group's requests, so its entry is in `order` now
            g, n = order.popleft()
            got = [first] + [next(fetched) for _ in range(n - 1)]
            groups[g] = _decode(fetcher, table, classes, urls[g], g, _footer(table, urls[g], footers, g), got,
                                source.unit_version(g))
            groups = {k: v for k, v in groups.items() if k in kept}
        group = groups[s.shard]
        yield ReadSpan(group.samples[s.start:s.stop],
                       {i - s.start: e for i, e in group.problems.items() if s.start <= i < s.stop})


class _Recent:
    """The latest distinct keys seen, as many as ``budget`` holds by ``size_of`` (the last one
    always): :meth:`new` says whether a key was not among them."""

    def __init__(self, budget: int, size_of: Callable[[int], int]):
        self.budget, self.size_of = budget, size_of
        self.keys: OrderedDict[int, int] = OrderedDict()  # key -> size, least recent first

    def new(self, key: int) -> bool:
        fresh = key not in self.keys
        self.keys[key] = self.size_of(key) if fresh else self.keys[key]
        self.keys.move_to_end(key)
        while len(self.keys) > 1 and sum(self.keys.values()) > self.budget:
            self.keys.popitem(last=False)
        return fresh

    def __contains__(self, key) -> bool:
        return key in self.keys


def _footer(table, url: str, footers: OrderedDict, g: int):
    """The parsed footer of row group ``g``'s file (from the table; the last few kept
    parsed), or the ``ShardFormatError`` saying it does not parse."""
    f = int(table.file[g])
    if f in footers:
        footers.move_to_end(f)
        return footers[f]
    start, footer = table.footer(f)
    try:
        meta = read_footer(int(table.file_sizes[f]), start, footer, url)
    except ShardFormatError as exc:
        return ShardFormatError(f"{exc.reason} (a damaged index.json: rerun `gpupipe index`)", shard=url)
    footers[f] = meta
    if len(footers) > _FOOTERS_KEPT:
        footers.popitem(last=False)
    return meta


def _decode(fetcher: Fetcher, table, classes: Sequence[str], url: str, g: int, meta, got: list,
            version: ObjectVersion) -> _Group:
    """Decode row group ``g`` from its fetched ranges; bytes that fail their checksum or
    do not decode are read again (past the cache) up to ``fetch.refetch`` times."""
    rows, ranges = int(table.rows[g]), table.byte_ranges(g)
    problem: GpupipeError | None = meta if isinstance(meta, GpupipeError) else None
    attempt = 0
    while problem is None:
        problem = next((x for x in got if isinstance(x, StorageError)), None)
        if problem is not None:
            break
        try:
            pieces = {a: b"".join(blocks) for (a, _), blocks in zip(ranges, got)}
            _check_crc(table, g, [pieces[a] for a, _ in ranges], url)
            return _samples(fetcher, table, classes, url, g, meta, pieces)
        except ShardFormatError as exc:
            if attempt == fetcher.config.refetch:
                problem = exc
                break
        attempt += 1
        got = [fetcher.read_fresh(ByteRange(url, a, b), version) for a, b in ranges]
    return _Group(g, [None] * rows, dict.fromkeys(range(rows), problem))


def _check_crc(table, g: int, parts: list[bytes], url: str) -> None:
    if table.crc32 is None:
        return
    crc = 0
    for p in parts:
        crc = crc32(p, crc)
    if crc != int(table.crc32[g]):
        raise ShardFormatError(f"row group {int(table.index[g])} fails its checksum (damaged in transit on every "
                               "read, or the file changed after index.json was written: rerun `gpupipe index`)",
                               shard=url)


def _more(fetcher: Fetcher, url: str, start: int, stop: int) -> bytes:
    """Bytes pyarrow asks for beyond the column chunk ranges in the footer (old writers
    under-reported dictionary page headers, and pyarrow pads its read for them)."""
    log.debug("%s: reading [%d, %d) beyond the column chunk ranges", url, start, stop)
    return fetcher.read(ByteRange(url, start, stop))


def _samples(fetcher: Fetcher, table, classes: Sequence[str], url: str, g: int, meta, pieces: dict) -> _Group:
    f = int(table.file[g])
    file = Pieces(int(table.file_sizes[f]), pieces, url, fallback=lambda a, b: _more(fetcher, url, a, b))
    samples, problems = row_group_samples(table, classes, g, meta, file)
    return _Group(g, samples, dict(problems))


FOLDER.hook(read_spans=object_spans)
PARQUET.hook(read_spans=rowgroup_spans)
