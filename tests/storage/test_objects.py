"""The many-objects fetcher (issue 15): bounded, ordered, retried one object at a time,
on an async filesystem's own event loop."""
from __future__ import annotations

import asyncio

import pytest
from fsspec.asyn import AsyncFileSystem

from gpupipe.core.errors import StorageError
from gpupipe.core.types import ByteRange
from gpupipe.storage.fetch import FetchConfig, Fetcher
from gpupipe.storage.objects import fetch_objects


class SlowObjects(AsyncFileSystem):
    """Objects ``o<i>`` of ``i + 1`` bytes, each GET taking a few ms; counts what runs at once.
    ``fail``: {path: [exceptions to raise, in turn]}."""

    protocol = "slowobj"
    cachable = False  # a fresh instance (and fresh counters) for every test

    def __init__(self, fail=None, **kw):
        super().__init__(asynchronous=False, **kw)
        self.running = self.most = self.calls = 0
        self.fail = {k: list(v) for k, v in (fail or {}).items()}

    async def _cat_file(self, path, start=None, end=None, **kw):
        self.calls += 1
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0.005)
            if self.fail.get(path):
                raise self.fail[path].pop(0)
            return bytes([int(path[1:]) % 256]) * (int(path[1:]) + 1)
        finally:
            self.running -= 1


def ranges(n):
    return [(ByteRange(f"o{i}", 0, i + 1), "") for i in range(n)]


def test_results_in_order_with_at_most_in_flight_running():
    fs = SlowObjects()
    got = list(fetch_objects(Fetcher(fs, FetchConfig(concurrency=4)), ranges(40), in_flight=6))
    assert got == [bytes([i]) * (i + 1) for i in range(40)]
    assert 2 <= fs.most <= 6  # concurrent, and bounded


def test_readahead_bytes_bound_what_is_asked_ahead():
    fs = SlowObjects()
    fetcher = Fetcher(fs, FetchConfig(readahead_bytes=50))
    it = fetch_objects(fetcher, ranges(60), in_flight=32)
    next(it)
    assert fs.calls <= 12  # 1 + 2 + ... : about 50 bytes asked ahead, not 32 objects
    it.close()


def test_transient_errors_retried_and_a_missing_object_reported_in_place():
    fs = SlowObjects(fail={"o3": [ConnectionResetError("reset"), TimeoutError()], "o5": [FileNotFoundError("o5")]})
    fetcher = Fetcher(fs, FetchConfig(backoff_s=0.001, retries=3))
    got = list(fetch_objects(fetcher, ranges(8), in_flight=4))
    assert got[3] == bytes([3]) * 4 and fetcher.stats.retries == 2
    assert isinstance(got[5], StorageError) and "o5" in str(got[5])
    assert got[6] == bytes([6]) * 7  # later objects still come


def test_gives_up_after_the_retries_with_the_url():
    fs = SlowObjects(fail={"o1": [ConnectionResetError("reset")] * 5})
    got = list(fetch_objects(Fetcher(fs, FetchConfig(backoff_s=0.001, retries=2)), ranges(3)))
    assert isinstance(got[1], StorageError) and "gave up after 3 attempts" in str(got[1])


def test_a_short_body_is_retried():
    class Short(SlowObjects):
        async def _cat_file(self, path, start=None, end=None, **kw):
            data = await super()._cat_file(path, start, end)
            return data[:-1] if self.calls == 1 else data

    got = list(fetch_objects(Fetcher(Short(), FetchConfig(backoff_s=0.001)), ranges(1)))
    assert got == [b"\x00"]


def test_stopping_early_cancels_what_runs():
    fs = SlowObjects()
    it = fetch_objects(Fetcher(fs), ranges(100), in_flight=8)
    next(it)
    it.close()
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0.05), fs.loop).result()
    assert fs.running == 0 and fs.calls < 30


def test_a_range_without_a_size_is_refused():
    with pytest.raises(ValueError, match="needs the size of o1"):
        list(fetch_objects(Fetcher(SlowObjects()), [(ByteRange("o1"), "")]))


@pytest.mark.parametrize("is_async", [True, False])
def test_a_fresh_read_counts_once(is_async):
    import fsspec

    from gpupipe.storage.objects import read_object_fresh

    if is_async:
        fetcher, r = Fetcher(SlowObjects()), ByteRange("o2", 0, 3)
    else:
        fs = fsspec.filesystem("memory")
        fs.pipe_file("/objects-fresh/o2", b"\x02" * 3)
        fetcher, r = Fetcher(fs), ByteRange("memory://objects-fresh/o2", 0, 3)
    assert read_object_fresh(fetcher, r) == b"\x02" * 3 and fetcher.stats.refetches == 1
