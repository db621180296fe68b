"""Reused read buffers (:mod:`gpupipe.storage.buffers`): a buffer is handed out again only when
nothing can see it any more, so bytes already handed out are never overwritten."""
from __future__ import annotations

import numpy as np
import pytest

from gpupipe.storage.buffers import BufferPool, read_into


def test_a_buffer_is_reused_only_once_every_view_of_it_is_gone():
    pool = BufferPool(1024, keep=2)
    a = pool.take(100)
    view = np.frombuffer(a[10:20], dtype=np.uint8)  # a view of a view still holds the buffer
    del a
    b = pool.take(100)
    assert not np.shares_memory(b, view)
    mv = memoryview(b)
    del b
    c = pool.take(50)
    assert not np.shares_memory(c, view) and not np.shares_memory(c, np.frombuffer(mv, dtype=np.uint8))
    kept = view.base
    del view, mv, c
    d = pool.take(10)  # every view gone: one of the two buffers again
    assert d.base is not None and len(pool._buffers) == 2
    del kept


def test_beyond_the_pool_and_larger_requests_get_their_own_buffer():
    pool = BufferPool(64, keep=1)
    held = [pool.take(64), pool.take(64), pool.take(65)]
    assert len(pool._buffers) == 1 and all(len(x) == n for x, n in zip(held, (64, 64, 65)))


