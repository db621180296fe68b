"""Reused shared batch buffers (gpupipe.stream.slots): a worker writes a batch into a slot only
once the training process holds nothing of the batch that was there — kept batches stay intact —
and, batches let go, the slots are reused instead of fresh shared memory each batch."""
from __future__ import annotations

import pytest
from datagen import payload, write_dataset

from gpupipe.loader.encoded import EncodedLoader
from gpupipe.stream.slots import MAX_SLOTS, SlotBoard


def test_a_slot_is_taken_again_only_after_every_view_of_its_batch_is_gone():
    board = SlotBoard(workers=2, slots=2)
    taker = board.taker(1)
    a, slot_a = taker.take(100)
    assert slot_a == 2 and board.flags.tolist() == [0, 0, 1, 0]
    view = a[10:20].numpy()  # what a consumer keeps: a numpy view of a view
    board.hold(a, slot_a)
    del a
    assert board.release() == 0 and board.flags[2] == 1  # the view holds the storage
    b, slot_b = taker.take(80)
    assert slot_b == 3
    board.hold(b, slot_b)
    c, slot_c = taker.take(50)
    assert slot_c == -1 and taker.fresh == 3  # no slot free: a storage of its own, never a held one
    del view, b
    assert board.release() == 2 and board.flags.tolist() == [0, 0, 0, 0]
    d, slot_d = taker.take(90)
    assert slot_d == 2 and taker.fresh == 3  # the first slot again, its storage kept (100 * 1.25 bytes)
    e, _ = taker.take(400)
    assert taker.fresh == 4 and e.numel() == 400  # too small a slot grows with a new storage


def _check(batch) -> None:
    ids = batch.sample_ids.tolist()
    for i, sid in enumerate(ids):
        assert bytes(batch.image(i)) == payload(sid), (batch.slot, i, sid)


@pytest.mark.timeout(120)
def test_batches_kept_by_the_consumer_stay_intact_and_let_go_their_slots_are_reused(tmp_path):
    url = str(tmp_path / "shards")
    write_dataset(url, [100] * 8)
    loader = EncodedLoader(url, batch_size=4, num_workers=2, seed=2, rank=0, world_size=1)
    kept = list(loader)  # a whole pass held: no slot can be freed, every batch must stay as it came
    for batch in kept:
        _check(batch)
    assert len({b.slot for b in kept if b.slot >= 0}) == len([b for b in kept if b.slot >= 0])
    slots = 2 * min(MAX_SLOTS, (loader.prefetch_factor + 2) * max(loader.unit_sizes) + 2)
    assert sum(b.slot < 0 for b in kept) >= len(kept) - slots  # the rest in storages of their own
    del kept
    in_slots = 0
    for batch in loader:  # let go as they come: the slots are reused, the bytes still right
        _check(batch)
        in_slots += batch.slot >= 0
    assert in_slots == len(loader) > slots  # more batches in slots than slots: each was reused


def test_a_slots_storage_crosses_once_then_its_batches_travel_as_places_in_it():
    """torch hands a storage over with a file descriptor and a connection per batch (~1.5 ms a
    batch of both processes' CPU): a slot's storage crosses once, later batches in it as views."""
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import numpy as np
    import torch.multiprocessing  # noqa: F401 — registers torch's reductions (storages by file descriptor)

    from gpupipe.stream.batch import SampleTable, pack_table
    from gpupipe.stream.slots import SlotBatch

    board = SlotBoard(workers=1, slots=2)
    taker = board.taker(0)

    def batch(seed: int):
        data = [bytes(np.random.default_rng(seed + i).integers(0, 256, 50 + i, dtype=np.uint8)) for i in range(5)]
        table = SampleTable(buffers=tuple(data), buffer=np.arange(5), start=np.zeros(5, np.int64),
                            size=np.array([len(d) for d in data]), labels=np.arange(5) + seed,
                            sample_ids=np.arange(5) + 10 * seed, keys=[f"k{seed}-{i}" for i in range(5)],
                            valid=np.ones(5, bool))
        return data, pack_table(table, shared=True, slots=taker)

    def cross(item):  # what the DataLoader's queue does to it
        return pickle.loads(ForkingPickler.dumps(item))

    sent = []
    for seed in range(4):
        data, packed = batch(seed)
        item = taker.crossing(packed)
        assert isinstance(item, SlotBatch)
        sent.append(item.storage is not None)
        got = board.receive(cross(item))
        assert [bytes(got.image(i)) for i in range(5)] == data
        assert got.labels.tolist() == list(range(seed, seed + 5)) and got.keys == packed.keys
        assert got.slot == packed.slot and got.valid.all()
        board.hold(got.data, got.slot)
        del got, packed, item
        assert board.release() == 1  # the storage kept here does not keep the slot held
    assert sent == [True, False, False, False]  # one slot, reused: its storage crossed once
    data, packed = batch(0)
    board.hold(packed.data, packed.slot)  # slot 0 held: the next batch takes slot 1, new to the consumer
    other = taker.crossing(batch(1)[1])
    assert other.slot == 1 and other.storage is not None
    del packed
    board.flags[:] = 0
    grown = taker.crossing(pack_table(SampleTable(
        buffers=(b"x" * 10_000,), buffer=np.zeros(1, np.int64), start=np.zeros(1, np.int64),
        size=np.array([10_000]), labels=np.zeros(1, np.int64), sample_ids=np.zeros(1, np.int64), keys=["big"],
        valid=np.ones(1, bool)), shared=True, slots=taker))
    assert grown.slot == 0 and grown.generation == 2 and grown.storage is not None  # outgrown: a new storage crosses
    assert bytes(board.receive(cross(grown)).image(0)) == b"x" * 10_000


def test_torchs_pinning_thread_makes_a_slot_batch_a_batch_again(monkeypatch):
    """With pin_memory=True torch's pinning thread calls ``pin_memory()`` on what a worker sent: a
    SlotBatch must come out as the batch (then pinned). No CPU machine reaches that thread (torch
    pins nothing without an accelerator), so the batch's own pinning is stood in for here."""
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import numpy as np
    import torch.multiprocessing  # noqa: F401 — registers torch's reductions

    from gpupipe.stream.batch import EncodedBatch, SampleTable, pack_table

    monkeypatch.setattr(EncodedBatch, "pin_memory", lambda self: self)
    board = SlotBoard(workers=1, slots=2)
    taker = board.taker(0)
    data = [b"abc", b"defgh"]
    table = SampleTable(buffers=tuple(data), buffer=np.arange(2), start=np.zeros(2, np.int64),
                        size=np.array([3, 5]), labels=np.array([4, 5]), sample_ids=np.array([7, 8]),
                        keys=["a", "b"], valid=np.ones(2, bool))
    for _ in range(2):  # the storage with the batch, then the batch alone
        sent = pickle.loads(ForkingPickler.dumps(taker.crossing(pack_table(table, shared=True, slots=taker))))
        got = sent.pin_memory()
        assert isinstance(got, EncodedBatch) and [bytes(got.image(i)) for i in range(2)] == data
        assert got.labels.tolist() == [4, 5] and int(board.mapped[got.slot]) == taker.generations[0]
        del got, sent
        board.flags[:] = 0
