"""The block cache cannot serve stale bytes (issue 25).

Every entry is keyed by what the object *is* — its checksum in the manifest, or the identity
the storage gives (ETag / LastModified on S3, mtime + size + inode on a local disk) — so a
manifest, a labels file or a shard rewritten under the same URL is never answered from the
cache; shard bytes are cached in blocks of a fixed grid, so a second epoch (whose spans start
elsewhere) finds them; and the folder stays within ``cache_bytes`` with several processes
writing. Run against local files and the loopback moto S3 server (requests counted by a
proxy in front of it).
"""
from __future__ import annotations

import email.utils
import multiprocessing
import os
import threading
import time
from datetime import datetime, timezone

import fsspec
import pytest
from datagen import payload, write_dataset
from inplace_data import CLASSES, label_of, write_flat_folder, write_parquet
from s3util import storage_options_via

from gpupipe.core.types import ByteRange
from gpupipe.loader.encoded import EncodedLoader, StreamConfig
from gpupipe.prepare.indexer import index, index_in_place
from gpupipe.storage.cache import BlockCache
from gpupipe.storage.fetch import FetchConfig, Fetcher, ObjectVersion
from gpupipe.storage.identity import identity_of

COUNTS = [37, 23, 41, 19]
N = sum(COUNTS)


def loader(url, opts, fetch, *, shuffle=False, workers=0, seed=0):
    return EncodedLoader(url, batch_size=8, num_workers=workers, storage_options=opts, rank=0, world_size=1,
                         drop_last=False, seed=seed, stream=StreamConfig(shuffle=shuffle, shuffle_buffer=32, fetch=fetch))


def delivered(ld) -> dict[str, tuple[bytes, int]]:
    """One epoch: each valid sample's key → (image bytes, label)."""
    out = {}
    for b in ld:
        for i in range(len(b)):
            if bool(b.valid[i]):
                assert b.keys[i] not in out, f"{b.keys[i]} delivered twice"
                out[b.keys[i]] = (bytes(b.image(i)), int(b.labels[i]))
    return out


def other(sid: int) -> bytes:
    """Other image bytes of the same length as ``payload(sid)``."""
    p = payload(sid)
    return p[:3] + bytes(b ^ 0xA5 for b in p[3:])


@pytest.fixture(params=["local", "s3"])
def place(request, tmp_path):
    """``(url, storage_options, backdate)``: a local folder whose files a test may date back
    (``backdate(seconds_ago)``: as if written long ago), or a prefix on the moto server."""
    if request.param == "local":
        root = tmp_path / "data"

        def backdate(ago: float) -> None:
            t = time.time() - ago
            for dirpath, _, files in os.walk(root):
                for f in files:
                    os.utime(os.path.join(dirpath, f), (t, t))
        return str(root), None, backdate
    bucket = request.getfixturevalue("s3_bucket")
    return bucket.url("data"), bucket.storage_options, lambda ago: None


def rewrite(url: str, opts, name: str, data: bytes) -> None:
    fs, root = fsspec.core.url_to_fs(url, **(opts or {}))
    fs.pipe_file(f"{root.rstrip('/')}/{name}", data)


