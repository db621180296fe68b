"""Decode in a child process, so that a native decoder's crash costs one batch, not the command.

``gpupipe validate`` decodes every image with the backend training would use. A native
decoder (DALI, nvJPEG) that dies by a signal inside its C++ code takes its process with
it: no exception, no message, exit 139. The header gate (:mod:`gpupipe.decode.gate`) keeps
the known crashers away from them, but what the gate cannot see (a decoder bug on data
that looks well-formed) could still kill a process. So :class:`ChildDecoder` runs the
decoder in a child process; when the child dies, :func:`contained_verdicts` names the
batch, narrows it down by halves -- each in a fresh child -- to the file(s) that kill the
decoder on their own, reports them as ``decoder crash``, and goes on with the rest.

:func:`verdicts` is the per-batch check itself (one decode of the batch; on failure each
image alone, so every bad one is named), used in the child and, for Pillow, in-process.
"""
from __future__ import annotations

import importlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from gpupipe.core.errors import DecodeError, GpupipeError

__all__ = ["ChildDecoder", "ChildDied", "Crash", "verdicts", "contained_verdicts", "FACTORY"]

log = logging.getLogger(__name__)

FACTORY = "gpupipe.decode:make_decoder"  # (config, device) -> Decoder, imported in the child by name
_POLL_S = 1.0  # how often a wait for the child checks that it is still alive


class ChildDied(GpupipeError):
    """The decoding child process died (a signal, or an exit without answering)."""

    def __init__(self, how: str):
        super().__init__(f"the decoding process died ({how})")
        self.how = how


@dataclass
class Crash:
    """One death of the decoding child: the keys of the batch it was decoding, how it died,
    and the keys it was narrowed to (empty when no part of the batch killed it again)."""

    keys: tuple[str, ...]
    how: str
    culprits: tuple[str, ...] = ()

    def describe(self) -> str:
        first, last = self.keys[0], self.keys[-1]
        batch = f"a batch of {len(self.keys)} ({first}{' .. ' + last if last != first else ''})"
        if not self.culprits:
            return f"the decoder died ({self.how}) on {batch}; no part of it killed it again (not narrowed)"
        return f"the decoder died ({self.how}) on {batch}; narrowed to {', '.join(self.culprits)}"


def verdicts(decoder, images: Sequence[tuple[str, bytes]]) -> list[str | None]:
    """Decode ``images`` ((key, bytes) each) as one batch; on failure each alone. Per image:
    None if it decodes, else why not (the backend's message; for a native backend, with
    Pillow's opinion of the same bytes)."""
    if not images:
        return []
    try:
        decoder.decode(_pack(images))
        return [None] * len(images)
    except DecodeError:
        pass
    out: list[str | None] = []
    for key, data in images:
        try:
            decoder.decode(_pack([(key, data)]))
            out.append(None)
        except DecodeError as exc:
            out.append(_reason(exc, data, decoder.name))
    return out


def _reason(exc: DecodeError, data: bytes, backend: str) -> str:
    """The decoder's message without the key it repeats; a native backend's says little, so
    Pillow's opinion of the same bytes is added."""
    reason = str(exc)
    if reason.startswith("cannot decode sample"):
        reason = reason.split(": ", 1)[-1]
    from gpupipe.decode import BACKENDS

    if not BACKENDS[backend].native:  # Pillow's own message (it is the opinion added to the others')
        return f"{backend}: {reason}"
    return f"{backend}: {reason} ({pillow_opinion(data)})"


def pillow_opinion(data: bytes) -> str:
    """"Pillow decodes it" or "Pillow: <its error>"."""
    from gpupipe.decode.pil import decode_one

    try:
        decode_one(data, None, None)
        return "Pillow decodes it"
    except Exception as exc:  # noqa: BLE001 — untrusted bytes: Pillow raises many kinds
        return f"Pillow: {type(exc).__name__}: {exc}"


def _pack(images: Sequence[tuple[str, bytes]]):
    from gpupipe.core.types import Sample
    from gpupipe.stream.batch import pack

    samples = [Sample(key=key, fields={"jpg": data}, shard="", offset=0, sample_id=i)
               for i, (key, data) in enumerate(images)]
    return pack(samples, [True] * len(samples))


def _serve(conn) -> None:
    """The child: build the decoder the first message names, then answer each batch with
    its :func:`verdicts`."""
    factory, config, device, path = conn.recv()
    sys.path[:] = path  # the parent's: its factory may live outside the installed packages
    module, attr = factory.split(":")
    try:
        decoder = getattr(importlib.import_module(module), attr)(config, device)
    except Exception as exc:  # noqa: BLE001 — goes back to the parent, which raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    if hasattr(getattr(decoder, "stats", None), "warn_stretched"):
        decoder.stats.warn_stretched = False  # validate's 8x8 decode stretches on purpose: no warning about it
    conn.send(("ready", f"{decoder.name} on {decoder.device}"))
    while (images := conn.recv()) is not None:
        try:
            conn.send(("ok", verdicts(decoder, images)))
        except Exception as exc:  # noqa: BLE001 — anything else a decoder raises goes back to the parent
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
    decoder.close()


