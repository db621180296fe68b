"""Processes and ranks (issue 7): a DataLoader worker killed mid-epoch, and 2-rank gloo runs
over uneven shards (one empty) for 2 epochs with 0 and 2 workers.

(tests/storage/test_storage.py already runs one gloo epoch with 1 worker, and tests/plan/test_plan.py
checks the pure planner for world sizes 1-8; these add the real processes.)
"""
from __future__ import annotations

import gc
import json
import os
import signal
import threading
import time

import pytest
from datagen import write_dataset
from gloo_ranks import run_ranks

from gpupipe.core.errors import WorkerError
from gpupipe.loader.encoded import EncodedLoader, StreamConfig

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: the helpers a subprocess imports


def children(pid: int | None = None) -> set[int]:
    """Live child processes of ``pid`` (this process by default), from /proc."""
    pid = os.getpid() if pid is None else pid
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.add(int(entry))
    return out


def _two_workers_running(url: str, counts: list[int]):
    """A dataset of ``counts`` at ``url`` and a pass of a 2-worker loader over it, its first batch
    taken: (loader, the pass's iterator, this process's children before, the two workers' pids)."""
    write_dataset(url, counts)
    loader = EncodedLoader(url, batch_size=4, num_workers=2, rank=0, world_size=1,
                           stream=StreamConfig(shuffle_buffer=64))
    before = children()
    it = iter(loader)
    next(it)
    workers = sorted(children() - before)
    assert len(workers) == 2
    return loader, it, before, workers


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_killed_worker_is_named_with_its_shards_and_nothing_is_left(tmp_path):
    url = str(tmp_path / "ds")
    loader, it, before, workers = _two_workers_running(url, [400, 0, 300, 500])
    threading.Timer(0.05, os.kill, (workers[1], signal.SIGKILL)).start()
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        for _ in it:
            pass
    assert time.monotonic() - t0 < 10
    text = str(info.value)
    assert f"pid {workers[1]}, killed by SIGKILL" in text and "DataLoader worker" in text
    assert f"{url}/part-" in text and ".tar" in text, text
    deadline = time.monotonic() + 5
    while children() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not children() - before  # no orphan, no zombie


@pytest.mark.timeout(90)
def test_a_worker_dead_holding_the_workers_shared_lock_is_named_not_waited_for(tmp_path):
    """torch's liveness check asked the workers' shared done event about a dead worker, taking a lock
    the workers take too: a worker killed inside its own ``is_set()`` left it held, and the training
    process waited for ever (seen once in CI). Here a process dies holding that lock, then a worker
    is killed: the death is named within torch's 5 s check, not waited for."""
    loader, it, _, workers = _two_workers_running(str(tmp_path / "ds"), [400, 300])
    lock = loader._workers.loader._iterator._workers_done_event._cond  # what is_set() takes, in every process
    holder = os.fork()
    if holder == 0:  # dies holding it, as a worker SIGKILLed inside done_event.is_set()
        lock.acquire()
        os._exit(0)
    os.waitpid(holder, 0)
    os.kill(workers[1], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match=f"pid {workers[1]}, killed by SIGKILL"):
        for _ in it:
            pass
    assert time.monotonic() - t0 < 30


def test_breaking_early_keeps_the_workers_for_the_next_pass_and_close_or_the_loader_going_stops_them(tmp_path):
    """Stream workers outlive a pass (gpupipe.stream.ticket): a pass broken off leaves them idle for
    the next one; ``close()`` stops them at once, and so does dropping the loader."""
    url = str(tmp_path / "ds")
    write_dataset(url, [300, 300])
    loader = EncodedLoader(url, batch_size=4, num_workers=2, rank=0, world_size=1,
                           stream=StreamConfig(shuffle_buffer=64))
    before = children()
    batches = loader.batches()
    next(batches)
    workers = children() - before
    assert len(workers) == 2
    batches.close()
    assert children() - before == workers
    next(loader.batches())
    assert children() - before == workers  # the same two, not forked again
    loader.close()
    assert not children() - before
    next(loader.batches())
    assert len(children() - before) == 2
    del loader, batches
    gc.collect()
    deadline = time.monotonic() + 5
    while children() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not children() - before  # no orphan, no zombie


_RANK_SCRIPT = """
import datetime, json, os, sys
import torch.distributed as dist
sys.path[:0] = {paths!r}
from datagen import ids_of
from gpupipe.loader.encoded import EncodedLoader
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
ld = EncodedLoader({url!r}, batch_size=4, num_workers={workers}, drop_last={drop_last}, seed=5)
epochs = []
for epoch in range(2):
    steps, ids = 0, []
    for batch in ld:
        ids += ids_of(batch)
        steps += 1
        dist.barrier()  # a rank with fewer steps would leave the other one waiting here: timeout, not hang
    epochs.append({{"steps": steps, "len": len(ld), "ids": ids}})
out = [None, None]
dist.all_gather_object(out, epochs)
if dist.get_rank() == 0:
    print(json.dumps(out))
dist.destroy_process_group()
"""


def _run_two_ranks(tmp_path, url: str, workers: int, drop_last: bool) -> list:
    script = tmp_path / f"rank_{workers}_{drop_last}.py"
    paths = [os.getcwd(), TESTS]
    script.write_text(_RANK_SCRIPT.format(paths=paths, url=url, workers=workers, drop_last=drop_last))
    return json.loads(run_ranks(script, 2))


@pytest.mark.slow
@pytest.mark.usefixtures("one_job_at_a_time")  # conftest.py: a job of several processes
@pytest.mark.parametrize("workers, drop_last", [(0, True), (2, False)])
def test_two_gloo_ranks_two_epochs_uneven_shards(tmp_path, workers, drop_last):
    counts = [13, 0, 21, 8, 1]  # 43 samples, one shard empty
    url = str(tmp_path / "ds")
    write_dataset(url, counts)
    ranks = _run_two_ranks(tmp_path, url, workers, drop_last)
    for epoch in range(2):
        r0, r1 = ranks[0][epoch], ranks[1][epoch]
        assert r0["steps"] == r1["steps"] == r0["len"] == r1["len"]
        seen = r0["ids"] + r1["ids"]
        if drop_last:  # 43 // 8 = 5 steps: 40 distinct samples, none twice
            assert r0["steps"] == 5 and len(seen) == len(set(seen)) == 40
        else:  # 6 steps; the 5 padded positions are masked, every sample exactly once
            assert r0["steps"] == 6 and sorted(seen) == list(range(43))
    assert ranks[0][0]["ids"] != ranks[0][1]["ids"]  # epochs differ
