"""Stages that overlap: one thread per stage, bounded queues between them.

``GpuLoader`` runs two: *decode* (encoded batches from the workers → decoded images)
and *augment* (decoded → augmented). While batch N is augmented, batch N+1 is decoded,
and both run while the training step uses batch N-1. Each queue holds one batch, the
last one ``prefetch`` batches, so memory stays bounded and a slow consumer stops the
stages instead of piling batches up.

An exception in a stage travels down the queues as an item and is raised in the
consumer, with its traceback. :meth:`Stages.stop` ends every thread: it is called by
the consumer's ``finally`` and, for an iteration an exception in the training loop
left suspended, when the interpreter shuts down (:func:`_stop_live`) — a thread
still inside a DALI or torch call at teardown would abort the process
("terminate called without an active exception").
"""
from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gpupipe.core.machine import limit_this_threads_intraop

__all__ = ["END", "Stage", "Stages"]

log = logging.getLogger(__name__)
END = object()  # the last item of an iteration
_JOIN_TIMEOUT_S = 30.0


@dataclass
class Stage:
    """One thread's job: ``run(item) -> item``; ``busy_s`` sums the seconds it worked, and
    ``spans`` (when ``timeline`` is on) holds each item's (start, end) ``perf_counter``.
    ``threads``: torch intra-op threads in this stage's thread (None: torch's default;
    ``GpuLoader.augment_threads``, docs/tuning.md)."""

    name: str
    run: Callable[[Any], Any]
    busy_s: float = 0.0
    timeline: bool = False
    threads: int | None = None
    # the first stage only: a function from the source's iterator to this stage's results, for a
    # stage that works ahead (a decoder fed one batch ahead); ``run`` is then not used
    flow: Callable[[Iterator[Any]], Iterator[Any]] | None = None

    def __post_init__(self) -> None:
        if self.threads is not None and int(self.threads) < 1:
            raise ValueError(f"stage {self.name!r}: threads={self.threads!r}; use 1 or more, or None for torch's "
                             "default (GpuLoader.augment_threads)")
    spans: list[tuple[float, float]] = field(default_factory=list)

    def __call__(self, item: Any) -> Any:
        t0 = time.perf_counter()
        out = self.run(item)
        t1 = time.perf_counter()
        self.busy_s += t1 - t0
        if self.timeline:
            self.spans.append((t0, t1))
        return out


class Stages:
    """``source`` (an iterator, read in the first stage's thread) through ``stages``, each in
    its own thread; :meth:`get` returns the results in order, then :data:`END`."""

    def __init__(self, source: Callable[[], Iterator[Any]], stages: list[Stage], prefetch: int,
                 name: str = "gpupipe") -> None:
        _hook_interpreter_exit()
        self.event = threading.Event()
        self.queues: list[queue.Queue[Any]] = [queue.Queue(maxsize=1) for _ in stages[:-1]] + [
            queue.Queue(maxsize=prefetch)]
        self.wait_source_s = 0.0  # the first stage waiting for its source (the workers)
        inputs: list[queue.Queue[Any] | None] = [None, *self.queues[:-1]]
        self.threads = [threading.Thread(target=self._loop, args=(stage, inputs[i], self.queues[i], source),
                                         daemon=True, name=f"{name}-{stage.name}") for i, stage in enumerate(stages)]
        _LIVE.add(self)
        for t in self.threads:
            t.start()

    def get(self) -> Any:
        """The next result (or :data:`END`); raises instead of waiting forever if a stage
        thread died without a word."""
        while True:
            try:
                return self.queues[-1].get(timeout=1.0)
            except queue.Empty:
                if not any(t.is_alive() for t in self.threads) and self.queues[-1].empty():
                    raise RuntimeError("gpupipe: the decode threads ended without finishing the epoch "
                                       "(see the log)") from None

    def stop(self, timeout_s: float = _JOIN_TIMEOUT_S) -> None:
        """Ask every thread to stop, unblock the ones waiting to put, and wait for them."""
        self.event.set()
        deadline = time.monotonic() + timeout_s
        while any(t.is_alive() for t in self.threads) and time.monotonic() < deadline:
            for q in self.queues:
                try:
                    q.get(timeout=0.02)
                except queue.Empty:
                    pass
        if any(t.is_alive() for t in self.threads):
            log.warning("gpupipe: a stage thread did not stop within %.0f s; leaving it (daemon)", timeout_s)
        _LIVE.discard(self)

    # -- the threads ---------------------------------------------------------------------------
    def _loop(self, stage: Stage, inbox: queue.Queue | None, outbox: queue.Queue, source) -> None:
        limit_this_threads_intraop(stage.threads)
        if inbox is None:
            self._first(stage, outbox, source)
            return
        while not self.event.is_set():
            try:
                item = inbox.get(timeout=0.05)
            except queue.Empty:
                continue
            if item is not END and not isinstance(item, BaseException):
                try:
                    item = stage(item)
                except BaseException as exc:  # hand it on: the consumer raises it
                    item = exc
            if not self._put(outbox, item) or item is END or isinstance(item, BaseException):
                return

    def _first(self, stage: Stage, outbox: queue.Queue, source) -> None:
        items = source()
        flowing = stage.flow(self._waited(items)) if stage.flow is not None else None
        try:
            while not self.event.is_set():
                t0, waited = time.perf_counter(), self.wait_source_s
                if flowing is None:
                    item = next(items, END)
                    self.wait_source_s += time.perf_counter() - t0
                    if item is not END:
                        item = stage(item)
                else:
                    item = next(flowing, END)
                    t1 = time.perf_counter()
                    stage.busy_s += (t1 - t0) - (self.wait_source_s - waited)
                    if stage.timeline and item is not END:
                        stage.spans.append((t0, t1))
                if item is END:
                    break
                if not self._put(outbox, item):
                    return
            self._put(outbox, END)
        except BaseException as exc:  # hand it on: the consumer raises it
            self._put(outbox, exc)
        finally:
            for it in (flowing, items):
                close = getattr(it, "close", None)
                if close is not None:
                    close()

    def _waited(self, items: Iterator[Any]) -> Iterator[Any]:
        """``items``, adding the time spent waiting for each to :attr:`wait_source_s`."""
        while True:
            t0 = time.perf_counter()
            item = next(items, END)
            self.wait_source_s += time.perf_counter() - t0
            if item is END:
                return
            yield item

    def _put(self, q: queue.Queue, item: Any) -> bool:
        while not self.event.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False


_LIVE: weakref.WeakSet[Stages] = weakref.WeakSet()
_HOOKED = False


def _forget_in_child() -> None:
    """A forked child (a DataLoader worker is forked from the decode thread) inherits ``_LIVE``
    and the exit hook, but none of the threads: stopping them at its exit would wait for the
    forking thread, alive in the child, until the join timeout — and the parent, joining the
    worker, with it (5 s per pass, torch's join timeout). The parent's stages are not the child's."""
    _LIVE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _stop_live() -> None:
    for run in list(_LIVE):
        run.stop()


def _hook_interpreter_exit() -> None:
    """Run :func:`_stop_live` when the main thread ends, before ``atexit`` handlers (DALI's
    among them) and before daemon threads are frozen — the hook ``concurrent.futures`` uses."""
    global _HOOKED
    if not _HOOKED:
        register = getattr(threading, "_register_atexit", atexit.register)
        register(_stop_live)
        _HOOKED = True
