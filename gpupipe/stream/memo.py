"""What the tar scan found in local shards, remembered while each file stays as it was.

The vectorized scan of a unit's samples (:mod:`gpupipe.formats.tarscan`) checks every header
and every sample's CRC-32 against the manifest, then says where each image lies in its sample,
its label and its key. None of that changes while the file does not, and every epoch reads the
same samples again. So for local files (read whole units at a time, :meth:`Fetcher.gather`)
this process keeps those answers per shard, with the file's identity (inode, size, modification
time in ns) — asked before the scanned bytes were read and again after, and kept only when the
two agree. A unit whose samples were all scanned before is read without a scan: its bytes
gathered as before and each image found at its remembered place, provided the identity of each
of its files, asked before this read and again after it, is the one its answers were found
under. A file written since (a new modification time) or replaced (another inode) is scanned
again. Remote objects are not remembered (each read is checked as it arrives).

Units whose samples carry targets (boxes, masks) are always scanned: their annotations are
parsed from the sample's own members.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["ScanMemo", "SCANNED"]

Identity = tuple  # the file's (inode, size, mtime ns) and its manifest layout (gpupipe.stream.chunks)

_LIMIT = 1 << 22  # samples remembered per process (~17 bytes each and the key): the oldest shards go first


@dataclass
class _Shard:
    """One shard's answers: per sample, whether it is known, its image's offset in the sample and
    size, its label and its key (ASCII bytes, as the scan reads keys)."""

    identity: Identity
    known: np.ndarray
    image_at: np.ndarray
    image_size: np.ndarray
    label: np.ndarray
    key: np.ndarray
    header: np.ndarray  # the probe's verdict on its image (gpupipe.formats.headers.header_ids), -1: none kept

    @classmethod
    def empty(cls, identity: Identity, n: int) -> _Shard:
        return cls(identity, np.zeros(n, bool), np.zeros(n, np.int32), np.zeros(n, np.int32),
                   np.zeros(n, np.int64), np.zeros(n, "S1"), np.full(n, -1, np.int32))


class ScanMemo:
    """The scan's answers about local shards, by URL (:mod:`gpupipe.stream.memo`); at most
    ``limit`` samples, the shards first remembered forgotten first. Shared by the threads of
    a process."""

    def __init__(self, limit: int = _LIMIT):
        self.limit = limit
        self._shards: OrderedDict[str, _Shard] = OrderedDict()
        self._samples = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._samples

    def clear(self) -> None:
        with self._lock:
            self._shards.clear()
            self._samples = 0

    def known(self, urls: Sequence[str], index: np.ndarray, shard_of: np.ndarray
              ) -> tuple[dict[int, Identity], np.ndarray, np.ndarray, np.ndarray, list[str], np.ndarray] | None:
        """For samples ``index`` of shards ``shard_of`` (positions in ``urls``): the identity each
        shard's answers hold for (by position) and each sample's image offset in its sample, image
        size, label, key and probe verdict (-1: none) — or ``None`` unless every sample is known."""
        n = len(index)
        image_at, size, label = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
        header = np.empty(n, np.int32)
        keys: list[tuple[np.ndarray, np.ndarray]] = []  # (places, their keys) by shard
        identities: dict[int, Identity] = {}
        with self._lock:
            for k in np.unique(shard_of).tolist():
                entry = self._shards.get(urls[k])
                mine = np.flatnonzero(shard_of == k)
                at = index[mine]
                if entry is None or at.max() >= len(entry.known) or not entry.known[at].all():
                    return None
                identities[k] = entry.identity
                image_at[mine], size[mine], label[mine] = entry.image_at[at], entry.image_size[at], entry.label[at]
                header[mine] = entry.header[at]
                keys.append((mine, entry.key[at]))
        width = max(k.dtype.itemsize for _, k in keys) if keys else 1
        joined = np.empty(n, f"S{width}")
        for mine, k in keys:
            joined[mine] = k
        return identities, image_at, size, label, joined.astype(f"U{width}").tolist(), header  # (ASCII keys: the scan's)

    def remember_headers(self, url: str, identity: Identity, index: np.ndarray, header: np.ndarray) -> None:
        """The probe's verdicts on the images of samples ``index`` of the shard at ``url``, whose
        bytes were read while the file had ``identity`` (kept only if its answers hold for that)."""
        with self._lock:
            entry = self._shards.get(url)
            if entry is not None and entry.identity == identity:
                entry.header[index] = header

    def remember(self, url: str, identity: Identity, samples: int, index: np.ndarray, image_at: np.ndarray,
                 size: np.ndarray, label: np.ndarray, keys: list[str]) -> None:
        """What the scan found for samples ``index`` of the shard at ``url`` (``samples`` in all),
        read while the file had ``identity``. (A sample whose image lies 2 GiB or more into it is
        not remembered.)"""
        if len(index) and max(int(image_at.max()), int(size.max())) >= 1 << 31:
            return
        with self._lock:
            entry = self._shards.get(url)
            if entry is None or entry.identity != identity or len(entry.known) != samples:
                if entry is not None:
                    self._samples -= len(entry.known)
                    del self._shards[url]
                while self._shards and self._samples + samples > self.limit:
                    _, old = self._shards.popitem(last=False)
                    self._samples -= len(old.known)
                if samples > self.limit:
                    return
                entry = self._shards[url] = _Shard.empty(identity, samples)
                self._samples += samples
            encoded = np.array([k.encode("ascii") for k in keys])
            if encoded.dtype.itemsize > entry.key.dtype.itemsize:
                entry.key = entry.key.astype(encoded.dtype)
            entry.known[index] = True
            entry.image_at[index], entry.image_size[index], entry.label[index] = image_at, size, label
            entry.key[index] = encoded


SCANNED = ScanMemo()
"""This process's memo (a DataLoader worker's own after the fork; kept across passes by
persistent workers)."""


def _new_lock_in_child() -> None:
    """A forked child (a stream worker) gets a lock of its own: another thread of the parent may
    have held the memo's at the fork, and no thread of the child would ever release it."""
    SCANNED._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)
