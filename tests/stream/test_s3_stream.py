"""The stream against a real S3 protocol server on loopback (moto), through s3fs.

The same loader suite as on local files, plus what only object storage does:
faults (503 SlowDown, 500, reset, truncated body, stall) injected by a proxy,
missing buckets and objects, bad credentials — and no HEAD before range reads.
"""
from __future__ import annotations

import dataclasses
import time

import pytest
from datagen import ids_of, write_dataset
from s3util import storage_options_via

from gpupipe.core.errors import StorageError
from gpupipe.loader.encoded import EncodedLoader, StreamConfig
from gpupipe.storage.fetch import FetchConfig

COUNTS = [40, 0, 33, 57, 12]
N = sum(COUNTS)


def loader(url, opts, *, workers=0, fetch=None, **kw):
    stream = StreamConfig(shuffle_buffer=32, fetch=fetch or FetchConfig(block_bytes=4096, backoff_s=0.01))
    return EncodedLoader(url, batch_size=8, num_workers=workers, storage_options=opts, rank=0, world_size=1,
                         drop_last=False, stream=stream, **kw)


@pytest.mark.parametrize("workers", [0, 2])
def test_epoch_from_s3_is_exact(s3_bucket, workers):
    write_dataset(s3_bucket.url("ds"), COUNTS, storage_options=s3_bucket.storage_options)
    ld = loader(s3_bucket.url("ds/"), s3_bucket.storage_options, workers=workers)
    assert sorted(i for b in ld for i in ids_of(b)) == list(range(N))
    assert len(ld) == -(-N // 8)


def test_units_smaller_than_a_window_on_s3_without_a_cache_are_warned_of(s3_bucket, caplog, tmp_path):
    """Issue 34: a unit of one batch of a shuffled window reads a sample or two per request; on
    object storage without a block cache the default unit is the window, and a smaller one set by
    hand is warned of, with what to set; behind the block cache the default is one batch."""
    write_dataset(s3_bucket.url("ds"), COUNTS, storage_options=s3_bucket.storage_options)
    url, opts = s3_bucket.url("ds/"), s3_bucket.storage_options
    with caplog.at_level("WARNING", logger="gpupipe.loader.encoded"):
        assert loader(url, opts).unit_sizes == (4, 4)
    assert "unit_batches" not in caplog.text
    with caplog.at_level("WARNING", logger="gpupipe.loader.encoded"):
        loader(url, opts, unit_batches=1)
    assert "stream.unit_batches=1 of a window of 4 batches" in caplog.text and "unit_batches=4" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="gpupipe.loader.encoded"):
        assert loader(url, opts, fetch=FetchConfig(cache_dir=str(tmp_path / "cache"))).unit_sizes == (1, 4)
        loader(url, opts, shuffle=False)
    assert "unit_batches" not in caplog.text


def test_brace_pattern_on_s3_uses_the_manifest(s3_bucket):
    write_dataset(s3_bucket.url("ds"), COUNTS, storage_options=s3_bucket.storage_options)
    ld = loader(s3_bucket.url("ds/part-{0000..0004}.tar"), s3_bucket.storage_options)
    assert ld.source.manifest is not None
    assert sorted(i for b in ld for i in ids_of(b)) == list(range(N))


def test_range_reads_send_no_head(s3_bucket, s3_proxy):
    write_dataset(s3_bucket.url("ds"), COUNTS, storage_options=s3_bucket.storage_options)
    proxy = s3_proxy()
    ld = loader(s3_bucket.url("ds/"), storage_options_via(proxy, s3_bucket))
    before = dict(proxy.counts)
    list(ld)
    assert proxy.counts.get("method:HEAD", 0) == before.get("method:HEAD", 0)
    assert proxy.counts["method:GET"] > before["method:GET"]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_five_percent_faults_still_deliver_the_full_set(s3_bucket, s3_proxy, workers):
    write_dataset(s3_bucket.url("ds"), COUNTS, storage_options=s3_bucket.storage_options)
    proxy = s3_proxy(fault_rate=0.05, seed=11, stall_seconds=3.0)
    opts = storage_options_via(proxy, s3_bucket, timeout_s=1.0)
    fetch = FetchConfig(block_bytes=2048, backoff_s=0.01, backoff_max_s=0.2, retries=10, request_timeout_s=5)
    ld = loader(s3_bucket.url("ds/"), opts, workers=workers, fetch=fetch)
    for epoch in range(2):
        got = [i for b in ld for i in ids_of(b)]
        assert sorted(got) == list(range(N)), f"epoch {epoch}"
    injected = sum(proxy.counts[f] for f in ("slowdown", "error500", "reset", "truncate", "stall"))
    assert injected >= 3, proxy.counts  # the faults really happened


@pytest.mark.parametrize("fault", ["slowdown", "error500", "truncate", "reset"])
def test_each_transient_fault_is_retried(s3_bucket, s3_proxy, fault):
    write_dataset(s3_bucket.url("ds"), [20], storage_options=s3_bucket.storage_options)
    proxy = s3_proxy(fault_rate=0.3, faults=(fault,), seed=3)
    ld = loader(s3_bucket.url("ds/"), storage_options_via(proxy, s3_bucket),
                fetch=FetchConfig(block_bytes=1024, backoff_s=0.01, backoff_max_s=0.05, retries=20))
    assert sorted(i for b in ld for i in ids_of(b)) == list(range(20))
    assert proxy.counts[fault] > 0


