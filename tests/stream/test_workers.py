"""Supervising DataLoader workers (gpupipe.stream.workers) with real worker processes: start them
with the garbage collector frozen for the fork, notice one killed by a real signal and name it,
stop them promptly, and stay harmless where torch's iterator internals are not there."""
from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from gpupipe.stream.workers import dead_workers, describe_dead, start_workers, stop_workers


class Items(Dataset):
    """Item i is (i, the pid that made it, the objects the garbage collector has frozen there),
    plain ints: a tensor would travel as a shared-memory file descriptor that the main process
    fetches from the worker when it unpickles it, so a worker that exits early (``exit_at``)
    could take an item it already sent with it (seen in CI under load: ConnectionResetError in
    resource_sharer). ``exit_at``: the item whose worker ends with exit code 3; ``sleep_s`` per item."""

    def __init__(self, n: int = 10**6, sleep_s: float = 0.002, exit_at: int | None = None):
        self.n, self.sleep_s, self.exit_at = n, sleep_s, exit_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.exit_at:
            time.sleep(0.2)  # the items before it leave the worker's queue first
            os._exit(3)
        time.sleep(self.sleep_s)
        return (i, os.getpid(), gc.get_freeze_count())


def loader(dataset: Dataset, workers: int = 2) -> DataLoader:
    return DataLoader(dataset, batch_size=None, num_workers=workers, prefetch_factor=2 if workers else None,
                      persistent_workers=False)


@pytest.fixture
def running():
    """Start two workers on an endless dataset; every iterator is stopped afterwards."""
    started = []

    def start(dataset: Dataset | None = None, workers: int = 2):
        it = start_workers(loader(dataset or Items(), workers))
        started.append(it)
        return it

    yield start
    for it in started:
        stop_workers(it)


def wait_for_exit(proc, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while proc.exitcode is None and time.monotonic() < deadline:
        time.sleep(0.01)


# ------------------------------------------------------------------------------ starting

def test_workers_fork_with_the_collector_frozen_and_the_parent_unfrozen_after(running):
    """Objects alive at the fork are frozen in the children (no destructor of the parent's can run
    in a worker's collection); the parent collects normally again afterwards."""
    assert gc.get_freeze_count() == 0
    it = running()
    assert gc.get_freeze_count() == 0, "the training process must not stay frozen"
    items = [next(it) for _ in range(8)]
    pids = {int(x[1]) for x in items}
    assert len(pids) == 2 and os.getpid() not in pids  # both workers answered, neither is this process
    assert all(int(x[2]) > 0 for x in items), "workers forked without the collector frozen"
    assert [int(x[0]) for x in items] == list(range(8))  # in order, nothing lost


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # torch's own __del__
def test_a_loader_that_fails_to_start_still_unfreezes_the_collector():
    """iter() raises (here in the sampler, before any fork): the collector is not left frozen."""
    class Refusing(torch.utils.data.Sampler):
        def __iter__(self):
            raise ValueError("no indices today")

        def __len__(self):
            return 1

    bad = DataLoader(Items(), batch_size=None, sampler=Refusing(), num_workers=1)
    with pytest.raises(ValueError, match="no indices today"):
        start_workers(bad)
    assert gc.get_freeze_count() == 0


def test_zero_workers_iterate_in_this_process_and_supervision_is_a_no_op():
    it = start_workers(loader(Items(n=3), workers=0))
    first = next(it)
    assert int(first[1]) == os.getpid() and int(first[2]) == 0  # no fork, nothing frozen
    assert dead_workers(it, wait_s=0.05) == [] and describe_dead(it) == []
    stop_workers(it)
    assert [int(x[0]) for x in it] == [1, 2]  # stopping had nothing to stop


# ------------------------------------------------------------------------------ a worker dies

def kill_from_outside(pid: int, sig: int) -> None:
    """Send ``sig`` from another process (the OOM killer, an operator): a torch worker that gets
    SIGTERM from its own parent takes it as the order to stop and exits with code 0."""
    subprocess.run([sys.executable, "-c", f"import os; os.kill({pid}, {int(sig)})"], check=True, timeout=30)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV])
