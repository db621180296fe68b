"""Byte-range reads from any fsspec filesystem: concurrent, bounded, retried.

A :class:`Fetcher` is built inside the process that uses it (a DataLoader
worker) from plain data — a URL, ``storage_options`` and a
:class:`FetchConfig` — never pickled with an open filesystem.

Every read is a byte range (``cat_file(path, start, end)``): with the
manifest's offsets that is one GET per block, and no HEAD before it. Transient
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
"""
from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gpupipe.core.errors import ConfigError, MissingDependencyError, StorageError
from gpupipe.core.types import ByteRange
from gpupipe.storage.cache import BlockCache
from gpupipe.storage.faults import CONNECT_TIMEOUT_S, Fault, classify, storage_error

__all__ = ["FetchConfig", "FetchStats", "Fetcher", "open_filesystem", "is_transient", "refuse_commands",
           "storage_errors"]

log = logging.getLogger(__name__)
MiB = 1 << 20
_REFUSED_PROTOCOLS = ("pipe",)  # webdataset-style shell commands are never run
_S3_PROTOCOLS = ("s3", "s3a")
_CONNECT_TIMEOUT_TRIES = 3  # attempts for a connect timeout before the endpoint has ever answered


@dataclass(frozen=True)
class FetchConfig:
    """How bytes are fetched. Plain data: safe to pickle into workers."""

    concurrency: int = 8  # requests in flight per worker
    object_concurrency: int = 32  # the same, for an image folder (one small request per image)
    readahead_bytes: int = 64 * MiB  # bytes requested but not yet consumed, per worker
    block_bytes: int = 8 * MiB  # largest single request
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
    requests: int = 0
    retries: int = 0
    refetches: int = 0  # byte ranges read again because their bytes failed a checksum
    bytes: int = 0
    cache_hits: int = 0
    wait_s: float = 0.0  # time the consumer waited for bytes
    errors: dict[str, int] = field(default_factory=dict)


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


class _ShortRead(OSError):
    """The server sent fewer bytes than the range asked for."""


