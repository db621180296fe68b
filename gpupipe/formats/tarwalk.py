"""The tar headers of a span's samples, walked a header at a time over all samples at once.

:func:`walk_span` follows every sample's headers from its start (the manifest's offset, where the
streaming reader's :func:`~gpupipe.formats.tar.iter_members` puts the sample's first header: a pax or
long-name header where there is one) to the next sample's start, and reads them as that reader does:

* regular files (typeflag ``0``, NUL, ``7``) are the members;
* a pax extended header (``x``) sets the next member's name (a ``path`` record) and size (``size``);
  its other records (``mtime``, ``atime``, ``uname``, ``SCHILY.*``, ...) are read past;
* a GNU long name (``L``) sets the next member's name (its data, up to a NUL);
* global pax headers, GNU long link names (``g``, ``K``) and directories (``5``) are skipped, their
  names checked as the streaming reader checks them; like it, they drop a pending name (a pending
  pax size is used by a directory, not by ``g`` or ``K``);
* a ustar prefix is joined to the name with ``/``, and leading ``./`` are removed.

Header checksums and fields are checked as arrays; the pax records of every ``x`` header of a step
are parsed together (:func:`~gpupipe.formats.paxscan.pax_records`). Anything read otherwise than
plainly (a record that is not ``"%d %s=%s\\n"`` in ASCII decimal, a NUL in a path, an extended
header left pending at a sample's end, another typeflag) gives ``None``: the streaming reader
decides those.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpupipe.formats.paxscan import cut, pax_records
from gpupipe.formats.tar import BLOCK, MAX_MEMBER_BYTES

__all__ = ["Segments", "SpanMembers", "walk_span"]

_REG, _PAX, _LONG, _META, _DIR = range(5)
_KIND = np.full(256, -1, dtype=np.int8)  # typeflag → what the streaming reader does with it (-1: not taken here)
_KIND[[0, ord("0"), ord("7")]] = _REG
_KIND[ord("x")], _KIND[ord("L")], _KIND[ord("5")] = _PAX, _LONG, _DIR
_KIND[[ord("g"), ord("K")]] = _META
_MAX_HEADERS = 256  # headers per sample taken here
_MAX_RANKS = 64  # members per sample taken here
_EXT_DATA = 1 << 13  # pax / long-name data read here (a path is at most 4096 bytes on any system)
_EXT_LIMIT = 1 << 20  # the streaming reader's limit on an extended header's data
_USTAR = np.frombuffer(b"ustar\0", dtype=np.uint8)
_SLASH, _DOT, _BACKSLASH = ord("/"), ord("."), ord("\\")


class Segments:
    """Consecutive byte segments seen as one span, without joining them: a 512-byte row (a
    header) always lies in one segment, since every segment but the last is whole rows."""

    def __init__(self, segments: Sequence):
        self.parts = [np.frombuffer(x, dtype=np.uint8) for x in segments]
        self.edges = np.cumsum([0] + [len(x) for x in self.parts])
        self.rows = [x[:len(x) - len(x) % BLOCK].reshape(-1, BLOCK) for x in self.parts]

    @property
    def aligned(self) -> bool:
        return not (self.edges % BLOCK).any()

    def row(self, index: np.ndarray) -> np.ndarray:
        """The 512-byte rows at ``index`` (in rows from the span's start): ``(k,) → (k, 512)`` uint8."""
        seg = np.searchsorted(self.edges // BLOCK, index, side="right") - 1
        first = int(seg[0]) if len(seg) else 0
        if (seg == first).all():
            return self.rows[first][index - self.edges[first] // BLOCK]
        segments = np.unique(seg)
        if 4 * len(segments) > len(index):  # many short segments (a shuffled unit's spans): row by row
            local = index - self.edges[seg] // BLOCK
            return np.stack([self.rows[k][i] for k, i in zip(seg.tolist(), local.tolist())])
        out = np.empty((len(index), BLOCK), dtype=np.uint8)
        for k in segments.tolist():
            mine = seg == k
            out[mine] = self.rows[k][index[mine] - self.edges[k] // BLOCK]
        return out

    def locate(self, start: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(segment, offset in it, whole)`` of byte ranges; ``whole`` is False for one across an edge."""
        seg = np.minimum(np.searchsorted(self.edges, start, side="right") - 1, len(self.parts) - 1)  # an empty
        return seg, start - self.edges[seg], start + size <= self.edges[seg + 1]  # range at the end is in the last

    def pieces(self, start: int, size: int) -> list[memoryview]:
        """Bytes ``[start, start + size)`` as views of the segments they lie in."""
        out, k = [], int(np.searchsorted(self.edges, start, side="right")) - 1
        while size > 0:
            at = start - int(self.edges[k])
            piece = self.parts[k].data[at:at + size]
            out.append(piece)
            start, size, k = start + len(piece), size - len(piece), k + 1
        return out


@dataclass(frozen=True)
class SpanMembers:
    """The regular-file members of a span's ``n`` samples, ``m`` in all, by rank, then sample (every
    sample's first member in sample order, then every second member, ...): ``sample``, ``rank``,
    ``row`` (the header's row in the span; the data starts a row later) and ``size`` (after any pax
    ``size``), each ``(m,)`` int64; ``names`` ``(m, W)`` uint8, each name as the streaming reader takes
    it (before its own checks), NUL-padded, with a NUL in every row."""

    sample: np.ndarray
    rank: np.ndarray
    row: np.ndarray
    size: np.ndarray
    names: np.ndarray


def walk_span(span: Segments, starts: np.ndarray) -> SpanMembers | None:
    """The members of the samples that start at rows ``starts`` (``n + 1``, the last the span's end);
    ``None`` where a header is not one taken here, a sample has no member, or a sample's headers do
    not end exactly at the next sample's start."""
    walk = _Walk(span, starts)
    active: np.ndarray | None = np.arange(len(starts) - 1)
    for _ in range(_MAX_HEADERS):
        if active is None:
            return None
        if not active.size:
            return walk.members()
        active = walk.step(active)
    return None


class _Walk:
    """Where each sample's walk stands: the row of its next header, the name row and size an ``x``
    or ``L`` header left for its next member (-1: none), whether such a header is pending, and how
    many members it has so far."""

    def __init__(self, span: Segments, starts: np.ndarray):
        n = len(starts) - 1
        self.span, self.ends, self.pos = span, starts[1:], starts[:-1].copy()
        self.name, self.size = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
        self.open, self.rank = np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int64)
        self.names = _NameRows()
        self.found: list[tuple[np.ndarray, ...]] = []  # (sample, rank, row, size, name row) per step
        self.skipped: list[np.ndarray] = []  # name rows of skipped entries

    def step(self, active: np.ndarray) -> np.ndarray | None:
        """Read the next header of each ``active`` sample: the samples with headers left, or ``None``."""
        here, end = self.pos[active], self.ends[active]
        h = self.span.row(here)
        kind, size = _KIND[h[:, 156]], _header_sizes(h)
        if size is None or (kind < 0).any():
            return None
        member = (kind == _REG) | (kind == _DIR)  # these take a pending pax size
        size = np.where(member & (self.size[active] >= 0), self.size[active], size)
        self.size[active[member]] = -1
        extended = (kind == _PAX) | (kind == _LONG)
        limit = np.where(extended, _EXT_DATA, np.where(kind == _META, _EXT_LIMIT, MAX_MEMBER_BYTES))
        nxt = here + 1 + (size + BLOCK - 1) // BLOCK
        if (size > limit).any() or (nxt > end).any():
            return None
        if extended.any() and not self._extended(active[extended], here[extended] + 1, size[extended],
                                                 kind[extended] == _LONG):
            return None
        self._named(active[~extended], h[~extended], here[~extended], size[~extended], kind[~extended])
        self.pos[active] = nxt
        done = active[nxt == end]
        if self.open[done].any() or (self.size[done] >= 0).any():
            return None  # an extended header whose member would lie in the next sample
        return active[nxt < end]

    def _extended(self, samples: np.ndarray, first: np.ndarray, size: np.ndarray, long: np.ndarray) -> bool:
        """Take the names and sizes that the ``x`` / ``L`` (``long``) headers of ``samples`` set."""
        data = _data(self.span, first, size)
        at, length, value = np.zeros(len(size), np.int64), np.full(len(size), -1, np.int64), np.full(len(size), -1)
        if (~long).any():
            records = pax_records(data[~long], size[~long])
            if records is None:
                return False
            at[~long], length[~long], value[~long] = records
        nul = data[long] == 0
        length[long] = np.where(nul.any(axis=1), nul.argmax(axis=1), data.shape[1])  # zeros past each size
        given = length > 0
        self.name[samples[length == 0]] = -1  # an empty name is no name: the header's is taken
        self.name[samples[given]] = self.names.add(cut(data[given], at[given], length[given]))
        self.size[samples[value >= 0]] = value[value >= 0]
        self.open[samples] = True
        return True

    def _named(self, samples: np.ndarray, h: np.ndarray, here: np.ndarray, size: np.ndarray,
               kind: np.ndarray) -> None:
        """Record members (and skipped entries) with their names: the pending one, else the header's."""
        rows = self.name[samples]
        own = rows < 0
        if own.any():
            rows[own] = self.names.add(_header_names(h[own]))
        self.name[samples], self.open[samples] = -1, False
        reg = kind == _REG
        s = samples[reg]
        self.found.append((s, self.rank[s].copy(), here[reg], size[reg], rows[reg]))
        self.rank[s] += 1
        if not reg.all():
            self.skipped.append(rows[~reg])

    def members(self) -> SpanMembers | None:
        sample, rank, row, size, ref = (np.concatenate(c) for c in zip(*self.found))
        if (rank == 0).sum() != len(self.ends) or rank.max() >= _MAX_RANKS:
            return None  # a sample without a member, or with very many
        names = _strip_dot_slash(self.names.matrix())
        if self.skipped and not _safe(names[np.concatenate(self.skipped)]):
            return None  # the streaming reader refuses a skipped entry's name
        order = np.lexsort((sample, rank))
        return SpanMembers(sample[order], rank[order], row[order], size[order], names[ref[order]])


def _header_sizes(h: np.ndarray) -> np.ndarray | None:
    """The size field of each header ``h`` ``(k, 512) → (k,)`` int64 (octal, or GNU base-256 below
    2**32), or ``None`` unless every checksum matches and every field is written as writers do."""
    stored = _octal(h[:, 148:156])
    if stored is None or not _checksums_match(h, stored):
        return None
    big = h[:, 124] >= 0x80
    if not big.any():
        return _octal(h[:, 124:136])
    b = h[big, 124:136]
    if (b[:, 0] != 0x80).any() or b[:, 1:8].any():
        return None  # negative, or larger than any member taken (the streaming reader refuses those)
    size = np.zeros(len(h), dtype=np.int64)
    size[big] = b[:, 8:].astype(np.int64) @ (np.int64(1) << np.arange(24, -1, -8))
    plain = _octal(h[~big, 124:136])
    if plain is None:
        return None
    size[~big] = plain
    return size


def _checksums_match(h: np.ndarray, stored: np.ndarray) -> bool:
    """Every header's checksum, summed as unsigned bytes or (some old tars) as signed ones."""
    field = h[:, 148:156]
    # (summed in 32 bits: at most 512 * 255, and numpy sums uint8 into uint32 ~2x faster than into int64)
    unsigned = h.sum(axis=1, dtype=np.uint32).astype(np.int64) - field.sum(axis=1, dtype=np.int64) + 8 * 0x20
    odd = stored != unsigned
    if not odd.any():
        return True
    high = (h[odd] > 127).sum(axis=1) - (field[odd] > 127).sum(axis=1)
    return bool((stored[odd] == unsigned[odd] - 256 * high).all())


def _octal(field: np.ndarray) -> np.ndarray | None:
    """Values of octal fields written as spaces, digits, then NULs or spaces (what tar writers
    do); ``None`` if any field is written otherwise (the streaming reader judges those)."""
    digit = (field >= ord("0")) & (field <= ord("7"))
    for k in range(field.shape[1] - 1, 0, -1):  # the usual form: k digits from the start, then NULs or spaces
        if digit[:, k - 1].all():
            tail = field[:, k:]
            if digit[:, :k].all() and ((tail == 0) | (tail == ord(" "))).all():
                return (field[:, :k].astype(np.int64) - ord("0")) @ (np.int64(8) ** np.arange(k - 1, -1, -1))
            break
    if not digit.any(axis=1).all():
        return None
    cols = np.arange(field.shape[1])
    first = digit.argmax(axis=1)[:, None]
    last = field.shape[1] - 1 - digit[:, ::-1].argmax(axis=1)[:, None]
    before, inside = cols < first, (cols >= first) & (cols <= last)
    ok = np.where(before, field == ord(" "), np.where(inside, digit, (field == 0) | (field == ord(" "))))
    if not ok.all():
        return None
    weight = np.where(inside, np.left_shift(np.int64(1), 3 * np.maximum(last - cols, 0)), 0)
    return ((field.astype(np.int64) - ord("0")) * weight).sum(axis=1)


def _data(span: Segments, first: np.ndarray, size: np.ndarray) -> np.ndarray:
    """``(k, W)`` uint8: the ``size`` bytes from rows ``first`` on (extended headers' data), NULs past
    them; ``W`` is the largest size (at least 1)."""
    width = max(int(size.max()), 1)
    last = int(span.edges[-1]) // BLOCK - 1
    rows = [span.row(np.minimum(first + j, last)) for j in range((width + BLOCK - 1) // BLOCK)]
    data = (rows[0] if len(rows) == 1 else np.concatenate(rows, axis=1))[:, :width]
    return data * (np.arange(width) < size[:, None])


class _NameRows:
    """Names gathered step by step as blocks of rows of bytes (a name ends at its first NUL or its
    row's end); a name is known by its row number."""

    def __init__(self) -> None:
        self.blocks: list[np.ndarray] = []
        self.count = 0

    def add(self, rows: np.ndarray) -> np.ndarray:
        self.blocks.append(rows)
        self.count += len(rows)
        return np.arange(self.count - len(rows), self.count)

    def matrix(self) -> np.ndarray:
        """``(count, W)`` uint8: every name cut at its first NUL, NUL-padded to one past the longest."""
        width = max(b.shape[1] for b in self.blocks) + 1
        out = np.zeros((self.count, width), dtype=np.uint8)
        at = 0
        for b in self.blocks:
            out[at:at + len(b), :b.shape[1]] = b
            at += len(b)
        out *= np.arange(width) < (out == 0).argmax(axis=1)[:, None]
        return out


def _header_names(h: np.ndarray) -> np.ndarray:
    """The names in headers ``h``: ``(k, 100)`` name fields, or ``(k, 256)`` where a header has a
    ustar prefix, which is joined in front with a ``/`` (GNU headers have no prefix field)."""
    prefixed = (h[:, 257:263] == _USTAR).all(axis=1) & (h[:, 345] != 0)
    if not prefixed.any():
        return h[:, :100]
    out = np.zeros((len(h), 256), dtype=np.uint8)
    out[:, :100] = h[:, :100]
    p = h[prefixed]
    joined = np.concatenate([p[:, 345:500], np.full((len(p), 1), _SLASH, np.uint8), p[:, :100]], axis=1)
    nul = p[:, 345:500] == 0
    plen = np.where(nul.any(axis=1), nul.argmax(axis=1), 155)[:, None]
    cols = np.arange(256)
    take = np.where(cols < plen, cols, cols - plen + 155)  # the prefix, then "/" and the name field
    out[prefixed] = np.take_along_axis(joined, np.minimum(take, 255), axis=1) * (take < 256)
    return out


def _strip_dot_slash(names: np.ndarray) -> np.ndarray:
    """``names`` without their leading ``./`` (any number of them), as the streaming reader takes them."""
    width = names.shape[1]
    cut = np.zeros(len(names), dtype=np.int64)
    rows = np.arange(len(names))
    while rows.size:
        at = cut[rows]
        rows, at = rows[at + 1 < width], at[at + 1 < width]
        rows = rows[(names[rows, at] == _DOT) & (names[rows, at + 1] == _SLASH)]
        cut[rows] += 2
    moved = np.flatnonzero(cut)
    if moved.size:
        cols = np.arange(width) + cut[moved, None]
        names[moved] = np.take_along_axis(names[moved], np.minimum(cols, width - 1), axis=1) * (cols < width)
    return names


def _safe(names: np.ndarray) -> bool:
    """No name is absolute, has a backslash or (perhaps) a ``..`` component: the names of skipped
    entries, which the streaming reader checks too."""
    inside = np.arange(names.shape[1]) < (names == 0).argmax(axis=1)[:, None]
    dots = (names[:, :-1] == _DOT) & (names[:, 1:] == _DOT) & inside[:, 1:]
    return not ((names[:, 0] == _SLASH).any() or ((names == _BACKSLASH) & inside).any() or dots.any())
