"""Worker-side streaming: planned units → byte ranges → tar members → samples.

Runs inside DataLoader workers (CPU I/O only). Two paths:

* with a manifest, :func:`iter_units` reads the spans holding each unit's samples
  (:func:`~gpupipe.plan_units.unit_spans`: a few batches of a shuffle window) as byte
  ranges, checks that every span holds exactly the samples the manifest promises, and
  returns the unit's samples in the planned (shuffled) order. Sources read in
  place (an image folder, Parquet files) take this path too: their spans are read
  by :mod:`gpupipe.stream.readers`, and everything after (checks, ``on_error``, order) is shared;
* without one, :func:`iter_whole_shards` streams whole shards (split by shard
  across ranks and workers) through a seeded shuffle buffer.

With a manifest that has per-sample checksums, every sample is checked before it
is delivered; a byte range whose bytes fail (a checksum, or a tar header) is read
again, and only if it keeps failing is it bad data. Bad data follows ``on_error``: ``"raise"`` stops with an error naming the shard
and offset; ``"skip"`` replaces each unreadable sample by a placeholder marked
invalid (so batch shapes and step counts never change), counts it and logs its key.

A mix of sources (``source.parts``) has its labels renumbered into its joined class list here, in
the worker (:func:`~gpupipe.sources.mixed.relabel`).

When the source's ``targets`` name boxes or masks, every sample must carry them
(:func:`~gpupipe.stream.targets.read_targets`): a sample without its ``.json`` or
``.mask.png``, or whose boxes do not parse, is bad data like a sample without an image.
A placeholder has no boxes and an empty mask.
"""
from __future__ import annotations

import logging
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gpupipe.core.errors import GpupipeError, ShardFormatError, StorageError
from gpupipe.core.types import ByteRange, ErrorPolicy, Sample
from gpupipe.formats.annotations import BOXES_FIELD, MASK_FIELD, parse_boxes
from gpupipe.formats.headers import header_ids, kept_under, probe_batch
from gpupipe.formats.imageheader import image_extensions
from gpupipe.formats.tar import TAR, group_by_key, iter_members, sample_crc32
from gpupipe.formats.tarscan import ScannedSpan, scan_span
from gpupipe.plan import PlanSpec, Runs, Span, permutation, shuffle_buffer
from gpupipe.plan_units import Unit, unit_runs, unit_spans
from gpupipe.sources.mixed import relabel
from gpupipe.sources.resolved import SourcePart
from gpupipe.sources.source import ResolvedSource
from gpupipe.storage.buffers import BufferPool
from gpupipe.storage.fetch import Fetcher, ObjectVersion
from gpupipe.stream.batch import LABEL_EXTENSIONS, SampleTable, image_field, label_of
from gpupipe.stream.memo import SCANNED
from gpupipe.stream.readers import ReadSpan
from gpupipe.stream.settings import StreamConfig
from gpupipe.stream.targets import SampleTargets, TargetColumns, member_fields, read_targets

__all__ = ["ErrorPolicy", "StreamConfig", "SkipLog", "iter_units", "iter_whole_shards"]

log = logging.getLogger(__name__)


@dataclass
class SkipLog:
    """Samples replaced because they could not be read: count and the first keys."""

    count: int = 0
    keys: list[str] = field(default_factory=list)
    quiet: bool = False  # padding's: a repeat of a sample said (and counted) where it was delivered

    def add(self, key: str, reason: str) -> None:
        self.count += 1
        if len(self.keys) < 100:
            self.keys.append(key)
        (log.debug if self.quiet else log.warning)("skipping %s: %s", key, reason)


def _placeholder(shard: str, key: str, sample_id: int) -> Sample:
    return Sample(key=key, fields={}, shard=shard, offset=-1, sample_id=sample_id)


def _checked(s: Sample, shard: str, sample_id: int) -> Sample:
    """The sample with its shard, id and parsed label; ShardFormatError if it has no
    image or a label that is not an integer."""
    if not image_field(s):
        empty = [ext for ext in image_extensions() if ext in s.fields]
        what = f"image member .{empty[0]} is empty" if empty else f"has no image member (has {sorted(s.fields)})"
        raise ShardFormatError(f"sample {s.key!r}: {what}", shard=shard, offset=s.offset)
    return Sample(key=s.key, fields=s.fields, shard=shard, offset=s.offset, sample_id=sample_id, label=label_of(s))


