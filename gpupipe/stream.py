"""Worker-side streaming: planned chunks → byte ranges → tar members → samples.

Runs inside DataLoader workers (CPU I/O only). Two paths:

* with a manifest, :func:`iter_chunks` reads each chunk's spans as byte ranges,
  checks that every span holds exactly the samples the manifest promises, and
  returns the chunk's samples in the planned (shuffled) order;
* without one, :func:`iter_whole_shards` streams whole shards (split by shard
  across ranks and workers) through a seeded shuffle buffer.

Bad data follows ``on_error``: ``"raise"`` stops with an error naming the shard
and offset; ``"skip"`` replaces each unreadable sample by a placeholder marked
invalid (so batch shapes and step counts never change), counts it and logs its key.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from gpupipe.batch import image_field, label_of
from gpupipe.errors import GpupipeError, ShardFormatError
from gpupipe.formats.tar import group_by_key, iter_members
from gpupipe.plan import Chunk, PlanSpec, chunk_order, chunk_spans, permutation, shuffle_buffer
from gpupipe.sources import ResolvedSource
from gpupipe.storage import Fetcher
from gpupipe.types import ByteRange, ErrorPolicy, Sample

__all__ = ["ErrorPolicy", "SkipLog", "iter_chunks", "iter_whole_shards"]

log = logging.getLogger(__name__)


@dataclass
class SkipLog:
    """Samples replaced because they could not be read: count and the first keys."""

    count: int = 0
    keys: list[str] = field(default_factory=list)

    def add(self, key: str, reason: str) -> None:
        self.count += 1
        if len(self.keys) < 100:
            self.keys.append(key)
        log.warning("skipping %s: %s", key, reason)


def _placeholder(shard: str, key: str, sample_id: int) -> Sample:
    return Sample(key=key, fields={}, shard=shard, offset=-1, sample_id=sample_id)


def _checked(s: Sample, shard: str, sample_id: int) -> Sample:
    """The sample with its shard, id and parsed label; ShardFormatError if it has no
    image or a label that is not an integer."""
    if not image_field(s):
        raise ShardFormatError(f"sample {s.key!r} has no image member (has {sorted(s.fields)})",
                               shard=shard, offset=s.offset)
    return Sample(key=s.key, fields=s.fields, shard=shard, offset=s.offset, sample_id=sample_id, label=label_of(s))


def _read_span(blocks: "list[bytes] | GpupipeError", url: str, start_byte: int, expected: int, first_id: int,
               on_error: ErrorPolicy, skips: SkipLog) -> list[Sample]:
    """The ``expected`` samples of one byte range, each checked; with ``skip``, bad ones
    (and all after a broken header, whose boundaries are lost) become placeholders."""
    out: list[Sample] = []
    try:
        if isinstance(blocks, GpupipeError):
            raise blocks
        for s in group_by_key(iter_members(blocks, shard=url, base_offset=start_byte), shard=url):
            if len(out) == expected:
                raise ShardFormatError(f"byte range holds more than the {expected} samples the manifest says "
                                       "(stale index.json? rerun `gpupipe index`)", shard=url, offset=s.offset)
            try:
                out.append(_checked(s, url, first_id + len(out)))
            except ShardFormatError as exc:
                if on_error is ErrorPolicy.RAISE:
                    raise
                skips.add(f"{url}#{s.key}", exc.reason)
                out.append(_placeholder(url, s.key, first_id + len(out)))
        if len(out) < expected:
            raise ShardFormatError(f"byte range holds {len(out)} samples, the manifest says {expected} "
                                   "(stale index.json? rerun `gpupipe index`)", shard=url, offset=start_byte)
    except GpupipeError as exc:
        if on_error is ErrorPolicy.RAISE:
            raise
        for i in range(len(out), expected):
            skips.add(f"{url}#{i}", str(exc))
            out.append(_placeholder(url, f"{url}#{i}", first_id + i))
    return out[:expected]


def iter_chunks(fetcher: Fetcher, source: ResolvedSource, spec: PlanSpec, epoch: int, chunks: Sequence[Chunk],
                *, on_error: ErrorPolicy = ErrorPolicy.RAISE, skips: SkipLog | None = None
                ) -> Iterator[tuple[Chunk, list[Sample], np.ndarray]]:
    """For each chunk: its remaining samples in delivery order and their valid flags."""
    assert source.manifest is not None, "iter_chunks needs a manifest"
    skips = skips if skips is not None else SkipLog()
    entries, first_ids = source.manifest.shards, spec.first_ids
    plans = [(c, chunk_spans(spec, epoch, c)) for c in chunks]

    def ranges() -> Iterator[tuple[ByteRange, str]]:
        for _, spans in plans:
            for s in spans:
                a, b = entries[s.shard].byte_range(s.start, s.stop)
                yield ByteRange(source.shard_urls[s.shard], a, b), entries[s.shard].sha256

    fetched = fetcher.read_many(ranges())
    for chunk, spans in plans:
        samples: list[Sample] = []
        valid: list[bool] = []
        for s in spans:
            url, first = source.shard_urls[s.shard], first_ids[s.shard] + s.start
            got = _read_span(next(fetched), url, int(entries[s.shard].offsets[s.start]), len(s), first, on_error, skips)
            samples += got
            valid += [s.valid and bool(x.fields) for x in got]
        order = chunk_order(spec, epoch, chunk)[chunk.first_batch * spec.batch_size:]
        yield chunk, [samples[i] for i in order], np.asarray(valid, dtype=bool)[order]


def iter_whole_shards(fetcher: Fetcher, shard_urls: Sequence[str], *, seed: int, epoch: int, shuffle: bool,
                      buffer_size: int, part: int, num_parts: int,
                      on_error: ErrorPolicy = ErrorPolicy.RAISE, skips: SkipLog | None = None) -> Iterator[Sample]:
    """Stream whole shards without a manifest: part ``part`` of ``num_parts`` gets every
    ``num_parts``-th shard of the seeded shard order."""
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
                        yield _checked(s, url, -1)
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
