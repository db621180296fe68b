"""A fault-injecting HTTP reverse proxy for object-storage tests.

:class:`FaultProxy` sits between an HTTP/1.1 keep-alive client (s3fs →
aiobotocore → aiohttp) and an upstream server (moto), all on 127.0.0.1. Every
request is forwarded unchanged — method, path and query, headers (the ``Host``
header too, because SigV4 signs it) and body. For requests whose method is in
``methods``, with probability ``fault_rate`` one fault from ``faults`` replaces
the normal answer:

``slowdown``  503 with the S3 ``SlowDown`` XML error (upstream not contacted).
``error500``  500 with the S3 ``InternalError`` XML error (upstream not contacted).
``reset``     the client socket is closed with a TCP RST, nothing answered.
``truncate``  the real response with its true ``Content-Length`` but only about
              half of the body, then the connection is closed.
``stall``     nothing for ``stall_seconds`` (cut short by :meth:`FaultProxy.stop`),
              then the connection is closed without an answer.

:data:`MORE_FAULTS` (opt in through ``faults``; the default stays :data:`FAULTS`):

``throttle``       429 ``TooManyRequests`` (upstream not contacted).
``reset_headers``  the real status line and headers, then a TCP RST instead of the body.
``drip``           the real response, its body sent ``drip_bytes`` at a time with
                   ``drip_interval_s`` between pieces (slow, but whole).
``flip``           the real response with one byte of the body XOR-ed with 0x01.
``replace``        for a path in ``alternates`` (``{"/bucket/key": bytes}``), this read
                   sees the replaced object: the asked range of the alternate bytes.
                   Other paths are forwarded untouched (and not counted).
``forbidden``      403 ``AccessDenied``; ``notfound`` 404 ``NoSuchKey`` (both fatal).

Faults are drawn from ``random.Random(seed)`` under a lock, so a single-threaded
client sees the same sequence of faults on every run. ``fault_rate``,
``faults`` and ``latency_s`` are plain attributes and may be changed while the
proxy runs. Only the standard library is used.
"""
from __future__ import annotations

import http.client
import random
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit
from xml.sax.saxutils import escape

__all__ = ["FAULTS", "MORE_FAULTS", "ALL_FAULTS", "RETRYABLE", "FATAL", "FaultProxy"]

FAULTS = ("slowdown", "error500", "reset", "truncate", "stall")
MORE_FAULTS = ("throttle", "reset_headers", "drip", "flip", "replace", "forbidden", "notfound")
ALL_FAULTS = FAULTS + MORE_FAULTS
FATAL = ("forbidden", "notfound")
RETRYABLE = tuple(f for f in ALL_FAULTS if f not in FATAL)

_S3_ERRORS = {
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "error500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "throttle": (429, "TooManyRequests", "Too many requests."),
    "forbidden": (403, "AccessDenied", "Access Denied"),
    "notfound": (404, "NoSuchKey", "The specified key does not exist."),
}
# Headers that describe one hop, not the message: never copied across the proxy.
_HOP_BY_HOP = frozenset(
    ["connection", "keep-alive", "proxy-connection", "te", "trailer",
     "transfer-encoding", "upgrade", "expect", "content-length"]
)
_UPSTREAM_TIMEOUT_S = 30.0