def _parse_span(blocks: list[bytes] | GpupipeError, url: str, start_byte: int, expected: int,
                crcs: np.ndarray | None) -> ReadSpan:
    """Parse a byte range that should hold ``expected`` samples, checking each against
    its manifest checksum when there is one."""
    samples: list[Sample | None] = []
    problems: dict[int, GpupipeError] = {}
    try:
        if isinstance(blocks, GpupipeError):
            raise blocks
        for s in group_by_key(iter_members(blocks, shard=url, base_offset=start_byte), shard=url):
            if len(samples) == expected:
                problems[expected - 1] = ShardFormatError(
                    f"byte range holds more than the {expected} samples the manifest says "
                    "(stale index.json? rerun `gpupipe index`)", shard=url, offset=s.offset)
                break
            if crcs is not None and sample_crc32(s.key, s.fields) != int(crcs[len(samples)]):
                problems[len(samples)] = ShardFormatError(
                    f"sample {s.key!r} fails its checksum (damaged in transit on every read, or the shard "
                    "changed after index.json was written: rerun `gpupipe index`)", shard=url, offset=s.offset)
            samples.append(s)
        if len(samples) < expected:
            raise ShardFormatError(f"byte range holds {len(samples)} samples, the manifest says {expected} "
                                   "(stale index.json? rerun `gpupipe index`)", shard=url, offset=start_byte)
    except GpupipeError as exc:
        problems.update((i, exc) for i in range(len(samples), expected))
    return ReadSpan(samples + [None] * (expected - len(samples)), problems)


def _read_span(fetcher: Fetcher, blocks: list[bytes] | GpupipeError, r: ByteRange, version: ObjectVersion,
               offsets: np.ndarray, crcs: np.ndarray | None) -> ReadSpan:
    """Parse and check a fetched byte range (``offsets``: its samples' starts and end).

    Samples whose bytes arrived damaged (a checksum or a tar header fails) are read
    again one by one, each up to ``refetch`` times; when one stays damaged the object
    itself changed: the samples after it are parsed from the bytes already fetched, from
    their own offsets in the manifest (a damaged tar header hides where the next member
    starts, and must not take its healthy neighbours with it).
    """
    span = _parse_span(blocks, r.url, r.start, len(offsets) - 1, crcs)
    damaged = [i for i, e in sorted(span.problems.items()) if not isinstance(e, StorageError)]
    if damaged:
        fetcher.forget(r, version)  # never serve these blocks from the cache again
    for i in damaged:
        one = ByteRange(r.url, int(offsets[i]), int(offsets[i + 1]))
        for attempt in range(fetcher.config.refetch):
            # the text, not the exception: a kept log record must not keep its frames (and sockets) alive
            log.warning("%s: %s; reading it again (%d of %d)", r.url, str(span.problems[i]), attempt + 1,
                        fetcher.config.refetch)
            again = _parse_span(fetcher.read_fresh(one, version), r.url, one.start, 1,
                                None if crcs is None else crcs[i:i + 1])
            if not again.problems:
                span.samples[i] = again.samples[0]
                del span.problems[i]
                break
            span.problems[i] = again.problems[0]
        if i in span.problems:
            _read_past(fetcher, span, blocks, r, version, offsets, crcs, i)
            break
    return span


def _read_past(fetcher: Fetcher, span: ReadSpan, blocks: list[bytes] | GpupipeError, r: ByteRange,
               version: ObjectVersion, offsets: np.ndarray, crcs: np.ndarray | None, bad: int) -> None:
    """Fill ``span``'s samples after the damaged sample ``bad`` by reading on from the next
    sample's offset in the bytes already fetched (each checked, and read again, as before)."""
    if bad + 2 >= len(offsets) or isinstance(blocks, GpupipeError):
        return
    start = int(offsets[bad + 1])
    tail = [b"".join(blocks)[start - r.start:]]
    rest = _read_span(fetcher, tail, ByteRange(r.url, start, r.stop), version, offsets[bad + 1:],
                      None if crcs is None else crcs[bad + 1:])
    span.samples[bad + 1:] = rest.samples
    for j in range(bad + 1, len(offsets) - 1):
        span.problems.pop(j, None)
    span.problems.update({bad + 1 + j: e for j, e in rest.problems.items()})


