"""Units of work (issue 34): a worker takes a few batches of a chunk and reads only their samples.
The delivered order is the whole-chunk order, for every unit size and worker count, and resuming
stays exact and elastic."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_plan import cuts, delivered, object_specs, rowgroup_specs, specs, take

from gpupipe.core.errors import PlanError
from gpupipe.plan import Chunk, PlanSpec, Progress, chunk_size, plan_identity, rank_chunks, resume_plan
from gpupipe.plan_units import Unit, cut_units, rank_units, unit_sample_ids, unit_spans, worker_units

unit_sizes = st.integers(1, 6)


def unit_samples(spec: PlanSpec, u: Unit) -> int:
    """Samples in ``u``: whole batches, but for one process's short last batch (the plan ends at its last sample)."""
    return min(u.num_batches * spec.batch_size, chunk_size(spec, u.chunk) - u.first_batch * spec.batch_size)


def by_units(spec: PlanSpec, epoch: int, rank: int, unit_batches: int, workers: int = 1,
             progress: Progress | None = None, first_batches: int | None = None) -> list[tuple[int, bool]]:
    """Ids and valid flags as the loader delivers them: each worker reads its round-robin share of
    the units, one item per unit, and torch takes the workers' items round-robin."""
    units = rank_units(spec, rank, progress, unit_batches, first_batches)
    n = max(workers, 1)
    shares = [worker_units(units, w, n) for w in range(n)]
    order = [share[i] for i in range(max(map(len, shares), default=0)) for share in shares if i < len(share)]
    assert [u.key for u in order] == [u.key for u in units]  # round-robin gives back the plan's order
    out = []
    for u in order:
        ids, valid = unit_sample_ids(spec, epoch, u)
        assert len(ids) == unit_samples(spec, u)
        out.extend(zip(ids.tolist(), valid.tolist()))
    return out


@settings(max_examples=300, deadline=None)
@given(spec=specs, epoch=st.integers(0, 5), unit_batches=unit_sizes, workers=st.integers(0, 4))
def test_units_deliver_the_whole_chunk_order_for_any_unit_size_and_worker_count(spec, epoch, unit_batches, workers):
    for rank in range(spec.world_size):
        assert by_units(spec, epoch, rank, unit_batches, workers) == delivered(spec, epoch, rank)


@settings(max_examples=150, deadline=None)
@given(spec=specs, epoch=st.integers(0, 5), unit_batches=unit_sizes, first=unit_sizes, workers=st.integers(0, 4))
def test_small_units_in_a_passs_first_chunk_change_nothing_delivered(spec, epoch, unit_batches, first, workers):
    """The loader's default on local tar shards: units of one batch in the first chunk (a fast
    first batch), the window after it (long reads); any two sizes deliver the chunk order."""
    units = rank_units(spec, 0, None, unit_batches, first)
    chunks = rank_chunks(spec, 0)
    if chunks:
        assert all(u.num_batches <= first for u in units if u.chunk == chunks[0])
        assert all(u.num_batches <= unit_batches for u in units if u.chunk != chunks[0])
    for rank in range(spec.world_size):
        assert by_units(spec, epoch, rank, unit_batches, workers, first_batches=first) == delivered(spec, epoch, rank)


@settings(max_examples=100, deadline=None)
@given(spec=st.one_of(object_specs, rowgroup_specs), epoch=st.integers(0, 5), unit_batches=unit_sizes,
       workers=st.integers(0, 4))
def test_units_over_objects_and_row_groups(spec, epoch, unit_batches, workers):
    rank = spec.world_size - 1
    assert by_units(spec, epoch, rank, unit_batches, workers) == delivered(spec, epoch, rank)


def test_units_keep_the_order_of_the_whole_chunk_reader_before_units():
    """Pinned: the order gpupipe delivered before units (commit 161d1bb, a chunk read whole), for
    a plan with an empty shard and one padded sample (-1 - id: not valid)."""
    spec = PlanSpec(counts=(7, 0, 12, 4), batch_size=3, world_size=2, seed=5, chunk_batches=3, drop_last=False)
    before = {0: [15, 11, 10, 9, 7, 12, 14, 13, 8, 17, 16, 18], 1: [20, 4, 3, 6, 5, 1, 0, 19, 2, 21, 22, -8]}
    for unit_batches in (1, 2, 3, 9):
        for workers in (0, 1, 3):
            for rank in (0, 1):
                got = by_units(spec, 1, rank, unit_batches, workers)
                assert [i if v else -1 - i for i, v in got] == before[rank]


@settings(max_examples=300, deadline=None)
@given(spec=specs, epoch=st.integers(0, 3), unit_batches=unit_sizes)
def test_a_unit_reads_only_its_samples_in_runs(spec, epoch, unit_batches):
    """A unit's spans hold exactly its samples, in sequence order, each span a run of one shard
    that the next span does not continue (else they would be one)."""
    for u in rank_units(spec, 0, None, unit_batches):
        spans, order = unit_spans(spec, epoch, u)
        assert sum(len(s) for s in spans) == unit_samples(spec, u)
        assert sorted(order.tolist()) == list(range(len(order)))
        assert all(0 <= s.start < s.stop <= spec.counts[s.shard] for s in spans)
        for a, b in zip(spans, spans[1:]):
            assert not (a.shard == b.shard and a.stop == b.start and a.valid == b.valid)


