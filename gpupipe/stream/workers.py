"""Supervising the DataLoader worker processes of one iteration: start them safely,
notice one that died (and say which, and what it was reading), stop them promptly: a pass
ends when its work does, never on a poll or join timeout.

This is the one module that reaches into torch's DataLoader iterator internals
(``_workers``, ``_shutdown_workers``, the SIGCHLD handler's pid registry): each use is
guarded, so another torch version loses a nicer message, never a batch.
"""
from __future__ import annotations

import gc
import signal
import time

from torch.utils.data import DataLoader

__all__ = ["start_workers", "dead_workers", "stop_workers", "describe_dead", "STOP_GRACE_S"]


def start_workers(loader: DataLoader):
    """``iter(loader)``, with the garbage collector kept out of the forked workers and
    torch's asynchronous worker-death signal turned off (:func:`_no_async_worker_errors`).

    A worker is a fork of the training process, which holds objects such as DALI
    pipelines whose destructors deadlock outside the process that made them. If
    the child's garbage collector finds one of them in a reference cycle it runs
    that destructor and hangs (seen: ``Pipeline.__del__`` blocking in
    ``pthread_cond_destroy`` inside a DataLoader worker). So: freeze every object for
    the fork (a frozen object is never collected, in the child either, garbage or not), and
    let the parent collect normally again. No ``gc.collect()`` first: with torch and DALI
    loaded it took ~170 ms of the training process per pass (issue 34), and the parent
    collects that garbage itself after ``unfreeze``.
    """
    if loader.num_workers == 0:
        return iter(loader)
    gc.freeze()
    try:
        it = iter(loader)
    finally:
        gc.unfreeze()
    _no_async_worker_errors(it)
    _no_shared_lock_for_the_dead(it)
    return it


def _no_async_worker_errors(it) -> None:
    """Keep torch's SIGCHLD handler from raising about this iterator's workers.

    It raises a dead worker's ``RuntimeError`` from a signal handler, at whatever line
    the main thread is running (in the training step, or halfway through handling the
    same death). Without it a death still shows, through the iterator: a reset pipe at
    once, or torch's liveness check within its 5 s status interval; the loader turns
    that into a :class:`~gpupipe.core.errors.WorkerError` naming the worker and its shards.
    """
    try:
        from torch.utils.data._utils import signal_handling

        if getattr(it, "_worker_pids_set", False):
            signal_handling._remove_worker_pids(id(it))
            it._worker_pids_set = False
    except (ImportError, AttributeError, RuntimeError, ValueError):
        pass  # another torch: its handler stays; the error is then torch's own


def _no_shared_lock_for_the_dead(it) -> None:
    """Let torch's liveness check mark a dead worker unavailable without the shared done event.

    After 5 s without data torch marks each dead worker unavailable, and that asks the workers'
    shared done event whether it is set — taking a lock the workers take too. A worker killed
    while holding it (SIGKILL inside its own ``done_event.is_set()``) leaves it held for ever, and
    the training process hung there (seen once in CI, in
    tests/reliability/test_reliability_processes.py). For a dead worker only the bookkeeping is
    done here (nothing can be sent to it anyway); torch then raises its error about the death,
    which the loader names as a :class:`~gpupipe.core.errors.WorkerError`."""
    mark = getattr(it, "_mark_worker_as_unavailable", None)
    if mark is None or not hasattr(it, "_workers") or not hasattr(it, "_workers_status"):
        return  # another torch: its own way

    def unavailable(worker_id: int, shutdown: bool = False) -> None:
        if not shutdown and it._workers[worker_id].exitcode not in (None, 0):  # (lists torch renews each pass)
            it._workers_status[worker_id] = False
            return
        mark(worker_id, shutdown)

    it._mark_worker_as_unavailable = unavailable


def dead_workers(it, wait_s: float = 0.0) -> list:
    """``(worker id, process)`` of the workers of a DataLoader iterator that died,
    waiting up to ``wait_s`` for one (its pipes close before the kernel reports the exit)."""
    deadline = time.monotonic() + wait_s
    while True:
        dead = [(i, p) for i, p in enumerate(getattr(it, "_workers", [])) if p.exitcode not in (None, 0)]
        if dead or time.monotonic() >= deadline:
            return dead
        time.sleep(0.02)