# -- identity -------------------------------------------------------------------------------
def test_identity_of_what_each_filesystem_gives():
    old, now = time.time() - 100, time.time()
    s3 = {"ETag": '"5d41"', "LastModified": datetime.fromtimestamp(old, timezone.utc), "size": 5, "VersionId": None}
    assert identity_of(s3) and identity_of(s3) == identity_of(dict(s3))
    assert identity_of({**s3, "ETag": '"5d42"'}) != identity_of(s3)  # other bytes
    assert identity_of({**s3, "LastModified": datetime.fromtimestamp(old + 1, timezone.utc)}) != identity_of(s3)
    assert identity_of({**s3, "VersionId": "v2"}) != identity_of(s3)
    local = {"mtime": old, "size": 5, "ino": 7, "created": now, "type": "file"}
    assert identity_of(local) and identity_of({**local, "ino": 8}) != identity_of(local)
    assert identity_of({**local, "mtime": old + 0.001}) != identity_of(local)
    assert identity_of({**local, "size": 6}) != identity_of(local)
    memory = {"created": datetime.fromtimestamp(old, timezone.utc), "size": 5}
    assert identity_of(memory) and identity_of({**memory, "created": old}) == identity_of(memory)
    http = {"size": 5, "Last-Modified": email.utils.formatdate(old, usegmt=True)}
    assert identity_of(http) and identity_of({**http, "ETag": "W/\"x\""}) != identity_of(http)
    gcs = {"generation": "1700000000000001", "updated": "2020-01-01T00:00:00.000Z", "size": 5}
    assert identity_of(gcs) and identity_of({**gcs, "generation": "1700000000000002"}) != identity_of(gcs)
    # nothing that names the bytes, or written too recently to tell a rewrite in the same tick: no identity
    assert identity_of({"size": 5}) == ""
    assert identity_of({**local, "mtime": now}) == identity_of({**s3, "LastModified": datetime.now(timezone.utc)}) == ""


# -- the fetcher ---------------------------------------------------------------------------
def test_whole_object_is_cached_by_what_the_storage_says_it_is(tmp_path):
    f = tmp_path / "index.json"
    f.write_bytes(b"0123456789")
    os.utime(f, (time.time() - 100,) * 2)
    fetcher = Fetcher.for_url(str(tmp_path), None, FetchConfig(cache_dir=str(tmp_path / "c")))
    assert fetcher.read(ByteRange(str(f))) == fetcher.read(ByteRange(str(f))) == b"0123456789"
    assert (fetcher.stats.requests, fetcher.stats.cache_hits) == (1, 1)
    f.write_bytes(b"abcdefghij")  # same size, in place (same inode)
    os.utime(f, (time.time() - 50,) * 2)
    assert fetcher.read(ByteRange(str(f))) == b"abcdefghij" and fetcher.stats.requests == 2
    f.write_bytes(b"ABCDEFGHIJ")  # just written: a rewrite in the same clock tick would look the same
    assert fetcher.read(ByteRange(str(f))) == fetcher.read(ByteRange(str(f))) == b"ABCDEFGHIJ"
    assert fetcher.stats.requests == 4 and fetcher.stats.cache_hits == 1


def test_blocks_of_a_fixed_grid_serve_ranges_that_start_elsewhere(tmp_path):
    data = os.urandom(20_000)
    (tmp_path / "shard").write_bytes(data)
    url, v = str(tmp_path / "shard"), ObjectVersion("sha256:x", 20_000)
    fetcher = Fetcher.for_url(str(tmp_path), None, FetchConfig(cache_dir=str(tmp_path / "c"), block_bytes=4096))
    assert b"".join(next(fetcher.read_many([(ByteRange(url, 100, 5000), v)]))) == data[100:5000]
    assert fetcher.stats.requests == 2  # blocks [0, 4096) and [4096, 8192), whole
    assert fetcher.read(ByteRange(url, 3000, 9000), version=v) == data[3000:9000]
    assert (fetcher.stats.requests, fetcher.stats.cache_hits) == (3, 2)  # only [8192, 12288) is new
    got = [b"".join(b) for b in fetcher.read_many([(ByteRange(url, a, a + 700), v) for a in range(0, 19_600, 700)])]
    assert got == [data[a:a + 700] for a in range(0, 19_600, 700)]
    assert fetcher.stats.requests == 5  # [12288, 16384) and [16384, 20000): each block once, at any concurrency
    assert sorted(os.path.getsize(tmp_path / "c" / e) for e in os.listdir(tmp_path / "c") if e != ".lock") == \
        [20_000 - 4 * 4096] + [4096] * 4
    fetcher.forget(ByteRange(url, 5000, 5001), v)  # bad bytes in block 1
    assert fetcher.read(ByteRange(url, 0, 20_000), version=v) == data and fetcher.stats.requests == 6
    assert fetcher.read(ByteRange(url, 10, 20), version="") == data[10:20]  # no version: past the cache
    assert fetcher.stats.requests == 7
    fetcher.close()


