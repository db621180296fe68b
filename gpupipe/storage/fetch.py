"""Byte-range reads from any fsspec filesystem: concurrent, bounded, retried.

A :class:`Fetcher` is built inside the process that uses it (a DataLoader
worker) from plain data — a URL, ``storage_options`` and a
:class:`FetchConfig` — never pickled with an open filesystem.

Every read is a byte range (``cat_file(path, start, end)``): with the
manifest's offsets that is one GET per block, and no HEAD before it (a whole
object of unknown size costs one ``info()`` first). Transient
failures (5xx including S3 SlowDown, 429, connection reset, timeouts, a body
shorter than asked) are retried with capped exponential backoff and full
jitter; a block is only ever returned whole, so bytes are never joined wrongly.
What cannot get better by waiting fails at once, with the URL and what to set
(:mod:`gpupipe.storage.faults`): no credentials, a 403, a 404, a missing bucket, and
— until the endpoint has answered once — an unknown host or a refused connection.
For ``s3://`` the client makes one attempt per call (the ``Fetcher`` is the one
retry layer) and gives up connecting after ``CONNECT_TIMEOUT_S``; both are defaults
that a user's ``config_kwargs`` overrides.
Bytes that arrive whole but wrong (a flipped byte, an object replaced between
two reads) are caught by the stream's per-sample checksums, which then ask for
each damaged sample again with :meth:`Fetcher.read_fresh` (past the cache), at
most ``FetchConfig.refetch`` times, after dropping the damaged blocks from the cache.

With ``cache_dir`` set, a range is read through a :class:`~gpupipe.storage.cache.BlockCache`
only when its object's version is known (:mod:`gpupipe.storage.identity`): a checksum from
the manifest, given with the range, or the storage's identity, from the ``info()`` a whole
object needs anyway. An object of known size is cached in blocks of a fixed grid —
``[k * block_bytes, (k + 1) * block_bytes)``, the last one ending with the object — which
are fetched whole and sliced, so that a range that starts elsewhere next epoch finds them.
Without a known size a range is cached as it is asked for; without a version, not at all.
"""
from __future__ import annotations

import itertools
import logging
import mmap
import os
import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

import numpy as np

from gpupipe.core.errors import ConfigError, MissingDependencyError, StorageError
from gpupipe.core.types import ByteRange
from gpupipe.storage.buffers import BufferPool, read_into
from gpupipe.storage.cache import BlockCache
from gpupipe.storage.faults import CONNECT_TIMEOUT_S, Fault, classify, storage_error
from gpupipe.storage.identity import ObjectVersion, as_version, identity_of

__all__ = ["FetchConfig", "FetchStats", "Fetcher", "ObjectVersion", "Version", "open_filesystem", "is_transient",
           "is_plain_local", "mappable",
           "refuse_commands", "storage_errors"]

Version = ObjectVersion | str  # a bare string is a tag of unknown size

log = logging.getLogger(__name__)
MiB = 1 << 20
_REFUSED_PROTOCOLS = ("pipe",)  # webdataset-style shell commands are never run
_S3_PROTOCOLS = ("s3", "s3a")
_INLINE_BYTES = 256 << 10  # a local range shorter than this is read in the calling thread (read_many)
_FILES_OPEN = 16  # local files a fetcher keeps open for those reads
_FILES_MAPPED = 64  # local files a fetcher that maps them keeps mapped
_CONNECT_TIMEOUT_TRIES = 3  # attempts for a connect timeout before the endpoint has ever answered


