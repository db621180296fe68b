"""All the tar headers of a planned byte range at once: numpy over the span, no object per member.

With the manifest's offsets a span's samples are known before a byte arrives: sample ``i`` is
bytes ``[starts[i], starts[i + 1])``. :func:`scan_span` reads the members of every sample a member
rank at a time (the first member of every sample, then the second, ...): header checksums, sizes,
names and keys are checked as arrays, and what a batch needs comes back as columns — keys, where
each image lies in the buffer, labels, and where other members asked for lie (a ``.json``, a
``.mask.png``) — with each sample's :func:`~gpupipe.formats.tar.sample_crc32` for the caller to
compare with the manifest's.

It takes only the plain layout that ``gpupipe ingest``, ``webdataset`` and ``tar`` write for
ASCII names: ustar/GNU headers of regular files, octal fields, ``<key>.<ext>`` names with a
lower-case extension, one member per extension, an image in every sample, and samples that
end exactly where the manifest says. Anything else — pax or GNU long-name headers, a bad
checksum, an unusual name, a label that is not plain digits — returns ``None``, and the caller
reads that span with the streaming reader (:func:`~gpupipe.formats.tar.iter_members`), which
accepts what is valid and names what is not. So this module decides nothing the streaming
reader would decide differently; it only skips the per-member Python when nothing is unusual.
"""
from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gpupipe.core.checksum import crc32
from gpupipe.formats.tar import BLOCK, MAX_MEMBER_BYTES

__all__ = ["ScannedSpan", "scan_span"]

_NAME = 100  # bytes of the ustar name field
_EXT = 16  # longest extension taken here
_MAX_RANKS = 64  # members per sample taken here
_REGULAR = np.array([ord("0"), 0, ord("7")], dtype=np.uint8)
_USTAR = np.frombuffer(b"ustar\0", dtype=np.uint8)
_SLASH, _DOT, _BACKSLASH = ord("/"), ord("."), ord("\\")


@dataclass(frozen=True)
class ScannedSpan:
    """The samples of a span, as columns: image ``i`` is bytes ``[image_start[i], image_start[i] +
    image_size[i])`` of ``buffers[image_buffer[i]]`` (the segments as given, then a copy of each
    image that lies across two); ``labels`` (-1: none); ``crcs`` each sample's ``sample_crc32``;
    ``members``: for each extension in ``member_exts``, ``(buffer, start, size)`` of that member
    of each sample, as for the images (size -1: the sample has none)."""

    keys: list[str]
    buffers: list[np.ndarray]
    image_buffer: np.ndarray
    image_start: np.ndarray
    image_size: np.ndarray
    labels: np.ndarray
    crcs: np.ndarray
    members: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)


class _Segments:
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
        """The 512-byte rows at ``index`` (in rows from the span's start)."""
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


