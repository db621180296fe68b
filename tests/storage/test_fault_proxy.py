"""Tests of the object-storage test infrastructure itself, through real s3fs.

They also pin down what each injected fault looks like to s3fs (with botocore
and s3fs retries off), which is what gpupipe's storage layer has to handle:

=========  ===========================================================
slowdown   ``OSError(errno.EBUSY)`` — s3fs's translation of ``SlowDown``
error500   ``OSError(errno.EREMOTEIO)`` — s3fs's translation of a 500
reset      ``botocore.exceptions.EndpointConnectionError``; aiohttp first
           resends the idempotent GET once on its own, so two resets
truncate   ``aiohttp.ClientPayloadError`` — never silently short bytes
stall      ``botocore.exceptions.ReadTimeoutError`` after the read timeout
=========  ===========================================================
"""
from __future__ import annotations

import dataclasses
import errno
import http.client
import pickle
import threading
import time

import aiohttp
import botocore.exceptions
import pytest
import s3fs
from fault_proxy import FAULTS, FaultProxy
from s3util import storage_options_via

PAYLOAD = bytes(range(256)) * 64  # 16 KiB

# What a one-attempt ranged read raises for each fault, and how many faults it took.
EXPECTED = {
    "slowdown": (OSError, 1),
    "error500": (OSError, 1),
    "reset": (botocore.exceptions.EndpointConnectionError, 2),
    "truncate": (aiohttp.ClientPayloadError, 1),
    "stall": (botocore.exceptions.ReadTimeoutError, 1),
}


def via(proxy, bucket, *, timeout_s: float = 2.0) -> s3fs.S3FileSystem:
    """A fresh S3FileSystem that reaches ``bucket`` through ``proxy``."""
    return s3fs.S3FileSystem(skip_instance_cache=True,
                             **storage_options_via(proxy, bucket, timeout_s=timeout_s))


def test_clean_proxy_passes_everything_through(s3_bucket, s3_proxy):
    direct = s3_bucket.fs()
    for i in range(3):
        direct.pipe_file(s3_bucket.url(f"shard-{i}.tar"), PAYLOAD[i:])
    proxy = s3_proxy(fault_rate=0.0)
    fs = via(proxy, s3_bucket)

    assert fs.cat_file(s3_bucket.url("shard-0.tar")) == PAYLOAD
    assert fs.cat_file(s3_bucket.url("shard-1.tar"), start=10, end=110) == PAYLOAD[11:111]
    assert fs.info(s3_bucket.url("shard-2.tar"))["size"] == len(PAYLOAD) - 2
    assert len(fs.ls(s3_bucket.name)) == 3
    fs.pipe_file(s3_bucket.url("written-via-proxy"), PAYLOAD)
    assert direct.cat_file(s3_bucket.url("written-via-proxy")) == PAYLOAD

    counts = dict(proxy.counts)
    assert counts["requests"] == counts["forwarded"] >= 6
    assert all(counts[fault] == 0 for fault in FAULTS)


def test_chunked_request_body_is_forwarded(s3_bucket, s3_proxy):
    proxy = s3_proxy()
    conn = http.client.HTTPConnection("127.0.0.1", int(proxy.url.rsplit(":", 1)[1]), timeout=5)
    conn.request("PUT", f"/{s3_bucket.name}/chunked", body=iter([b"abc", b"defg"]),
                 encode_chunked=True)
    assert conn.getresponse().status == 200
    conn.close()
    assert s3_bucket.fs().cat_file(s3_bucket.url("chunked")) == b"abcdefg"


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_fails_a_ranged_read(s3_bucket, s3_proxy, fault):
    s3_bucket.fs().pipe_file(s3_bucket.url("obj"), PAYLOAD)
    proxy = s3_proxy(fault_rate=1.0, faults=(fault,), stall_seconds=5.0)
    fs = via(proxy, s3_bucket, timeout_s=0.5)
    error_type, faults_seen = EXPECTED[fault]

    with pytest.raises(error_type) as caught:
        fs.cat_file(s3_bucket.url("obj"), start=0, end=4096)

    assert proxy.counts[fault] == faults_seen
    if fault in ("slowdown", "error500"):
        assert caught.value.errno == {"slowdown": errno.EBUSY, "error500": errno.EREMOTEIO}[fault]


