"""All the tar headers of a planned byte range at once: numpy over the span, no object per member.

With the manifest's offsets a span's samples are known before a byte arrives: sample ``i`` is
bytes ``[starts[i], starts[i + 1])``. :func:`scan_span` reads the members of every sample a header
at a time (the first member of every sample, then the second, ...): header checksums, sizes,
names and keys are checked as arrays, and what a batch needs comes back as columns — keys, where
each image lies in the buffer, labels, and where other members asked for lie (a ``.json``, a
``.mask.png``) — with each sample's :func:`~gpupipe.formats.tar.sample_crc32` for the caller to
compare with the manifest's.

It takes the layouts that ``gpupipe ingest``, ``webdataset``'s ``TarWriter``, Python's ``tarfile``
and GNU ``tar`` write (ustar, GNU and pax formats) for ASCII names: regular files, with the pax
extended headers, GNU long names and ustar prefixes that the streaming reader reads around them
(:mod:`gpupipe.formats.tarwalk` walks the headers), ``<key>.<ext>`` names with a lower-case
extension, one member per extension, an image in every sample, and samples that end exactly where
the manifest says. Anything else — a bad checksum, a pax record that is not plain, an unusual
name, a label that is not plain digits — returns ``None``, and the caller
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
from gpupipe.formats.tar import BLOCK
from gpupipe.formats.tarwalk import Segments, walk_span

__all__ = ["ScannedSpan", "scan_span"]

_EXT = 16  # longest extension taken here
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


def scan_span(segments: Sequence, starts: np.ndarray, *, image_exts: Sequence[str],
              label_exts: Sequence[str], member_exts: Sequence[str] = ()) -> ScannedSpan | None:
    """Scan the span made of ``segments`` (bytes-like, consecutive) whose samples start at
    ``starts`` (``n + 1`` offsets from the span's start, the last its end). ``image_exts`` /
    ``label_exts`` in order of preference; ``member_exts``: further members to locate.
    ``None`` when anything is not in the plain layout (the module docstring)."""
    span = Segments(segments)
    starts = np.asarray(starts, dtype=np.int64)
    n = len(starts) - 1
    if n < 1 or starts[0] != 0 or starts[-1] != span.edges[-1] or not span.aligned or (starts % BLOCK).any():
        return None
    members = walk_span(span, starts // BLOCK)  # headers start on the 512-byte grid: a header is a row
    if members is None:
        return None
    sample, rank, row, size = members.sample, members.rank, members.row, members.size
    parsed = _names(members.names)
    if parsed is None:
        return None
    names, length, dot = parsed
    if not _keys_match(names, dot, sample, rank, n):
        return None
    exts = _extensions(names, length, dot)
    if exts is None:
        return None
    grid = np.full((n, int(rank.max()) + 1), -1, dtype=np.int64)  # member index by (sample, rank)
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
    crcs = _crcs(span, sample, names, length, (row + 1) * BLOCK, size, n)
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


def _locate(span: Segments, buffers: list[np.ndarray], start: np.ndarray, size: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """``(buffer, start in it)`` of each byte range: in its segment, or (across an edge) in a
    copy of its own appended to ``buffers``."""
    seg, at, whole = span.locate(start, size)
    for i in np.flatnonzero(~whole).tolist():
        buffers.append(np.frombuffer(b"".join(span.pieces(int(start[i]), int(size[i]))), dtype=np.uint8))
        seg[i], at[i] = len(buffers) - 1, 0
    return seg, at


def _names(names: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(names, length, dot)``: the members' names (:class:`~gpupipe.formats.tarwalk.SpanMembers`)
    cut to the longest name and its NUL, where each NUL is, and the dot that ends each key (the first
    of the last path component); ``None`` for a name the streaming reader treats specially (not
    ASCII, unsafe, no key or extension, an upper-case extension)."""
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
    if (names[:, 0] == _SLASH).any():
        return None  # absolute (a leading "./" is gone already, as in the streaming reader)
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


def _labels(span: Segments, row: np.ndarray, size: np.ndarray, member: np.ndarray) -> np.ndarray | None:
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


def _crcs(span: Segments, sample: np.ndarray, names: np.ndarray, length: np.ndarray, start: np.ndarray,
          size: np.ndarray, n: int) -> np.ndarray:
    """Each sample's ``sample_crc32``: over ``"<key>.<ext>\\0"`` (the member's name and its NUL: the
    name is exactly that here) and the data at ``start``, member by member in rank order."""
    names = np.ascontiguousarray(names)
    flat, width = names.reshape(-1).data, names.shape[1]
    heads = range(0, len(sample) * width, width)
    out = [0] * n
    small = zlib.crc32
    if len(span.parts) == 1 and (size < _SMALL).all():  # one buffer (a unit read whole), small members
        view = span.parts[0].data
        for s, h, k, d, z in zip(sample.tolist(), heads, (length + 1).tolist(), start.tolist(), (start + size).tolist()):
            out[s] = small(view[d:z], small(flat[h:h + k], out[s]))
        return np.array(out, dtype=np.uint32)
    dseg, dat, whole = span.locate(start, size)
    views = [p.data for p in span.parts]
    for s, h, k, dk, d, z, w in zip(sample.tolist(), heads, length.tolist(), dseg.tolist(), dat.tolist(),
                                    size.tolist(), whole.tolist()):
        crc = small(flat[h:h + k + 1], out[s])
        if not w:
            for piece in span.pieces(int(span.edges[dk]) + d, z):
                crc = crc32(piece, crc)
        else:
            crc = (crc32 if z >= _SMALL else small)(views[dk][d:d + z], crc)
        out[s] = crc
    return np.array(out, dtype=np.uint32)