class Fetcher:
    """Ranged reads of one filesystem with retries, concurrency and an optional cache."""

    def __init__(self, fs, config: FetchConfig = FetchConfig()):
        self.fs = fs
        self.config = config
        self.stats = FetchStats()
        self._cache = BlockCache(config.cache_dir, config.cache_bytes) if config.cache_dir else None
        self._jitter = random.Random()  # timing only; never touches data order
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self.answered = False  # has a request succeeded (so the endpoint is right)?

    @classmethod
    def for_url(cls, url: str, storage_options: Mapping[str, Any] | None, config: FetchConfig = FetchConfig()) -> Fetcher:
        fs, _ = open_filesystem(url, storage_options)
        return cls(fs, config)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # -- single requests ---------------------------------------------------------------
    def size(self, url: str) -> int:
        return int(self._retrying(url, lambda: self.fs.size(self.fs._strip_protocol(url))))

    def call(self, url: str, method: str, *args):
        """``fs.<method>(path_of(url), *args)`` with the same retries as reads
        (for listings and metadata: ``glob``, ``isdir``, ``exists``)."""
        return self._retrying(url, lambda: getattr(self.fs, method)(self.fs._strip_protocol(url), *args))

    def read(self, r: ByteRange, *, version: str = "", fresh: bool = False) -> bytes:
        """The bytes of ``r`` (``stop=None``: to the end), retried; never short.
        ``fresh``: from storage even when cached (and the cache entry replaced)."""
        stop = self.size(r.url) if r.stop is None else r.stop
        if stop <= r.start:
            return b""
        key = BlockCache.key(r.url, r.start, stop, version) if self._cache else ""
        if self._cache and not fresh and (hit := self._cache.get(key)) is not None and len(hit) == stop - r.start:
            with self._lock:
                self.stats.cache_hits += 1
            return hit
        data = self._retrying(r.url, lambda: self._read_once(r.url, r.start, stop))
        if self._cache:
            self._cache.put(key, data)
        return data

    def _read_once(self, url: str, start: int, stop: int) -> bytes:
        refuse_commands([url])  # a list of URLs is opened with the first one's filesystem
        path = self.fs._strip_protocol(url)
        if getattr(self.fs, "async_impl", False) and getattr(self.fs, "loop", None) is not None:
            from fsspec.asyn import sync

            data = sync(self.fs.loop, self.fs._cat_file, path, start=start, end=stop, timeout=self.config.request_timeout_s)
        else:
            data = self.fs.cat_file(path, start=start, end=stop)
        with self._lock:
            self.stats.requests += 1
            self.stats.bytes += len(data)
        if len(data) != stop - start:
            raise _ShortRead(f"got {len(data)} of {stop - start} bytes for range [{start}, {stop})")
        return bytes(data)

    def _retrying(self, url: str, attempt):
        cfg = self.config
        for n in range(cfg.retries + 1):
            try:
                result = attempt()
                self.answered = True
                return result
            except Exception as exc:  # classified in give_up; a bug is not retried
                error = self.give_up(exc, url, attempts=n + 1)
                if error is not None:
                    raise error from exc
                delay = self._jitter.uniform(0, min(cfg.backoff_max_s, cfg.backoff_s * 2**n))
                log.debug("retrying %s in %.2fs after %s", url, delay, type(exc).__name__)
                time.sleep(delay)

    def give_up(self, exc: BaseException, url: str, *, attempts: int) -> StorageError | None:
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

    def forget(self, r: ByteRange, version: str = "") -> None:
        """Drop the cached blocks of ``r`` (as :meth:`read_many` cut it): their bytes were bad."""
        if self._cache is None:
            return
        for _, _, b, v in self._blocks([(r, version)]):
            if b.stop is not None:  # always: _blocks gives each block its stop
                self._cache.discard(BlockCache.key(b.url, b.start, b.stop, v))

    def read_fresh(self, r: ByteRange, version: str = "") -> list[bytes] | StorageError:
        """``r`` again, block by block as :meth:`read_many` cut it, bypassing (and
        overwriting) the cache: for bytes that arrived whole but failed a checksum."""
        with self._lock:
            self.stats.refetches += 1
        try:
            return [self.read(b, version=v, fresh=True) for _, _, b, v in self._blocks([(r, version)])]
        except StorageError as exc:
            return exc

    # -- pipelined reads ---------------------------------------------------------------
    def read_many(self, ranges: Iterable[tuple[ByteRange, str]]) -> Iterator[list[bytes] | StorageError]:
        """For each ``(range, version)`` in order, its bytes as a list of blocks — or the
        ``StorageError`` that ended it (so the caller decides; later ranges still come).

        Up to ``concurrency`` block requests run at once and at most about
        ``readahead_bytes`` are requested ahead of the consumer, so memory does
        not grow with the size of the dataset.
        """
        cfg = self.config
        if self._pool is None:
            self._pool = ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="gpupipe-fetch")
        pending: deque[tuple[int, int, Future]] = deque()  # (range index, block bytes, future)
        blocks = self._blocks(ranges)
        done: dict[int, list[bytes | StorageError]] = {}
        counts: dict[int, int] = {}
        next_out, in_flight = 0, 0
        exhausted = False
        while True:
            while not exhausted and (not pending or in_flight < cfg.readahead_bytes) and len(pending) < 4 * cfg.concurrency:
                item = next(blocks, None)
                if item is None:
                    exhausted = True
                    break
                index, total, block, version = item
                counts[index] = total
                pending.append((index, block.length or 0, self._pool.submit(self.read, block, version=version)))
                in_flight += block.length or 0
            if not pending:
                return
            index, nbytes, fut = pending.popleft()
            t0 = time.perf_counter()
            try:
                data: bytes | StorageError = fut.result()
            except StorageError as exc:
                data = exc
            self.stats.wait_s += time.perf_counter() - t0
            in_flight -= nbytes
            done.setdefault(index, []).append(data)
            while next_out in counts and len(done.get(next_out, ())) == counts[next_out]:
                parts = done.pop(next_out)
                error = next((p for p in parts if isinstance(p, StorageError)), None)
                yield error if error is not None else [p for p in parts if isinstance(p, bytes)]
                next_out += 1

    def _blocks(self, ranges: Iterable[tuple[ByteRange, str]]) -> Iterator[tuple[int, int, ByteRange, str]]:
        step = self.config.block_bytes
        for index, (r, version) in enumerate(ranges):
            stop = self.size(r.url) if r.stop is None else r.stop
            starts = list(range(r.start, stop, step)) or [r.start]
            for s in starts:
                yield index, len(starts), ByteRange(r.url, s, min(s + step, stop)), version