def test_read_into_reads_the_range(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(bytes(range(256)) * 10)
    pool = BufferPool(1024, keep=1)
    assert bytes(read_into(str(path), 5, 300, pool)) == (bytes(range(256)) * 10)[5:300]
    assert len(read_into(str(path), 2550, 2600, pool)) == 10  # short at the end of the file


def test_batches_packed_in_process_never_share_a_buffer_with_a_batch_still_held():
    from gpupipe.stream.batch import SampleTable, pack_table

    image = np.arange(3 << 20, dtype=np.uint64).view(np.uint8)  # 24 MB: the pooled path
    table = SampleTable(buffers=(image,), buffer=np.zeros(2, np.int64), start=np.array([0, 8]),
                        size=np.array([len(image) // 2, len(image) // 2]), labels=np.zeros(2, np.int64),
                        sample_ids=np.arange(2), keys=["a", "b"], valid=np.ones(2, bool))
    held = [pack_table(table) for _ in range(3)]
    for i, a in enumerate(held):
        assert bytes(a.image(1)[:16]) == image[8:24].tobytes()
        assert all(not np.shares_memory(a.data.numpy(), b.data.numpy()) for b in held[i + 1:])
    first = held[0].data.data_ptr()
    del held
    again = [pack_table(table).data.data_ptr() for _ in range(2)]
    assert first in again  # once nothing holds it, a buffer comes back


def test_short_local_ranges_are_read_in_place_from_files_kept_open(tmp_path, monkeypatch):
    """read_many(reuse=True) reads a short range of a local file in the calling thread, from a file
    it keeps open (at most _FILES_OPEN, closed with the fetcher); long ranges still go to the pool."""
    import fsspec

    from gpupipe.core.types import ByteRange
    from gpupipe.storage import fetch
    from gpupipe.storage.fetch import Fetcher

    monkeypatch.setattr(fetch, "_FILES_OPEN", 2)
    data = {i: bytes(range(256)) * (40 + i) for i in range(3)}
    for i, d in data.items():
        (tmp_path / f"f{i}").write_bytes(d)
    f = Fetcher(fsspec.filesystem("file"))
    ranges = [(ByteRange(str(tmp_path / f"f{i % 3}"), 7 * i, 7 * i + 300 + i), "") for i in range(9)]
    got = [b"".join(bytes(b) for b in blocks) for blocks in f.read_many(ranges, reuse=True)]
    assert got == [data[i % 3][7 * i:7 * i + 300 + i] for i in range(9)]
    assert f._pool is not None and f._pool._threads == set()  # no read went to a thread
    assert len(f._files) == 2
    f.close()
    assert not f._files
    (tmp_path / "f0").write_bytes(b"x" * fetch._INLINE_BYTES)
    f = Fetcher(fsspec.filesystem("file"))
    blocks = next(f.read_many([(ByteRange(str(tmp_path / "f0"), 0, fetch._INLINE_BYTES), "")], reuse=True))
    assert b"".join(bytes(b) for b in blocks) == b"x" * fetch._INLINE_BYTES
    assert f._pool is not None and f._pool._threads and not f._files  # read by a thread of the pool
    f.close()


def test_a_fetcher_that_maps_files_gives_views_of_them_and_sees_a_file_rewritten(tmp_path, monkeypatch):
    """map_files (a stream worker): each range a view of its file mapped in memory (at most
    _FILES_MAPPED kept), no read a system call; past a file's end or for a missing file, the error
    every read gives; a file changed on disk is mapped again once forget_changed_files is asked."""
    import fsspec

    from gpupipe.core.errors import StorageError
    from gpupipe.core.types import ByteRange
    from gpupipe.storage import fetch
    from gpupipe.storage.fetch import FetchConfig, Fetcher

    monkeypatch.setattr(fetch, "_FILES_MAPPED", 2)
    data = {i: bytes(range(256)) * (40 + i) for i in range(3)}
    for i, d in data.items():
        (tmp_path / f"f{i}").write_bytes(d)
    f = Fetcher(fsspec.filesystem("file"), FetchConfig(retries=1, backoff_s=0.001), map_files=True)
    ranges = [(ByteRange(str(tmp_path / f"f{i % 3}"), 7 * i, 7 * i + 300 + i), "") for i in range(9)]
    got = list(f.read_many(ranges, reuse=True))
    assert [bytes(b[0]) for b in got] == [data[i % 3][7 * i:7 * i + 300 + i] for i in range(9)]
    assert all(len(b) == 1 and b[0].base is not None for b in got)  # views, not copies
    assert f._pool is None and len(f._maps) == 2  # no thread, no pool: views
    assert f.stats.bytes == sum(300 + i for i in range(9))
    del got
    past, missing = f.read_many([(ByteRange(str(tmp_path / "f1"), 0, len(data[1]) + 1), ""),
                                 (ByteRange(str(tmp_path / "nope"), 0, 10), "")], reuse=True)
    assert isinstance(past, StorageError) and "f1" in str(past)
    assert isinstance(missing, StorageError) and "nope" in str(missing)
    one = [(ByteRange(str(tmp_path / "f2"), 0, 100), "")]
    old = bytes(next(f.read_many(one, reuse=True))[0])
    (tmp_path / "f2").write_bytes(b"y" * 50 + b"z" * 50)  # rewritten in place (the same inode)
    assert f.forget_changed_files() == 1
    assert bytes(next(f.read_many(one, reuse=True))[0]) == b"y" * 50 + b"z" * 50 != old
    f.close()
    assert not f._maps
    cached = Fetcher(fsspec.filesystem("file"), FetchConfig(cache_dir=str(tmp_path / "cache")), map_files=True)
    assert cached._maps is None  # reads through a cache are the cache's


def test_files_on_a_network_file_system_are_read_not_mapped(tmp_path, monkeypatch):
    """A mapped page that a network file system fails to read in is SIGBUS (the worker dies) where a
    read call returns an error to retry: only local disks and memory are mapped."""
    import fsspec

    from gpupipe.core.types import ByteRange
    from gpupipe.storage import fetch
    from gpupipe.storage.fetch import Fetcher, mappable

    assert not mappable("/proc/self/status")  # procfs: not a local disk
    (tmp_path / "f").write_bytes(bytes(range(256)) * 8)
    monkeypatch.setattr(fetch, "mappable", lambda path: False)  # as on an NFS mount
    f = Fetcher(fsspec.filesystem("file"), map_files=True)
    got = [bytes(b[0]) for b in f.read_many([(ByteRange(str(tmp_path / "f"), a, a + 100), "") for a in (0, 700)],
                                           reuse=True)]
    assert got == [(bytes(range(256)) * 8)[a:a + 100] for a in (0, 700)]
    assert f._maps is None  # read as before, and never mapped after
    f.close()


@pytest.mark.parametrize("mapped", [False, True])
def test_a_gather_reads_ranges_end_to_end_or_leaves_them_to_read_many(tmp_path, mapped):
    """gather (a unit of work's spans of local files in one read): the ranges' bytes end to end in
    one buffer, the same from mapped files as read; a buffer held is never handed out again; a
    missing file, a range past a file's end or a fetcher with a cache gives None (the spans are
    then read by read_many, which names what fails)."""
    import fsspec

    from gpupipe.storage.fetch import FetchConfig, Fetcher

    data = {i: bytes(np.random.default_rng(i).integers(0, 256, 5000 + i, dtype=np.uint8)) for i in range(3)}
    for i, d in data.items():
        (tmp_path / f"f{i}").write_bytes(d)
    f = Fetcher(fsspec.filesystem("file"), FetchConfig(retries=1, backoff_s=0.001), map_files=mapped)
    assert f.gathers
    urls = [str(tmp_path / f"f{i % 3}") for i in range(12)]
    starts = [(311 * i) % 4000 for i in range(12)]
    stops = [a + 1 + 37 * i for i, a in enumerate(starts)]
    first = f.gather(urls, starts, stops)
    assert first is not None
    want = b"".join(data[i % 3][a:b] for i, (a, b) in enumerate(zip(starts, stops)))
    assert bytes(first) == want
    assert (f.stats.requests, f.stats.bytes) == (12, len(want))
    again = f.gather(urls[::-1], starts[::-1], stops[::-1])  # `first` is held: another buffer
    assert again is not None and not np.shares_memory(first, again) and bytes(first) == want
    assert f.gather([urls[0], str(tmp_path / "nope")], [0, 0], [10, 10]) is None
    assert f.gather([urls[1]], [4990], [5002]) is None  # f1 has 5001 bytes
    assert f.gather([], [], []) is None
    f.close()
    cached = Fetcher(fsspec.filesystem("file"), FetchConfig(cache_dir=str(tmp_path / "cache")), map_files=mapped)
    assert not cached.gathers and cached.gather(urls, starts, stops) is None


@pytest.mark.parametrize("mapped", [False, True])
def test_a_file_replaced_while_held_has_no_identity_until_let_go(tmp_path, mapped):
    """identity() says what a gather reads: a file mapped or opened before its path was given to a
    new file is still read as the old one, so the path's identity is not its (None, and the scan
    memo neither trusts nor records it); written in place, the new modification time tells."""
    import os

    import fsspec

    from gpupipe.storage.fetch import Fetcher

    path = tmp_path / "f"
    path.write_bytes(b"a" * 4000)
    f = Fetcher(fsspec.filesystem("file"), map_files=mapped)
    url = str(path)
    first = f.identity(url)
    assert first is not None and bytes(f.gather([url], [0], [10])) == b"a" * 10
    assert f.identity(url) == first
    (tmp_path / "new").write_bytes(b"b" * 4000)
    os.replace(tmp_path / "new", path)
    assert f.identity(url) is None  # still reading the old file
    assert bytes(f.gather([url], [0], [10])) == b"a" * 10
    f.close()
    fresh = Fetcher(fsspec.filesystem("file"), map_files=mapped)
    now = fresh.identity(url)
    assert now is not None and now != first and bytes(fresh.gather([url], [0], [10])) == b"b" * 10
    with open(path, "r+b") as out:  # in place: the same inode, a new modification time
        out.write(b"c" * 10)
    assert fresh.identity(url) not in (None, now)
    fresh.close()
