"""The pax extended headers of many members at once: their records read as arrays, a record rank at a time.

:func:`pax_records` reads the data of every ``x`` header of a step of :func:`~gpupipe.formats.tarwalk.walk_span`
as the streaming reader's ``_parse_pax`` (:mod:`gpupipe.formats.tar`) reads one: records
``"<length> <key>=<value>\\n"`` one after the other until the data ends or a NUL starts a record; the
last ``path`` and the last ``size`` are kept, every other key is read past. Each record is found from
narrow windows (its length digits, its last byte, the four bytes of its key), so the cost does not grow
with the header's size. Anything the streaming reader might read otherwise, or refuse, gives ``None``.
"""
from __future__ import annotations

import numpy as np

from gpupipe.formats.tar import MAX_MEMBER_BYTES

__all__ = ["cut", "pax_records"]

_MAX_RECORDS = 64  # records per pax header taken here
_SPACE, _EQUALS, _NEWLINE = ord(" "), ord("="), ord("\n")
_PATH, _SIZE = np.frombuffer(b"path", dtype=np.uint8), np.frombuffer(b"size", dtype=np.uint8)
_POWERS = np.int64(10) ** np.arange(19)
_EIGHT, _FIVE = np.arange(8), np.arange(5)


def cut(data: np.ndarray, at: np.ndarray, length: np.ndarray) -> np.ndarray:
    """``(k, max length)`` uint8: bytes ``[at, at + length)`` of each row of ``data``, NULs past them."""
    cols = np.arange(int(length.max()) if len(length) else 0)
    return _window(data, at, cols) * (cols < length[:, None])


def _window(data: np.ndarray, at: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``(k, len(cols))``: bytes ``at + cols`` of each row of ``data`` (the last byte past its end)."""
    return data[np.arange(len(data))[:, None], np.minimum(at[:, None] + cols, data.shape[1] - 1)]


def _decimal(data: np.ndarray, at: np.ndarray, digits: np.ndarray, most: int) -> np.ndarray | None:
    """The ``digits`` (at most ``most``, up to 18) ASCII decimal digits at ``at`` of each row, or ``None``."""
    cols = np.arange(most)
    value = _window(data, at, cols) - np.uint8(ord("0"))  # a byte below "0" wraps past 9
    inside = cols < digits[:, None]
    if ((value > 9) & inside).any():
        return None
    return (value * (_POWERS[np.maximum(digits[:, None] - 1 - cols, 0)] * inside)).sum(axis=1)


def pax_records(data: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per pax header (rows of ``data``, ``size`` bytes each), as the streaming reader reads it: where
    its last ``path`` value starts and its length (-1: none), and its last ``size`` value (-1: none).
    ``None`` for a record that is not ``"%d %s=%s\\n"`` with ASCII decimals, a path with a NUL, or a
    size that is not 1 to 18 digits or is larger than a member taken here."""
    k = len(size)
    path_at, path_len, value = np.zeros(k, np.int64), np.full(k, -1, np.int64), np.full(k, -1, np.int64)
    pos, live = np.zeros(k, np.int64), np.arange(k)
    for _ in range(_MAX_RECORDS):
        live = live[(pos[live] < size[live]) & (data[live, np.minimum(pos[live], data.shape[1] - 1)] != 0)]
        if not live.size:
            return path_at, path_len, value
        d = data[live]
        record = _record(d, pos[live], size[live])
        if record is None:
            return None
        end, at, key = record
        length = np.maximum(end - 1 - at, 0)  # the value: up to the record's last byte
        p, s = key == 1, key == 2
        if p.any():
            path = cut(d[p], at[p], length[p])
            if ((path == 0) & (np.arange(path.shape[1]) < length[p, None])).any():
                return None  # a NUL in a path: the streaming reader refuses the name
            path_at[live[p]], path_len[live[p]] = at[p], length[p]
        if s.any():
            digits = length[s]
            got = _decimal(d[s], at[s], digits, 18) if ((digits >= 1) & (digits <= 18)).all() else None
            if got is None or (got > MAX_MEMBER_BYTES).any():
                return None
            value[live[s]] = got
        pos[live] = end
    return None


def _record(d: np.ndarray, pos: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The pax record at ``pos`` of each row of ``d`` (``size`` bytes each): ``(end, where its value
    starts, key)``, key 1 for ``path``, 2 for ``size``, 0 for any other (whose value is not read);
    ``None`` unless it is ``"<length> <key>[=<value>]\\n"`` with 1 to 7 ASCII digits and lies in the data.
    Only narrow windows are read: the length, the newline, the four bytes of a key and what follows."""
    spaces = (_window(d, pos, _EIGHT) == _SPACE) & (pos[:, None] + _EIGHT < size[:, None])
    if not spaces.any(axis=1).all():
        return None
    space = pos + spaces.argmax(axis=1)
    digits = space - pos
    length = _decimal(d, pos, digits, 7) if (digits >= 1).all() else None
    if length is None or (length <= digits).any() or (pos + length > size).any():
        return None
    end = pos + length
    if (d[np.arange(len(d)), end - 1] != _NEWLINE).any():
        return None  # the streaming reader does not look at this byte
    word = _window(d, space + 1, _FIVE)
    region = end - space - 2  # "<key>=<value>": the key is what comes before its first "=", or all of it
    four = (region == 4) | ((region > 4) & (word[:, 4] == _EQUALS))
    path, size_ = four & (word[:, :4] == _PATH).all(axis=1), four & (word[:, :4] == _SIZE).all(axis=1)
    key = np.where(path, 1, np.where(size_, 2, 0))
    return end, space + 6, key
