"""Long runs (issue 7): 20 epochs over a small dataset on the loopback S3 server with 1%
faults. Memory does not creep (RSS slope after warm-up under 1 MB/epoch), and file
descriptors, threads and temporary files come back to where they were; the block cache
holds only whole, hash-named entries within its bound.

Faults: every retryable class but ``stall`` (each stall costs a full read timeout; the
fault-matrix tests cover it). The fetcher runs in this process (``num_workers=0``), so
its memory, sockets and threads are the ones measured.
"""
from __future__ import annotations

import gc
import os
import tempfile
import threading
import time

import numpy as np
import pytest
from datagen import ids_of, write_dataset
from fault_proxy import RETRYABLE
from s3util import storage_options_via

from gpupipe.loader.encoded import EncodedLoader, StreamConfig
from gpupipe.prepare.indexer import index
from gpupipe.storage.fetch import FetchConfig

COUNTS = [30, 0, 20, 25, 15]
N = sum(COUNTS)
EPOCHS, WARMUP = 20, 4
BOUND = 100_000  # cache_bytes


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def fd_targets() -> list[str]:
    out = []
    for f in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{f}"))
        except OSError:
            pass
    return sorted(out)


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def settle(target_fds: int, target_threads: int, timeout: float = 5.0) -> tuple[int, int]:
    """Counts once they reach the targets (pools shut down without waiting), or at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        now = fds(), threads()
        if (now[0] <= target_fds and now[1] <= target_threads) or time.monotonic() > deadline:
            return now
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_twenty_epochs_with_one_percent_faults_leak_nothing(s3_bucket, s3_proxy, tmp_path, monkeypatch):
    import s3fs

    write_dataset(s3_bucket.url("ds"), COUNTS, storage_options=s3_bucket.storage_options, manifest=False)
    index(s3_bucket.url("ds/"), storage_options=s3_bucket.storage_options, progress=False)
    proxy = s3_proxy(fault_rate=0.01, faults=tuple(f for f in RETRYABLE if f != "stall"), seed=20)
    opts = storage_options_via(proxy, s3_bucket)
    tmp, cache = tmp_path / "tmp", tmp_path / "cache"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    # a cache smaller than the data (~190 kB): every epoch still reads from storage (and meets faults) and evicts;
    # with room for all of it, every epoch after the first would make no request at all
    fetch = FetchConfig(block_bytes=4096, backoff_s=0.005, retries=12, cache_dir=str(cache), cache_bytes=BOUND)
    stream = StreamConfig(shuffle_buffer=32, fetch=fetch)

    base_fds, base_threads = fds(), threads()
    base_targets = fd_targets()
    loader = EncodedLoader(s3_bucket.url("ds/"), batch_size=8, num_workers=0, storage_options=opts, rank=0,
                           world_size=1, drop_last=False, stream=stream)
    rss, open_fds = [], []
    for epoch in range(EPOCHS):
        assert sorted(i for b in loader for i in ids_of(b)) == list(range(N)), epoch
        gc.collect()
        rss.append(rss_mb())
        open_fds.append(fds())
    injected = sum(proxy.counts[f] for f in RETRYABLE)
    assert injected >= 3, dict(proxy.counts)

    slope = np.polyfit(np.arange(WARMUP, EPOCHS), rss[WARMUP:], 1)[0]
    assert slope < 1.0, f"RSS grows {slope:.2f} MB/epoch: {rss}"
    assert max(open_fds[WARMUP:]) - min(open_fds[WARMUP:]) <= 4, open_fds  # no socket or file piles up

    del loader
    s3fs.S3FileSystem.clear_instance_cache()  # its connection pool is the only thing meant to outlive a run
    after_fds, after_threads = settle(base_fds + 2, base_threads + 2)
    assert after_fds <= base_fds + 2, (base_fds, after_fds, sorted(set(fd_targets()) - set(base_targets)))
    assert after_threads <= base_threads + 2, (base_threads, after_threads, [t.name for t in threading.enumerate()])
    assert os.listdir(tmp) == []
    entries = [e for e in os.listdir(cache) if e != ".lock"]  # .lock: the entries' total, for all writers
    assert entries and all(len(e) == 64 + 4 and e.endswith(".blk") for e in entries)  # no half-written files
    assert sum(os.path.getsize(cache / e) for e in entries) <= BOUND
