"""Where the tasks of a job run — an ingest's (:mod:`gpupipe.prepare.tasks`), an index's
(:mod:`gpupipe.prepare.indexer`): this machine, or a Ray cluster. A task is anything with a
``name`` and ``describe(context)``; ``fn(context, task)`` does it and returns its result.

* ``local``: in this process one after another (``processes=1``, the default: each task reads with
  its own threads), or in ``processes`` processes at once, forked from a fresh server process
  (multiprocessing's ``forkserver``: the driver has threads — fsspec's, the fetcher's, tqdm's — and a
  fork of a process with threads may inherit a lock held for ever); the job goes to each process
  once. A task whose process dies runs again in a new one (up to 4 runs, as on Ray). A destination
  only this process can see (fsspec's ``memory://``) keeps them in this process.
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
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from gpupipe.core.errors import ConfigError, GpupipeError
from gpupipe.formats.containers import container

__all__ = ["ENGINES", "Job", "UnitRange", "unit_ranges", "run_tasks", "results_in_order"]

log = logging.getLogger(__name__)

ENGINES = ("local", "ray")
_CONNECT_TIMEOUT_S = 5.0  # to tell an unreachable Ray address from a slow one
OnResult = Callable[[Any, Any], None]


@dataclass(frozen=True)
class Job:
    """What runs: ``fn(context, task)`` for each task; ``what`` names the job in errors (``"ingest"``),
    ``after_error`` says what to do after one; ``local``: the context is only this process's to see
    (a ``memory://`` destination): its tasks stay in this process."""

    fn: Callable[[Any, Any], Any]
    context: Any
    what: str
    after_error: str = ""
    local: bool = False


@dataclass(frozen=True)
class UnitRange:
    """A task over units ``[start, stop)`` of a source (tar shards, images or row groups); its
    context names the units' URLs (``unit_urls``)."""

    start: int
    stop: int

    @property
    def name(self) -> str:
        return f"units {self.start}-{self.stop - 1}"

    def describe(self, context: Any) -> str:
        urls = context.unit_urls
        return f"from {urls[self.start]} to {urls[self.stop - 1]}"


def unit_ranges(num_units: int, kind: str) -> list[UnitRange]:
    """A source's ``num_units`` units of container ``kind`` cut into tasks of its
    ``units_per_task`` (1,000 images of a folder; one shard or row group)."""
    step = container(kind).units_per_task
    return [UnitRange(a, min(a + step, num_units)) for a in range(0, num_units, step)]


def run_tasks(job: Job, tasks: Sequence[Any], *, engine: str = "local", processes: int = 1,
              ray_address: str | None = None, on_result: OnResult) -> None:
    """Run ``job``'s ``tasks`` on ``engine``; ``on_result(task, result)`` as each finishes."""
    if engine not in ENGINES:
        raise ConfigError(f"{job.what}: unknown engine {engine!r} (known: {', '.join(ENGINES)})")
    if not tasks:
        return
    if engine == "ray":
        _run_ray(job, tasks, ray_address, on_result)
    elif processes > 1 and len(tasks) > 1 and not job.local:
        _run_processes(job, tasks, processes, on_result)
    else:
        for task in tasks:
            try:
                result = job.fn(job.context, task)
            except GpupipeError as exc:
                raise _failed(job, task, exc) from exc
            on_result(task, result)


def results_in_order(job: Job, tasks: Sequence[Any], *, engine: str = "local", processes: int = 1,
                     ray_address: str | None = None,
                     tick: Callable[[Any, Any], Any] = lambda task, result: None) -> list[Any]:
    """:func:`run_tasks`, the results in the order of ``tasks`` (``tick(task, result)`` as each
    finishes, for a progress bar)."""
    at = {id(task): i for i, task in enumerate(tasks)}
    done: dict[int, Any] = {}

    def on_result(task: Any, result: Any) -> None:
        done[at[id(task)]] = result
        tick(task, result)

    run_tasks(job, tasks, engine=engine, processes=processes, ray_address=ray_address, on_result=on_result)
    return [done[i] for i in range(len(tasks))]


def _failed(job: Job, task: Any, exc: BaseException | str) -> GpupipeError:
    """The job's error for a task that raised: which task, which inputs, why."""
    return GpupipeError(f"{job.what} task {task.name} ({task.describe(job.context)}) failed, and the job with it: "
                        f"{exc}{'. ' + job.after_error if job.after_error else ''}")


# -- processes on this machine ----------------------------------------------------------------------
_JOB: Job | None = None  # a task process's job (set once in each, by _set_job)
_PRELOAD = ["gpupipe.prepare.tasks", "gpupipe.prepare.indexer"]  # imported once, by the fork server


def _set_job(job: Job) -> None:
    global _JOB
    _JOB = job


def _in_child(task: Any) -> Any:
    assert _JOB is not None, "set when the process started"
    return _JOB.fn(_JOB.context, task)


_TRIES = 4  # runs of a task whose process dies (Ray's max_retries=3 is the same: 1 + 3)


def _run_processes(job: Job, tasks: Sequence[Any], processes: int, on_result: OnResult) -> None:
    """``tasks`` on ``processes`` processes of a fork server. A process that dies (the OOM killer, a
    signal) breaks its pool: the tasks that had not finished run again in a new one, each up to
    :data:`_TRIES` times in all, as Ray retries a task whose worker died (a task's output appears
    whole or not at all, so a run again writes the same bytes). A broken pool fails every task it
    had not finished, so a task's last run is in a pool of its own: the task the job names is the
    one whose process died, not one that ran beside it. A task that raises stops the job."""
    runs = [0] * len(tasks)
    left = list(range(len(tasks)))
    while left:
        for i in left:
            runs[i] += 1
        if any(runs[i] >= _TRIES for i in left):
            left = [j for i in left for j in _run_pool(job, tasks, [i], runs, 1, on_result)]
        else:
            left = _run_pool(job, tasks, left, runs, processes, on_result)
        if left:
            log.warning("%s: a task's process died; %d unfinished task(s) run again in new processes",
                        job.what, len(left))


def _run_pool(job: Job, tasks: Sequence[Any], todo: list[int], runs: list[int], processes: int,
              on_result: OnResult) -> list[int]:
    """Run tasks ``todo`` (indices) in one pool; the ones to run again when a process of it died."""
    again: list[int] = []
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)  # (read when the server starts: once per driver process)
    with ProcessPoolExecutor(min(processes, len(todo)), mp_context=context, initializer=_set_job,
                             initargs=(job,)) as pool:
        running: dict[Future, int] = {pool.submit(_in_child, tasks[i]): i for i in todo}
        try:
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    i = running.pop(future)
                    try:
                        result = future.result()
                    except BrokenProcessPool as exc:  # a process of the pool died: this task did not finish
                        if runs[i] >= _TRIES:
                            raise _failed(job, tasks[i], f"its process died {runs[i]} times ({exc})") from exc
                        again.append(i)
                        continue
                    except Exception as exc:  # noqa: BLE001 — the task's own error
                        raise _failed(job, tasks[i], exc) from exc
                    on_result(tasks[i], result)
        finally:
            for future in running:
                future.cancel()
    return sorted(again)


