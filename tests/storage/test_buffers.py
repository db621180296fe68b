"""Reused read buffers (:mod:`gpupipe.storage.buffers`): a buffer is handed out again only when
nothing can see it any more, so bytes already handed out are never overwritten."""
from __future__ import annotations

import numpy as np

from gpupipe.storage.buffers import BufferPool, read_into


def test_a_buffer_is_reused_only_once_every_view_of_it_is_gone():
    pool = BufferPool(1024, keep=2)
    a = pool.take(100)
    view = np.frombuffer(a[10:20], dtype=np.uint8)  # a view of a view still holds the buffer
    del a
    b = pool.take(100)
    assert not np.shares_memory(b, view)
    mv = memoryview(b)
    del b
    c = pool.take(50)
    assert not np.shares_memory(c, view) and not np.shares_memory(c, np.frombuffer(mv, dtype=np.uint8))
    kept = view.base
    del view, mv, c
    d = pool.take(10)  # every view gone: one of the two buffers again
    assert d.base is not None and len(pool._buffers) == 2
    del kept


def test_beyond_the_pool_and_larger_requests_get_their_own_buffer():
    pool = BufferPool(64, keep=1)
    held = [pool.take(64), pool.take(64), pool.take(65)]
    assert len(pool._buffers) == 1 and all(len(x) == n for x, n in zip(held, (64, 64, 65)))


def test_read_into_reads_the_range(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(bytes(range(256)) * 10)
    pool = BufferPool(1024, keep=1)
    assert bytes(read_into(str(path), 5, 300, pool)) == (bytes(range(256)) * 10)[5:300]
    assert len(read_into(str(path), 2550, 2600, pool)) == 10  # short at the end of the file


def test_batches_packed_in_process_never_share_a_buffer_with_a_batch_still_held():
    from gpupipe.stream.batch import SampleTable, pack_table

    image = np.arange(3 << 20, dtype=np.uint64).view(np.uint8)  # 24 MB: the pooled path
    table = SampleTable(buffers=(image,), buffer=np.zeros(2, np.int64), start=np.array([0, 8]),
                        size=np.array([len(image) // 2, len(image) // 2]), labels=np.zeros(2, np.int64),
                        sample_ids=np.arange(2), keys=["a", "b"], valid=np.ones(2, bool))
    held = [pack_table(table) for _ in range(3)]
    for i, a in enumerate(held):
        assert bytes(a.image(1)[:16]) == image[8:24].tobytes()
        assert all(not np.shares_memory(a.data.numpy(), b.data.numpy()) for b in held[i + 1:])
    first = held[0].data.data_ptr()
    del held
    again = [pack_table(table).data.data_ptr() for _ in range(2)]
    assert first in again  # once nothing holds it, a buffer comes back
