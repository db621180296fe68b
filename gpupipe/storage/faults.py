"""What a failed storage request means: retry it, or stop at once and say what to set.

:func:`classify` reads an exception from any fsspec backend (s3fs/botocore, aiohttp,
local files) — its type, HTTP status, error code and the chain of exceptions under it —
and names the :class:`Fault`. :func:`storage_error` turns it into the ``StorageError``
subclass a user sees: the URL, what went wrong and the variable or storage option that
fixes it. Nothing here retries or sleeps; :class:`gpupipe.storage.fetch.Fetcher` decides that.
Exception texts from the backends carry no secrets; storage options are never read here.
"""
from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Iterator
from enum import Enum

from gpupipe.core.errors import StorageAuthError, StorageEndpointError, StorageError, StorageNotFoundError

__all__ = ["Fault", "classify", "storage_error", "from_backend", "CONNECT_TIMEOUT_S"]

CONNECT_TIMEOUT_S = 3.0  # default for s3:// (botocore's own is 60 s); see gpupipe.storage.fetch.open_filesystem

_BACKENDS = ("aiohttp", "botocore", "aiobotocore", "asyncio", "fsspec", "requests", "urllib3", "s3fs", "gcsfs",
             "adlfs", "google")
_CREDENTIAL_TYPES = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                     "DefaultCredentialsError")
_DENIED_CODES = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                 "InvalidToken")
_UNREACHABLE = (errno.ENETUNREACH, errno.EHOSTUNREACH)


class Fault(Enum):
    """Kinds of failure, each with whether a retry can help."""

    CREDENTIALS = "no credentials found"
    DENIED = "access denied"
    NO_BUCKET = "no such bucket"
    NOT_FOUND = "not found"
    HOST_NAME = "cannot resolve the host name"
    REFUSED = "connection refused"
    UNREACHABLE = "network unreachable"
    CONNECT_TIMEOUT = "no connection within the connect timeout"
    TRANSIENT = "transient error"
    OTHER = "unexpected error"

    @property
    def transient(self) -> bool:
        """Worth retrying (an endpoint fault may be too, once the endpoint has answered)."""
        return self in (Fault.TRANSIENT, Fault.CONNECT_TIMEOUT)

    @property
    def endpoint(self) -> bool:
        """The endpoint could not be reached at all (wrong address, or down)."""
        return self in (Fault.HOST_NAME, Fault.REFUSED, Fault.UNREACHABLE, Fault.CONNECT_TIMEOUT)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what caused it (``__cause__``/``__context__``, aiohttp's ``os_error``)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo and len(seen) < 12:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, getattr(e, "os_error", None)]


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None) or getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


def classify(exc: BaseException) -> Fault:
    """The :class:`Fault` behind ``exc`` (the first telling exception of its chain wins)."""
    chain = list(_chain(exc))
    for e in chain:  # a root cause that no retry fixes wins (fsspec's http raises FileNotFoundError over a refusal)
        fault = _root_cause(e)
        if fault is not None:
            return fault
    for e in chain:
        fault = _classify_one(e)
        if fault is not None:
            return fault
    module = (type(exc).__module__ or "").split(".")[0]
    if isinstance(exc, (OSError, TimeoutError, ConnectionError)) or module in _BACKENDS:
        return Fault.TRANSIENT
    return Fault.OTHER  # a bug: not retried


def _root_cause(e: BaseException) -> Fault | None:
    """Missing credentials, or an endpoint that cannot be reached."""
    name = type(e).__name__
    if name in _CREDENTIAL_TYPES:
        return Fault.CREDENTIALS
    if isinstance(e, socket.gaierror) or name == "ClientConnectorDNSError":
        return Fault.HOST_NAME
    if isinstance(e, ConnectionRefusedError) or (isinstance(e, OSError) and e.errno == errno.ECONNREFUSED):
        return Fault.REFUSED
    if isinstance(e, OSError) and e.errno in _UNREACHABLE:
        return Fault.UNREACHABLE
    if "ConnectTimeout" in name or "ConnectionTimeout" in name:
        return Fault.CONNECT_TIMEOUT
    return None


def _classify_one(e: BaseException) -> Fault | None:
    name, text = type(e).__name__, str(e)
    if "NoSuchBucket" in name or "NoSuchBucket" in text or "bucket does not exist" in text.lower():
        return Fault.NO_BUCKET
    if isinstance(e, PermissionError) or any(code in text for code in _DENIED_CODES):
        return Fault.DENIED
    if isinstance(e, (FileNotFoundError, IsADirectoryError, NotADirectoryError)) or "NoSuchKey" in text:
        return Fault.NOT_FOUND
    status = _status(e)
    if status in (401, 403):
        return Fault.DENIED
    if status == 404:
        return Fault.NOT_FOUND
    if status is not None:
        return Fault.TRANSIENT if status == 429 or status >= 500 else Fault.OTHER
    return None


def from_backend(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) was raised by a storage client library."""
    return any((type(e).__module__ or "").split(".")[0] in _BACKENDS and not isinstance(e, asyncio.CancelledError)
               for e in _chain(exc))


def storage_error(exc: BaseException, url: str, *, fault: Fault | None = None, attempts: int = 1) -> StorageError:
    """The ``StorageError`` (subclass by fault) for ``exc`` on ``url``: what failed and what to do."""
    fault = fault or classify(exc)
    cause = f"{type(exc).__name__}: {exc}"
    if attempts > 1:
        message = f"gave up after {attempts} attempts; last error {cause}"
    elif fault in (Fault.TRANSIENT, Fault.OTHER, Fault.NOT_FOUND):
        message = cause
    else:
        message = f"{fault.value} ({cause})"
    hint = _hint(fault, url, s3=any(type(e).__module__.startswith(("botocore", "aiobotocore", "s3fs"))
                                    for e in _chain(exc)))
    kind = {Fault.CREDENTIALS: StorageAuthError, Fault.DENIED: StorageAuthError, Fault.NO_BUCKET: StorageNotFoundError,
            Fault.NOT_FOUND: StorageNotFoundError}.get(fault, StorageEndpointError if fault.endpoint else StorageError)
    return kind(f"{message}; {hint}" if hint else message, url=url)


def _hint(fault: Fault, url: str, *, s3: bool) -> str:
    """What to check or set; ``s3``: the failure came from botocore/s3fs."""
    protocol = url.split("://", 1)[0] if "://" in url else ""
    s3 = s3 or protocol in ("s3", "s3a")
    if fault is Fault.CREDENTIALS:
        if s3:
            return ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or storage_options key and "
                    "secret (CLI: --storage-option key=... --storage-option secret=...); "
                    "for a public bucket set storage_options anon: true")
        if protocol in ("gs", "gcs"):
            return "set GOOGLE_APPLICATION_CREDENTIALS, or storage_options token (token: anon for a public bucket)"
        return "give the credentials in storage_options"
    if fault is Fault.DENIED:
        who = "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or storage_options key/secret" if s3 else "the credentials"
        return f"check {who}, and that they may access this bucket and path"
    if fault is Fault.NO_BUCKET:
        return "check the bucket name in the URL" + (" and storage_options endpoint_url" if s3 else "")
    if fault.endpoint:
        where = "storage_options endpoint_url (or AWS_ENDPOINT_URL)" if s3 else "the host and port in the URL"
        wait = (f"; the connect timeout is storage_options config_kwargs.connect_timeout "
                f"({CONNECT_TIMEOUT_S:g} s by default)" if s3 and fault is Fault.CONNECT_TIMEOUT else "")
        return f"check {where} and that the storage server is up and reachable from here{wait}"
    return ""