def _put_many(root: str, bound: int, worker: int, go) -> None:
    cache = BlockCache(root, bound)
    go.wait()
    for i in range(600):
        cache.put(f"{worker}-{i}", bytes(100 + 37 * (i % 5)))


def test_processes_sharing_a_folder_keep_its_bound(tmp_path):
    root, bound = str(tmp_path / "c"), 10_000
    ctx = multiprocessing.get_context("fork")  # forked before the watcher thread starts
    go = ctx.Event()
    procs = [ctx.Process(target=_put_many, args=(root, bound, w, go)) for w in range(3)]
    for p in procs:
        p.start()
    sizes: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                sizes.append(cache_size(root))
            except FileNotFoundError:
                pass
    watcher = threading.Thread(target=watch)
    watcher.start()
    go.set()
    try:
        for p in procs:
            p.join(60)
    finally:
        stop.set()
        watcher.join()
    assert [p.exitcode for p in procs] == [0, 0, 0]
    entries = [e for e in os.listdir(root) if e.endswith(".blk")]
    assert sum(os.path.getsize(os.path.join(root, e)) for e in entries) <= bound
    assert BlockCache(root, bound).total_bytes() == sum(os.path.getsize(os.path.join(root, e)) for e in entries)
    assert len(sizes) > 10 and max(sizes) <= bound + 3 * 248, max(sizes)  # + one temporary file per process


# -- stale manifests and objects ---------------------------------------------------------------
def test_relabelled_flat_folder_is_read_with_its_new_labels(place, tmp_path):
    url, opts, backdate = place
    write_flat_folder(url, 12, storage_options=opts)
    index_in_place(url + "/", storage_options=opts, progress=False)
    backdate(100)
    fetch = FetchConfig(cache_dir=str(tmp_path / "cache"))
    first = delivered(loader(url + "/", opts, fetch))
    assert {k: label for k, (_, label) in first.items()} == {f"img{i:05d}": label_of(i) for i in range(12)}
    # every image moves to the next class: labels.csv and index.json keep their length
    rows = "".join(f"img{i:05d}.jpg,c{(label_of(i) + 1) % CLASSES}\n" for i in range(12))
    rewrite(url, opts, "labels.csv", ("filename,class\n" + rows).encode())
    index_in_place(url + "/", storage_options=opts, progress=False)
    backdate(50)
    again = delivered(loader(url + "/", opts, fetch))
    assert {k: label for k, (_, label) in again.items()} == {f"img{i:05d}": (label_of(i) + 1) % CLASSES
                                                             for i in range(12)}
    assert {k: data for k, (data, _) in again.items()} == {f"img{i:05d}": payload(i) for i in range(12)}


def test_image_replaced_and_reindexed_without_checksums_is_read_anew(place, tmp_path):
    url, opts, backdate = place
    write_flat_folder(url, 12, storage_options=opts)
    index_in_place(url + "/", storage_options=opts, progress=False)  # no checksums: sizes only
    backdate(100)
    fetch = FetchConfig(cache_dir=str(tmp_path / "cache"))
    assert delivered(loader(url + "/", opts, fetch))["img00003"][0] == payload(3)
    rewrite(url, opts, "img00003.jpg", other(3))  # same size, other bytes
    index_in_place(url + "/", storage_options=opts, progress=False)  # the same index.json, written again
    backdate(50)
    again = delivered(loader(url + "/", opts, fetch))
    assert again["img00003"][0] == other(3)
    assert {k: d for k, (d, _) in again.items() if k != "img00003"} == {
        f"img{i:05d}": payload(i) for i in range(12) if i != 3}