@dataclass(frozen=True)
class _Wanted:
    """The target kinds every sample must carry, and the class count their labels are below
    (``None``: not checked)."""

    kinds: tuple[str, ...] = ()
    num_classes: int | None = None
    probe: tuple[int | None] | None = None  # (max_pixels,): each image's probe verdict, where kept

    @classmethod
    def of(cls, source: ResolvedSource, probe: tuple[int | None] | None = None) -> _Wanted:
        classes = source.manifest.classes if source.manifest is not None else ()
        return cls(tuple(source.targets), len(classes) if classes else None, probe)


def _deliver(span: ReadSpan, url: str, first_id: int, on_error: ErrorPolicy, skips: SkipLog,
             wanted: _Wanted = _Wanted()) -> SampleTable:
    """The span's samples, each checked; with ``skip``, bad and unreadable ones become
    placeholders (so the count never changes)."""
    if span.table is not None:  # scanned and checked whole
        return replace(span.table, sample_ids=span.table.sample_ids + first_id)
    out: list[Sample] = []
    parsed: list[SampleTargets] = []
    for i, s in enumerate(span.samples):
        try:
            if i in span.problems or s is None:  # (a None sample always has its problem)
                raise span.problems[i]
            checked = _checked(s, url, first_id + i)
            if wanted.kinds:
                parsed.append(read_targets(checked, wanted.kinds, wanted.num_classes))
            out.append(checked)
        except GpupipeError as exc:
            if on_error is ErrorPolicy.RAISE:
                raise
            key = s.key if s is not None else f"{url}#{i}"
            skips.add(key if s is None else f"{url}#{key}", getattr(exc, "reason", str(exc)))
            out.append(_placeholder(url, key, first_id + i))
            if wanted.kinds:
                parsed.append(read_targets(out[-1], wanted.kinds))
    return SampleTable.from_samples(out, [True] * len(out), wanted.kinds, parsed=parsed)


def iter_units(fetcher: Fetcher, source: ResolvedSource, spec: PlanSpec, epoch: int, units: Sequence[Unit],
               *, on_error: ErrorPolicy = ErrorPolicy.RAISE, skips: SkipLog | None = None,
               probe: tuple[int | None] | None = None) -> Iterator[tuple[Unit, SampleTable]]:
    """For each unit: its samples in delivery order (padding and placeholders not valid).
    Only the spans holding them are read, the units' one after another (the reader reads ahead).
    ``probe`` ``(max_pixels,)``: where the scan memo keeps them, each image's probe verdict comes
    with its sample (``SampleTable.header_ids``; :func:`_tar_unit`).

    A shuffled unit is many short spans. Tar spans are fetched one by one but scanned together,
    in one call for the unit (:func:`_scanned_unit`); only when that fails is each span read on
    its own (:func:`_tar_read`), which finds, re-reads and reports what is wrong."""
    assert source.manifest is not None, "iter_units needs a manifest"
    skips = skips if skips is not None else SkipLog()
    first_ids = spec.first_ids
    wanted = _Wanted.of(source, probe)
    planned: deque[tuple[Unit, list[Span], np.ndarray]] = deque()

    def spans() -> Iterator[Span]:  # lazily: a folder unit is a span per image
        for u in units:
            planned.append((u, *unit_spans(spec, epoch, u)))
            yield from planned[-1][1]

    kind = source.manifest.container
    reader = kind.needs("read_spans", f"streaming {source.shard_urls[0] if source.shard_urls else 'a source'}")
    # tar's: see the end of the module
    scan, settle, gather = (kind.hooks.get(h) for h in ("scan_unit", "settle_span", "read_unit"))

    def settled(unit_spans_: list[Span], got: list) -> SampleTable:
        tables: list[SampleTable] = []
        for s, span in zip(unit_spans_, got):
            url = source.shard_urls[s.shard]
            if settle is not None:
                span = settle(fetcher, source, s, span, wanted)
            # padding repeats samples delivered elsewhere: a bad one is not counted (or raised) again
            one = _deliver(span, url, int(first_ids(s.shard)) + s.start,
                           on_error if s.valid else ErrorPolicy.SKIP, skips if s.valid else SkipLog(quiet=True),
                           wanted)
            tables.append(one if s.valid else replace(one, valid=np.zeros(len(one), dtype=bool)))
        return SampleTable.concat(tables)

    if gather is not None and fetcher.gathers:  # local files: a unit's bytes in one read
        for unit in units:
            runs, order = unit_runs(spec, epoch, unit)
            table = gather(fetcher, source, runs, first_ids, wanted) if len(runs) else None
            if table is None:
                unit_spans_ = runs.spans()
                table = settled(unit_spans_, list(reader(fetcher, source, unit_spans_)))
            yield unit, _relabeled(table.take(order), source.parts)
        return
    read: Iterator = reader(fetcher, source, spans())
    while True:
        first = next(read, None)  # reading a unit's first span has put the unit in `planned`
        if first is None:
            return
        unit, unit_spans_, order = planned.popleft()
        got = [first] + [next(read) for _ in unit_spans_[1:]]
        table = scan(source, unit_spans_, got, first_ids, wanted) if scan is not None else None
        if table is None:
            table = settled(unit_spans_, got)
        yield unit, _relabeled(table.take(order), source.parts)