class ChildDecoder:
    """A decoder that lives in a child process, started on first use and again after a death.

    The child is ``python -m gpupipe.tools.validate_child`` with two pipes of its own: a fresh
    interpreter that inherits nothing of this one's threads, DALI or CUDA state, and -- unlike
    multiprocessing's ``spawn`` -- never re-runs the caller's ``__main__`` (a script without a
    ``__name__`` guard, a notebook, stdin)."""

    def __init__(self, config, device: str = "cpu", factory: str | None = None):
        self.config, self.device, self.factory = config, str(device), factory or FACTORY
        self.describe = ""  # "dali on cpu", once the first child has said so
        self._process: subprocess.Popen | None = None  # the child and its pipes: both set, or neither
        self._conn: _Pair | None = None

    def verdicts(self, images: Sequence[tuple[str, bytes]]) -> list[str | None]:
        """:func:`verdicts` in the child; raises :class:`ChildDied` if the child dies meanwhile."""
        _, conn = self._start() if self._process is None else self._running()
        try:
            conn.send(list(images))
        except OSError:  # BrokenPipeError and the like: it died between two batches
            raise self._died() from None
        status, value = self._answer()
        if status == "error":
            raise DecodeError(f"the decoder raised {value}")
        return value

    def _running(self) -> tuple[subprocess.Popen, _Pair]:
        """The child and its pipes; :class:`ChildDied` when none runs (it died, or was closed)."""
        if self._process is None or self._conn is None:
            raise ChildDied("the decoding process is not running")
        return self._process, self._conn

    def _start(self) -> tuple[subprocess.Popen, _Pair]:
        from multiprocessing.connection import Connection

        down_r, down_w = os.pipe()  # parent -> child
        up_r, up_w = os.pipe()  # child -> parent
        process = subprocess.Popen([sys.executable, "-m", __name__, str(down_r), str(up_w)],
                                   pass_fds=(down_r, up_w), stdin=subprocess.DEVNULL)
        os.close(down_r)
        os.close(up_w)
        conn = _Pair(Connection(up_r, writable=False), Connection(down_w, readable=False))
        self._process, self._conn = process, conn
        try:
            conn.send((self.factory, self.config, self.device, list(sys.path)))
            status, value = self._answer()
        except (ChildDied, OSError) as exc:
            self.close()
            raise DecodeError(f"the decoding process could not start ({exc}); run the same command with "
                              "--decode pil to check the data without a native decoder") from None
        if status == "error":
            self.close()
            raise DecodeError(f"the decoder could not be built in its process: {value}")
        self.describe = value
        return process, conn

    def _answer(self):
        """The child's next message; :class:`ChildDied` if it dies before sending one."""
        process, conn = self._running()
        while True:
            try:
                if conn.poll(_POLL_S):
                    return conn.recv()
            except (EOFError, OSError):
                raise self._died() from None
            if process.poll() is not None:
                raise self._died()

    def _died(self) -> ChildDied:
        process, conn = self._running()
        code = process.wait()
        conn.close()
        self._process = self._conn = None
        if code < 0:
            return ChildDied(signal.Signals(-code).name)
        return ChildDied(f"exit code {code}")

    def close(self) -> None:
        if self._process is None or self._conn is None:
            return
        process, conn = self._process, self._conn
        try:
            conn.send(None)
        except OSError:
            pass
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        conn.close()
        self._process = self._conn = None


class _Pair:
    """One end of two one-way pipes, as one connection."""

    def __init__(self, reader, writer):
        self.reader, self.writer = reader, writer

    def send(self, obj) -> None:
        self.writer.send(obj)

    def recv(self):
        return self.reader.recv()

    def poll(self, timeout: float) -> bool:
        return self.reader.poll(timeout)

    def close(self) -> None:
        self.reader.close()
        self.writer.close()


def contained_verdicts(child: ChildDecoder, images: Sequence[tuple[str, bytes]],
                       crashes: list[Crash]) -> list[str | None]:
    """:meth:`ChildDecoder.verdicts`, surviving the child's death: the batch is named,
    narrowed by halves (each in a fresh child) to the images that kill the decoder alone,
    those get a ``decoder crash:`` verdict, and the rest their own. Each death at the top
    is recorded in ``crashes``."""
    try:
        return child.verdicts(images)
    except ChildDied as died:
        crash = Crash(tuple(k for k, _ in images), died.how)
        log.warning("the decoder died (%s) on a batch of %d (%s .. %s); narrowing it down to the file(s), each part "
                    "in a new process", died.how, len(images), images[0][0], images[-1][0])
        out = _narrow(child, list(images), died.how, crash)
        log.warning("%s", crash.describe())
        crashes.append(crash)
        return out


def _narrow(child: ChildDecoder, images: list[tuple[str, bytes]], how: str, crash: Crash) -> list[str | None]:
    """Verdicts for ``images``, which killed the child (``how``) as a whole."""
    if len(images) == 1:
        key, data = images[0]
        crash.culprits += (key,)
        return [f"decoder crash: the decoding process ({child.describe}) died ({how}) on this image alone "
                f"({pillow_opinion(data)})"]
    half = len(images) // 2
    out: list[str | None] = []
    for part in (images[:half], images[half:]):  # each in a fresh child when the last one died
        try:
            out += child.verdicts(part)
        except ChildDied as died:
            out += _narrow(child, part, died.how, crash)
    return out


if __name__ == "__main__":  # the child: python -m gpupipe.tools.validate_child READ_FD WRITE_FD
    from multiprocessing.connection import Connection

    _serve(_Pair(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False)))