def test_shard_rewritten_and_reindexed_is_never_read_from_the_cache(s3_bucket, tmp_path):
    opts, fs = s3_bucket.storage_options, s3_bucket.fs()
    manifest = f"{s3_bucket.name}/ds/index.json"
    write_dataset(s3_bucket.url("ds"), [10, 10], storage_options=opts, manifest=False)
    index(s3_bucket.url("ds/"), storage_options=opts, progress=False)
    length = len(fs.cat_file(manifest)) + 200
    fs.pipe_file(manifest, fs.cat_file(manifest).ljust(length))  # JSON with trailing blanks
    fetch = FetchConfig(cache_dir=str(tmp_path / "cache"), block_bytes=4096)
    first = delivered(loader(s3_bucket.url("ds/"), opts, fetch))
    assert {k: d for k, (d, _) in first.items()} == {f"k{i:07d}": payload(i) for i in range(20)}

    # part-0001.tar rewritten with other images of the same sizes, and indexed again
    write_dataset(s3_bucket.url("alt"), [10, 10], storage_options=opts, manifest=False, image=other)
    old = fs.cat_file(f"{s3_bucket.name}/ds/part-0001.tar")
    fs.pipe_file(f"{s3_bucket.name}/ds/part-0001.tar", fs.cat_file(f"{s3_bucket.name}/alt/part-0001.tar"))
    assert len(fs.cat_file(f"{s3_bucket.name}/ds/part-0001.tar")) == len(old)
    index(s3_bucket.url("ds/"), storage_options=opts, progress=False)
    fs.pipe_file(manifest, fs.cat_file(manifest).ljust(length))  # a manifest of the same length as before
    again = delivered(loader(s3_bucket.url("ds/"), opts, fetch))
    assert {k: d for k, (d, _) in again.items()} == {f"k{i:07d}": payload(i) if i < 10 else other(i)
                                                     for i in range(20)}


def test_shard_rewritten_without_a_manifest_is_read_anew(place, tmp_path):
    url, opts, backdate = place
    write_dataset(url, [10, 10], storage_options=opts, manifest=False)  # streamed whole
    backdate(100)
    fetch = FetchConfig(cache_dir=str(tmp_path / "cache"), block_bytes=4096)
    assert {k: d for k, (d, _) in delivered(loader(url + "/", opts, fetch)).items()} == {
        f"k{i:07d}": payload(i) for i in range(20)}
    alt = write_dataset(url + "-alt", [10, 10], storage_options=opts, manifest=False, image=other)
    with fsspec.open(alt[1], "rb", **(opts or {})) as f:
        rewrite(url, opts, "part-0001.tar", f.read())
    backdate(50)
    again = delivered(loader(url + "/", opts, fetch))
    assert {k: d for k, (d, _) in again.items()} == {f"k{i:07d}": payload(i) if i < 10 else other(i)
                                                     for i in range(20)}


# -- a second epoch hits --------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["shards", "folder with checksums", "folder", "parquet"])
def test_second_epoch_reads_nothing_from_storage(s3_bucket, s3_proxy, tmp_path, monkeypatch, kind):
    opts = s3_bucket.storage_options
    if kind == "shards":
        write_dataset(s3_bucket.url("ds"), COUNTS, storage_options=opts, manifest=False)
        index(s3_bucket.url("ds/"), storage_options=opts, progress=False)
        keys = {f"k{i:07d}" for i in range(N)}
    elif kind == "parquet":
        pytest.importorskip("pyarrow")
        write_parquet(s3_bucket.url("ds"), [20, 20], storage_options=opts)
        index_in_place(s3_bucket.url("ds/"), storage_options=opts, checksums=True, progress=False)
        keys = {f"part-{k:03d}.parquet/{r}" for k in range(2) for r in range(20)}
    else:
        write_flat_folder(s3_bucket.url("ds"), 40, storage_options=opts)
        index_in_place(s3_bucket.url("ds/"), storage_options=opts, checksums=kind != "folder", progress=False)
        keys = {f"img{i:05d}" for i in range(40)}
        if kind == "folder":  # as if indexed a while ago: the index's identity vouches for the images
            monkeypatch.setattr("gpupipe.storage.identity.RACY_S", 0.0)
    proxy = s3_proxy()
    fetch = FetchConfig(cache_dir=str(tmp_path / "cache"), block_bytes=4096)
    ld = loader(s3_bucket.url("ds/"), storage_options_via(proxy, s3_bucket), fetch, shuffle=True)
    requests = []
    epochs = []
    for _ in range(3):  # each epoch its own shard order and shuffle windows: the spans start elsewhere
        before = dict(proxy.counts)
        epochs.append(delivered(ld))
        requests.append({k: v - before.get(k, 0) for k, v in proxy.counts.items()
                         if k.startswith("method:") and v > before.get(k, 0)})
    assert requests[0].get("method:GET", 0) > 0
    assert requests[1] == requests[2] == {}, requests  # not one request, GET or HEAD
    assert epochs[0] == epochs[1] == epochs[2]  # byte-identical samples
    assert set(epochs[0]) == keys
    fs = s3_bucket.fs()
    data = sum(fs.size(p) for p in fs.find(f"{s3_bucket.name}/ds"))
    assert cache_size(tmp_path / "cache") <= data  # blocks of the data (and the index), each once