def test_a_worker_killed_by_a_signal_is_noticed_and_named(running, sig):
    it = running()
    next(it)
    victim = it._workers[1]
    kill_from_outside(victim.pid, sig)
    time.sleep(0.3)  # torch's SIGCHLD handler would raise here, at a random line of the training loop
    t0 = time.monotonic()
    dead = dead_workers(it, wait_s=5)
    assert time.monotonic() - t0 < 2, "it must return as soon as the death is known"
    assert [(wid, p.pid) for wid, p in dead] == [(1, victim.pid)]
    assert describe_dead(it) == [(1, f"DataLoader worker 1 (pid {victim.pid}, killed by {sig.name})")]
    assert it._workers[0].exitcode is None  # the other one is alive, and not named


def test_a_worker_killed_by_a_real_time_signal_is_named():
    """Linux has signals that ``signal.Signals`` has no name for (SIGRTMIN+1 ... SIGRTMAX-1); a
    worker killed by one is still described, by number, not by a ValueError in the handler."""
    it = start_workers(loader(Items()))
    try:
        next(it)
        victim = it._workers[0]
        number = int(signal.SIGRTMIN) + 2
        os.kill(victim.pid, number)
        assert [wid for wid, _ in dead_workers(it, wait_s=5)] == [0]
        assert describe_dead(it) == [(0, f"DataLoader worker 0 (pid {victim.pid}, killed by signal {number})")]
    finally:
        stop_workers(it)


def test_a_worker_that_exits_with_a_code_is_named_with_it(running):
    it = running(Items(exit_at=5))  # item 5 goes to worker 1 (indices are dealt round-robin)
    assert [int(next(it)[0]) for _ in range(4)] == list(range(4))  # by now index 5 was handed out
    wait_for_exit(it._workers[1])
    assert describe_dead(it) == [(1, f"DataLoader worker 1 (pid {it._workers[1].pid}, exit code 3)")]


def test_workers_that_finished_their_epoch_are_not_dead():
    it = start_workers(loader(Items(n=6)))
    assert sorted(int(x[0]) for x in it) == list(range(6))
    for proc in it._workers:
        wait_for_exit(proc)
    assert [p.exitcode for p in it._workers] == [0, 0]
    assert dead_workers(it) == [] and describe_dead(it) == []


def test_waiting_for_a_death_that_does_not_come_takes_wait_s(running):
    it = running()
    next(it)
    t0 = time.monotonic()
    assert dead_workers(it, wait_s=0.3) == []
    assert 0.3 <= time.monotonic() - t0 < 1.5


# ------------------------------------------------------------------------------ stopping

def test_stop_workers_stops_busy_workers_at_once(running):
    it = running()
    for _ in range(10):
        next(it)
    procs = list(it._workers)
    t0 = time.monotonic()
    stop_workers(it)
    assert time.monotonic() - t0 < 3
    assert all(not p.is_alive() for p in procs) and all(p.exitcode is not None for p in procs)
    stop_workers(it)  # a second stop (a finally after an except that stopped them) is harmless


def test_stop_workers_after_a_death_stops_the_others(running):
    it = running()
    next(it)
    procs = list(it._workers)
    os.kill(procs[0].pid, signal.SIGKILL)
    dead_workers(it, wait_s=5)
    stop_workers(it)
    assert all(not p.is_alive() for p in procs)
    assert procs[0].exitcode == -signal.SIGKILL


