"""The data path's numbers for a plain PyTorch loop (issue 38): ``loader.metrics()`` gives the rates
since the previous call; :func:`rates` is plain arithmetic on two readings."""
from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
from gloo_ranks import run_ranks

from gpupipe import GpuLoader
from gpupipe.formats.writer import ShardSink
from gpupipe.loader.metrics import RankRow, Reading, rates, spread
from gpupipe.tools.synth import synthetic_jpeg


def test_rates_between_two_readings():
    a = Reading(t=10.0, batches=4, images=100, wait_s=0.5, decode_s=1.0, augment_s=0.2, bytes=1000, io_wait_s=0.1,
                skipped=1, requests=10, cache_hits=0, read_bytes=2000)
    b = Reading(t=12.0, batches=8, images=300, wait_s=1.5, decode_s=2.0, augment_s=1.2, bytes=5000, io_wait_s=0.5,
                skipped=3, requests=14, cache_hits=12, read_bytes=8000)
    r = rates(a, b)
    assert r == {"images_per_s": 100.0, "wait_ms_per_step": 250.0, "wait_share": 0.5, "decode_busy": 0.5,
                 "augment_busy": 0.5, "bytes_per_s": 2000.0, "read_bytes_per_s": 3000.0, "io_wait_share": 0.2,
                 "requests_per_s": 2.0,
                 "cache_hit_rate": 0.75, "skipped": 3.0}
    reset = Reading(t=13.0, batches=1, images=10, wait_s=0.1, decode_s=0.1, augment_s=0.0, bytes=10, io_wait_s=0.0,
                    skipped=0)
    assert rates(b, reset)["images_per_s"] == 10.0  # counters that went back (stats reset) count from zero
    assert rates(b, b)["images_per_s"] == 0.0 and rates(b, b)["wait_ms_per_step"] == 0.0


def test_a_plain_loop_reads_the_metrics_since_the_previous_call(tmp_path):
    rng = np.random.default_rng(0)
    with ShardSink(str(tmp_path / "s"), shard_size=16) as sink:
        for i in range(32):
            sink.write(f"k{i:03d}", {"jpg": synthetic_jpeg(rng, (20, 20)), "cls": b"0"})
    loader = GpuLoader(str(tmp_path / "s"), batch_size=8, image_size=(16, 16), decode="pil", device="cpu",
                       num_workers=0)
    for _ in loader:
        pass
    first = loader.metrics()
    assert first["images_per_s"] > 0 and first["bytes_per_s"] > 0 and first["decode_busy"] > 0
    assert 0 <= first["wait_share"] <= 1 and first["wait_ms_per_step"] >= 0
    assert loader.metrics()["images_per_s"] == 0.0  # nothing delivered since


def test_spread_names_the_rank_that_waits_more_than_twice_the_median():
    rows = [RankRow(0, "a", 2.0, 900.0), RankRow(1, "b", 2.5, 880.0), RankRow(2, "c", 9.0, 400.0),
            RankRow(3, "d", 2.2, 890.0)]
    numbers, warning = spread(rows)
    assert numbers == {"wait_ms_max": 9.0, "wait_ms_median": 2.35, "slowest_rank": 2.0, "images_per_s_min": 400.0}
    assert warning is not None and warning.startswith("rank 2 on c waited 9.0 ms a step")
    assert spread([RankRow(0, "a", 2.0, 1.0), RankRow(1, "b", 3.0, 1.0)])[1] is None  # 1.5x: not a straggler
    assert spread([RankRow(0, "a", 0.01, 1.0), RankRow(1, "b", 0.5, 1.0)])[1] is None  # under a ms: noise
    assert spread([RankRow(0, "a", 50.0, 1.0)])[1] is None  # one rank: nobody to wait for


@pytest.mark.usefixtures("one_job_at_a_time")  # conftest.py
def test_two_gloo_ranks_name_the_slowed_one(tmp_path):
    """Two real processes on gloo, rank 1's data path slowed on purpose: the collective at the end
    of the pass brings both rows to rank 0, which names rank 1 and its host."""
    rng = np.random.default_rng(1)
    with ShardSink(str(tmp_path / "s"), shard_size=16) as sink:
        for i in range(64):
            sink.write(f"k{i:03d}", {"jpg": synthetic_jpeg(rng, (20, 20)), "cls": b"0"})
    out = json.loads(run_ranks(Path(__file__).resolve().parents[1] / "straggler_script.py", 2, timeout=120,
                               env={**os.environ, "SHARDS": str(tmp_path / "s"), "SLOW_RANK": "1",
                                    "PYTHONPATH": os.pathsep.join(sys.path)}))
    assert out["numbers"]["slowest_rank"] == 1.0 and out["numbers"]["wait_ms_max"] >= 20
    assert out["warning"].startswith(f"rank 1 on {socket.gethostname()} waited")


def test_the_workers_storage_requests_and_cache_hits_reach_the_loader(tmp_path):
    """FetchStats lived in the worker: now every batch carries its requests and cache hits, and the
    second epoch over a block cache is all hits (``cache_hit_rate`` 1)."""
    rng = np.random.default_rng(0)
    with ShardSink(str(tmp_path / "s"), shard_size=16) as sink:
        for i in range(32):
            sink.write(f"k{i:03d}", {"jpg": synthetic_jpeg(rng, (20, 20)), "cls": b"0"})
    loader = GpuLoader(str(tmp_path / "s"), batch_size=8, image_size=(16, 16), decode="pil", device="cpu",
                       num_workers=1, cache_dir=str(tmp_path / "cache"), block_bytes=1 << 16)
    for _ in loader:
        pass
    first = loader.metrics()
    assert first["requests_per_s"] > 0 and 0 < first["cache_hit_rate"] < 1  # blocks fetched, then read from the cache
    shards = sum(p.stat().st_size for p in (tmp_path / "s").glob("*.tar"))
    read = loader.encoded.stats.fetch.bytes  # the workers' storage bytes reach the loader too
    assert read >= shards > loader.encoded.stats.bytes and first["read_bytes_per_s"] > first["bytes_per_s"] > 0
    for _ in loader:
        pass
    assert loader.metrics()["cache_hit_rate"] == 1.0 and loader.encoded.stats.fetch.requests == 2
