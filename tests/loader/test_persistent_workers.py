"""Stream workers that outlive a pass (gpupipe.stream.ticket): the same processes serve every
pass, each pass reads its own epoch, plan and progress from what the training process published,
a pass broken off leaves nothing behind for the next (torch drains it; its slots come back), and
what the workers were forked with changing, or a worker dying, gives fresh workers."""
from __future__ import annotations

import os
import signal

import pytest
from datagen import write_dataset

from gpupipe.core.errors import GpupipeError, WorkerError
from gpupipe.loader.encoded import EncodedLoader


def _ids(batches) -> list[list[int]]:
    return [b.sample_ids.tolist() for b in batches]


def _pids(loader) -> list[int]:
    return [w.pid for w in loader._workers.loader._iterator._workers]


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("persistent") / "shards")
    write_dataset(root, [30] * 8)
    return root


def _reference(url: str, epoch: int) -> list[list[int]]:
    ref = EncodedLoader(url, batch_size=4, num_workers=0, seed=5)
    ref.set_epoch(epoch)
    return _ids(ref)


@pytest.mark.timeout(120)
def test_the_same_workers_serve_every_pass_each_with_its_own_epoch(url):
    loader = EncodedLoader(url, batch_size=4, num_workers=2, seed=5)
    assert _ids(loader) == _reference(url, 0)
    pids = _pids(loader)
    assert _ids(loader) == _reference(url, 1)  # the next pass is the next epoch, read from the ticket
    loader.set_epoch(7)
    assert _ids(loader) == _reference(url, 7)
    assert _pids(loader) == pids  # not forked again
    loader.close()
    assert loader._workers is None


@pytest.mark.timeout(120)
def test_a_pass_broken_off_leaves_nothing_to_the_next_and_its_slots_come_back(url):
    loader = EncodedLoader(url, batch_size=4, num_workers=2, seed=5)
    loader.set_epoch(3)
    for _ in range(6):  # Lightning's sanity check, limit_val_batches: a few batches, then break
        for i, _batch in enumerate(loader):
            if i == 1:
                break
    whole = list(loader)
    assert _ids(whole) == _reference(url, 3)  # the same epoch again, from its first batch, exactly
    assert all(b.slot >= 0 for b in whole)  # the slots the broken passes left flagged were taken back
    state = None
    for i, _batch in enumerate(loader):  # stop mid-epoch, save, resume on the same loader
        if i == 9:
            state = loader.state_dict()
            break
    assert state is not None
    loader.load_state_dict(state)
    assert _ids(loader) == _reference(url, 4)[10:]  # the rest, with the progress from the ticket


@pytest.mark.timeout(120)
def test_a_worker_dead_between_passes_or_mid_pass_gives_fresh_workers(url, caplog):
    loader = EncodedLoader(url, batch_size=4, num_workers=2, seed=5)
    list(loader)
    pids = _pids(loader)
    os.kill(pids[0], signal.SIGKILL)  # between passes (the OOM killer, say): nothing of a pass is lost
    assert _ids(loader) == _reference(url, 1)
    assert "is gone" in caplog.text and set(_pids(loader)).isdisjoint(pids)
    pids = _pids(loader)
    with pytest.raises(WorkerError, match="SIGBUS: reading a shard it had mapped failed"):
        for i, _batch in enumerate(loader):
            if i == 2:
                os.kill(pids[1], signal.SIGBUS)  # how a worker dies touching a mapped shard that shrank
    assert loader._workers is None
    assert len(list(loader)) == len(loader)  # the next pass starts new workers
    assert set(_pids(loader)).isdisjoint(pids)


@pytest.mark.timeout(120)
def test_a_shard_rewritten_between_passes_is_read_as_it_is_now_never_past_its_new_end(tmp_path):
    """A worker keeps its shards mapped from pass to pass; one rewritten in place meanwhile (the same
    file, shorter) must be read as it is now — an error naming it — not touched past its new end
    through the old mapping (SIGBUS: the worker would die)."""
    root = tmp_path / "shards"
    write_dataset(str(root), [30] * 4)
    loader = EncodedLoader(str(root), batch_size=4, num_workers=1, seed=5)
    list(loader)
    shard = sorted(root.glob("*.tar"))[-1]
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    with pytest.raises(GpupipeError) as caught:
        list(loader)
    assert not isinstance(caught.value, WorkerError), caught.value
    assert shard.name in str(caught.value)


def test_changed_settings_fork_new_workers(url):
    loader = EncodedLoader(url, batch_size=4, num_workers=2, seed=5)
    list(loader)
    pids = _pids(loader)
    loader.pin_memory = not loader.pin_memory  # what the workers were made with
    list(loader)
    assert set(_pids(loader)).isdisjoint(pids)


@pytest.mark.timeout(60)
def test_a_loader_collected_in_a_reference_cycle_stops_its_workers_at_once(url):
    """torch's own __del__ on a collected cycle found its queues closed by then and waited 5 s a
    worker (a test suite of such loaders took minutes more); the loader's finalizer keeps them open."""
    import gc
    import time

    for broken in (False, True):
        loader = EncodedLoader(url, batch_size=4, num_workers=2, seed=5)
        for i, _batch in enumerate(loader):
            if broken and i == 1:
                break
        pids = _pids(loader)
        loader.cycle = loader
        del loader, _batch
        t0 = time.monotonic()
        gc.collect()
        assert time.monotonic() - t0 < 2.5
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)  # gone (and reaped)