def scan_span(segments: Sequence, starts: np.ndarray, *, image_exts: Sequence[str],
              label_exts: Sequence[str], member_exts: Sequence[str] = ()) -> ScannedSpan | None:
    """Scan the span made of ``segments`` (bytes-like, consecutive) whose samples start at
    ``starts`` (``n + 1`` offsets from the span's start, the last its end). ``image_exts`` /
    ``label_exts`` in order of preference; ``member_exts``: further members to locate.
    ``None`` when anything is not in the plain layout (the module docstring)."""
    span = _Segments(segments)
    starts = np.asarray(starts, dtype=np.int64)
    n = len(starts) - 1
    if n < 1 or starts[0] != 0 or starts[-1] != span.edges[-1] or not span.aligned or (starts % BLOCK).any():
        return None
    members = _walk(span, starts // BLOCK)  # headers start on the 512-byte grid: a header is a row
    if members is None:
        return None
    sample, row, size, names = (np.concatenate(col) for col in zip(*members))
    rank = np.concatenate([np.full(len(m[0]), k) for k, m in enumerate(members)])
    parsed = _names(names)
    if parsed is None:
        return None
    names, length, dot = parsed
    if not _keys_match(names, dot, sample, rank, n):
        return None
    exts = _extensions(names, length, dot)
    if exts is None:
        return None
    grid = np.full((n, len(members)), -1, dtype=np.int64)  # member index by (sample, rank)
    grid[sample, rank] = np.arange(len(sample))
    if _repeated_extension(exts, grid):
        return None
    image = _choose(exts, grid, image_exts)
    if (image < 0).any() or (size[image] == 0).any():
        return None  # a sample without an image, or an empty one: the streaming reader says which
    labels = _labels(span, row, size, _choose(exts, grid, label_exts))
    if labels is None:
        return None
    first = names[:n] * (np.arange(names.shape[1]) < dot[:n, None])  # rank 0 is every sample, in order
    keys = [k.decode("ascii") for k in np.ascontiguousarray(first).view(f"S{names.shape[1]}").ravel().tolist()]
    crcs = _crcs(span, sample, row * BLOCK, length, size, n)
    buffers = list(span.parts)
    seg, at = _locate(span, buffers, (row[image] + 1) * BLOCK, size[image])
    located: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for ext in member_exts:
        m = _choose(exts, grid, [ext])
        has = m >= 0
        where = np.zeros(n, np.int64), np.zeros(n, np.int64), np.where(has, size[m], -1)
        where[0][has], where[1][has] = _locate(span, buffers, (row[m[has]] + 1) * BLOCK, size[m[has]])
        located[ext] = where
    return ScannedSpan(keys=keys, buffers=buffers, image_buffer=seg, image_start=at, image_size=size[image],
                       labels=labels, crcs=crcs, members=located)


def _locate(span: _Segments, buffers: list[np.ndarray], start: np.ndarray, size: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """``(buffer, start in it)`` of each byte range: in its segment, or (across an edge) in a
    copy of its own appended to ``buffers``."""
    seg, at, whole = span.locate(start, size)
    for i in np.flatnonzero(~whole).tolist():
        buffers.append(np.frombuffer(b"".join(span.pieces(int(start[i]), int(size[i]))), dtype=np.uint8))
        seg[i], at[i] = len(buffers) - 1, 0
    return seg, at


def _walk(span: _Segments, starts: np.ndarray) -> list[tuple[np.ndarray, ...]] | None:
    """``(sample, header row, size, name field)`` of the members of each rank (``starts``
    in rows); ``None`` where a header is not a plain one or the members do not end exactly
    at the next sample's start."""
    ends, pos = starts[1:], starts[:-1].copy()
    active: np.ndarray = np.arange(len(ends))
    out: list[tuple[np.ndarray, ...]] = []
    while active.size:
        if len(out) == _MAX_RANKS:
            return None
        here, end = pos[active], ends[active]
        if (here >= end).any():
            return None
        h = span.row(here)
        size = _plain_headers(h)
        if size is None:
            return None
        nxt = here + 1 + (size + BLOCK - 1) // BLOCK
        if (nxt > end).any():
            return None
        out.append((active, here, size, h[:, :_NAME]))
        pos[active] = nxt
        active = active[nxt < end]
    return out


def _plain_headers(h: np.ndarray) -> np.ndarray | None:
    """Member sizes of headers ``h`` (rows of 512 bytes), or ``None`` unless every one is a
    regular file with a valid checksum, octal fields and no ustar prefix."""
    if not np.isin(h[:, 156], _REGULAR).all():
        return None
    if ((h[:, 257:263] == _USTAR).all(axis=1) & (h[:, 345] != 0)).any():
        return None  # a POSIX prefix: part of the name lives elsewhere
    stored, size = _octal(h[:, 148:156]), _octal(h[:, 124:136])
    if stored is None or size is None or (size > MAX_MEMBER_BYTES).any():
        return None
    field = h[:, 148:156]
    unsigned = h.sum(axis=1, dtype=np.int64) - field.sum(axis=1, dtype=np.int64) + 8 * 0x20
    odd = stored != unsigned
    if odd.any():  # a tar that summed signed chars
        high = (h[odd] > 127).sum(axis=1) - (field[odd] > 127).sum(axis=1)
        if (stored[odd] != unsigned[odd] - 256 * high).any():
            return None
    return size


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


def _names(names: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(names, length, dot)``: the name fields cut to the longest name and its NUL, where each
    NUL is, and the dot that ends each key (the first of the last path component); ``None`` for a name the streaming reader treats
    specially (no NUL, not ASCII, unsafe, no key or extension, an upper-case extension)."""
    nul = names == 0
    if not nul.any(axis=1).all():
        return None
    length = nul.argmax(axis=1)
    names = names[:, :int(length.max()) + 1]  # the rest is past every name's NUL
    width = names.shape[1]
    cols = np.arange(width)
    inside = cols < length[:, None]
    if ((names >= 0x80) & inside).any() or ((names == _BACKSLASH) & inside).any():
        return None
    if (names[:, 0] == _SLASH).any() or ((names[:, 0] == _DOT) & (names[:, 1] == _SLASH)).any():
        return None  # absolute, or "./" (stripped by the streaming reader)
    if ((names[:, :-1] == _DOT) & (names[:, 1:] == _DOT) & inside[:, 1:]).any():
        return None  # perhaps a ".." component
    slashes = (names == _SLASH) & inside
    slash = np.where(slashes.any(axis=1), width - 1 - slashes[:, ::-1].argmax(axis=1), -1)
    dots = (names == _DOT) & inside & (cols > slash[:, None])
    dot = np.where(dots.any(axis=1), dots.argmax(axis=1), width)
    if (dot <= slash + 1).any() or (dot >= length - 1).any():
        return None  # an empty key or extension
    upper = (names >= ord("A")) & (names <= ord("Z")) & inside & (cols > dot[:, None])
    if upper.any():
        return None  # the extension is lower-cased in the sample (and in its checksum)
    return names, length, dot


def _keys_match(names: np.ndarray, dot: np.ndarray, sample: np.ndarray, rank: np.ndarray, n: int) -> bool:
    """Every member has its sample's key, and no two neighbouring samples share one (the
    streaming reader would join them)."""
    keys = names * (np.arange(names.shape[1]) < dot[:, None])
    first = keys[:n]
    later = rank > 0
    if not (keys[later] == first[sample[later]]).all():
        return False
    return not (first[1:] == first[:-1]).all(axis=1).any()


def _extensions(names: np.ndarray, length: np.ndarray, dot: np.ndarray) -> np.ndarray | None:
    """Each member's extension as a fixed-width bytes array."""
    if (length - dot - 1 > _EXT).any():
        return None
    cols = dot[:, None] + 1 + np.arange(_EXT)
    ext = np.take_along_axis(names, np.minimum(cols, names.shape[1] - 1), axis=1) * (cols < length[:, None])
    return np.ascontiguousarray(ext).view(f"S{_EXT}").ravel()


def _repeated_extension(exts: np.ndarray, grid: np.ndarray) -> bool:
    for a in range(grid.shape[1]):
        for b in range(a + 1, grid.shape[1]):
            both = (grid[:, a] >= 0) & (grid[:, b] >= 0)
            if (exts[grid[both, a]] == exts[grid[both, b]]).any():
                return True
    return False


def _choose(exts: np.ndarray, grid: np.ndarray, wanted: Sequence[str]) -> np.ndarray:
    """Per sample, the member whose extension comes first in ``wanted`` (-1: none)."""
    preference = np.full(len(exts), len(wanted), dtype=np.int64)
    for i, ext in reversed(list(enumerate(wanted))):
        preference[exts == ext.encode()] = i
    ranked = np.where(grid >= 0, preference[grid], len(wanted))
    best = ranked.argmin(axis=1)
    rows = np.arange(len(grid))
    return np.where(ranked[rows, best] < len(wanted), grid[rows, best], -1)


def _labels(span: _Segments, row: np.ndarray, size: np.ndarray, member: np.ndarray) -> np.ndarray | None:
    """Each sample's integer label (-1 without one); ``None`` when a label is not plain
    ASCII digits of at most 18 (the streaming reader parses, or refuses, the others)."""
    labels = np.full(len(member), -1, dtype=np.int64)
    has = member >= 0
    if not has.any():
        return labels
    m = member[has]
    z = size[m]
    if (z < 1).any() or (z > 18).any():
        return None
    cols = np.arange(18)
    text = span.row(row[m] + 1)[:, :18].astype(np.int64)  # the data: the row after the header
    inside = cols < z[:, None]
    if not (((text >= ord("0")) & (text <= ord("9"))) | ~inside).all():
        return None
    power = np.where(inside, 10 ** np.maximum(z[:, None] - 1 - cols, 0), 0)
    labels[has] = ((text - ord("0")) * power).sum(axis=1)
    return labels


_SMALL = 2048  # below this zlib's crc32 is cheaper to call than ISA-L's (the same value)


def _crcs(span: _Segments, sample: np.ndarray, header: np.ndarray, length: np.ndarray, size: np.ndarray,
          n: int) -> np.ndarray:
    """Each sample's ``sample_crc32``: over ``"<key>.<ext>\\0"`` (the header's name and its NUL:
    the name is exactly that here) and the data, member by member in rank order."""
    hseg, hat, _ = span.locate(header, length)
    dseg, dat, whole = span.locate(header + BLOCK, size)
    views = [p.data for p in span.parts]
    out = [0] * n
    small = zlib.crc32
    for s, hk, h, k, dk, d, z, w in zip(sample.tolist(), hseg.tolist(), hat.tolist(), length.tolist(), dseg.tolist(),
                                        dat.tolist(), size.tolist(), whole.tolist()):
        crc = small(views[hk][h:h + k + 1], out[s])
        if not w:
            for piece in span.pieces(int(span.edges[dk]) + d, z):
                crc = crc32(piece, crc)
        else:
            crc = (crc32 if z >= _SMALL else small)(views[dk][d:d + z], crc)
        out[s] = crc
    return np.array(out, dtype=np.uint32)
