"""Fault matrix on the loopback S3 server through the fault proxy (issue 7).

Retryable faults (5xx, 429, resets before and after the headers, truncated
bodies, stalls, slow drips, a flipped byte, a read that sees a replaced object):
every epoch delivers exactly the full set, and every delivered sample's bytes are
its own (``ids_of`` checks them). Fatal faults (403, 404): a ``StorageError``
naming the shard URL, quickly. Per-sample checksums in the manifest are what
catch the flipped byte and the replaced object; they are tested here too.
``benchmarks/reliability.py`` runs the full matrix (more rates and seeds) for
the figures in docs/reliability.md.
"""
from __future__ import annotations

import json
import time

import pytest
from datagen import ids_of, write_dataset
from fault_proxy import FATAL, RETRYABLE
from s3util import storage_options_via

from gpupipe.core.errors import ShardFormatError, StorageError
from gpupipe.formats.manifest import Manifest
from gpupipe.loader.encoded import EncodedLoader, StreamConfig
from gpupipe.prepare.indexer import index
from gpupipe.storage.fetch import FetchConfig

COUNTS = [40, 0, 33, 57, 12]
N = sum(COUNTS)
FETCH = FetchConfig(block_bytes=2048, backoff_s=0.005, backoff_max_s=0.1, retries=12, request_timeout_s=5)


def checked_dataset(bucket, counts=COUNTS) -> str:
    """Shards with ids 0..N-1 under ``ds/``, indexed by ``gpupipe index`` (so with checksums)."""
    write_dataset(bucket.url("ds"), counts, storage_options=bucket.storage_options, manifest=False)
    index(bucket.url("ds/"), storage_options=bucket.storage_options, progress=False)
    return bucket.url("ds/")


def replaced_objects(bucket, counts=COUNTS) -> dict[str, bytes]:
    """For each shard path, the bytes of a different shard (ids shifted by one, so other
    payloads and other offsets): what a read sees when the object was replaced."""
    write_dataset(bucket.url("alt"), [1, *counts], storage_options=bucket.storage_options, manifest=False)
    fs = bucket.fs()
    return {f"/{bucket.name}/ds/part-{i:04d}.tar": fs.cat_file(f"{bucket.name}/alt/part-{i + 1:04d}.tar")
            for i in range(len(counts))}


def make_loader(url, opts, *, workers=0, fetch=FETCH, on_error="raise"):
    stream = StreamConfig(shuffle_buffer=32, fetch=fetch, on_error=on_error)
    return EncodedLoader(url, batch_size=8, num_workers=workers, storage_options=opts, rank=0, world_size=1,
                         drop_last=False, stream=stream)


def test_index_and_writer_record_checksums_and_old_manifests_still_load(s3_bucket, tmp_path):
    url = checked_dataset(s3_bucket)
    doc = json.loads(s3_bucket.fs().cat_file(f"{s3_bucket.name}/ds/index.json"))
    assert [len(s["crc32"]) for s in doc["shards"]] == COUNTS
    for s in doc["shards"]:
        del s["crc32"]
    old = Manifest.from_json(json.dumps(doc))
    assert all(e.crc32 is None for e in old.shards)
    assert sorted(i for b in make_loader(url, s3_bucket.storage_options) for i in ids_of(b)) == list(range(N))
    bad = json.loads(s3_bucket.fs().cat_file(f"{s3_bucket.name}/ds/index.json"))
    bad["shards"][0]["crc32"] = bad["shards"][0]["crc32"][:-1]
    with pytest.raises(ShardFormatError, match="crc32 values for 40 samples"):
        Manifest.from_json(json.dumps(bad))


@pytest.mark.parametrize("fault", ["flip", "replace"])
def test_damaged_bytes_are_read_again_never_delivered(s3_bucket, s3_proxy, fault):
    url = checked_dataset(s3_bucket)
    proxy = s3_proxy(fault_rate=0.2, faults=(fault,), seed=5, alternates=replaced_objects(s3_bucket))
    ld = make_loader(url, storage_options_via(proxy, s3_bucket))
    assert sorted(i for b in ld for i in ids_of(b)) == list(range(N))  # ids_of checks every byte
    assert proxy.counts[fault] >= 5