def _relabeled(table: SampleTable, parts: Sequence[SourcePart]) -> SampleTable:
    """A mix's labels (and box labels) renumbered from each source's class list into the joined one."""
    if not parts:
        return table
    t = table.targets
    if t is not None and t.box_labels is not None and t.box_counts is not None:
        t = replace(t, box_labels=relabel(parts, np.repeat(table.sample_ids, t.box_counts), t.box_labels))
    return replace(table, labels=relabel(parts, table.sample_ids, table.labels, table.keys), targets=t)


def _tar_fetched(fetcher: Fetcher, source: ResolvedSource, spans: Iterable[Span]
                 ) -> Iterator[list[bytes] | GpupipeError]:
    """Tar shards: the bytes of each span (its blocks, or the error that ended its read); each
    span is one byte range, from the manifest's offsets. The cache knows the shard by its SHA-256
    in the manifest and keeps it in blocks of a fixed grid, so the spans of another epoch, which
    start elsewhere, find them."""
    assert source.manifest is not None, "iter_units checked it"
    entries = source.manifest.shards

    versions: dict[int, ObjectVersion] = {}  # a shard's, asked once (a unit is hundreds of spans)

    def ranges() -> Iterator[tuple[ByteRange, ObjectVersion]]:
        for s in spans:
            offsets = entries[s.shard].offsets
            version = versions.get(s.shard)
            if version is None:
                version = versions[s.shard] = source.unit_version(s.shard)
            yield ByteRange(source.shard_urls[s.shard], int(offsets[s.start]), int(offsets[s.stop])), version

    yield from fetcher.read_many(ranges(), reuse=True)


def _tar_read(fetcher: Fetcher, source: ResolvedSource, s: Span, blocks: list[bytes] | GpupipeError,
              wanted: _Wanted) -> ReadSpan:
    """The samples of one tar span from its bytes: scanned whole when it takes the plain layout,
    else read member by member (re-reading what arrived damaged)."""
    assert source.manifest is not None, "iter_units checked it"
    entry, url = source.manifest.shards[s.shard], source.shard_urls[s.shard]
    crcs = None if entry.crc32 is None else entry.crc32[s.start:s.stop]
    offsets = entry.offsets[s.start:s.stop + 1]
    scanned = None if isinstance(blocks, GpupipeError) else _scanned(blocks, offsets, crcs, wanted, url)
    if scanned is not None:
        return ReadSpan([], {}, scanned)
    return _read_span(fetcher, blocks, ByteRange(url, *entry.byte_range(s.start, s.stop)),
                      source.unit_version(s.shard), offsets, crcs)


_JOIN_SEGMENTS = 16  # a unit's spans joined into one buffer before the scan above this many


