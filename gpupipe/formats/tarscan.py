"""All the tar headers of a planned byte range at once: numpy over the span, no object per member.

With the manifest's offsets a span's samples are known before a byte arrives: sample ``i`` is
bytes ``[starts[i], starts[i + 1])``. :func:`scan_span` reads the members of every sample a member
rank at a time (the first member of every sample, then the second, ...): header checksums, sizes,
names and keys are checked as arrays, and what a batch needs comes back as columns — keys, where
each image lies in the buffer, labels — with each sample's :func:`~gpupipe.formats.tar.sample_crc32`
for the caller to compare with the manifest's.

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

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpupipe.core.checksum import crc32
from gpupipe.formats.tar import BLOCK, MAX_MEMBER_BYTES

__all__ = ["ScannedSpan", "scan_span"]

_NAME = 100  # bytes of the ustar name field
_COLS = np.arange(_NAME, dtype=np.int64)
_EXT = 16  # longest extension taken here
_MAX_RANKS = 64  # members per sample taken here
_REGULAR = np.array([ord("0"), 0, ord("7")], dtype=np.uint8)
_USTAR = np.frombuffer(b"ustar\0", dtype=np.uint8)
_SLASH, _DOT, _BACKSLASH = ord("/"), ord("."), ord("\\")


@dataclass(frozen=True)
class ScannedSpan:
    """The samples of a span, as columns: ``image_start`` / ``image_size`` locate each image in
    the scanned buffer; ``labels`` (-1: none); ``crcs`` each sample's ``sample_crc32``."""

    keys: list[str]
    image_start: np.ndarray
    image_size: np.ndarray
    labels: np.ndarray
    crcs: np.ndarray


def scan_span(buf: np.ndarray, starts: np.ndarray, *, image_exts: Sequence[str],
              label_exts: Sequence[str]) -> ScannedSpan | None:
    """Scan ``buf`` (uint8, the span's bytes) whose samples start at ``starts`` (``n + 1``
    offsets into ``buf``, the last its end). ``image_exts`` / ``label_exts`` in order of
    preference. ``None`` when anything is not in the plain layout (the module docstring)."""
    starts = np.asarray(starts, dtype=np.int64)
    n = len(starts) - 1
    if n < 1 or starts[0] != 0 or starts[-1] != len(buf) or len(buf) % BLOCK or (starts % BLOCK).any():
        return None
    blocks = buf.reshape(-1, BLOCK)  # headers start on the 512-byte grid: a header is a row
    members = _walk(blocks, starts // BLOCK)
    if members is None:
        return None
    sample, row, size, names = (np.concatenate(col) for col in zip(*members))
    header = row * BLOCK
    rank = np.concatenate([np.full(len(m[0]), k) for k, m in enumerate(members)])
    parsed = _names(names)
    if parsed is None:
        return None
    length, dot = parsed
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
    labels = _labels(buf, header, size, _choose(exts, grid, label_exts))
    if labels is None:
        return None
    first = names[:n] * (_COLS < dot[:n, None])  # rank 0 is every sample, in order
    keys = [k.decode("ascii") for k in np.ascontiguousarray(first).view(f"S{_NAME}").ravel().tolist()]
    crcs = _crcs(buf, sample, header, length, size, n)
    return ScannedSpan(keys=keys, image_start=header[image] + BLOCK, image_size=size[image], labels=labels, crcs=crcs)


def _walk(blocks: np.ndarray, starts: np.ndarray) -> list[tuple[np.ndarray, ...]] | None:
    """``(sample, header block, size, name field)`` of the members of each rank (``starts``
    in blocks); ``None`` where a header is not a plain one or the members do not end exactly
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
        h = blocks[here]
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


def _names(names: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(length, dot)`` of each name: where its NUL is, and the dot that ends its key (the
    first of its last path component); ``None`` for a name the streaming reader treats
    specially (no NUL, not ASCII, unsafe, no key or extension, an upper-case extension)."""
    nul = names == 0
    if not nul.any(axis=1).all():
        return None
    length = nul.argmax(axis=1)
    inside = _COLS < length[:, None]
    if ((names >= 0x80) & inside).any() or ((names == _BACKSLASH) & inside).any():
        return None
    if (names[:, 0] == _SLASH).any() or ((names[:, 0] == _DOT) & (names[:, 1] == _SLASH)).any():
        return None  # absolute, or "./" (stripped by the streaming reader)
    if ((names[:, :-1] == _DOT) & (names[:, 1:] == _DOT) & inside[:, 1:]).any():
        return None  # perhaps a ".." component
    slashes = (names == _SLASH) & inside
    slash = np.where(slashes.any(axis=1), _NAME - 1 - slashes[:, ::-1].argmax(axis=1), -1)
    dots = (names == _DOT) & inside & (_COLS > slash[:, None])
    dot = np.where(dots.any(axis=1), dots.argmax(axis=1), _NAME)
    if (dot <= slash + 1).any() or (dot >= length - 1).any():
        return None  # an empty key or extension
    upper = (names >= ord("A")) & (names <= ord("Z")) & inside & (_COLS > dot[:, None])
    if upper.any():
        return None  # the extension is lower-cased in the sample (and in its checksum)
    return length, dot


def _keys_match(names: np.ndarray, dot: np.ndarray, sample: np.ndarray, rank: np.ndarray, n: int) -> bool:
    """Every member has its sample's key, and no two neighbouring samples share one (the
    streaming reader would join them)."""
    keys = names * (_COLS < dot[:, None])
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
    ext = np.take_along_axis(names, np.minimum(cols, _NAME - 1), axis=1) * (cols < length[:, None])
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


def _labels(buf: np.ndarray, header: np.ndarray, size: np.ndarray, member: np.ndarray) -> np.ndarray | None:
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
    text = buf[np.minimum(header[m, None] + BLOCK + cols, len(buf) - 1)].astype(np.int64)
    inside = cols < z[:, None]
    if not (((text >= ord("0")) & (text <= ord("9"))) | ~inside).all():
        return None
    power = np.where(inside, 10 ** np.maximum(z[:, None] - 1 - cols, 0), 0)
    labels[has] = ((text - ord("0")) * power).sum(axis=1)
    return labels


def _crcs(buf: np.ndarray, sample: np.ndarray, header: np.ndarray, length: np.ndarray, size: np.ndarray,
          n: int) -> np.ndarray:
    """Each sample's ``sample_crc32``: over ``"<key>.<ext>\\0"`` (the header's name and its NUL:
    the name is exactly that here) and the data, member by member in rank order."""
    view = memoryview(buf.data)
    out = [0] * n
    for s, h, k, z in zip(sample.tolist(), header.tolist(), length.tolist(), size.tolist()):
        out[s] = crc32(view[h + BLOCK:h + BLOCK + z], crc32(view[h:h + k + 1], out[s]))
    return np.array(out, dtype=np.uint32)
