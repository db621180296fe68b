"""Where an ingest's tasks run (:mod:`gpupipe.prepare.tasks`): this machine, or a Ray cluster.

* ``local``: in this process one after another (``processes=1``, the default: each task reads with
  its own threads), or in ``processes`` forked processes at once. A destination only this process
  can see (fsspec's ``memory://``) keeps them in this process.
* ``ray``: each task a Ray task (one CPU), on the cluster at ``address`` (``RAY_ADDRESS`` when not
  given; neither: a Ray instance started on this machine), or on the one this process joined already.
  The context goes to the object store once. A task whose worker process dies is retried by Ray
  (its shard is written whole or not at all, so a retry writes the same bytes); a task that raises
  stops the job with its error.

Either way ``on_result(task, result)`` is called in this process as each task finishes, in the order
they finish; the first task error stops the job (tasks already running finish or are cancelled) and
is raised naming the task and its slice of the plan.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from gpupipe.core.errors import ConfigError, GpupipeError
from gpupipe.prepare.tasks import IngestContext, IngestTask, TaskResult, run_task

__all__ = ["ENGINES", "run_tasks"]

log = logging.getLogger(__name__)

ENGINES = ("local", "ray")
_CONNECT_TIMEOUT_S = 5.0  # to tell an unreachable Ray address from a slow one
OnResult = Callable[[IngestTask, TaskResult], None]


def run_tasks(tasks: Sequence[IngestTask], context: IngestContext, *, engine: str = "local", processes: int = 1,
              ray_address: str | None = None, on_result: OnResult) -> None:
    """Run ``tasks`` on ``engine``; ``on_result`` as each finishes."""
    if engine not in ENGINES:
        raise ConfigError(f"ingest: unknown engine {engine!r} (known: {', '.join(ENGINES)})")
    if not tasks:
        return
    if engine == "ray":
        _run_ray(tasks, context, ray_address, on_result)
    elif processes > 1 and len(tasks) > 1 and not context.dst.startswith("memory://"):
        _run_processes(tasks, context, processes, on_result)
    else:
        for task in tasks:
            on_result(task, _named(task, context))


def _failed(task: IngestTask, context: IngestContext, exc: BaseException) -> GpupipeError:
    """The job's error for a task that raised: which task, which inputs, why."""
    refs = task.refs.tolist()
    first, last = refs[0], refs[-1]
    return GpupipeError(f"ingest task {task.name} ({len(task)} inputs of the plan, from {_input(context, first)} "
                        f"to {_input(context, last)}) failed, and the job with it: {exc}. What the finished tasks "
                        f"wrote is kept: run the same command again to finish the rest")


def _input(context: IngestContext, ref: Any) -> str:
    manifest = context.resolved.manifest
    assert manifest is not None, "plan_tasks planned it"
    if manifest.objects is not None:
        return manifest.objects.names[int(ref)]
    assert manifest.parquet is not None, "Parquet"
    g, r = int(ref[0]), int(ref[1])
    t = manifest.parquet
    return f"{t.files[int(t.file[g])]}#row{int(t.first_row[g]) + r}"


def _named(task: IngestTask, context: IngestContext) -> TaskResult:
    """The task run here; its error, should it raise one, named."""
    try:
        return run_task(context, task)
    except GpupipeError as exc:
        raise _failed(task, context, exc) from exc


# -- processes on this machine ----------------------------------------------------------------------
_CONTEXT: IngestContext | None = None  # a forked process's context (set before the fork)


def _in_child(task: IngestTask) -> TaskResult:
    assert _CONTEXT is not None, "set before the processes forked"
    return run_task(_CONTEXT, task)


def _run_processes(tasks: Sequence[IngestTask], context: IngestContext, processes: int, on_result: OnResult) -> None:
    global _CONTEXT
    _CONTEXT = context  # forked into each process, not pickled once per task
    try:
        with ProcessPoolExecutor(min(processes, len(tasks)), mp_context=multiprocessing.get_context("fork")) as pool:
            running: dict[Future, IngestTask] = {pool.submit(_in_child, t): t for t in tasks}
            try:
                while running:
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in done:
                        task = running.pop(future)
                        try:
                            result = future.result()
                        except Exception as exc:  # noqa: BLE001 — a task's error, or its process's death
                            raise _failed(task, context, exc) from exc
                        on_result(task, result)
            finally:
                for future in running:
                    future.cancel()
    finally:
        _CONTEXT = None


# -- Ray ----------------------------------------------------------------------------------------------
def _run_ray(tasks: Sequence[IngestTask], context: IngestContext, address: str | None, on_result: OnResult) -> None:
    try:
        import ray
    except ImportError:
        raise ConfigError("ingest --engine ray needs Ray: pip install 'gpupipe[ray]' (or ray)") from None
    started = False
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS")
        if address and address != "auto":
            _reachable(address)
        try:
            ray.init(address=address, log_to_driver=False, include_dashboard=False, ignore_reinit_error=True)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(f"ingest --engine ray: could not join the Ray cluster at {address or 'a new local one'}: "
                              f"{exc}") from None
        started = True
    try:
        shared = ray.put(context)
        remote = ray.remote(num_cpus=1, max_retries=3)(run_task)
        running = {remote.remote(shared, t): t for t in tasks}
        try:
            while running:
                done, _ = ray.wait(list(running), num_returns=1)
                task = running.pop(done[0])
                try:
                    result = ray.get(done[0])
                except Exception as exc:  # noqa: BLE001 — ray wraps the task's error (RayTaskError)
                    cause = getattr(exc, "cause", None) or exc
                    raise _failed(task, context, cause) from exc
                on_result(task, result)
        finally:
            for ref in running:
                ray.cancel(ref)
    finally:
        if started:
            ray.shutdown()


def _reachable(address: str) -> None:
    """A clear error in seconds for an address nothing answers at (``host:port``, ``ray://host:port``)."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"ingest --engine ray: {address!r} is not a Ray address (host:port, ray://host:port or auto)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ConfigError(f"ingest --engine ray: nothing answers at the Ray address {address} ({exc}); is the cluster "
                          "up, and is RAY_ADDRESS / --ray-address right?") from None
