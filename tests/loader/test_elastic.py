"""Issue 25, in one process: padding spread over the ranks, a mid-epoch state resumed at another
world size or batch size (elastic resume), and an order that does not depend on the worker count.

Ranks are simulated (``rank=``/``world_size=``, no torch.distributed): every rank takes the same
steps, as DDP would; tests/loader/test_elastic_ranks.py runs the same with real gloo processes.
"""
from __future__ import annotations

import json

import pytest
from datagen import ids_of, write_dataset

from gpupipe.loader.encoded import EncodedLoader, StreamConfig

COUNTS = [23, 0, 41, 7, 30, 1, 19]  # 121 samples, uneven, one shard empty
N = sum(COUNTS)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("elastic") / "ds")
    write_dataset(path, COUNTS)
    return path


def loader(url: str, rank: int, world: int, batch: int = 4, workers: int = 0, window: int = 8,
           drop_last: bool = False) -> EncodedLoader:
    return EncodedLoader(url, batch_size=batch, num_workers=workers, seed=11, rank=rank, world_size=world,
                         drop_last=drop_last, stream=StreamConfig(shuffle_buffer=window))


def test_padding_is_spread_so_every_rank_gets_its_share(tmp_path):
    """The case of the issue: 1,000 samples, 4 ranks, batch 200, drop_last=False gave real samples
    [400, 400, 200, 0] per rank (a mean over no valid sample on the last); now 250 each."""
    path = str(tmp_path / "thousand")
    write_dataset(path, [100] * 10)
    real, steps = [], set()
    seen: list[int] = []
    for rank in range(4):
        ld = EncodedLoader(path, batch_size=200, num_workers=0, rank=rank, world_size=4, drop_last=False)
        batches = list(ld)
        steps.add(len(batches))
        ids = [i for b in batches for i in ids_of(b)]
        real.append(len(ids))
        seen += ids
    assert real == [250, 250, 250, 250]
    assert steps == {2}
    assert sorted(seen) == list(range(1000))


@pytest.mark.parametrize("world", [2, 3, 5])
def test_real_samples_per_rank_differ_by_at_most_one(url, world):
    real = [sum(len(ids_of(b)) for b in loader(url, r, world)) for r in range(world)]
    assert set(real) <= {N // world, -(-N // world)} and sum(real) == N


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_the_order_does_not_depend_on_the_worker_count(url, workers):
    """The docs promise the same order on any machine, and the default worker count depends on
    the machine: 0, 1, 2 or 3 workers deliver the same batches in the same order."""
    base = [ids_of(b) for b in loader(url, 0, 1)]
    assert [ids_of(b) for b in loader(url, 0, 1, workers=workers)] == base


def run_elastic(url: str, world: int, stop: int, new_world: int, batch: int = 4, new_batch: int | None = None,
                window: int = 8, new_window: int | None = None, drop_last: bool = False,
                workers: int = 0) -> tuple[list[int], list[int], list[int]]:
    """Every rank of ``world`` takes ``stop`` steps; rank 0's state (through JSON, as a checkpoint
    holds it) is loaded by every rank of ``new_world``, which run the epoch out. Returns the ids
    delivered before, those after, and the steps each new rank took."""
    before: list[int] = []
    state = None
    for rank in range(world):
        ld = loader(url, rank, world, batch, window=window, drop_last=drop_last)
        ld.set_epoch(3)
        for n, b in enumerate(ld):
            before += ids_of(b)
            if n + 1 == stop:
                break
        if rank == 0:
            state = json.loads(json.dumps(ld.state_dict()))
    after: list[int] = []
    steps = []
    for rank in range(new_world):
        ld = loader(url, rank, new_world, new_batch or batch, window=new_window or window, drop_last=drop_last,
                    workers=workers)
        ld.load_state_dict(state)
        n = 0
        for b in ld:
            after += ids_of(b)
            n += 1
        assert n + stop == len(ld)  # len(): the batches of this epoch, those before the resume counted
        steps.append(n)
        assert ld.epoch == 3
    return before, after, steps


@pytest.mark.parametrize("world, new_world", [(2, 3), (3, 2), (4, 2), (1, 4), (2, 1), (2, 5)])
@pytest.mark.parametrize("stop", [1, 2, 3])
def test_a_mid_epoch_state_resumes_at_another_world_size_with_exactly_the_rest(url, world, new_world, stop):
    before, after, steps = run_elastic(url, world, stop, new_world)
    assert len(set(steps)) == 1  # equal steps on every new rank
    assert sorted(before + after) == list(range(N))  # every sample of the epoch exactly once


@pytest.mark.parametrize("batch, new_batch, window, new_window", [(4, 3, 8, 8), (4, 8, 8, 8), (2, 5, 8, 20),
                                                                  (4, 4, 8, 12)])
def test_a_mid_epoch_state_resumes_with_another_batch_size_or_window(url, batch, new_batch, window, new_window):
    before, after, steps = run_elastic(url, 2, 3, 2, batch=batch, new_batch=new_batch, window=window,
                                       new_window=new_window)
    assert len(set(steps)) == 1
    assert sorted(before + after) == list(range(N))


def test_with_drop_last_the_rest_loses_less_than_one_step_and_nothing_repeats(url):
    before, after, steps = run_elastic(url, 2, 4, 3, drop_last=True)
    assert len(set(steps)) == 1
    seen = before + after
    assert len(seen) == len(set(seen))
    # the epoch at world 2 holds 121 // 8 * 8 = 120 samples; the rest is cut to whole steps of 3 x 4
    assert 120 - len(seen) < 3 * 4


def test_an_elastic_resume_with_workers_delivers_the_same_as_without(url):
    assert run_elastic(url, 2, 2, 3, workers=2) == run_elastic(url, 2, 2, 3, workers=0)