@dataclass(frozen=True)
class _UnitLayout:
    """A unit's samples as the manifest has them, in span order: each one's ``shard`` and
    ``index`` in it, its ``size`` in bytes and its CRC-32 (``crcs``: None when no shard has them)."""

    shard: np.ndarray
    index: np.ndarray
    size: np.ndarray
    crcs: np.ndarray | None
    valid: np.ndarray
    at: np.ndarray  # each sample's first byte in its shard
    lengths: np.ndarray  # samples per span

    @classmethod
    def of(cls, source: ResolvedSource, runs: Runs) -> _UnitLayout | None:
        """``None`` when some of the shards have checksums and some not (each span is then
        checked on its own)."""
        assert source.manifest is not None, "iter_units checked it"
        entries = source.manifest.shards
        lengths = runs.stop - runs.start
        shard = np.repeat(runs.shard, lengths)
        index = np.arange(len(shard)) + np.repeat(runs.start - np.cumsum(lengths) + lengths, lengths)
        shards = np.unique(shard).tolist()
        checked = [entries[k].crc32 is not None for k in shards]
        if any(checked) != all(checked):
            return None
        at, sizes = np.empty(len(shard), np.int64), np.empty(len(shard), np.int64)
        crcs = np.empty(len(shard), np.int64) if all(checked) else None
        for k in shards:
            mine, entry = shard == k, entries[k]
            at[mine] = entry.offsets[index[mine]]
            sizes[mine] = entry.offsets[index[mine] + 1] - at[mine]
            if crcs is not None and entry.crc32 is not None:
                crcs[mine] = entry.crc32[index[mine]]
        return cls(shard, index, sizes, crcs, np.repeat(runs.valid, lengths), at, lengths)

    def byte_ranges(self) -> tuple[list[int], list[int], list[int]]:
        """Each span's shard, first byte and end in it."""
        last = np.cumsum(self.lengths) - 1
        first = last - self.lengths + 1
        return self.shard[first].tolist(), self.at[first].tolist(), (self.at[last] + self.size[last]).tolist()

    @property
    def starts(self) -> np.ndarray:
        """``n + 1`` offsets: each sample's start in the unit's bytes end to end, then their end."""
        return np.concatenate([[0], np.cumsum(self.size)])


def _scanned_unit(source: ResolvedSource, spans: Sequence[Span], got: Sequence[list[bytes] | GpupipeError],
                  first_ids: Callable[[Any], Any], wanted: _Wanted) -> SampleTable | None:
    """The samples of a unit's tar spans, in span order, from one scan of their bytes side by side
    (a span's bytes are exactly its samples, so together they are a run of whole samples); ``None``
    when a read failed or the scan does not take them all (each span is then read on its own)."""
    layout = _UnitLayout.of(source, Runs.of(spans))
    if layout is None or any(isinstance(g, GpupipeError) for g in got):
        return None
    segments: list[Any] = [block for blocks in got if not isinstance(blocks, GpupipeError) for block in blocks]
    if len(segments) > _JOIN_SEGMENTS:  # many short spans (blocks of shards): one copy beats a gather per span
        segments = [_joined(segments)]
    return _scanned_layout(source, segments, layout, first_ids, wanted)


def _scanned_layout(source: ResolvedSource, segments: list, layout: _UnitLayout, first_ids: Callable[[Any], Any],
                    wanted: _Wanted) -> SampleTable | None:
    table = _scanned(segments, layout.starts, layout.crcs, wanted, source.shard_urls[int(layout.shard[0])])
    if table is None:
        return None
    return replace(table, sample_ids=first_ids(layout.shard) + layout.index, valid=layout.valid)


