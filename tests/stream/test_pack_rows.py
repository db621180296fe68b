"""Issue 34: a padded batch's rows are filled by one gather of the read buffer's windows where they
can be (short rows, images of one buffer, a row's length after each); each row starts with its
image either way, whatever the mix of buffers, placeholders and images near a buffer's end."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupipe.stream import batch as batch_module
from gpupipe.stream.batch import SampleTable, pack_table


def _table(rng: np.random.Generator, n: int, others: int, empty: int, near_end: bool) -> SampleTable:
    main = rng.integers(0, 256, 20_000, dtype=np.uint8)
    extra = [rng.integers(0, 256, 900, dtype=np.uint8) for _ in range(2)]
    size = rng.integers(1, 700, n)
    start = rng.integers(0, len(main) - 700, n)
    if near_end:
        start[-1], size[-1] = len(main) - 5, 5  # its row's length runs past the buffer's end
    buffer = np.zeros(n, np.int64)
    buffer[:others] = 1 + np.arange(others) % 2
    start[:others] = rng.integers(0, 100, others)
    size[:others] = np.minimum(size[:others], 700)
    size[others:others + empty] = 0  # placeholders: no image
    return SampleTable(buffers=(main, *extra), buffer=buffer, start=start, size=size, labels=np.arange(n),
                       sample_ids=np.arange(n), keys=[f"k{i}" for i in range(n)], valid=size > 0)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 40), others=st.integers(0, 3), empty=st.integers(0, 3),
       near_end=st.booleans(), at_once=st.sampled_from([0, 8 << 10]))
def test_each_row_starts_with_its_image(seed, n, others, empty, near_end, at_once):
    table = _table(np.random.default_rng(seed), n, min(others, n), min(empty, max(0, n - others)), near_end)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(batch_module, "_ROWS_AT_ONCE", at_once)  # 0: row by row, as the reference
        b = pack_table(table, pad=100.0)
    assert b.stride == int(table.size.max())
    for i in range(n):
        want = bytes(np.asarray(table.buffers[table.buffer[i]])[table.start[i]:table.start[i] + table.size[i]])
        assert bytes(b.image(i)) == want