@dataclass(frozen=True)
class FetchConfig:
    """How bytes are fetched. Plain data: safe to pickle into workers."""

    concurrency: int = 8  # requests in flight per worker
    object_concurrency: int = 32  # the same, for an image folder (one small request per image)
    readahead_bytes: int = 64 * MiB  # bytes requested but not yet consumed, per worker
    block_bytes: int = 8 * MiB  # largest single request; with a cache, the grid its blocks sit on
    retries: int = 8  # attempts after the first, for transient errors
    backoff_s: float = 0.05
    backoff_max_s: float = 5.0
    request_timeout_s: float = 60.0
    cache_dir: str | None = None
    cache_bytes: int = 10 << 30
    refetch: int = 8  # new reads of a sample whose bytes failed their checksum or tar header

    def __post_init__(self) -> None:
        for name in ("concurrency", "object_concurrency", "readahead_bytes", "block_bytes", "cache_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"stream.{name}: must be >= 1, got {getattr(self, name)}")
        if self.retries < 0 or self.refetch < 0 or self.request_timeout_s <= 0:
            raise ConfigError("stream.retries and stream.refetch must be >= 0 and stream.request_timeout_s > 0")


@dataclass
class FetchStats:
    """A fetcher's counters — the one record they travel in, from a worker's fetcher (each batch
    carries what changed since the worker's previous one: :meth:`since`) to the loader's sum
    (:meth:`add`) and its metrics."""

    requests: int = 0
    retries: int = 0
    refetches: int = 0  # byte ranges read again because their bytes failed a checksum
    bytes: int = 0
    cache_hits: int = 0  # blocks answered by the cache
    wait_s: float = 0.0  # time the consumer waited for bytes
    errors: dict[str, int] = field(default_factory=dict)

    def since(self, earlier: FetchStats) -> FetchStats:
        """What changed from ``earlier`` (a :meth:`copy` of these counters) to now."""
        out = FetchStats(**{f.name: getattr(self, f.name) - getattr(earlier, f.name)
                            for f in fields(self) if f.name != "errors"})
        out.errors = {k: n - earlier.errors.get(k, 0) for k, n in self.errors.items() if n != earlier.errors.get(k, 0)}
        return out

    def add(self, other: FetchStats) -> None:
        """Count ``other``'s counters in."""
        for f in fields(self):
            if f.name != "errors":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        for k, n in other.errors.items():
            self.errors[k] = self.errors.get(k, 0) + n

    def copy(self) -> FetchStats:
        return replace(self, errors=dict(self.errors))


def is_plain_local(fs) -> bool:
    """fsspec's own local filesystem (not a subclass that may change how it reads)."""
    from fsspec.implementations.local import LocalFileSystem

    return type(fs) is LocalFileSystem


def refuse_commands(urls: Iterable[str]) -> None:
    """Raise ``ConfigError`` for any ``pipe:`` URL (a shell command) among ``urls``."""
    for url in urls:
        if isinstance(url, str) and url.lstrip().startswith(_REFUSED_PROTOCOLS[0] + ":"):
            raise ConfigError(f"source: pipe: URLs (shell commands) are refused ({url[:40]!r}); give a storage URL")


_BACKENDS = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"),
             "http": ("aiohttp", "http"), "https": ("aiohttp", "http")}  # protocol → (package, pip extra)


def open_filesystem(url: str, storage_options: Mapping[str, Any] | None = None):
    """``(filesystem, path)`` for ``url``; bad protocols and missing packages raise clearly.

    The storage options are passed to fsspec and never logged or put in messages.
    """
    import fsspec.core

    refuse_commands([url])
    protocol = url.split("://", 1)[0] if "://" in url else "file"
    if protocol in _REFUSED_PROTOCOLS:
        raise ConfigError(f"source: {protocol}: URLs (shell commands) are refused; give a storage URL")
    options = dict(storage_options or {})
    if protocol in _S3_PROTOCOLS:
        options = _s3_defaults(options)
    try:
        return fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        package, extra = _BACKENDS.get(protocol, (exc.name or protocol, protocol))
        raise MissingDependencyError(package, extra=extra, feature=f"reading {protocol}:// URLs") from None
    except ValueError as exc:
        if "Protocol not known" in str(exc):
            raise ConfigError(f"source: unknown storage protocol {protocol!r} in {url!r}") from None
        raise