STOP_GRACE_S = 1.0  # a worker told to stop may finish the item in hand this long, then it is terminated


def stop_workers(it, grace_s: float = STOP_GRACE_S) -> None:
    """Stop and join the worker processes of a DataLoader iterator now, not when it is
    garbage (a traceback holding the frame would keep them alive).

    Workers that ran out of work have exited already (torch shut them down with the
    iterator's last item); this costs nothing then. Workers still busy — the consumer broke
    off the pass — are told to stop and given ``grace_s`` to finish the item in hand; one
    still running after that (inside a slow read) is terminated: its work would be thrown
    away. torch's own shutdown would wait its status interval (5 s) for each such worker."""
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is None:
        return
    if dead_workers(it):
        _end_taking_no_shared_lock(it)
        return
    _tell_workers_to_stop(it, grace_s)
    try:
        shutdown()
    except RuntimeError:  # torch's SIGCHLD handler reporting a dead worker again as the others exit
        if not dead_workers(it):
            raise
    for proc in getattr(it, "_workers", []):
        proc.join(timeout=5)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=1)


def _end_taking_no_shared_lock(it) -> None:
    """End the workers of an iterator one of whose workers died by a signal.

    torch's shutdown sets the workers' done event and puts to their queues; each takes a lock
    shared with the workers, and a worker killed while holding one (SIGKILL inside
    ``done_event.is_set()``) leaves it held for ever: the shutdown, and with it the training
    process, would hang (seen in CI). torch guards that with its SIGCHLD handler, which
    :func:`_no_async_worker_errors` turns off; so here the live workers are terminated, the
    queues let go without a join, and the iterator marked shut down (its ``__del__`` then
    does nothing)."""
    it._shutdown = True
    pin_done = getattr(it, "_pin_memory_thread_done_event", None)
    if pin_done is not None:
        pin_done.set()  # a threading.Event: the pin-memory thread sees it within its poll
    workers = list(getattr(it, "_workers", []))
    for proc in workers:
        if proc.is_alive():
            proc.terminate()
    for proc in workers:
        proc.join(timeout=1)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=1)
    for q in [*getattr(it, "_index_queues", []), getattr(it, "_worker_result_queue", None)]:
        if q is not None:
            q.cancel_join_thread()


def _tell_workers_to_stop(it, grace_s: float) -> None:
    """What torch's ``_shutdown_workers`` does first — stop the pin-memory thread, set the
    workers' done event, send each worker ``None`` — then join with a short deadline and
    terminate the workers still running, so that its own join (5 s each) finds them ended.
    The pin-memory thread goes first, as in torch: it must not read what a worker leaves
    in the result queue as it exits (a batch whose shared memory lived in that worker)."""
    done, queues = getattr(it, "_workers_done_event", None), getattr(it, "_index_queues", None)
    busy = [p for p in getattr(it, "_workers", []) if p.is_alive()]
    if not busy or done is None or queues is None or getattr(it, "_shutdown", True):
        return
    try:
        pin = getattr(it, "_pin_memory_thread", None)
        if pin is not None:  # torch's own steps, bar closing the queue: its shutdown puts to it again
            it._pin_memory_thread_done_event.set()
            it._worker_result_queue.put((None, None))
            pin.join()
        done.set()  # a worker skips what it was asked for and takes the None that follows
        for q in queues:
            q.put(None)
    except (OSError, ValueError, AttributeError):  # a queue closed, another torch: leave it to torch's shutdown
        return
    deadline = time.monotonic() + grace_s
    for proc in busy:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc in busy:
        if proc.is_alive():
            proc.terminate()


def describe_dead(it) -> list[tuple[int, str]]:
    """``(worker id, "DataLoader worker 1 (pid 123, killed by SIGKILL)")`` for each dead worker."""
    out = []
    for wid, proc in dead_workers(it):
        how = f"killed by {_signal_name(-proc.exitcode)}" if proc.exitcode and proc.exitcode < 0 \
            else f"exit code {proc.exitcode}"
        out.append((wid, f"DataLoader worker {wid} (pid {proc.pid}, {how})"))
    return out


def _signal_name(number: int) -> str:
    """``SIGKILL``; ``signal 36`` for a signal Python has no name for (SIGRTMIN+2 on Linux)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
