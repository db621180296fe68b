"""Fetcher, cache, world detection and sources on local/memory/http storage."""
from __future__ import annotations

import logging
import os
import pickle
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
from datagen import ids_of, write_dataset
from gloo_ranks import run_ranks

from gpupipe.core.errors import ConfigError, StorageError
from gpupipe.core.types import ByteRange, World
from gpupipe.loader.encoded import EncodedLoader, StreamConfig
from gpupipe.sources.source import Source, expand_pattern, resolve
from gpupipe.storage.cache import BlockCache
from gpupipe.storage.fetch import FetchConfig, Fetcher, is_transient, open_filesystem
from gpupipe.storage.identity import ObjectVersion

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: the helpers a subprocess imports


# -- patterns ---------------------------------------------------------------------------------
def test_brace_ranges_lists_and_nesting():
    assert expand_pattern("s3://b/shard-{000..002}.tar") == [f"s3://b/shard-{i:03d}.tar" for i in range(3)]
    assert expand_pattern(["a-{1,2}.tar", "b.tar"]) == ["a-1.tar", "a-2.tar", "b.tar"]


def test_pipe_urls_are_refused():
    with pytest.raises(ConfigError, match="refused"):
        open_filesystem("pipe:curl -s http://127.0.0.1/x.tar")


def test_unknown_protocol_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown storage protocol 'nosuchfs'"):
        open_filesystem("nosuchfs://x/y.tar")


def test_glob_without_manifest_and_empty_glob(tmp_path):
    write_dataset(str(tmp_path / "ds"), [3, 4], manifest=False)
    src = resolve(Source(str(tmp_path / "ds" / "*.tar")))
    assert len(src.shard_urls) == 2 and src.manifest is None
    with pytest.raises(StorageError, match="no shards match"):
        resolve(Source(str(tmp_path / "ds" / "*.tgz")))


def test_manifest_is_found_beside_listed_shards(tmp_path):
    urls = write_dataset(str(tmp_path / "ds"), [3, 4, 5])
    src = resolve(Source([urls[2], urls[0]]))
    assert src.manifest is not None and src.manifest.sample_counts() == (5, 3)


# -- fetcher ----------------------------------------------------------------------------------
def test_read_many_keeps_order_and_blocks_bound_memory(tmp_path):
    data = os.urandom(100_000)
    (tmp_path / "blob").write_bytes(data)
    fetcher = Fetcher.for_url(str(tmp_path), None, FetchConfig(block_bytes=1000, readahead_bytes=5000, concurrency=4))
    ranges = [(ByteRange(str(tmp_path / "blob"), a, a + 7_000), "") for a in range(0, 90_000, 7_000)]
    out = [b"".join(blocks) for blocks in fetcher.read_many(ranges)]
    assert out == [data[a:a + 7000] for a in range(0, 90_000, 7_000)]
    assert fetcher.stats.requests == 13 * 7
    fetcher.close()


def test_transient_classification():
    assert not is_transient(FileNotFoundError("x"))
    assert not is_transient(PermissionError("x"))
    assert is_transient(ConnectionResetError())
    assert is_transient(TimeoutError())
    err = OSError("slow down")
    err.status = 503
    assert is_transient(err)
    err.status = 403
    assert not is_transient(err)
    assert not is_transient(TypeError("a bug is not retried"))


def test_a_bug_is_not_retried(tmp_path):
    fetcher = Fetcher.for_url(str(tmp_path), None, FetchConfig(retries=5))
    calls = []

    def boom():
        calls.append(1)
        raise TypeError("bug")
    with pytest.raises(StorageError, match="TypeError: bug"):
        fetcher._retrying("x", boom)
    assert len(calls) == 1