class FaultProxy:
    """A reverse proxy in front of ``upstream`` that injects faults; see the module doc.

    ``counts`` holds one counter per fault name plus ``"requests"`` (every request
    received), ``"method:GET"`` and the like per HTTP method, and ``"forwarded"``
    (every request sent upstream); it is updated under
    a lock, so take ``dict(proxy.counts)`` for a consistent snapshot.
    """

    def __init__(self, upstream: str, *, fault_rate: float = 0.0,
                 faults: tuple[str, ...] = FAULTS, seed: int = 0,
                 stall_seconds: float = 5.0, latency_s: float = 0.0,
                 methods: tuple[str, ...] = ("GET",), drip_bytes: int = 1024,
                 drip_interval_s: float = 0.002, alternates: dict[str, bytes] | None = None):
        unknown = set(faults) - set(ALL_FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; choose from {ALL_FAULTS}")
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream {upstream!r} must be an http://host:port URL")
        self.upstream = (parts.hostname, parts.port or 80)
        self.fault_rate = fault_rate
        self.faults = tuple(faults)
        self.stall_seconds = stall_seconds
        self.latency_s = latency_s
        self.methods = tuple(m.upper() for m in methods)
        self.drip_bytes, self.drip_interval_s = drip_bytes, drip_interval_s
        self.alternates = dict(alternates or {})
        self.counts: dict[str, int] = dict.fromkeys(("requests", "forwarded", *ALL_FAULTS), 0)
        self.first_at: dict[str, float] = {}
        self.url = ""
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> FaultProxy:
        """Listen on a free port of 127.0.0.1 and serve in a daemon thread."""
        self._stopping.clear()
        server = _Server(("127.0.0.1", 0), _Handler)
        server.proxy = self
        self._server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05},
            name=f"FaultProxy{server.server_address[1]}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, wake every handler (stalled or idle) and close all sockets."""
        if self._server is None:
            return
        self._stopping.set()
        self._server.shutdown()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its handler
        self._server.server_close()
        self._thread.join(timeout=2.0)
        self._server = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def count(self, name: str) -> None:
        """Add one to ``counts[name]`` (and note in ``first_at[name]`` the
        ``time.monotonic()`` of the first)."""
        with self._lock:
            self.counts[name] = self.counts.get(name, 0) + 1
            self.first_at.setdefault(name, time.monotonic())

    def draw_fault(self, method: str) -> str | None:
        """Return the fault for one request with ``method``, or None to forward it."""
        if method.upper() not in self.methods:
            return None
        with self._lock:
            hit = self._rng.random() < self.fault_rate
            return self._rng.choice(self.faults) if hit and self.faults else None

    def draw_position(self, n: int) -> int:
        """A position in ``range(n)`` from the proxy's seeded generator."""
        with self._lock:
            return self._rng.randrange(n)

    def sleep(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; return False when cut short by :meth:`stop`."""
        return seconds <= 0 or not self._stopping.wait(seconds)

    def track(self, conn: socket.socket, alive: bool) -> None:
        """Remember (``alive``) or forget an accepted client socket.

        A socket accepted while :meth:`stop` runs is shut down at once.
        """
        with self._lock:
            (self._connections.add if alive else self._connections.discard)(conn)
        if alive and self._stopping.is_set():
            conn.shutdown(socket.SHUT_RDWR)

    def forward(self, method: str, path: str, headers: list[tuple[str, str]],
                body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        """Send one request upstream on a fresh connection; return status, reason, headers, body."""
        conn = http.client.HTTPConnection(*self.upstream, timeout=_UPSTREAM_TIMEOUT_S)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                conn.putheader(name, value)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            response = conn.getresponse()
            payload = response.read()
            return response.status, response.reason, response.getheaders(), payload
        finally:
            conn.close()


class _Server(ThreadingHTTPServer):
    """One daemon thread per client connection; a deep accept queue for bursts."""

    daemon_threads = True
    request_queue_size = 128
    proxy: FaultProxy


class _Handler(BaseHTTPRequestHandler):
    """Serves one client connection: a keep-alive loop of proxied requests."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.proxy.track(self.connection, alive=True)

    def finish(self) -> None:
        self.server.proxy.track(self.connection, alive=False)
        try:
            super().finish()
        except OSError:
            pass  # the socket was reset on purpose or shut down by stop()

    def log_message(self, format: str, *args: object) -> None:
        """Keep test output quiet."""

    def do_GET(self) -> None:
        """Proxy one request (every method goes through here), maybe injecting a fault."""
        self._proxy_one()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = do_GET

    def _proxy_one(self) -> None:
        proxy = self.server.proxy
        proxy.count("requests")
        proxy.count(f"method:{self.command}")
        body = self._read_body()
        fault = proxy.draw_fault(self.command)
        if not proxy.sleep(proxy.latency_s):
            self.close_connection = True
            return
        if fault == "replace" and self.path.split("?", 1)[0] not in proxy.alternates:
            fault = None  # nothing to replace this object with
        if fault is not None:
            proxy.count(fault)
        if fault in _S3_ERRORS:
            self._send_s3_error(*_S3_ERRORS[fault])
        elif fault == "reset":
            self._reset()
        elif fault == "stall":
            proxy.sleep(proxy.stall_seconds)
            self.close_connection = True
        elif fault == "replace":
            self._send_alternate(proxy.alternates[self.path.split("?", 1)[0]])
        else:
            self._forward(body, fault=fault)

    def _read_body(self) -> bytes:
        """Read the request body, framed by Content-Length or chunked encoding."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _forward(self, body: bytes, *, fault: str | None) -> None:
        proxy = self.server.proxy
        truncate = fault == "truncate"
        headers = [(k, v) for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP]
        try:
            status, reason, out_headers, payload = proxy.forward(
                self.command, self.path, headers, body)
        except (OSError, http.client.HTTPException) as exc:
            self._send_s3_error(502, "BadGateway", f"upstream {proxy.upstream}: {exc!r}")
            return
        proxy.count("forwarded")
        self.send_response_only(status, reason)
        for name, value in out_headers:
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        if self.command == "HEAD" or status in (204, 304):
            length = dict((k.lower(), v) for k, v in out_headers).get("content-length")
            if length is not None:
                self.send_header("Content-Length", length)
            self.end_headers()
            self.close_connection = truncate  # no body to cut short
            return
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if fault == "reset_headers":
            self.wfile.flush()
            self._reset()
        elif fault == "drip":
            self._drip(payload)
        elif fault == "flip" and payload:
            at = proxy.draw_position(len(payload))
            self.wfile.write(payload[:at] + bytes([payload[at] ^ 0x01]) + payload[at + 1:])
        else:
            self.wfile.write(payload[: len(payload) // 2] if truncate else payload)
        if truncate:
            self.close_connection = True

    def _drip(self, payload: bytes) -> None:
        proxy = self.server.proxy
        for at in range(0, len(payload), proxy.drip_bytes):
            self.wfile.write(payload[at:at + proxy.drip_bytes])
            self.wfile.flush()
            if not proxy.sleep(proxy.drip_interval_s):
                self.close_connection = True
                return

    def _send_alternate(self, data: bytes) -> None:
        """Answer a GET from ``data`` (the replaced object), honouring a ``bytes=a-b`` Range."""
        first, last = 0, len(data) - 1
        spec = self.headers.get("Range", "")
        if spec.startswith("bytes="):
            a, _, b = spec[6:].partition("-")
            first, last = int(a or 0), min(int(b) if b else len(data) - 1, len(data) - 1)
        part = data[first:last + 1]
        self.send_response_only(206 if spec else 200)
        if spec:
            self.send_header("Content-Range", f"bytes {first}-{first + len(part) - 1}/{len(data)}")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        self.wfile.write(part)

    def _send_s3_error(self, status: int, code: str, message: str) -> None:
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>{escape(message)}</Message><RequestId>fault-proxy</RequestId>"
                f"</Error>").encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _reset(self) -> None:
        """Close the client socket with SO_LINGER (on, 0 s): the kernel sends RST, not FIN."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.rfile.close()  # drop makefile()'s reference so close() really closes the fd
        self.connection.close()
        self.close_connection = True
