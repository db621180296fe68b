"""One-sample units placed per position (issue 39): an image folder of 100M objects read in place
is planned without an array of 100M — the keyed bijection, the compact counts, and a state saved
before version 4 resuming in the layout it was saved with."""
from __future__ import annotations

import json
import pickle
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpupipe.plan as plan
from gpupipe.core.counts import UnitCounts
from gpupipe.plan import (
    PlanSpec,
    Progress,
    bijection,
    chunk_order,
    chunk_sample_ids,
    chunk_spans,
    plan_identity,
    rank_chunks,
    resume_plan,
)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 3000), key=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=4), data=st.data())
def test_the_bijection_is_a_permutation_evaluated_anywhere(n, key, data):
    whole = bijection(n, key, np.arange(n))
    assert sorted(whole.tolist()) == list(range(n))
    if n:
        some = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=50)), dtype=np.int64)
        assert bijection(n, key, some).tolist() == whole[some].tolist()  # per position, as a whole


def test_the_bijection_shuffles_and_depends_on_its_key():
    n = 200_003
    p = np.arange(n)
    a, b = bijection(n, (0, 0, 1), p), bijection(n, (0, 1, 1), p)
    assert abs(np.corrcoef(p, a)[0, 1]) < 0.01  # no trace of the position left
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.01 and (a == b).mean() < 0.001  # another epoch, another order
    step = np.abs(np.diff(a)).mean()
    assert n / 3 * 0.97 < step < n / 3 * 1.03  # neighbours land as far apart as at random (n/3)
    # each tenth of the positions takes about a tenth of every tenth of the units
    cells = np.histogram2d(p, a, bins=10)[0]
    assert cells.min() > n / 100 * 0.9 and cells.max() < n / 100 * 1.1


def test_unit_counts_are_compact_and_equal_the_tuple_they_stand_for():
    ones = UnitCounts.uniform(1, 10**9)
    assert len(ones) == 10**9 and ones.total == 10**9 and ones.value == 1 and ones[-1] == 1
    assert ones.first_ids(np.array([0, 5, 10**9 - 1])).tolist() == [0, 5, 10**9 - 1]
    assert len(pickle.dumps(ones)) < 200 and pickle.loads(pickle.dumps(ones)) == ones
    small = UnitCounts.uniform(3, 5)
    assert small == (3,) * 5 and small != (3,) * 4 and small[1:3] == (3, 3) and list(small) == [3] * 5
    assert small.crc32() == zlib.crc32(np.full(5, 3, "<i8").tobytes())
    assert UnitCounts.uniform(1, 300_000).crc32() == zlib.crc32(np.ones(300_000, "<i8").tobytes())
    mixed = UnitCounts.of((4, 0, 2))
    assert mixed.value is None and mixed == [4, 0, 2] and mixed.total == 6 and mixed.first_ids(2) == 4
    assert mixed.crc32() == zlib.crc32(np.array([4, 0, 2], "<i8").tobytes()) and mixed.sum_of(1, 9) == 2
    assert UnitCounts.of((7, 7)) == UnitCounts.uniform(7, 2) and UnitCounts.of(()) == ()
    with pytest.raises(IndexError):
        small[5]


def test_a_plan_of_100m_objects_makes_no_array_of_them(monkeypatch):
    """The layout of one-sample units is per position: nothing of the size of the data set is
    made (the whole-epoch functions are made to refuse), and a window still holds distinct
    units from all over the data set."""
    def refuse(*args, **kwargs):
        raise AssertionError("an array of every unit was asked for")

    for name in ("permutation", "blocks", "_layout"):
        real = getattr(plan, name)
        monkeypatch.setattr(plan, name, lambda n, *a, real=real, **k: refuse() if isinstance(n, PlanSpec) or (
            np.size(n) > 10**6 or isinstance(n, int) and n > 10**6) else real(n, *a, **k))
    n = 10**8
    spec = PlanSpec(counts=UnitCounts.uniform(1, n), batch_size=256, world_size=8, seed=3, block=4)
    chunks = rank_chunks(spec, 5)
    ids, valid = chunk_sample_ids(spec, 0, chunks[7])
    assert valid.all() and len(set(ids.tolist())) == len(ids) == 4 * 256
    assert ids.min() < n // 10 and ids.max() > n - n // 10  # drawn from all over, not a neighbourhood
    again, _ = chunk_sample_ids(spec, 1, chunks[7])
    assert len(set(ids.tolist()) & set(again.tolist())) < 5  # another epoch, other units


def test_a_placed_plan_gives_every_unit_once_per_epoch_over_ranks():
    spec = PlanSpec(counts=(1,) * 5_000, batch_size=16, world_size=3, seed=1, drop_last=False)
    assert spec.placed
    got = [i for r in range(3) for c in rank_chunks(spec, r) for i, v in zip(*chunk_sample_ids(spec, 2, c)) if v]
    assert sorted(got) == list(range(5_000))
    spans = chunk_spans(spec, 2, rank_chunks(spec, 0)[0])
    assert all(len(s) == 1 for s in spans) and len(chunk_order(spec, 2, rank_chunks(spec, 0)[0])) == 4 * 16


def test_only_one_sample_units_of_one_source_are_placed():
    assert not PlanSpec(counts=(1, 2, 1), batch_size=2).placed
    assert not PlanSpec(counts=(1,) * 8, batch_size=2, keyed=False).placed
    assert not PlanSpec(counts=(1,) * 8, batch_size=2, draws=((4, 4), (4, 4))).placed


def test_a_state_saved_before_v4_resumes_in_its_own_layout():
    """A checkpoint of a folder epoch written before version 4 (no ``keyed`` in its plan) goes on
    in the layout it was saved in: the samples it had not delivered, each once."""
    old = PlanSpec(counts=(1,) * 600, batch_size=10, world_size=2, seed=4, keyed=False)
    progress = Progress.for_rank(old)
    delivered = []
    for chunk in rank_chunks(old, 0)[:3]:
        for b in range(chunk.num_batches):
            progress.advance(chunk.index, b)
    for r in range(2):
        for chunk in rank_chunks(old, r)[:3]:
            delivered += chunk_sample_ids(old, 0, chunk)[0].tolist()
    saved = json.loads(json.dumps({k: v for k, v in plan_identity(old).items() if k != "keyed"}))
    spec = PlanSpec(counts=UnitCounts.uniform(1, 600), batch_size=10, world_size=2, seed=4)
    for cut in ({}, {"world_size": 3}):  # the same plan goes on; or the rest under another cut
        new = PlanSpec(**{**dict(counts=spec.counts, batch_size=10, world_size=2, seed=4), **cut})
        rest_plan, rest_progress = resume_plan(new, 0, saved, progress.to_dict())
        assert not rest_plan.keyed
        rest = [i for r in range(rest_plan.world_size) for c in rank_chunks(rest_plan, r, rest_progress if not cut
                else None) for i in chunk_sample_ids(rest_plan, 0, c)[0].tolist()]
        assert sorted(delivered + rest) == list(range(600))
    assert plan_identity(spec)["keyed"] is True
