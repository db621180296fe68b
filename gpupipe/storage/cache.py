"""An optional local cache of fetched byte ranges: size-bounded, atomic, named by hash.

Entries are files named by the SHA-256 of (url, range, version); a write goes
to a temporary file in the same folder and is renamed into place, so a reader
never sees half a file and several worker processes can share one folder.
When the folder grows past ``max_bytes`` the least recently used entries go
(exactly within one process; several processes sharing a folder each enforce
the bound when they write, so it may be passed briefly by one entry per process).
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading

__all__ = ["BlockCache"]

log = logging.getLogger(__name__)
_SUFFIX = ".blk"


class BlockCache:
    def __init__(self, root: str, max_bytes: int):
        if max_bytes <= 0:
            raise ValueError(f"cache max_bytes must be > 0, got {max_bytes}")
        self.root = root
        self.max_bytes = max_bytes
        os.makedirs(root, exist_ok=True)
        self._lock = threading.Lock()  # fetch threads share one cache
        self._approx_bytes = self._scan_total()

    @staticmethod
    def key(url: str, start: int, stop: int, version: str = "") -> str:
        return hashlib.sha256(f"{url}\0{start}\0{stop}\0{version}".encode()).hexdigest()

    def _path(self, key: str) -> str:
        return os.path.join(self.root, key + _SUFFIX)

    def get(self, key: str) -> bytes | None:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
            os.utime(path)  # mark as recently used
            return data
        except FileNotFoundError:
            return None

    def discard(self, key: str) -> None:
        """Remove one entry (its bytes turned out bad); a missing entry is fine."""
        _remove(self._path(key))

    def put(self, key: str, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self._path(key))
        except BaseException:
            _remove(tmp)
            raise
        with self._lock:
            self._approx_bytes += len(data)
            if self._approx_bytes > self.max_bytes:
                self._evict()

    def evict(self) -> None:
        """Delete least recently used entries until the folder fits ``max_bytes``."""
        with self._lock:
            self._evict()

    def _evict(self) -> None:
        entries = []
        for name in os.listdir(self.root):
            if name.endswith(_SUFFIX):
                try:
                    st = os.stat(os.path.join(self.root, name))
                except FileNotFoundError:
                    continue  # another process evicted it
                entries.append((st.st_mtime, st.st_size, name))
        total = sum(size for _, size, _ in entries)
        for _, size, name in sorted(entries):
            if total <= self.max_bytes * 0.9:
                break
            _remove(os.path.join(self.root, name))
            total -= size
        self._approx_bytes = total

    def _scan_total(self) -> int:
        total = 0
        for name in os.listdir(self.root):
            if name.endswith(_SUFFIX):
                try:
                    total += os.stat(os.path.join(self.root, name)).st_size
                except FileNotFoundError:
                    pass
        return total


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