def test_the_units_of_a_shuffled_window_are_many_short_runs_and_of_an_unshuffled_one_a_few_long():
    spec = PlanSpec(counts=(1000, 1000), batch_size=64, chunk_batches=16, seed=2)
    unit = rank_units(spec, 0, None, 1)[0]
    spans, _ = unit_spans(spec, 0, unit)
    assert 40 < len(spans) <= 64  # 64 of the window's 1024 positions: few of them neighbours
    spans, order = unit_spans(dataclasses.replace(spec, shuffle=False), 0, unit)
    assert len(spans) == 1 and len(spans[0]) == 64 and order.tolist() == list(range(64))
    whole = rank_units(spec, 0, None, 16)[0]
    assert whole.num_batches == 16 and len(unit_spans(spec, 0, whole)[0]) == 2  # the window: a run per shard


def test_units_are_cut_from_the_first_undelivered_batch_of_a_chunk():
    spec = PlanSpec(counts=(100,), batch_size=2, chunk_batches=7)  # 50 steps: chunks of 7, the last of 1
    progress = Progress.for_rank(spec)
    for b in range(5):
        progress.advance(0, b)
    units = rank_units(spec, 0, progress, 3)
    assert [(u.chunk.index, u.first_batch, u.num_batches) for u in units[:5]] == \
        [(0, 5, 2), (1, 0, 3), (1, 3, 3), (1, 6, 1), (2, 0, 3)]
    assert [(u.chunk.index, u.num_batches) for u in rank_units(spec, 0, None, 99)] == \
        [(c, 7) for c in range(7)] + [(7, 1)]  # larger than a chunk: the chunk whole
    assert units[0].key == (0, 5)
    with pytest.raises(PlanError, match="unit_batches must be >= 1, got 0"):
        cut_units([Chunk(index=0, start=0, num_batches=1)], 0)


@settings(max_examples=200, deadline=None)
@given(spec=specs, epoch=st.integers(0, 3), data=st.data(), units_before=unit_sizes, units_after=unit_sizes,
       workers_before=st.integers(1, 4), workers_after=st.integers(0, 4))
def test_resume_with_units_is_exact_for_any_unit_size_and_worker_count(spec, epoch, data, units_before,
                                                                         units_after, workers_before, workers_after):
    """Deliver units round-robin, stop after any batch (inside a unit too), save, resume with
    another unit size and worker count: the rest is the uninterrupted run's rest, in its order."""
    rank = data.draw(st.integers(0, spec.world_size - 1))
    full = delivered(spec, epoch, rank)
    batches = [(u.chunk.index, u.first_batch + i) for u in rank_units(spec, rank, None, units_before)
               for i in range(u.num_batches)]
    stop = data.draw(st.integers(0, len(batches)))
    progress = Progress.for_rank(spec)
    for chunk, b in batches[:stop]:
        progress.advance(chunk, b)
    resumed = Progress.from_dict(spec, json.loads(json.dumps(progress.to_dict())))
    rest = by_units(spec, epoch, rank, units_after, workers_after, resumed)
    assert full == full[:stop * spec.batch_size] + rest


@settings(max_examples=150, deadline=None)
@given(spec=specs, epoch=st.integers(0, 3), data=st.data(), unit_batches=unit_sizes, workers=st.integers(0, 4))
def test_elastic_resume_read_by_units_delivers_the_rest_of_the_epoch_in_the_chunks_order(spec, epoch, data,
                                                                                         unit_batches, workers):
    """After a resume under another cut (the plan covers the rest of the epoch only), units deliver
    what whole chunks deliver: the rest of the epoch, each sample once."""
    steps = steps_of(spec)
    if steps < 2:
        return
    progress = Progress.for_rank(spec)
    take(spec, epoch, progress, data.draw(st.integers(1, steps - 1)))
    state = json.loads(json.dumps({"plan": plan_identity(spec), "progress": progress.to_dict()}))
    plan, rest = resume_plan(dataclasses.replace(spec, **data.draw(cuts)), epoch, state["plan"], state["progress"])
    for rank in range(plan.world_size):
        assert by_units(plan, epoch, rank, unit_batches, workers, rest) == delivered(plan, epoch, rank, 1, rest)


def steps_of(spec: PlanSpec) -> int:
    return sum(c.num_batches for c in rank_chunks(spec, 0))


def test_a_unit_is_plain_data():
    unit = rank_units(PlanSpec(counts=(10,), batch_size=2), 0)[0]
    assert dataclasses.replace(unit) == unit and unit == Unit(unit.chunk, 0, 1)
    assert np.array_equal(unit_sample_ids(PlanSpec(counts=(10,), batch_size=2), 0, unit)[0],
                          unit_sample_ids(PlanSpec(counts=(10,), batch_size=2), 0, unit)[0])