def test_persistent_failure_gives_up_with_the_url(s3_bucket, s3_proxy):
    write_dataset(s3_bucket.url("ds"), [20], storage_options=s3_bucket.storage_options)
    opts = storage_options_via(s3_proxy(), s3_bucket)
    ld = loader(s3_bucket.url("ds/"), opts, fetch=FetchConfig(retries=2, backoff_s=0.01))
    bad = s3_proxy(fault_rate=1.0, faults=("slowdown",))
    ld.source = dataclasses.replace(ld.source, storage_options=storage_options_via(bad, s3_bucket))
    with pytest.raises(StorageError, match=r"part-0000\.tar.*gave up after 3 attempts"):
        list(ld)


def test_missing_bucket_fails_fast_naming_it(s3_bucket):
    t0 = time.monotonic()
    with pytest.raises(StorageError, match="no-such-bucket-gpupipe"):
        loader("s3://no-such-bucket-gpupipe/ds/", s3_bucket.storage_options)
    assert time.monotonic() - t0 < 10


def test_missing_shard_fails_fast_naming_it(s3_bucket):
    write_dataset(s3_bucket.url("ds"), [10, 10], storage_options=s3_bucket.storage_options)
    s3_bucket.fs().rm(f"{s3_bucket.name}/ds/part-0001.tar")
    ld = loader(s3_bucket.url("ds/"), s3_bucket.storage_options, fetch=FetchConfig(retries=5, backoff_s=1.0))
    t0 = time.monotonic()
    with pytest.raises(StorageError, match=r"part-0001\.tar.*FileNotFoundError"):
        list(ld)
    assert time.monotonic() - t0 < 5  # a 404 is not retried


def test_bad_credentials_fail_fast_and_keep_the_secret_out(s3_auth_bucket):
    write_dataset(s3_auth_bucket.url("ds"), [10], storage_options=s3_auth_bucket.storage_options)
    wrong = dataclasses.replace(s3_auth_bucket, secret="sentinel-secret-123")
    with pytest.raises(StorageError) as info:
        loader(wrong.url("ds/"), wrong.storage_options, fetch=FetchConfig(retries=5, backoff_s=1.0))
    assert "PermissionError" in str(info.value) or "Forbidden" in str(info.value)
    assert "sentinel-secret-123" not in str(info.value) and "sentinel-secret-123" not in repr(info.value)


# -- sources read in place (issue 15): an image folder and Parquet files on S3 -----------------
def _in_place(kind, bucket):
    from inplace_data import write_class_folder, write_parquet

    opts = bucket.storage_options
    if kind == "folder":
        write_class_folder(bucket.url("imgs"), 60, storage_options=opts)
        return bucket.url("imgs/"), 60
    write_parquet(bucket.url("table"), [25, 0, 35], row_group_rows=6, storage_options=opts)
    return bucket.url("table/"), 60


@pytest.mark.parametrize("kind", ["folder", "parquet"])
def test_in_place_sources_on_s3_without_and_with_index(s3_bucket, s3_proxy, kind):
    from inplace_data import image_ids

    from gpupipe.prepare.indexer import index_in_place

    url, n = _in_place(kind, s3_bucket)
    proxy = s3_proxy()
    opts = storage_options_via(proxy, s3_bucket)
    listed = loader(url, opts)
    assert listed.source.kind == kind and sorted(i for b in listed for i in image_ids(b)) == list(range(n))
    index_in_place(url, storage_options=s3_bucket.storage_options, checksums=True, progress=False)
    before = dict(proxy.counts)
    indexed = loader(url, opts)
    assert indexed.source.manifest.num_samples == n
    start_requests = proxy.counts["requests"] - before["requests"]
    assert start_requests <= 2, proxy.counts  # the index.json (HEAD + GET): no listing, no footers
    assert sorted(i for b in indexed for i in image_ids(b)) == list(range(n))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["folder", "parquet"])
def test_in_place_sources_survive_five_percent_faults(s3_bucket, s3_proxy, kind):
    from inplace_data import image_ids

    from gpupipe.prepare.indexer import index_in_place

    url, n = _in_place(kind, s3_bucket)
    index_in_place(url, storage_options=s3_bucket.storage_options, checksums=True, progress=False)
    faults = ("slowdown", "error500", "reset", "truncate", "stall", "flip")
    proxy = s3_proxy(fault_rate=0.05, seed=7, stall_seconds=3.0, faults=faults)
    opts = storage_options_via(proxy, s3_bucket, timeout_s=1.0)
    fetch = FetchConfig(block_bytes=2048, backoff_s=0.01, backoff_max_s=0.2, retries=10, request_timeout_s=5)
    ld = loader(url, opts, workers=2, fetch=fetch)
    for epoch in range(2):
        got = [i for b in ld for i in image_ids(b)]
        assert sorted(got) == list(range(n)), f"epoch {epoch}: 0 lost, 0 duplicated"
    assert sum(proxy.counts[f] for f in faults) >= 3, proxy.counts  # the faults really happened