# -- Ray ----------------------------------------------------------------------------------------------
def _run_ray(job: Job, tasks: Sequence[Any], address: str | None, on_result: OnResult) -> None:
    try:
        import ray
    except ImportError:
        raise ConfigError(f"{job.what} --engine ray needs Ray: pip install 'gpupipe[ray]' (or ray)") from None
    started = False
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS")
        if address and address != "auto":
            _reachable(address, job.what)
        try:
            ray.init(address=address, log_to_driver=False, include_dashboard=False, ignore_reinit_error=True)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(f"{job.what} --engine ray: could not join the Ray cluster at "
                              f"{address or 'a new local one'}: {exc}") from None
        started = True
    try:
        shared = ray.put(job.context)
        remote = ray.remote(num_cpus=1, max_retries=3)(job.fn)
        running = {remote.remote(shared, t): t for t in tasks}
        try:
            while running:
                done, _ = ray.wait(list(running), num_returns=1)
                task = running.pop(done[0])
                try:
                    result = ray.get(done[0])
                except Exception as exc:  # noqa: BLE001 — ray wraps the task's error (RayTaskError)
                    cause = getattr(exc, "cause", None) or exc
                    raise _failed(job, task, cause) from exc
                on_result(task, result)
        finally:
            for ref in running:
                ray.cancel(ref)
    finally:
        if started:
            ray.shutdown()


def _reachable(address: str, what: str) -> None:
    """A clear error in seconds for an address nothing answers at (``host:port``, ``ray://host:port``)."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"{what} --engine ray: {address!r} is not a Ray address (host:port, ray://host:port or auto)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ConfigError(f"{what} --engine ray: nothing answers at the Ray address {address} ({exc}); is the cluster "
                          "up, and is RAY_ADDRESS / --ray-address right?") from None
