"""Helpers for tests against a loopback moto S3 server (fixtures live in conftest.py).

Bad credentials in moto server mode
-----------------------------------
moto accepts any credentials until IAM checks are switched on. The switch is
``settings.INITIAL_NO_AUTH_ACTION_COUNT`` (environment variable of the same name,
read once at import): after that many requests every request must be signed by
an access key that exists in moto's IAM and whose policies allow the action.
``moto.core.set_initial_no_auth_action_count`` is a decorator for the in-memory
mock, not for a running server; for a server, including the in-process
``ThreadedMotoServer``, the way is ``POST /moto-api/reset-auth`` with the count
as the body — ``0`` turns checks on for every following request, ``inf`` turns
them off again (see :func:`iam_enforced`). With checks on, through s3fs:

* an unknown access key (the default ``testing``) → ``InvalidAccessKeyId`` (403);
* a known key with the wrong secret → ``SignatureDoesNotMatch`` (403);
* a known key whose policy does not allow the action → ``AccessDenied`` (403);

and s3fs turns all three into ``PermissionError``. The switch is global to the
server, so only one test at a time may hold it: tests in one process run in
sequence, and pytest-xdist workers each start their own server.
"""
from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "FAKE_KEY",
    "FAKE_SECRET",
    "REGION",
    "S3Bucket",
    "create_bucket",
    "create_iam_user",
    "delete_bucket",
    "delete_iam_user",
    "iam_enforced",
    "single_attempt_s3fs",
    "start_moto_server",
    "storage_options_via",
]

FAKE_KEY = "testing"
FAKE_SECRET = "testing"
REGION = "us-east-1"

_bucket_numbers = itertools.count(1)
_user_numbers = itertools.count(1)


@dataclass(frozen=True)
class S3Bucket:
    """A bucket on the test server and the credentials to reach it.

    Plain data, safe to pickle. ``dataclasses.replace(bucket, secret="wrong")``
    gives the same bucket with bad credentials.
    """

    name: str
    endpoint: str
    key: str = FAKE_KEY
    secret: str = FAKE_SECRET

    @property
    def storage_options(self) -> dict[str, Any]:
        """s3fs storage options for this bucket, talking to the server directly."""
        return {"endpoint_url": self.endpoint, "key": self.key, "secret": self.secret,
                "client_kwargs": {"region_name": REGION}}

    def url(self, path: str = "") -> str:
        """``s3://<bucket>/<path>``."""
        return f"s3://{self.name}/{path.lstrip('/')}"

    def fs(self):
        """A fresh, uncached ``s3fs.S3FileSystem`` for :attr:`storage_options`."""
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options)


def storage_options_via(proxy, bucket: S3Bucket, *, timeout_s: float = 2.0) -> dict[str, Any]:
    """s3fs storage options that reach ``bucket`` through ``proxy`` (a started FaultProxy).

    botocore makes one attempt per call, so every injected fault reaches s3fs.
    (``total_max_attempts`` counts the first attempt; botocore's ``max_attempts``
    counts only retries, so ``max_attempts: 1`` would mean two attempts.)
    ``timeout_s`` is both the connect and the read timeout. s3fs's own retry loop
    (``S3FileSystem.retries``, 5 by default: timeouts, short bodies and SlowDown)
    is a class attribute, not a constructor argument — s3fs hands unknown keywords
    to ``AioSession``, which rejects ``retries`` — so it cannot travel in storage
    options; the ``s3_proxy`` fixture sets it to 1 for the test instead
    (:func:`single_attempt_s3fs`).
    """
    return {
        **bucket.storage_options,
        "endpoint_url": proxy.url,
        "config_kwargs": {"retries": {"total_max_attempts": 1, "mode": "standard"},
                          "connect_timeout": timeout_s, "read_timeout": timeout_s},
    }


def single_attempt_s3fs(monkeypatch) -> None:
    """Make every ``S3FileSystem`` (made now or later, in this process) try each call once.

    Forked worker processes inherit the setting; spawned ones do not.
    """
    import s3fs

    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)


