"""Shared pytest fixtures.

Jobs of several processes (gloo ranks, torchrun, Lightning's DDP launcher, a training killed
and resumed) run one at a time under pytest-xdist: ``one_job_at_a_time`` (``job_turn`` in a
module-scoped fixture).

Devices: ``device`` runs a test on the CPU and, where CUDA is present, on the GPU
(that case is marked ``gpu``; it skips cleanly without CUDA).

Object storage: one loopback moto S3 server per session (``s3_server``; one per worker under
pytest-xdist, each on a free port), a fresh
bucket per test (``s3_bucket``), fault-injecting proxies in front of the server
(``s3_proxy``) and a bucket behind IAM checks (``s3_auth_bucket``). The helpers
behind them live in ``s3util.py`` and ``fault_proxy.py``.

gpupipe vs torchvision: the ``vs_torchvision`` record and the two tables printed at the end
of the run live in ``tv_report.py``, a plugin registered here so that its hooks run in the
process that prints the summary (the controller, under pytest-xdist).
"""
from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning. Set before torch is imported (libgomp reads it once, when it
# loads) and inherited by every process a test starts. With two xdist workers on two cores, each with torch's
# two threads, spinning threads took the cores the other worker (or a test's subprocesses) needed: tests/augment
# on 2 workers took 30-32 s (51-53 s of CPU) and takes 25 s (41 s) with this, back to back on a quiet machine;
# in one process it made no difference there, and saved 55 -> 33 s on a busy one. It changes how threads wait,
# not how many there are or what they compute.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import s3util
import torch
from fault_proxy import FaultProxy
from gloo_ranks import exclusive
from tvshim import import_torchvision

pytest_plugins = ["tv_report"]

import_torchvision()  # once, before any test module imports it (tvshim.py says why)

# ---------------------------------------------------------------- devices


@pytest.fixture(autouse=True)
def _scan_memo_per_test() -> Iterator[None]:
    """Each test starts with this process's memo of scanned local shards empty
    (gpupipe.stream.memo): a test that counts scans, or damages a shard another test read, sees its
    own reads only. Tests of the memo itself read a source more than once."""
    from gpupipe.stream.memo import SCANNED

    SCANNED.clear()
    yield


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])])
def device(request) -> torch.device:
    return torch.device(request.param)


# ---------------------------------------------------------------- jobs of several processes


@pytest.fixture(scope="session")
def job_turn(tmp_path_factory: pytest.TempPathFactory) -> Callable[[], contextlib.AbstractContextManager[None]]:
    """``with job_turn():`` around a job of several processes. Under pytest-xdist (``make test``)
    the workers take turns through an exclusive lock on a file in the folder they share (the
    parent of each one's basetemp), so two such jobs never compete for the cores and no starved
    rank meets its process group's 20-60 s join timeout, while the rest of the suite goes on
    beside them on the other workers. In a single pytest process it holds nothing."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return contextlib.nullcontext
    return functools.partial(exclusive, tmp_path_factory.getbasetemp().parent / "jobs.lock")


@pytest.fixture
def one_job_at_a_time(job_turn: Callable[[], contextlib.AbstractContextManager[None]]) -> Iterator[None]:
    """The whole test in ``job_turn()``: ``@pytest.mark.usefixtures("one_job_at_a_time")``."""
    with job_turn():
        yield


# ---------------------------------------------------------------- object storage


@pytest.fixture
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake AWS credentials in the environment for this test only; no profile, no IMDS."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3util.FAKE_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3util.FAKE_SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", s3util.REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE",
                 "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """Endpoint URL (``http://127.0.0.1:<port>``) of a moto S3 server shared by the session.

    It needs no credentials itself; tests whose code reads them from the
    environment request ``aws_credentials`` (``s3_bucket`` does).
    """
    server, endpoint = s3util.start_moto_server()
    yield endpoint
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: str, aws_credentials: None) -> Iterator[s3util.S3Bucket]:
    """A fresh, empty bucket (``.name``, ``.endpoint``, ``.storage_options``,
    ``.url(path)``, ``.fs()``); its objects and the bucket are deleted afterwards."""
    bucket = s3util.create_bucket(s3_server)
    yield bucket
    s3util.delete_bucket(bucket)


@pytest.fixture
def s3_proxy(s3_server: str, monkeypatch: pytest.MonkeyPatch
             ) -> Iterator[Callable[..., FaultProxy]]:
    """A factory ``make(**FaultProxy kwargs) -> FaultProxy``, started in front of
    ``s3_server`` and stopped at teardown. Use ``s3util.storage_options_via(proxy,
    bucket)`` to reach a bucket through it. While it is in use s3fs makes one
    attempt per call (``S3FileSystem.retries = 1``), so faults reach the code under test.
    """
    s3util.single_attempt_s3fs(monkeypatch)
    proxies: list[FaultProxy] = []

    def make(**kwargs) -> FaultProxy:
        proxies.append(FaultProxy(s3_server, **kwargs).start())
        return proxies[-1]

    yield make
    for proxy in proxies:
        proxy.stop()


@pytest.fixture
def s3_auth_bucket(s3_bucket: s3util.S3Bucket) -> Iterator[s3util.S3Bucket]:
    """``s3_bucket`` with the server checking signatures and IAM policies for this test.

    Its ``key``/``secret`` are those of an IAM user allowed ``s3:*``; with
    ``dataclasses.replace(bucket, secret="wrong")`` (SignatureDoesNotMatch) or
    ``key="testing"`` (InvalidAccessKeyId) s3fs raises ``PermissionError``.
    """
    user, key, secret = s3util.create_iam_user(s3_bucket.endpoint)
    try:
        with s3util.iam_enforced(s3_bucket.endpoint):
            yield dataclasses.replace(s3_bucket, key=key, secret=secret)
    finally:
        s3util.delete_iam_user(s3_bucket.endpoint, user)


@pytest.fixture
def train_steps() -> Callable[[Any], torch.Tensor]:
    """Train a linear classifier on every batch of a loader (images 3x4x4, 2 classes) as a user's loop
    does; the last loss. For the plugin tests: a plugin's data goes all the way to a gradient step."""
    def train(loader: Any) -> torch.Tensor:
        model = torch.nn.Linear(3 * 4 * 4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = torch.tensor(float("nan"))
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images.flatten(1).float() / 255), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return loss
    return train