def _s3_defaults(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with botocore making one attempt per call (gpupipe retries) and a
    ``CONNECT_TIMEOUT_S`` connect timeout, unless ``config_kwargs`` already sets them."""
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
    config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
    config.setdefault("max_pool_connections", 32)  # botocore's 10 would cap FetchConfig.object_concurrency
    return {**options, "config_kwargs": config}


def is_transient(exc: BaseException) -> bool:
    """Whether a failed request is worth retrying (see :func:`gpupipe.storage.faults.classify`)."""
    return classify(exc).transient


@contextmanager
def storage_errors(url: str) -> Iterator[None]:
    """Within the block, a storage backend's exception becomes the ``StorageError`` for
    ``url`` that says what to do (for direct filesystem calls, outside a ``Fetcher``)."""
    try:
        yield
    except StorageError:
        raise
    except Exception as exc:  # classified; a bug (Fault.OTHER) keeps its own type
        if classify(exc) is Fault.OTHER:
            raise
        raise storage_error(exc, url) from exc


class _NotMapped(Exception):
    """A file on a file system that is not mapped (:func:`mappable`)."""


# File systems whose files a worker maps (Linux names, /proc/self/mounts). On a network or FUSE file
# system an I/O error while a mapped page is read in is SIGBUS, which kills the reader, where a read
# call would have returned an error to retry: those are read, not mapped.
_MAPPED_FS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "ramfs", "overlay", "zfs", "f2fs", "bcachefs"})
_MOUNTS: list[tuple[str, str]] | None = None  # (mount point, file system type), longest first


def mappable(path: str) -> bool:
    """Whether the local file at ``path`` lies on a file system whose files are mapped (a local
    disk or memory: :data:`_MAPPED_FS`); False where that cannot be told."""
    global _MOUNTS
    if _MOUNTS is None:
        try:
            with open("/proc/self/mounts") as f:
                rows = [line.split()[1:3] for line in f if len(line.split()) >= 3]
        except OSError:
            rows = []
        _MOUNTS = sorted(((point.replace("\\040", " "), kind) for point, kind in rows), key=lambda m: -len(m[0]))
    real = os.path.realpath(path)
    for point, kind in _MOUNTS:
        if real == point or real.startswith(point.rstrip("/") + "/"):
            return kind in _MAPPED_FS
    return False


class _ShortRead(OSError):
    """The server sent fewer bytes than the range asked for."""


class _Done:
    """A read done in the calling thread, answering ``result()`` as its ``Future`` would (without
    the lock and condition a ``Future`` makes: a shuffled unit reads hundreds of short ranges)."""

    __slots__ = ("value", "error")

    def __init__(self, value: Any, error: Exception | None = None):
        self.value, self.error = value, error

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value

    def cancel(self) -> bool:
        return False  # done already


T = TypeVar("T")


def read_ahead(items: Iterator[T], submit: Callable[[T], Any], size: Callable[[T], int], *, in_flight: int,
               readahead_bytes: int, stats: FetchStats) -> Iterator[tuple[T, Any]]:
    """Each item with its result — what ``submit(item)``'s future gives, or the ``StorageError``
    it raised — in order, keeping up to ``in_flight`` submitted and about ``readahead_bytes``
    (``size(item)`` each) asked ahead of the consumer, at least one: the one read-ahead window of
    every read path (threads in :meth:`Fetcher.read_many`, coroutines in
    :mod:`gpupipe.storage.objects`), so memory does not grow with the dataset. The consumer's
    wait is counted in ``stats.wait_s``; what is pending when it stops is cancelled."""
    pending: deque[tuple[T, int, Any]] = deque()
    ahead, exhausted = 0, False
    try:
        while True:
            while not exhausted and len(pending) < in_flight and (not pending or ahead < readahead_bytes):
                item = next(items, None)
                if item is None:
                    exhausted = True
                    break
                nbytes = size(item)
                pending.append((item, nbytes, submit(item)))
                ahead += nbytes
            if not pending:
                return
            item, nbytes, fut = pending.popleft()
            t0 = time.perf_counter()
            try:
                data: Any = fut.result()
            except StorageError as exc:
                data = exc
            stats.wait_s += time.perf_counter() - t0
            ahead -= nbytes
            yield item, data
    finally:
        for _, _, fut in pending:  # the consumer stopped early: nothing keeps running for it
            fut.cancel()


class Fetcher:
    """Ranged reads of one filesystem with retries, concurrency and an optional cache."""

    def __init__(self, fs, config: FetchConfig = FetchConfig(), *, map_files: bool = False):
        """``map_files``: reads of local files without a cache are views of the file mapped in memory (no
        copy, no system call a read). Only where a process may die of it: a file that shrinks while
        mapped kills the reader with SIGBUS on the next touch of its lost pages (a DataLoader worker,
        whose death the training process reports)."""
        self.fs = fs
        self.config = config
        self.stats = FetchStats()
        self._cache = BlockCache(config.cache_dir, config.cache_bytes) if config.cache_dir else None
        self._jitter = random.Random()  # timing only; never touches data order
        self._lock = threading.Lock()
        self._loading: dict[str, threading.Event] = {}  # cache blocks being fetched by a thread now
        self._pool: ThreadPoolExecutor | None = None
        self._cache_failed = False  # a cache write failed (disk full?): said once
        self.answered = False  # has a request succeeded (so the endpoint is right)?
        self._pool_buffers: BufferPool | None = None  # local files, no cache: reused buffers (read_many(reuse=True))
        self._files: OrderedDict[str, int] = OrderedDict()  # local files open for short reads (LRU), by URL
        if config.cache_dir is None and is_plain_local(fs):
            self._pool_buffers = BufferPool.shared(config.block_bytes, config.readahead_bytes // config.block_bytes + 8)
        # or mapped (local files read without a cache): URL → (the file's bytes, its (inode, size, mtime) then)
        self._maps: OrderedDict[str, tuple[np.ndarray, tuple]] | None = \
            OrderedDict() if map_files and self._pool_buffers is not None else None

    @classmethod
    def for_url(cls, url: str, storage_options: Mapping[str, Any] | None, config: FetchConfig = FetchConfig(), *,
                map_files: bool = False) -> Fetcher:
        fs, _ = open_filesystem(url, storage_options)
        return cls(fs, config, map_files=map_files)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        while self._files:
            os.close(self._files.popitem()[1])
        if self._maps is not None:
            self._maps.clear()  # each unmapped when the last view of it goes

    # -- single requests ---------------------------------------------------------------
    def size(self, url: str) -> int:
        return int(self._retrying(url, lambda: self.fs.size(self.fs._strip_protocol(url))))

    def stat(self, url: str) -> ObjectVersion:
        """The object's size and its storage identity as a version tag, from one ``info()``
        (a HEAD on object stores) — asked of the storage, not of a listing cached earlier.
        The tag is ``""`` when the storage gives none (:func:`~gpupipe.storage.identity.identity_of`)."""
        path = self.fs._strip_protocol(url)

        def attempt():
            self.fs.invalidate_cache(path)
            return self.fs.info(path)

        info = self._retrying(url, attempt)
        return ObjectVersion(identity_of(info), int(info["size"]))

    def call(self, url: str, method: str, *args):
        """``fs.<method>(path_of(url), *args)`` with the same retries as reads
        (for listings and metadata: ``glob``, ``isdir``, ``exists``)."""
        return self._retrying(url, lambda: getattr(self.fs, method)(self.fs._strip_protocol(url), *args))

    def read(self, r: ByteRange, *, version: Version = "", fresh: bool = False, reuse: bool = False) -> bytes:
        """The bytes of ``r`` (``stop=None``: to the end), retried; never short.

        ``version`` says what the object's bytes are (:class:`ObjectVersion`, or a tag of
        unknown size); the cache answers only for a known version. ``r`` to the end of an
        object of unknown size costs one ``info()``, which gives the storage's identity
        when ``version`` gives none. ``fresh``: from storage, past the cache (whose blocks
        of ``r`` are dropped) — for bytes that failed their checksum.
        """
        v = as_version(version)
        if r.stop is None and v.size is None:
            v = self._whole(r.url, v)
        stop = v.size if r.stop is None else r.stop
        assert stop is not None, "known from the range or the version"
        if stop <= r.start:
            return b""
        if fresh:
            self.forget(ByteRange(r.url, r.start, stop), v)
        if self._cache is None or not v.tag or fresh:
            return self._retrying(r.url, lambda: self._read_once(r.url, r.start, stop, pooled=reuse and not fresh))
        parts = [self._cached(r.url, v.tag, a, b, (lo, hi)) for a, b, lo, hi in self._cells(r.start, stop, v)]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _whole(self, url: str, v: ObjectVersion) -> ObjectVersion:
        """``v`` with the object's size, and the storage's identity as its tag when it has none."""
        found = self.stat(url)
        return ObjectVersion(v.tag or found.tag, found.size)

    def _cells(self, start: int, stop: int, v: ObjectVersion) -> list[tuple[int, int, int, int]]:
        """``(a, b, lo, hi)`` for each cache entry ``[a, b)`` that ``[start, stop)`` needs, and
        the part of it, ``[lo, hi)``, that falls in the range: the cells of the grid when the
        object's size is known, else the range itself."""
        if v.size is None or stop > v.size:
            return [(start, stop, 0, stop - start)]
        step, out = self.config.block_bytes, []
        for k in range(start // step, (stop - 1) // step + 1):
            a, b = k * step, min((k + 1) * step, v.size)
            out.append((a, b, max(start, a) - a, min(stop, b) - a))
        return out

    def _cached(self, url: str, tag: str, a: int, b: int, part: tuple[int, int]) -> bytes:
        """Bytes ``part`` (counted from ``a``) of the block ``[a, b)`` of version ``tag`` of ``url``:
        from the cache, else the block is fetched (once, however many threads ask at the same
        time) and put there. A hit reads only the part."""
        assert self._cache is not None, "read() checked it"
        key = BlockCache.key(url, tag, a, b)
        while True:
            hit = self._hit(key, b - a, part)
            if hit is not None:
                return hit
            done = self._claim(key)
            if done is not None:
                break
        try:
            # Claimed; but another thread may have put the block between this thread's miss and
            # its claim (seen under load: a block of the same grid fetched twice). Look once more.
            hit = self._hit(key, b - a, part)
            if hit is not None:
                return hit
            data = self._retrying(url, lambda: self._read_once(url, a, b))
            try:
                self._cache.put(key, data)
            except OSError as exc:  # a full or read-only disk costs the cache, never the read
                if not self._cache_failed:
                    self._cache_failed = True
                    log.warning("stream.fetch.cache_dir %s: cannot write (%s); reading past the cache",
                                self._cache.root, exc)
            return data if part == (0, b - a) else data[part[0]:part[1]]
        finally:
            with self._lock:
                del self._loading[key]
            done.set()

    def _hit(self, key: str, size: int, part: tuple[int, int]) -> bytes | None:
        """Bytes ``part`` of block ``key`` from the cache if the block is there whole (counted as
        a hit), else None."""
        assert self._cache is not None, "read() checked it"
        hit = self._cache.get(key, part, size)
        if hit is None or len(hit) != part[1] - part[0]:
            return None
        with self._lock:
            self.stats.cache_hits += 1
        return hit

    def _claim(self, key: str) -> threading.Event | None:
        """The event to set once this thread has fetched block ``key``; ``None`` after
        waiting for another thread that was fetching it (its bytes are in the cache now,
        unless that fetch failed)."""
        with self._lock:
            loading = self._loading.get(key)
            if loading is None:
                self._loading[key] = threading.Event()
                return self._loading[key]
        loading.wait()
        return None

    def _read_once(self, url: str, start: int, stop: int, pooled: bool = False) -> bytes:
        refuse_commands([url])  # a list of URLs is opened with the first one's filesystem
        path = self.fs._strip_protocol(url)
        if pooled and self._pool_buffers is not None:
            data: Any = read_into(path, start, stop, self._pool_buffers)
        elif getattr(self.fs, "async_impl", False) and getattr(self.fs, "loop", None) is not None:
            from fsspec.asyn import sync

            data = sync(self.fs.loop, self.fs._cat_file, path, start=start, end=stop, timeout=self.config.request_timeout_s)
        else:
            data = self.fs.cat_file(path, start=start, end=stop)
        self.count_read(len(data))
        if len(data) != stop - start:
            raise _ShortRead(f"got {len(data)} of {stop - start} bytes for range [{start}, {stop})")
        return data if pooled and self._pool_buffers is not None else bytes(data)

    def _retrying(self, url: str, attempt):
        for n in range(self.config.retries + 1):
            try:
                result = attempt()
                self.answered = True
                return result
            except Exception as exc:  # classified by retry_after; a bug is not retried
                time.sleep(self.retry_after(exc, url, n))
        raise AssertionError("unreachable: retry_after raises after the last attempt")

    def retry_after(self, exc: BaseException, url: str, attempt: int) -> float:
        """The one retry policy of every read path (threads here, coroutines in
        :mod:`gpupipe.storage.objects`): after try ``attempt`` (from 0) of a request for ``url``
        failed with ``exc``, the seconds to wait before the next — capped exponential backoff with
        full jitter — or the ``StorageError`` raised, from ``exc``, when it is not worth another
        (:meth:`_error_or_retry` decides and counts)."""
        error = self._error_or_retry(exc, url, attempts=attempt + 1)
        if error is not None:
            raise error from exc
        cfg = self.config
        with self._lock:  # one generator, shared by the pool's threads and the event loop
            delay = self._jitter.uniform(0, min(cfg.backoff_max_s, cfg.backoff_s * 2**attempt))
        log.debug("retrying %s in %.2fs after %s", url, delay, type(exc).__name__)
        return delay

    def count_read(self, nbytes: int) -> None:
        """One request answered with ``nbytes``, in :attr:`stats` (from any thread)."""
        with self._lock:
            self.stats.requests += 1
            self.stats.bytes += nbytes

    def count_refetch(self) -> None:
        """A range asked again because its bytes failed a checksum, in :attr:`stats`."""
        with self._lock:
            self.stats.refetches += 1

    def _error_or_retry(self, exc: BaseException, url: str, *, attempts: int) -> StorageError | None:
        """After ``attempts`` tries of a request for ``url`` failed, the last with ``exc``:
        the ``StorageError`` to raise, or ``None`` to retry (counted in :attr:`stats`).

        An endpoint that has not answered yet (:attr:`answered`) is most likely
        misconfigured: an unknown host or a refused connection fails at once, a connect
        timeout after ``_CONNECT_TIMEOUT_TRIES`` tries. Once it has answered, the same
        faults are a restart or a blip and get every retry."""
        fault = classify(exc)
        if fault.transient or (fault.endpoint and self.answered):
            limit = self.config.retries + 1
            if fault is Fault.CONNECT_TIMEOUT and not self.answered:
                limit = min(limit, _CONNECT_TIMEOUT_TRIES)
        else:
            limit = 1
        with self._lock:
            if limit > 1:
                self.stats.errors[type(exc).__name__] = self.stats.errors.get(type(exc).__name__, 0) + 1
            if attempts < limit:
                self.stats.retries += 1
                return None
        return storage_error(exc, url, fault=fault, attempts=attempts)

    def forget(self, r: ByteRange, version: Version = "") -> None:
        """Drop the cached blocks that hold bytes of ``r``: they were bad."""
        v = as_version(version)
        stop = v.size if r.stop is None else r.stop
        if self._cache is None or not v.tag or stop is None:
            return
        keys = {BlockCache.key(r.url, v.tag, a, b) for a, b, _, _ in self._cells(r.start, stop, v)}
        if v.size is None or stop > v.size:  # cached as read_many cut it
            keys.update(BlockCache.key(b.url, v.tag, b.start, b.stop or 0) for _, _, b, _ in self._blocks([(r, v)]))
        for key in keys:
            self._cache.discard(key)

    def read_fresh(self, r: ByteRange, version: Version = "") -> list[bytes] | StorageError:
        """``r`` again from storage, block by block, past the cache (whose blocks of ``r``
        are dropped): for bytes that arrived whole but failed a checksum."""
        self.count_refetch()
        try:
            return [self.read(b, version=v, fresh=True) for _, _, b, v in self._blocks([(r, version)])]
        except StorageError as exc:
            return exc

    # -- pipelined reads ---------------------------------------------------------------
    def read_many(self, ranges: Iterable[tuple[ByteRange, Version]], *,
                  reuse: bool = False) -> Iterator[list[Any] | StorageError]:
        """For each ``(range, version)`` in order, its bytes as a list of blocks — or the
        ``StorageError`` that ended it (so the caller decides; later ranges still come).

        ``reuse``: local files without a cache are read into reused buffers
        (:class:`~gpupipe.storage.buffers.BufferPool`), and the blocks are then uint8 numpy
        arrays rather than ``bytes``: for a consumer that only reads them through the buffer
        protocol, as the tar span reader does.

        Up to ``concurrency`` block requests run at once and at most about
        ``readahead_bytes`` are requested ahead of the consumer, so memory does
        not grow with the size of the dataset. A fetcher that maps local files gives each range
        as one view of its file, in this thread (a read that fails that way is read again as below).
        """
        if reuse and self._maps is not None:
            yield from self._read_mapped(ranges)
            return
        yield from self._read_pooled(ranges, reuse)

    @property
    def gathers(self) -> bool:
        """Whether :meth:`gather` reads here: local files without a cache."""
        return self._pool_buffers is not None

    def gather(self, urls: Sequence[str], starts: Sequence[int], stops: Sequence[int]) -> np.ndarray | None:
        """Bytes ``[starts[i], stops[i])`` of the local file at ``urls[i]``, for every ``i``, end to
        end in one reused buffer, read now in this thread: copied from the file mapped where this
        fetcher maps files, else one system call a range — a shuffled unit of work is hundreds of
        short ranges, and :meth:`read_many` costs a request, a block and a future each. ``None``
        when this fetcher does not read local files without a cache (:attr:`gathers`) or when any
        range cannot be read so (a file gone or shorter, a network file system): the caller reads
        them with :meth:`read_many`, which retries and names what fails. The buffer goes back to
        its pool once nothing holds a view of it."""
        if self._pool_buffers is None or not urls:
            return None
        sizes = [b - a for a, b in zip(starts, stops)]
        total = sum(sizes)
        if min(sizes) < 0:
            return None
        out = BufferPool.take_sized(total, 3, least=1 << 20)
        try:
            if self._maps is not None:
                files: dict[str, np.ndarray] = {}
                parts = []
                for url, a, b in zip(urls, starts, stops):
                    whole = files.get(url)
                    if whole is None or b > len(whole):
                        whole = files[url] = self._mapping(url, b)
                    parts.append(whole[a:b])
                np.concatenate(parts, out=out)
            else:
                distinct = dict.fromkeys(urls)  # each file's descriptor once (all of them held open at once)
                fd = {url: self._open(url) for url in distinct}.__getitem__ if len(distinct) <= _FILES_OPEN \
                    else self._open
                at, view = 0, out.data
                for url, a, n in zip(urls, starts, sizes):
                    if os.preadv(fd(url), (view[at:at + n],), a) != n:
                        return None
                    at += n
        except (OSError, ValueError, _NotMapped):
            return None
        with self._lock:
            self.stats.requests += len(sizes)
            self.stats.bytes += total
        return out

    def identity(self, url: str) -> tuple[int, int, int] | None:
        """The local file at ``url`` as it is now: (inode, size, modification time in ns), or
        ``None`` when it cannot be told (gone, not local) or when what this fetcher reads of it is
        another file: one mapped or opened before the path was given to a new file (a mapping or an
        open descriptor keeps reading the file it was made of)."""
        if self._pool_buffers is None:
            return None
        try:
            st = os.stat(self.fs._strip_protocol(url))
            held = self._maps.get(url) if self._maps is not None else None
            if held is not None and held[1] and held[1][0] != st.st_ino:
                return None
            fd = self._files.get(url)
            if fd is not None and os.fstat(fd).st_ino != st.st_ino:
                return None
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _open(self, url: str) -> int:
        """A descriptor of the local file at ``url``, kept open for the next short read of it (the
        last ``_FILES_OPEN`` files; a file replaced meanwhile is read as it was when opened)."""
        fd = self._files.pop(url, None)
        if fd is None:
            fd = os.open(self.fs._strip_protocol(url), os.O_RDONLY)
            while len(self._files) >= _FILES_OPEN:
                os.close(self._files.popitem(last=False)[1])
        self._files[url] = fd
        return fd

    def _read_mapped(self, ranges: Iterable[tuple[ByteRange, Version]]) -> Iterator[list[Any] | StorageError]:
        """:meth:`read_many` of mapped local files: a view per range, no thread, no future; a range
        that cannot be had so (past the end, a file gone) goes the pooled way, with its retries
        and its error."""
        rest = iter(ranges)
        for r, version in rest:
            if r.stop is not None:
                try:
                    yield [self._mapped(r.url, r.start, r.stop)]
                    continue
                except _NotMapped:  # a network file system: read as before, never mapped
                    self._maps = None
                    yield from self._read_pooled(itertools.chain([(r, version)], rest), True)
                    return
                except (OSError, ValueError, _ShortRead):
                    pass
            yield next(self._read_pooled(iter([(r, version)]), True))

    def _read_pooled(self, ranges: Iterable[tuple[ByteRange, Version]], reuse: bool
                     ) -> Iterator[list[Any] | StorageError]:
        cfg = self.config
        if self._pool is None:
            self._pool = ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="gpupipe-fetch")
        pool = self._pool
        counts: dict[int, int] = {}  # range index → its blocks, noted as they are cut

        def blocks() -> Iterator[tuple[int, int, ByteRange, ObjectVersion]]:
            for item in self._blocks(ranges):
                counts[item[0]] = item[1]
                yield item

        def submit(item: tuple[int, int, ByteRange, ObjectVersion]) -> Any:
            _, _, block, version = item
            short = reuse and self._pool_buffers is not None and (block.length or _INLINE_BYTES) < _INLINE_BYTES
            return self._inline(block) if short else pool.submit(self.read, block, version=version, reuse=reuse)

        done: dict[int, list[bytes | StorageError]] = {}
        next_out = 0
        for (index, _, _, _), data in read_ahead(blocks(), submit, lambda item: self._held(item[2], item[3]),
                                                 in_flight=4 * cfg.concurrency, readahead_bytes=cfg.readahead_bytes,
                                                 stats=self.stats):
            done.setdefault(index, []).append(data)
            while next_out in counts and len(done.get(next_out, ())) == counts[next_out]:
                parts = done.pop(next_out)
                error = next((p for p in parts if isinstance(p, StorageError)), None)
                yield error if error is not None else [p for p in parts if not isinstance(p, StorageError)]
                next_out += 1

    def _inline(self, r: ByteRange) -> _Done:
        """The bytes of ``r``, a short range of a local file, read now in this thread, as a done
        future: copying them from the page cache costs less than handing it to a thread and back,
        and a fresh buffer that small costs no page faults (the pool's are for long ranges).
        A shuffled unit of work reads many such ranges (a sample or two each)."""
        assert r.stop is not None, "a short range has its end"
        stop = r.stop
        try:
            return _Done(self._retrying(r.url, lambda: self._read_short(r.url, r.start, stop)))
        except Exception as exc:  # as a thread's future would hold it
            return _Done(None, exc)

    def _read_short(self, url: str, start: int, stop: int) -> np.ndarray:
        """Bytes ``[start, stop)`` of a local file (:meth:`_open`), into an uninitialised buffer (a ``bytearray`` is zeroed first: one more pass over the bytes).
        (A fetcher that maps files reads here only what the mapping could not give: read, not mapped.)"""
        out = np.empty(stop - start, dtype=np.uint8)
        got = os.preadv(self._open(url), [out.data], start)
        self.count_read(got)
        if got != stop - start:
            raise _ShortRead(f"got {got} of {stop - start} bytes for range [{start}, {stop})")
        return out

    def _mapped(self, url: str, start: int, stop: int) -> np.ndarray:
        """Bytes ``[start, stop)`` of a local file as a view of it mapped whole (:meth:`_mapping`).
        A view keeps its mapping alive; one dropped here is unmapped when its last view goes."""
        whole = self._mapping(url, stop)
        self.count_read(stop - start)
        return whole[start:stop]

    def _mapping(self, url: str, stop: int) -> np.ndarray:
        """The local file at ``url`` mapped whole, at least ``stop`` bytes of it (the last
        ``_FILES_MAPPED`` files; mapped again when ``stop`` is past the end, should it have grown)."""
        assert self._maps is not None, "a fetcher that maps files"
        whole, known = self._maps.pop(url, (None, ()))
        if whole is None or stop > len(whole):
            path = self.fs._strip_protocol(url)
            if not mappable(path):
                raise _NotMapped(path)
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                whole = np.frombuffer(mmap.mmap(f.fileno(), st.st_size, access=mmap.ACCESS_READ), dtype=np.uint8) \
                    if st.st_size else np.empty(0, dtype=np.uint8)
                known = (st.st_ino, st.st_size, st.st_mtime_ns)
            while len(self._maps) >= _FILES_MAPPED:
                self._maps.popitem(last=False)
        self._maps[url] = whole, known
        if stop > len(whole):
            raise _ShortRead(f"got {len(whole)} of the {stop} bytes asked for")
        return whole

    def forget_changed_files(self) -> int:
        """Unmap the mapped files changed on disk since they were mapped (another inode, size or
        mtime): a fetcher kept from one pass to the next calls it at each pass's start, so that a
        file rewritten meanwhile is read as it is now — and one that shrank is never touched past
        its new end (SIGBUS). The number unmapped."""
        if not self._maps:
            return 0
        changed = []
        for url, (_, known) in self._maps.items():
            try:
                st = os.stat(self.fs._strip_protocol(url))
                now: tuple = (st.st_ino, st.st_size, st.st_mtime_ns)
            except OSError:
                now = ()
            if now != known:
                changed.append(url)
        for url in changed:
            del self._maps[url]
        return len(changed)

    def _held(self, piece: ByteRange, v: ObjectVersion) -> int:
        """The bytes a read of ``piece`` holds in memory: its cache block, when it comes from
        one (a few bytes of a range may need a whole block), else itself."""
        length = piece.length or 0
        if self._cache is None or not v.tag or v.size is None or piece.stop is None or piece.stop > v.size:
            return length
        step = self.config.block_bytes
        k = piece.start // step
        return max(length, min((k + 1) * step, v.size) - k * step)

    def _blocks(self, ranges: Iterable[tuple[ByteRange, Version]]) -> Iterator[tuple[int, int, ByteRange, ObjectVersion]]:
        """Each range cut into requests of at most ``block_bytes``: on the cache's grid when
        the range is cached by it, else from the range's start. A range to the end of an
        object of unknown size costs one ``info()`` here (its size and identity)."""
        step = self.config.block_bytes
        for index, (r, version) in enumerate(ranges):
            v = as_version(version)
            if r.stop is None and v.size is None:
                v = self._whole(r.url, v)
            stop = v.size if r.stop is None else r.stop
            assert stop is not None, "known from the range or the version"
            if self._cache is not None and v.tag and v.size is not None and r.start < stop <= v.size:
                starts = [r.start] + list(range((r.start // step + 1) * step, stop, step))
            else:
                starts = list(range(r.start, stop, step)) or [r.start]
            for s, e in zip(starts, starts[1:] + [stop]):
                yield index, len(starts), ByteRange(r.url, s, max(s, e)), v