def test_stop_workers_after_a_death_takes_no_lock_the_dead_worker_may_hold(running):
    """A worker killed while holding the done event's lock (inside ``is_set()``) leaves it held:
    torch's shutdown would wait on it for ever (a 300 s CI timeout). Here the lock is held by a
    thread that never lets go, which is what the dead worker does; stop_workers still returns."""
    it = running()
    next(it)
    procs = list(it._workers)
    os.kill(procs[0].pid, signal.SIGKILL)
    dead_workers(it, wait_s=5)
    held = threading.Event()

    def hold_for_ever():
        it._workers_done_event._cond.acquire()
        held.set()

    threading.Thread(target=hold_for_ever, daemon=True).start()
    assert held.wait(5)
    stopper = threading.Thread(target=stop_workers, args=(it,), daemon=True)
    stopper.start()
    stopper.join(10)
    assert not stopper.is_alive(), "stop_workers waited on a lock a dead worker holds"
    assert all(not p.is_alive() for p in procs) and it._shutdown


def test_a_worker_stuck_in_an_item_is_terminated_after_a_short_grace():
    """A worker inside a 60 s read never looks at its queue. torch's shutdown would wait its
    status interval (5 s) for it; stop_workers tells it to stop, gives it its grace (1 s) to
    finish the item in hand, then terminates it, and returns with no worker left."""
    it = start_workers(loader(Items(sleep_s=60), workers=1))
    deadline = time.monotonic() + 5
    while it._workers[0].pid is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # inside __getitem__ now
    t0 = time.monotonic()
    stop_workers(it)
    assert time.monotonic() - t0 < 2.5
    assert not it._workers[0].is_alive()


# ------------------------------------------------------------------------------ no torch internals

class FakeProc:
    def __init__(self, exitcode, pid=4242):
        self.exitcode, self.pid, self.joined, self.terminated = exitcode, pid, 0, 0

    def join(self, timeout=None):
        self.joined += 1

    def is_alive(self):
        return self.exitcode is None and not self.terminated

    def terminate(self):
        self.terminated += 1


def test_an_iterator_without_workers_is_left_alone():
    for it in (object(), iter([1, 2]), SimpleNamespace(_workers=[])):
        assert dead_workers(it, wait_s=0.05) == [] and describe_dead(it) == []
        assert stop_workers(it) is None


def test_after_a_death_torchs_shutdown_is_not_called_and_otherwise_its_errors_show():
    calls = []

    def shutdown():
        calls.append(1)
        raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed.")

    died = SimpleNamespace(_shutdown_workers=shutdown, _workers=[FakeProc(-9), FakeProc(None, 4243)])
    stop_workers(died)
    assert calls == [] and died._shutdown  # it could wait on a lock the dead worker holds
    assert [p.joined for p in died._workers] == [1, 1]  # each joined once; the live one terminated first
    assert [p.terminated for p in died._workers] == [0, 1]
    assert describe_dead(died) == [(0, "DataLoader worker 0 (pid 4242, killed by SIGKILL)")]
    healthy = SimpleNamespace(_shutdown_workers=shutdown, _workers=[FakeProc(0)])
    with pytest.raises(RuntimeError, match="killed by signal"):
        stop_workers(healthy)  # not a death: a real error, not hidden


def test_the_pin_memory_thread_stops_before_the_workers_are_told():
    """torch's order (a CUDA run pins in a thread): the pin-memory thread must not read what
    an exiting worker leaves in the result queue, so it stops first; a worker still alive after
    its grace is terminated; torch's own shutdown runs last."""
    events: list[str] = []

    class Named:
        def __init__(self, name: str) -> None:
            self.name = name

        def set(self) -> None:
            events.append(f"set {self.name}")

        def put(self, item) -> None:
            events.append(f"put {self.name}")

        def join(self, timeout=None) -> None:
            events.append(f"join {self.name}")

    worker = FakeProc(None)
    it = SimpleNamespace(_shutdown=False, _workers=[worker], _workers_done_event=Named("workers done"),
                         _index_queues=[Named("index")], _pin_memory_thread=Named("pin thread"),
                         _pin_memory_thread_done_event=Named("pin done"), _worker_result_queue=Named("results"),
                         _shutdown_workers=lambda: events.append("torch shutdown"))
    stop_workers(it, grace_s=0.01)
    assert events == ["set pin done", "put results", "join pin thread", "set workers done", "put index",
                      "torch shutdown"]
    assert worker.terminated == 1