def start_moto_server():
    """Start moto's ThreadedMotoServer on a free port of 127.0.0.1; return (server, endpoint)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


@contextlib.contextmanager
def folder_on_s3(folder: str, prefix: str = "ds") -> Iterator[tuple[S3Bucket, str]]:
    """A moto server on loopback holding every file of ``folder`` under ``prefix/`` of a new
    bucket (fake credentials in the environment, as botocore wants some): (bucket, endpoint).
    For the benchmarks that read a data set from object storage."""
    from pathlib import Path

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    server, endpoint = start_moto_server()
    try:
        bucket = create_bucket(endpoint)
        fs = bucket.fs()
        for f in sorted(Path(folder).iterdir()):
            fs.pipe_file(f"{bucket.name}/{prefix}/{f.name}", f.read_bytes())
        yield bucket, endpoint
    finally:
        server.stop()


def _client(service: str, endpoint: str, key: str = FAKE_KEY, secret: str = FAKE_SECRET):
    import boto3

    return boto3.client(service, endpoint_url=endpoint, region_name=REGION,
                        aws_access_key_id=key, aws_secret_access_key=secret)


def create_bucket(endpoint: str) -> S3Bucket:
    """Create a bucket with a fresh name (``gpupipe-test-0001``, …) on the server."""
    name = f"gpupipe-test-{next(_bucket_numbers):04d}"
    _client("s3", endpoint).create_bucket(Bucket=name)
    return S3Bucket(name=name, endpoint=endpoint)


def delete_bucket(bucket: S3Bucket) -> None:
    """Delete every object, unfinished multipart upload and then the bucket itself."""
    s3 = _client("s3", bucket.endpoint)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket.name):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            s3.delete_objects(Bucket=bucket.name, Delete={"Objects": keys})
    uploads = s3.list_multipart_uploads(Bucket=bucket.name).get("Uploads", [])
    for upload in uploads:
        s3.abort_multipart_upload(Bucket=bucket.name, Key=upload["Key"],
                                  UploadId=upload["UploadId"])
    s3.delete_bucket(Bucket=bucket.name)


def create_iam_user(endpoint: str, actions: str = "s3:*") -> tuple[str, str, str]:
    """Create an IAM user allowed ``actions`` on every resource; return (user, key, secret).

    Call it while IAM checks are off (the fake key is not an IAM key).
    """
    iam = _client("iam", endpoint)
    user = f"gpupipe-test-user-{next(_user_numbers):04d}"
    iam.create_user(UserName=user)
    policy = {"Version": "2012-10-17",
              "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}
    iam.put_user_policy(UserName=user, PolicyName="allow", PolicyDocument=json.dumps(policy))
    created = iam.create_access_key(UserName=user)["AccessKey"]
    return user, created["AccessKeyId"], created["SecretAccessKey"]


def delete_iam_user(endpoint: str, user: str) -> None:
    """Delete a user made by :func:`create_iam_user` (IAM checks must be off)."""
    iam = _client("iam", endpoint)
    for key in iam.list_access_keys(UserName=user)["AccessKeyMetadata"]:
        iam.delete_access_key(UserName=user, AccessKeyId=key["AccessKeyId"])
    iam.delete_user_policy(UserName=user, PolicyName="allow")
    iam.delete_user(UserName=user)


def _reset_auth(endpoint: str, count: str) -> None:
    """POST ``count`` to moto's ``/moto-api/reset-auth`` (no proxy, whatever the environment)."""
    parts = urlsplit(endpoint)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("POST", "/moto-api/reset-auth", body=count.encode())
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"{endpoint}/moto-api/reset-auth answered {response.status}: "
                               f"{response.read()!r}")
    finally:
        conn.close()


@contextlib.contextmanager
def iam_enforced(endpoint: str) -> Iterator[None]:
    """Within the block, the server checks every request's signature and IAM policy."""
    _reset_auth(endpoint, "0")
    try:
        yield
    finally:
        _reset_auth(endpoint, "inf")