def test_truncated_body_raises_on_buffered_reads_too(s3_bucket, s3_proxy):
    s3_bucket.fs().pipe_file(s3_bucket.url("obj"), PAYLOAD)
    proxy = s3_proxy(fault_rate=1.0, faults=("truncate",))
    with via(proxy, s3_bucket).open(s3_bucket.url("obj"), "rb", block_size=4096) as f:
        with pytest.raises(aiohttp.ClientPayloadError):
            f.read(1000)
    assert proxy.counts["truncate"] == 1


def test_faults_hit_only_the_chosen_methods(s3_bucket, s3_proxy):
    s3_bucket.fs().pipe_file(s3_bucket.url("obj"), PAYLOAD)
    proxy = s3_proxy(fault_rate=1.0, faults=("error500",), methods=("GET",))
    fs = via(proxy, s3_bucket)
    assert fs.info(s3_bucket.url("obj"))["size"] == len(PAYLOAD)  # HEAD passes
    with pytest.raises(OSError):
        fs.cat_file(s3_bucket.url("obj"), start=0, end=10)
    proxy.fault_rate = 0.0  # attributes may change while it runs
    assert fs.cat_file(s3_bucket.url("obj"), start=0, end=10) == PAYLOAD[:10]


def test_same_seed_same_faults():
    def draws(seed: int) -> list[str | None]:
        proxy = FaultProxy("http://127.0.0.1:1", fault_rate=0.5, seed=seed)
        return [proxy.draw_fault("GET") for _ in range(200)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)
    assert set(draws(7)) == {None, *FAULTS}


def test_latency_is_added_to_every_response(s3_bucket, s3_proxy):
    s3_bucket.fs().pipe_file(s3_bucket.url("obj"), PAYLOAD)
    fs = via(s3_proxy(latency_s=0.05), s3_bucket)
    started = time.monotonic()
    for i in range(10):
        assert fs.cat_file(s3_bucket.url("obj"), start=i, end=i + 1) == PAYLOAD[i:i + 1]
    assert time.monotonic() - started >= 0.5


def test_stop_is_prompt_with_a_stalled_request(s3_bucket, s3_proxy):
    proxy = s3_proxy(fault_rate=1.0, faults=("stall",), stall_seconds=60.0)
    threads_before = set(threading.enumerate())
    outcome: list[object] = []

    def stalled_get() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", int(proxy.url.rsplit(":", 1)[1]))
        try:
            conn.request("GET", f"/{s3_bucket.name}/obj")
            outcome.append(conn.getresponse().status)
        except (OSError, http.client.HTTPException) as exc:
            outcome.append(exc)

    client = threading.Thread(target=stalled_get, daemon=True)
    client.start()
    deadline = time.monotonic() + 5
    while proxy.counts["stall"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.counts["stall"] == 1

    started = time.monotonic()
    proxy.stop()
    assert time.monotonic() - started < 2.0
    client.join(timeout=2.0)
    assert isinstance(outcome[0], (OSError, http.client.HTTPException))
    leftovers = set(threading.enumerate()) - threads_before - {client}
    assert all(thread.daemon for thread in leftovers)


def test_wrong_credentials_raise_permission_error(s3_auth_bucket, s3_proxy):
    s3_auth_bucket.fs().pipe_file(s3_auth_bucket.url("obj"), PAYLOAD)
    assert via(s3_proxy(), s3_auth_bucket).cat_file(s3_auth_bucket.url("obj")) == PAYLOAD
    for bad in (dataclasses.replace(s3_auth_bucket, secret="wrong"),
                dataclasses.replace(s3_auth_bucket, key="testing", secret="testing")):
        with pytest.raises(PermissionError):
            bad.fs().cat_file(bad.url("obj"), start=0, end=10)
        with pytest.raises(PermissionError):
            bad.fs().ls(bad.name)


def test_bucket_is_plain_picklable_data(s3_bucket):
    clone = pickle.loads(pickle.dumps(s3_bucket))
    assert clone == s3_bucket
    assert clone.url("a/b.tar") == f"s3://{s3_bucket.name}/a/b.tar"
    assert clone.storage_options["endpoint_url"] == s3_bucket.endpoint