def test_a_flipped_payload_byte_gets_through_only_without_checksums(s3_bucket):
    """Why the checksums exist: a byte flipped inside an image passes every tar check."""
    fs, path = s3_bucket.fs(), f"{s3_bucket.name}/ds/part-0000.tar"
    write_dataset(s3_bucket.url("ds"), [10], storage_options=s3_bucket.storage_options)  # no checksums
    data = bytearray(fs.cat_file(path))
    data[512 + 3] ^= 0x01  # the id inside the first image (its data follows one header)
    fs.pipe_file(path, bytes(data))
    with pytest.raises(AssertionError, match="do not match"):
        [i for b in make_loader(s3_bucket.url("ds/"), s3_bucket.storage_options) for i in ids_of(b)]
    index(s3_bucket.url("ds/"), storage_options=s3_bucket.storage_options, progress=False)  # of the damaged shard
    data[512 + 3] ^= 0x01
    data[512 + 4] ^= 0x01  # damaged differently after indexing
    fs.pipe_file(path, bytes(data))
    with pytest.raises(ShardFormatError, match=r"part-0000\.tar at byte 0: sample 'k0000000' fails its checksum"):
        list(make_loader(s3_bucket.url("ds/"), s3_bucket.storage_options, fetch=FetchConfig(refetch=2)))


def test_flipped_bytes_never_stay_in_the_cache(s3_bucket, s3_proxy, tmp_path):
    url = checked_dataset(s3_bucket)
    proxy = s3_proxy(fault_rate=0.2, faults=("flip",), seed=2)
    fetch = FetchConfig(block_bytes=2048, backoff_s=0.005, cache_dir=str(tmp_path / "cache"))
    ld = make_loader(url, storage_options_via(proxy, s3_bucket), fetch=fetch)
    for _ in range(2):
        assert sorted(i for b in ld for i in ids_of(b)) == list(range(N))
    proxy.fault_rate = 0.0
    assert sorted(i for b in ld for i in ids_of(b)) == list(range(N))  # fills what was dropped
    s3_bucket.fs().rm(f"{s3_bucket.name}/ds", recursive=True)  # from here on, only the cache can answer
    assert sorted(i for b in ld for i in ids_of(b)) == list(range(N))


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_object_replaced_for_good_is_an_error_naming_shard_and_key(s3_bucket, on_error):
    url = checked_dataset(s3_bucket, [20, 20])
    fs = s3_bucket.fs()
    ld = make_loader(url, s3_bucket.storage_options, on_error=on_error,
                     fetch=FetchConfig(block_bytes=2048, backoff_s=0.001))
    write_dataset(s3_bucket.url("alt"), [1, 20], storage_options=s3_bucket.storage_options, manifest=False)
    fs.pipe_file(f"{s3_bucket.name}/ds/part-0001.tar", fs.cat_file(f"{s3_bucket.name}/alt/part-0001.tar"))
    if on_error == "raise":
        with pytest.raises(ShardFormatError, match=r"part-0001\.tar.*(sample 'k\d{7}' fails its checksum|manifest)"):
            list(ld)
        return
    got = [i for b in ld for i in ids_of(b)]  # every delivered sample is its own bytes
    assert sorted(got) == list(range(20)) and ld.stats.skipped == 20


def _epoch_or_error(make):
    try:
        return sorted(i for b in make() for i in ids_of(b)), None
    except StorageError as exc:
        return None, exc


@pytest.mark.slow
@pytest.mark.parametrize("rate", [0.2])  # 1% and 5% with more seeds: benchmarks/reliability.py
@pytest.mark.parametrize("fault", RETRYABLE)
def test_retryable_fault_matrix_delivers_exactly_the_full_set(s3_bucket, s3_proxy, fault, rate):
    url = checked_dataset(s3_bucket)
    proxy = s3_proxy(fault_rate=rate, faults=(fault,), seed=int(rate * 100), stall_seconds=2.0,
                     alternates=replaced_objects(s3_bucket))
    got, error = _epoch_or_error(lambda: make_loader(url, storage_options_via(proxy, s3_bucket, timeout_s=0.5)))
    assert error is None and got == list(range(N)), (fault, rate, error, dict(proxy.counts))
    assert proxy.counts[fault] > 0


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.parametrize("fault", FATAL)
def test_fatal_fault_is_a_prompt_error_naming_the_shard(s3_bucket, s3_proxy, fault, workers):
    url = checked_dataset(s3_bucket)
    proxy = s3_proxy(fault_rate=0.2, faults=(fault,), seed=1)
    fetch = FetchConfig(block_bytes=2048, backoff_s=1.0, retries=8)  # a retried 403/404 would take minutes
    t0 = time.monotonic()
    got, error = _epoch_or_error(lambda: make_loader(url, storage_options_via(proxy, s3_bucket), workers=workers,
                                                     fetch=fetch))
    assert error is not None, got
    assert time.monotonic() - t0 < 10
    name = {"forbidden": "PermissionError", "notfound": "FileNotFoundError"}[fault]
    assert f"s3://{s3_bucket.name}/ds/" in str(error) and name in str(error)