# -- cache ------------------------------------------------------------------------------------
def test_cache_files_are_hash_named_complete_and_bounded(tmp_path):
    src = tmp_path / "src"
    write_dataset(str(src), [30, 30, 30])
    cache_dir = tmp_path / "cache"
    fetch = FetchConfig(cache_dir=str(cache_dir), cache_bytes=10_000, block_bytes=1024)
    loader = EncodedLoader(str(src), batch_size=5, num_workers=0, rank=0, world_size=1,
                           stream=StreamConfig(fetch=fetch, shuffle=False))
    first = [i for b in loader for i in ids_of(b)]
    entries = [f for f in cache_dir.iterdir() if f.name != ".lock"]  # .lock: the entries' total, for all writers
    size = sum(f.stat().st_size for f in entries)
    assert 0 < size <= 10_000
    assert not [f for f in entries if f.name.startswith(".tmp-")]  # no half-written files
    assert all(len(f.name) == 64 + 4 for f in entries)  # named by hash
    assert int((cache_dir / ".lock").read_bytes()) == size
    assert sorted(first) == list(range(90))
    second = [i for b in loader for i in ids_of(b)]  # next epoch, partly from the cache
    assert sorted(second) == list(range(90))


def test_cache_hit_returns_the_cached_bytes(tmp_path):
    (tmp_path / "f").write_bytes(b"0123456789")
    fetcher = Fetcher.for_url(str(tmp_path), None, FetchConfig(cache_dir=str(tmp_path / "c"), cache_bytes=1 << 20))
    r = ByteRange(str(tmp_path / "f"), 2, 6)
    assert fetcher.read(r, version="v1") == b"2345"
    (tmp_path / "f").write_bytes(b"abcdefghij")
    assert fetcher.read(r, version="v1") == b"2345" and fetcher.stats.cache_hits == 1
    assert fetcher.read(r, version="v2") == b"cdef"  # a new shard checksum is a new key


def test_cache_eviction_drops_least_recently_used(tmp_path):
    cache = BlockCache(str(tmp_path), max_bytes=3000)
    for i in range(5):
        cache.put(f"{i:064x}", bytes(1000))
        os.utime(tmp_path / f"{i:064x}.blk", (i, i))
    assert cache.get(f"{0:064x}") is None and cache.get(f"{4:064x}") is not None


def test_a_cache_hit_reads_only_the_part_asked_for(tmp_path, monkeypatch):
    """A few samples of a cached 8 MiB block read themselves, not the block (a shuffled unit of
    work reads hundreds of short ranges); a block of another size is no hit."""
    cache = BlockCache(str(tmp_path / "c"), max_bytes=1 << 20)
    cache.put("k" * 64, bytes(range(256)) * 4)
    assert cache.get("k" * 64, (10, 20), 1024) == bytes(range(10, 20))
    assert cache.get("k" * 64, (10, 20), 1000) is None and cache.get("k" * 64) == bytes(range(256)) * 4
    (tmp_path / "f").write_bytes(bytes(range(200)) * 50)
    data = bytes(range(200)) * 50
    fetcher = Fetcher.for_url(str(tmp_path), None, FetchConfig(cache_dir=str(tmp_path / "c"), block_bytes=4096))
    version = ObjectVersion("t", len(data))
    assert fetcher.read(ByteRange(str(tmp_path / "f"), 4000, 4200), version=version) == data[4000:4200]
    read: list = []
    real = BlockCache.get
    monkeypatch.setattr(BlockCache, "get", lambda self, *a: read.append(a[1:]) or real(self, *a))
    assert fetcher.read(ByteRange(str(tmp_path / "f"), 5000, 5010), version=version) == data[5000:5010]
    assert read == [((904, 914), 4096)] and fetcher.stats.cache_hits == 1  # 10 bytes of the grid's second block