def _tar_unit(fetcher: Fetcher, source: ResolvedSource, runs: Runs, first_ids: Callable[[Any], Any],
              wanted: _Wanted) -> SampleTable | None:
    """Tar shards of local files: a unit's samples from one read of its spans' bytes end to end
    (:meth:`Fetcher.gather`), scanned — or, where every sample was scanned before in files
    unchanged since, taken where the scan found them (:mod:`gpupipe.stream.memo`). ``None`` when
    the read or the scan fails: each span is then read on its own."""
    assert source.manifest is not None, "iter_units checked it"
    layout = _UnitLayout.of(source, runs)
    if layout is None:
        return None
    entries, urls = source.manifest.shards, source.shard_urls
    shards = np.unique(layout.shard).tolist()
    before = {k: _identity(fetcher, source, k) for k in shards}
    known = SCANNED.known(urls, layout.index, layout.shard) if not wanted.kinds else None
    span_shards, span_starts, span_stops = layout.byte_ranges()
    joined = fetcher.gather([urls[k] for k in span_shards], span_starts, span_stops)
    if joined is None:
        return None
    steady = all(before[k] is not None and before[k] == _identity(fetcher, source, k) for k in shards)
    starts = layout.starts[:-1]
    if known is not None and steady and all(known[0][k] == before[k] for k in shards):
        _, image_at, size, labels, keys, header = known
        start = starts + image_at
        verdicts = None
        if wanted.probe is not None:
            verdicts = kept_under(header, wanted.probe[0])
            missing = np.flatnonzero(verdicts < 0)
            if len(missing):  # probed once here (a pass after the scan), then kept while the file is unchanged
                verdicts[missing] = header_ids(probe_batch(
                    [joined[a:a + z] for a, z in zip(start[missing].tolist(), size[missing].tolist())],
                    wanted.probe[0]))
                for k in np.unique(layout.shard[missing]).tolist():
                    mine = missing[layout.shard[missing] == k]
                    SCANNED.remember_headers(urls[k], before[k] or (), layout.index[mine], verdicts[mine])
        return SampleTable(buffers=(joined,), buffer=np.zeros(len(size), np.int64), start=start, size=size,
                           labels=labels, sample_ids=first_ids(layout.shard) + layout.index, keys=keys,
                           valid=layout.valid, header_ids=verdicts)
    table = _scanned_layout(source, [joined], layout, first_ids, wanted)
    if table is not None and steady and not wanted.kinds and not table.buffer.any():
        for k in shards:
            mine = np.flatnonzero(layout.shard == k)
            SCANNED.remember(urls[k], before[k], len(entries[k].offsets) - 1, layout.index[mine],  # type: ignore[arg-type]
                             table.start[mine] - starts[mine], table.size[mine], table.labels[mine],
                             [table.keys[i] for i in mine.tolist()])
    return table


def _identity(fetcher: Fetcher, source: ResolvedSource, k: int) -> tuple | None:
    """Shard ``k`` as its local file is now, and as the manifest lays it out (its samples'
    offsets): what :data:`SCANNED`'s answers about it hold for."""
    assert source.manifest is not None, "iter_units checked it"
    now = fetcher.identity(source.shard_urls[k])
    if now is None:
        return None
    return (*now, _digest(source.manifest.shards[k].offsets))


_DIGESTS: dict[int, tuple[np.ndarray, int]] = {}  # id of a manifest's offsets array -> (it, its CRC-32)


def _digest(offsets: np.ndarray) -> int:
    """CRC-32 of a shard's sample offsets (its layout in the manifest), worked out once per array."""
    hit = _DIGESTS.get(id(offsets))
    if hit is None or hit[0] is not offsets:
        if len(_DIGESTS) >= 1 << 14:
            _DIGESTS.clear()
        hit = _DIGESTS[id(offsets)] = offsets, zlib.crc32(np.ascontiguousarray(offsets, dtype=np.int64).data)
    return hit[1]


def _joined(segments: Sequence) -> np.ndarray:
    """The segments one after another, in a buffer reused once nothing holds a view of it: a
    fresh one of a few MB cost its page faults each unit (a worker's large blocks are mapped
    anew: ``fix_malloc_mmap_threshold``): 1.1 ms per 1.7 MB of a unit's views on the 2-core VM against
    0.38 into a reused one."""
    parts = [np.frombuffer(x, dtype=np.uint8) for x in segments]
    n = sum(len(p) for p in parts)
    out = BufferPool.take_sized(n, 2, least=1 << 20)
    return np.concatenate(parts, out=out)


