"""An optional local cache of fetched blocks: size-bounded across processes, atomic, named by hash.

Entries are files named by the SHA-256 of (URL, version tag, byte range) — the tag names one
content of the object (:mod:`gpupipe.storage.identity`), so a rewritten object is never
answered from here. A write goes to a temporary file in the same folder and is renamed into
place, so a reader never sees half a file and several worker processes can share one folder.

The size bound holds across the processes sharing the folder: the total size of the entries
is kept in ``.lock`` and changed only under an exclusive ``flock`` of that file, and an entry
is renamed into place only once the least recently used ones (by mtime, which a hit
refreshes) have gone to make room. So the entries never exceed ``max_bytes``; the folder may
hold besides one temporary file per process, being written (each process writes one entry
at a time). Without ``fcntl`` (Windows) each process keeps the bound for what it writes.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["BlockCache"]

log = logging.getLogger(__name__)
_SUFFIX = ".blk"
_TMP = ".tmp-"
_LOCK = ".lock"  # flock-ed by writers; holds the entries' total size in bytes
_STALE_TMP_S = 600.0  # a temporary file this old was left by a process that died while writing
_HEADROOM = 0.9  # eviction frees down to this fraction of max_bytes, so that it is not run at every write


class _Total:
    def __init__(self, value: int):
        self.value = value


class BlockCache:
    def __init__(self, root: str, max_bytes: int):
        if max_bytes <= 0:
            raise ValueError(f"cache max_bytes must be > 0, got {max_bytes}")
        self.root = root
        self.max_bytes = max_bytes
        os.makedirs(root, exist_ok=True)
        self._lock = threading.Lock()  # the accounts, among this process's threads
        self._writing = threading.Lock()  # one entry written at a time: one temporary file per process
        with self._accounts():
            pass  # counts the folder once if no process has yet

    @staticmethod
    def key(url: str, tag: str, start: int, stop: int) -> str:
        """The name of bytes ``[start, stop)`` of version ``tag`` of the object at ``url``."""
        return hashlib.sha256(f"{url}\0{tag}\0{start}\0{stop}".encode()).hexdigest()

    def _path(self, key: str) -> str:
        return os.path.join(self.root, key + _SUFFIX)

    def get(self, key: str, part: tuple[int, int] | None = None, size: int | None = None) -> bytes | None:
        """Entry ``key``, or only its bytes ``[a, b)`` of ``part`` — a few samples of a large block
        read only themselves; ``None`` when it is not there, or not of ``size`` bytes."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                if size is not None and os.fstat(f.fileno()).st_size != size:
                    return None
                data = f.read() if part is None else os.pread(f.fileno(), part[1] - part[0], part[0])
            os.utime(path)  # mark as recently used
            return data
        except FileNotFoundError:  # not there, or evicted meanwhile
            return None

    def total_bytes(self) -> int:
        """The size of all entries, as accounted."""
        with self._accounts() as total:
            return total.value

    def discard(self, key: str) -> None:
        """Remove one entry (its bytes turned out bad); a missing entry is fine."""
        path = self._path(key)
        with self._accounts() as total:
            total.value -= _remove(path)

    def put(self, key: str, data: bytes) -> None:
        if len(data) > self.max_bytes * _HEADROOM:
            return  # it would push out everything else
        path = self._path(key)
        with self._writing:
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=_TMP)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                with self._accounts() as total:
                    if total.value + len(data) > self.max_bytes:
                        total.value = self._evict(int(self.max_bytes * _HEADROOM) - len(data))
                    total.value -= _remove(path)  # an entry read afresh replaces the old one
                    os.replace(tmp, path)
                    total.value += len(data)
            except BaseException:
                _remove(tmp)
                raise

    def evict(self) -> None:
        """Delete least recently used entries until the folder fits ``max_bytes``."""
        with self._accounts() as total:
            total.value = self._evict(self.max_bytes)

    @contextmanager
    def _accounts(self) -> Iterator[_Total]:
        """Exclusive, among threads and processes, use of the entries' total (``.value``),
        written back when the block ends; counted afresh when the record is missing."""
        with self._lock, open(_open_rw(os.path.join(self.root, _LOCK)), "r+b") as f:
            if fcntl is not None:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # released when the file closes
            raw = f.read(64)
            try:
                before = int(raw)
            except ValueError:
                before = self._scan()[0]
            total = _Total(before)
            yield total
            if total.value != before or not raw.strip():
                f.seek(0)
                f.write(str(max(0, total.value)).encode().ljust(20))
                f.flush()

    def _evict(self, target: int) -> int:
        """Under the accounts: delete least recently used entries until they total at most
        ``target``; returns their total, counted from the folder."""
        total, entries = self._scan()
        for _, _, name in sorted(entries):
            if total <= target:
                break
            total -= _remove(os.path.join(self.root, name))
        return total

    def _scan(self) -> tuple[int, list[tuple[float, int, str]]]:
        """The entries' total and ``(mtime, size, name)`` of each; temporary files left by a
        process that died while writing are removed on the way."""
        entries = []
        now = time.time()
        for name in os.listdir(self.root):
            try:
                st = os.stat(os.path.join(self.root, name))
            except FileNotFoundError:
                continue  # a reader's miss, or a rename, meanwhile
            if name.endswith(_SUFFIX):
                entries.append((st.st_mtime, st.st_size, name))
            elif name.startswith(_TMP) and now - st.st_mtime > _STALE_TMP_S:
                _remove(os.path.join(self.root, name))
        return sum(size for _, size, _ in entries), entries


def _open_rw(path: str) -> int:
    """A read-write descriptor of ``path``, made empty if it was not there."""
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


def _remove(path: str) -> int:
    """Remove ``path``; returns the bytes that went (0 when it was not there)."""
    try:
        size = os.stat(path).st_size
        os.remove(path)
        return size
    except FileNotFoundError:
        return 0
