"""One retry policy and one read-ahead window for every read path (issue 37): the thread pool's
reads and the event loop's object reads ask the same :meth:`Fetcher.retry_after` and go through
the same :func:`read_ahead`."""
from __future__ import annotations

import fsspec
import pytest

from gpupipe.core.errors import StorageError
from gpupipe.storage import objects
from gpupipe.storage.fetch import FetchConfig, Fetcher, FetchStats, read_ahead


def test_retry_after_backs_off_within_its_cap_and_raises_what_will_not_get_better():
    f = Fetcher(fsspec.filesystem("memory"), FetchConfig(retries=3, backoff_s=0.1, backoff_max_s=0.25))
    delays = [f.retry_after(ConnectionResetError("reset"), "memory://x", n) for n in range(3)]
    assert all(0 <= d <= cap for d, cap in zip(delays, (0.1, 0.2, 0.25)))
    assert f.stats.retries == 3 and f.stats.errors == {"ConnectionResetError": 3}
    with pytest.raises(StorageError, match="memory://x") as caught:
        f.retry_after(ConnectionResetError("reset"), "memory://x", 3)  # the last attempt
    assert isinstance(caught.value.__cause__, ConnectionResetError)
    with pytest.raises(StorageError):
        f.retry_after(PermissionError("403 Forbidden"), "memory://y", 0)  # at once: waiting will not help


class _Future:
    def __init__(self, log: list, item):
        self.log, self.item, self.cancelled = log, item, False

    def result(self):
        self.log.append(("result", self.item))
        if self.item == "bad":
            raise StorageError("bad range")
        return self.item * 2

    def cancel(self):
        self.cancelled = True
        return True


def test_read_ahead_keeps_its_window_returns_errors_in_place_and_cancels_what_is_left():
    log: list = []
    made: list[_Future] = []

    def submit(item):
        log.append(("submit", item))
        made.append(_Future(log, item))
        return made[-1]

    stats = FetchStats()
    got = read_ahead(iter([1, 2, "bad", 4, 5, 6]), submit, lambda item: 10, in_flight=2, readahead_bytes=100,
                     stats=stats)
    assert next(got) == (1, 2)
    assert log[:3] == [("submit", 1), ("submit", 2), ("result", 1)]  # two in flight, no more
    item, error = next(got), next(got)
    assert item == (2, 4) and error[0] == "bad" and isinstance(error[1], StorageError)
    got.close()  # the consumer stops: what was submitted and not taken is cancelled
    assert [f.item for f in made if f.cancelled] == [4]  # (5 and 6 never asked for)


def test_the_object_reads_of_the_event_loop_use_the_fetchers_retry_policy(monkeypatch):
    """objects._get retries by asking Fetcher.retry_after, as the threads' reads do."""
    asked = []

    class Flaky:
        async def _cat_file(self, path, start, end):
            if len(asked) < 2:
                raise ConnectionResetError("reset")
            return b"x" * (end - start)

        def _strip_protocol(self, url):
            return url

    f = Fetcher(fsspec.filesystem("memory"), FetchConfig(backoff_s=0.001))
    f.fs = Flaky()
    real = f.retry_after
    monkeypatch.setattr(f, "retry_after", lambda exc, url, n: asked.append(n) or real(exc, url, n))
    import asyncio

    assert asyncio.run(objects._get(f, "s3://b/k", 0, 5)) == b"xxxxx"
    assert asked == [0, 1] and f.stats.requests == 1 and f.stats.bytes == 5
