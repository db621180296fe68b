"""Many small objects at once: an image folder costs one GET per image.

At 20 ms a request one object at a time gives 50 images/s, so
:func:`fetch_objects` keeps up to ``in_flight`` requests running on fsspec's own
event loop (the ``_cat_file`` coroutines of an async filesystem such as s3fs,
gcsfs or http), each retried on its own with the fetcher's rules — the same
fault classes, messages and backoff (:meth:`~gpupipe.storage.fetch.Fetcher.retry_after`: capped
exponential backoff with full jitter), ``request_timeout_s`` per attempt, and the
same :class:`~gpupipe.storage.fetch.FetchStats` counters as
:class:`~gpupipe.storage.fetch.Fetcher`. Results come back in request order; at most
``in_flight`` requests and about ``readahead_bytes`` are outstanding, so memory
does not grow with the dataset.

fsspec's bulk ``_cat_ranges`` would gather a whole list at once: memory grows with
the list, one slow object holds back the whole batch, and a failed object cannot be
retried alone. A window of single coroutines has none of that and still runs on the
filesystem's event loop without a thread per request.

Filesystems without async support (local disk, ``memory://``) and fetchers with a
block cache go through :meth:`Fetcher.read_many` (a thread pool) instead.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator

from gpupipe.core.errors import StorageError
from gpupipe.core.types import ByteRange
from gpupipe.storage.fetch import Fetcher, Version, read_ahead

__all__ = ["fetch_objects", "read_object_fresh", "read_whole", "with_protocol"]

log = logging.getLogger(__name__)


class _ShortBody(OSError):
    """The server sent fewer bytes than asked (retried, as by the Fetcher)."""


def _is_async(fetcher: Fetcher) -> bool:
    fs = fetcher.fs
    return bool(getattr(fs, "async_impl", False)) and getattr(fs, "loop", None) is not None \
        and not fetcher.config.cache_dir


def fetch_objects(fetcher: Fetcher, ranges: Iterable[tuple[ByteRange, Version]], *, in_flight: int | None = None
                  ) -> Iterator[bytes | StorageError]:
    """For each ``(range, version)`` in order: its bytes, or the ``StorageError`` that
    ended it (later ranges still come). Every range needs a ``stop``."""
    if not _is_async(fetcher):
        for got in fetcher.read_many(ranges):
            yield got if isinstance(got, StorageError) else b"".join(got)
        return
    yield from _window(fetcher, ranges, max(1, in_flight or fetcher.config.concurrency))


def read_object_fresh(fetcher: Fetcher, r: ByteRange, version: Version = "") -> bytes | StorageError:
    """``r`` once more from storage (bytes that failed their checksum), retried as usual
    and counted in ``stats.refetches``."""
    if not _is_async(fetcher):
        got = fetcher.read_fresh(r, version)  # counts it
        return got if isinstance(got, StorageError) else b"".join(got)
    fetcher.count_refetch()
    return next(_window(fetcher, [(r, version)], 1))


def _window(fetcher: Fetcher, ranges: Iterable[tuple[ByteRange, Version]], in_flight: int
            ) -> Iterator[bytes | StorageError]:
    """Each range's bytes (or its error), in order, fetched by coroutines on the filesystem's loop
    through the fetcher's read-ahead window (:func:`~gpupipe.storage.fetch.read_ahead`)."""
    loop = fetcher.fs.loop

    def size(item: tuple[ByteRange, Version]) -> int:
        r = item[0]
        if r.stop is None:
            raise ValueError(f"fetch_objects needs the size of {r.url}")
        return r.stop - r.start

    def submit(item: tuple[ByteRange, Version]):
        r = item[0]
        return asyncio.run_coroutine_threadsafe(_get(fetcher, r.url, r.start, r.stop or 0), loop)

    for _, data in read_ahead(iter(ranges), submit, size, in_flight=in_flight,
                              readahead_bytes=fetcher.config.readahead_bytes, stats=fetcher.stats):
        yield data


async def _get(fetcher: Fetcher, url: str, start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` of ``url`` in one ranged GET, retried by the fetcher's rules
    (:meth:`Fetcher.retry_after` decides, counts and says how long to wait; the wait is on this
    loop, not a thread)."""
    fs, cfg = fetcher.fs, fetcher.config
    path = fs._strip_protocol(url)
    for n in range(cfg.retries + 1):
        try:
            data = await asyncio.wait_for(fs._cat_file(path, start=start, end=stop), cfg.request_timeout_s)
            fetcher.count_read(len(data))
            if len(data) != stop - start:
                raise _ShortBody(f"got {len(data)} of {stop - start} bytes for range [{start}, {stop})")
            fetcher.answered = True
            return bytes(data)
        except Exception as exc:  # classified by retry_after, exactly as for every other read
            await asyncio.sleep(fetcher.retry_after(exc, url, n))
    raise AssertionError("unreachable: retry_after raises after the last attempt")


def read_whole(fetcher: Fetcher, url: str) -> tuple[bytes, str] | None:
    """The bytes at ``url`` and their identity (the version tag from the one ``info()`` a
    whole read needs for the size; the cache answers only for that tag); ``None`` when there
    is no such object (other storage errors raise)."""
    try:
        version = fetcher.stat(url)
        return fetcher.read(ByteRange(url), version=version), version.tag
    except StorageError as exc:
        if isinstance(exc.__cause__, FileNotFoundError) and "bucket" not in str(exc.__cause__).lower():
            return None
        raise


def with_protocol(protocol: str, path: str) -> str:
    """``path`` as a URL of ``protocol`` (``"s3://"``; ``""``: local), as fsspec's listings drop it."""
    if not protocol or path.startswith(protocol):
        return path
    return protocol + path