# -- world ------------------------------------------------------------------------------------
def test_world_from_environment(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert World.detect() == World(rank=3, world_size=4, local_rank=1)
    assert World.detect(rank=0, world_size=2).world_size == 2  # explicit override wins
    with pytest.raises(ValueError, match="both"):
        World.detect(rank=1)
    with pytest.raises(ValueError, match="not in"):
        World(rank=2, world_size=2)


@pytest.mark.usefixtures("one_job_at_a_time")  # conftest.py: a job of several processes
def test_world_from_torch_distributed_two_gloo_ranks(tmp_path):
    write_dataset(str(tmp_path / "ds"), [13, 0, 21, 8])
    script = tmp_path / "rank.py"
    script.write_text(
        "import os, sys, torch, torch.distributed as dist\n"
        f"sys.path[:0] = [{os.getcwd()!r}, {TESTS!r}]\n"
        "from datagen import ids_of\n"
        "from gpupipe.loader.encoded import EncodedLoader\n"
        "dist.init_process_group('gloo', timeout=__import__('datetime').timedelta(seconds=60))\n"
        "os.environ.pop('RANK'); os.environ.pop('WORLD_SIZE')  # only torch.distributed may tell\n"
        f"ld = EncodedLoader({str(tmp_path / 'ds')!r}, batch_size=4, num_workers=1)\n"
        "ids = [i for b in ld for i in ids_of(b)]\n"
        "out = [None, None]\n"
        "dist.all_gather_object(out, (len(ld), ids))\n"
        "if dist.get_rank() == 0: print(repr(out))\n"
        "dist.destroy_process_group()\n")
    (len0, ids0), (len1, ids1) = eval(run_ranks(script, 2))
    assert len0 == len1 == 42 // 8 and not set(ids0) & set(ids1) and len(ids0) == len(ids1) == 20


# -- secrets ----------------------------------------------------------------------------------
def test_storage_options_never_in_repr_or_debug_logs(tmp_path, caplog):
    write_dataset(str(tmp_path / "ds"), [8])
    caplog.set_level(logging.DEBUG)
    opts = {"auto_mkdir": False, "sentinel": "sentinel-secret-xyz"}
    src = Source(str(tmp_path / "ds"), storage_options=opts)
    assert "sentinel-secret-xyz" not in repr(src)
    loader = EncodedLoader(src, batch_size=4, num_workers=0, rank=0, world_size=1)
    list(loader)
    with pytest.raises(StorageError) as info:
        resolve(Source(str(tmp_path / "missing") + "/", storage_options=opts))
    assert "sentinel-secret-xyz" not in str(info.value)
    assert "sentinel-secret-xyz" not in caplog.text
    assert "sentinel-secret-xyz" not in repr(loader.source) + repr(loader.state_dict())
    assert "sentinel-secret-xyz" not in repr(pickle.loads(pickle.dumps(src)))


# -- http -------------------------------------------------------------------------------------
class _RangeHandler(SimpleHTTPRequestHandler):
    """Static files with single byte-range support (what object stores and CDNs give)."""

    def log_message(self, *args):
        pass

    def send_head(self):
        rng = self.headers.get("Range")
        path = self.translate_path(self.path)
        if not rng or not os.path.isfile(path):
            return super().send_head()
        start, _, end = rng.split("=", 1)[1].partition("-")
        data = open(path, "rb").read()
        start, end = int(start), min(int(end or len(data) - 1), len(data) - 1)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        import io
        return io.BytesIO(data[start:end + 1])


def test_stream_over_http_with_range_requests(tmp_path):
    write_dataset(str(tmp_path / "ds"), [11, 9, 14])
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_RangeHandler, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/ds/part-{{0000..0002}}.tar"
        loader = EncodedLoader(url, batch_size=4, num_workers=0, drop_last=False, rank=0, world_size=1)
        assert loader.source.manifest is not None
        assert sorted(i for b in loader for i in ids_of(b)) == list(range(34))
    finally:
        server.shutdown()
        server.server_close()


def test_a_missing_fsspec_backend_names_the_extra_to_install(monkeypatch):
    """gcs:// without gcsfs: MissingDependencyError naming the package and the pip extra."""
    import builtins

    from gpupipe.core.errors import MissingDependencyError
    from gpupipe.storage.fetch import open_filesystem

    real_import = builtins.__import__

    def no_gcsfs(name, *args, **kwargs):
        if name == "gcsfs" or name.startswith("gcsfs."):
            raise ImportError("No module named 'gcsfs'", name="gcsfs")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gcsfs)
    with pytest.raises(MissingDependencyError, match=r"'gcsfs' package: pip install 'gpupipe\[gcs\]'"):
        open_filesystem("gcs://bucket/train/")