def _scanned(blocks: list, offsets: np.ndarray, crcs: np.ndarray | None, wanted: _Wanted = _Wanted(),
             url: str = "") -> SampleTable | None:
    """The span's samples from the vectorized scan (:func:`~gpupipe.formats.tarscan.scan_span`),
    when it takes the span, every sample matches its manifest checksum and carries the wanted
    targets, well formed; else ``None``, and the span is read by the streaming reader, which
    finds, re-reads and reports what is wrong.
    The blocks are not joined: each image (and mask) is copied once, into its batch."""
    got = scan_span(blocks, offsets - offsets[0], image_exts=image_extensions(), label_exts=LABEL_EXTENSIONS,
                    member_exts=member_fields(wanted.kinds))
    if got is None or (crcs is not None and not np.array_equal(got.crcs, crcs)):
        return None
    targets = _scanned_targets(got, wanted, url, int(offsets[0])) if wanted.kinds else None
    if wanted.kinds and targets is None:
        return None
    n = len(got.keys)
    return SampleTable(buffers=tuple(got.buffers), buffer=got.image_buffer, start=got.image_start,
                       size=got.image_size, labels=got.labels, sample_ids=np.arange(n, dtype=np.int64),
                       keys=got.keys, valid=np.ones(n, dtype=bool), targets=targets)


def _scanned_targets(got: ScannedSpan, wanted: _Wanted, url: str, base: int) -> TargetColumns | None:
    """The targets of a scanned span: its ``.json`` boxes parsed, its masks where they lie;
    ``None`` when a sample lacks one or its boxes do not parse (the streaming reader then
    names it, and ``on_error`` decides)."""
    columns = TargetColumns()
    if "boxes" in wanted.kinds:
        where, start, size = got.members[BOXES_FIELD]
        if (size <= 0).any():
            return None
        parsed = []
        for key, b, a, z in zip(got.keys, where.tolist(), start.tolist(), size.tolist()):
            try:
                parsed.append(SampleTargets(*parse_boxes(got.buffers[b].data[a:a + z], key, wanted.num_classes,
                                                         shard=url, offset=base)))
            except ShardFormatError:
                return None
        columns, _ = TargetColumns.from_parsed(parsed, ("boxes",), 0)
    if "masks" in wanted.kinds:
        where, start, size = got.members[MASK_FIELD]
        if (size <= 0).any():
            return None
        columns = replace(columns, mask_buffer=where, mask_start=start, mask_size=size)
    return columns


# Tar shards: each span fetched as blocks (read_spans) and a unit's spans scanned together (scan_unit) —
# of local files a unit's spans read in one piece and scanned, or found as scanned before (read_unit) —
# and only when that fails each span read on its own (settle_span). The containers read in place register
# their span readers in gpupipe.stream.readers.
TAR.hook(read_spans=_tar_fetched, read_unit=_tar_unit, scan_unit=_scanned_unit, settle_span=_tar_read)


def iter_whole_shards(fetcher: Fetcher, shard_urls: Sequence[str], *, seed: int, epoch: int, shuffle: bool,
                      buffer_size: int, part: int, num_parts: int,
                      on_error: ErrorPolicy = ErrorPolicy.RAISE, skips: SkipLog | None = None,
                      targets: Sequence[str] = ()) -> Iterator[Sample]:
    """Stream whole shards without a manifest: part ``part`` of ``num_parts`` gets every
    ``num_parts``-th shard of the seeded shard order. ``targets``: the kinds every sample
    must carry (checked here; :func:`~gpupipe.stream.batch.pack` with ``kinds`` reads them)."""
    skips = skips if skips is not None else SkipLog()
    order = permutation(len(shard_urls), (seed, epoch, 1)) if shuffle else np.arange(len(shard_urls))
    mine = [shard_urls[i] for i in order[part::num_parts]]

    def samples() -> Iterator[Sample]:
        fetched = fetcher.read_many((ByteRange(u), "") for u in mine)
        for url in mine:
            try:
                blocks = next(fetched)
                if isinstance(blocks, GpupipeError):
                    raise blocks
                for s in group_by_key(iter_members(blocks, shard=url), shard=url):
                    try:
                        checked = _checked(s, url, -1)
                        if targets:
                            read_targets(checked, targets)  # (no class list without a manifest)
                        yield checked
                    except ShardFormatError as exc:
                        if on_error is ErrorPolicy.RAISE:
                            raise
                        skips.add(f"{url}#{s.key}", str(exc))
            except GpupipeError as exc:
                if on_error is ErrorPolicy.RAISE:
                    raise
                skips.add(url, f"rest of shard unreadable: {exc}")

    if not shuffle or buffer_size <= 1:
        yield from samples()
        return
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, 2, part])))
    yield from shuffle_buffer(samples(), buffer_size, rng)