def cache_size(folder) -> int:
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if not f.startswith(".lock"))


# -- the size bound -------------------------------------------------------------------------
def test_cache_stays_within_its_bound_with_several_workers(tmp_path):
    write_dataset(str(tmp_path / "ds"), COUNTS * 3)
    data = sum(f.stat().st_size for f in (tmp_path / "ds").glob("*.tar"))
    block, bound, workers = 4096, 60_000, 2
    assert data > 4 * bound
    cache = tmp_path / "cache"
    fetch = FetchConfig(cache_dir=str(cache), cache_bytes=bound, block_bytes=block)
    ld = loader(str(tmp_path / "ds/"), None, fetch, shuffle=True, workers=workers)
    sizes: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                sizes.append(cache_size(cache))
            except FileNotFoundError:  # an entry evicted between the listing and its stat
                pass
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _ in range(3):
            assert len(delivered(ld)) == 3 * N
    finally:
        stop.set()
        watcher.join()
    assert len(sizes) > 10 and max(sizes) > bound // 2
    assert max(sizes) <= bound + (workers + 1) * block, max(sizes)  # + one block per process being written
    assert cache_size(cache) <= bound


def test_cache_never_holds_more_than_the_data(tmp_path):
    write_dataset(str(tmp_path / "ds"), COUNTS)
    data = sum(f.stat().st_size for f in (tmp_path / "ds").glob("*.tar"))
    fetch = FetchConfig(cache_dir=str(tmp_path / "cache"), block_bytes=4096)
    ld = loader(str(tmp_path / "ds/"), None, fetch, shuffle=True, workers=2)
    for _ in range(4):
        assert len(delivered(ld)) == N
    assert cache_size(tmp_path / "cache") <= data


def test_a_block_put_between_a_miss_and_the_claim_is_not_fetched_again(tmp_path):
    """The interleaving the fixed-grid test met under load: this thread misses the cache, the
    thread that was fetching the block puts it and lets go of its claim, then this thread
    claims. It must find the block in the cache, not fetch it a second time."""
    data = os.urandom(8192)
    (tmp_path / "shard").write_bytes(data)
    url, v = str(tmp_path / "shard"), ObjectVersion("sha256:y", 8192)
    fetcher = Fetcher.for_url(str(tmp_path), None, FetchConfig(cache_dir=str(tmp_path / "c"), block_bytes=4096))
    claim = fetcher._claim

    def other_thread_finishes_first(key):
        fetcher._cache.put(key, data[:4096])  # what the other thread fetched, then released
        return claim(key)

    fetcher._claim = other_thread_finishes_first
    assert fetcher.read(ByteRange(url, 0, 4096), version=v) == data[:4096]
    assert (fetcher.stats.requests, fetcher.stats.cache_hits) == (0, 1)
    fetcher.close()
