"""Invariants of the pure epoch planner: exactly-once, equal steps, determinism, resume."""
from __future__ import annotations

import dataclasses
import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupipe.core.errors import PlanError
from gpupipe.plan import (
    Earlier,
    PlanSpec,
    Progress,
    check_resumable,
    chunk_sample_ids,
    epoch_steps,
    permutation,
    plan_identity,
    rank_chunks,
    resume_plan,
    shard_order,
    steps_per_rank,
    worker_chunks,
)


def _specs(counts):
    return st.builds(PlanSpec, counts=counts, batch_size=st.integers(1, 9), world_size=st.integers(1, 8),
                     seed=st.integers(0, 2**32), shuffle=st.booleans(), drop_last=st.booleans(),
                     chunk_batches=st.integers(1, 5), block=st.one_of(st.just(0), st.integers(1, 12)))


specs = _specs(st.lists(st.integers(0, 40), min_size=1, max_size=12).map(tuple))  # tar shards
# Sources read in place (issue 15): an image folder is a unit per image; Parquet a unit per row group,
# with the uneven sizes writers leave (a small last group per file, empty files).
object_specs = _specs(st.integers(1, 300).map(lambda n: (1,) * n))
rowgroup_specs = _specs(st.lists(st.one_of(st.just(64), st.integers(0, 64)), min_size=1, max_size=20).map(tuple))


def delivered(spec: PlanSpec, epoch: int, rank: int, num_workers: int = 1, progress: Progress | None = None):
    """Ids and valid flags in the order workers would produce them (worker by worker)."""
    chunks = rank_chunks(spec, rank, progress)
    out = []
    for w in range(max(num_workers, 1)):
        for c in worker_chunks(chunks, w, max(num_workers, 1)):
            ids, valid = chunk_sample_ids(spec, epoch, c)
            out.extend(zip(ids.tolist(), valid.tolist()))
    return out


@settings(max_examples=300, deadline=None)
@given(spec=specs, epoch=st.integers(0, 5), workers=st.integers(0, 4))
def test_exactly_once_and_equal_steps(spec, epoch, workers):
    check_exactly_once_and_equal_steps(spec, epoch, workers)


@settings(max_examples=100, deadline=None)
@given(spec=st.one_of(object_specs, rowgroup_specs), epoch=st.integers(0, 5), workers=st.integers(0, 4))
def test_exactly_once_and_equal_steps_over_objects_and_row_groups(spec, epoch, workers):
    check_exactly_once_and_equal_steps(spec, epoch, workers)
    assert delivered(spec, epoch, 0, workers) == delivered(spec, epoch, 0, workers)  # a pure function


def check_exactly_once_and_equal_steps(spec, epoch, workers):
    steps = steps_per_rank(spec)
    all_valid = []
    for rank in range(spec.world_size):
        items = delivered(spec, epoch, rank, workers)
        if spec.world_size == 1 and not spec.drop_last:  # one process: no padding, its last batch short
            assert len(items) == spec.num_samples and all(v for _, v in items)
        else:
            assert len(items) == steps * spec.batch_size  # equal on every rank
        all_valid += [i for i, v in items if v]
    counts = Counter(all_valid)
    assert all(c == 1 for c in counts.values())  # nothing twice
    n = spec.num_samples
    if spec.drop_last:
        assert len(all_valid) == steps * spec.batch_size * spec.world_size
        assert len(all_valid) > n - spec.batch_size * spec.world_size  # drop less than one global step
    else:
        assert sorted(all_valid) == list(range(n))  # every sample exactly once


@settings(max_examples=100, deadline=None)
@given(spec=specs, epoch=st.integers(0, 5))
def test_deterministic_and_independent_of_worker_count(spec, epoch):
    for rank in range(spec.world_size):
        one = delivered(spec, epoch, rank, 1)
        assert one == delivered(spec, epoch, rank, 1)
        # other worker counts deliver the same multiset (the interleaving differs)
        assert sorted(one) == sorted(delivered(spec, epoch, rank, 3))


def test_epochs_differ_and_seeds_differ():
    spec = PlanSpec(counts=(50,) * 8, batch_size=10, world_size=2, seed=7)
    e0, e1 = delivered(spec, 0, 0), delivered(spec, 1, 0)
    assert e0 != e1 and sorted(e0) != sorted(e1)  # different order and a different share
    other = PlanSpec(counts=(50,) * 8, batch_size=10, world_size=2, seed=8)
    assert delivered(other, 0, 0) != e0


@settings(max_examples=200, deadline=None)
@given(spec=specs, epoch=st.integers(0, 3), data=st.data(), workers_before=st.integers(1, 4), workers_after=st.integers(0, 4))
def test_resume_at_any_point_gives_the_rest(spec, epoch, data, workers_before, workers_after):
    check_resume(spec, epoch, data, workers_before, workers_after)


@settings(max_examples=60, deadline=None)
@given(spec=st.one_of(object_specs, rowgroup_specs), epoch=st.integers(0, 3), data=st.data(),
       workers_before=st.integers(1, 4), workers_after=st.integers(0, 4))
def test_resume_over_objects_and_row_groups(spec, epoch, data, workers_before, workers_after):
    check_resume(spec, epoch, data, workers_before, workers_after)


def test_a_million_units_of_a_state_before_v4_draw_the_unit_order_once_per_epoch(monkeypatch):
    """An epoch resumed from a state saved before version 4 lays a folder's units out as it did
    then (``keyed`` False: a permutation of all of them): drawn once per epoch and kept, not
    drawn again for each chunk (~0.1 s each here)."""
    import gpupipe.plan as plan

    draws = []
    monkeypatch.setattr(plan, "shard_order", lambda spec, epoch: draws.append(epoch) or plan.permutation(
        len(spec.counts), (spec.seed, epoch, 1)))
    spec = PlanSpec(counts=(1,) * 1_000_000, batch_size=256, world_size=8, seed=1, keyed=False)
    chunks = rank_chunks(spec, 3)
    assert len(chunks) == 122  # 1e6 // (8 * 256) = 488 steps, in chunks of 4 batches
    ids = [chunk_sample_ids(spec, 0, c)[0] for c in chunks[:10]] + [chunk_sample_ids(spec, 1, chunks[0])[0]]
    assert draws == [0, 1]
    assert len(set(int(i) for a in ids[:10] for i in a)) == 10 * 4 * 256


def check_resume(spec, epoch, data, workers_before, workers_after):
    """Deliver batches in a DataLoader-like round-robin, stop anywhere, save, resume with
    another worker count: the union equals an uninterrupted epoch, nothing repeated."""
    rank = data.draw(st.integers(0, spec.world_size - 1))
    full = delivered(spec, epoch, rank, 1)
    progress = Progress.for_rank(spec)
    queues = [list(worker_chunks(rank_chunks(spec, rank), w, workers_before)) for w in range(workers_before)]
    batches = []  # (chunk, batch) in round-robin delivery order
    per_worker = [[(c.index, b) for c in q for b in range(c.num_batches)] for q in queues]
    for rnd in range(max((len(p) for p in per_worker), default=0)):
        batches += [p[rnd] for p in per_worker if rnd < len(p)]
    stop = data.draw(st.integers(0, len(batches)))
    seen = []
    for chunk, b in batches[:stop]:
        progress.advance(chunk, b)
        c = next(c for c in rank_chunks(spec, rank) if c.index == chunk)
        ids, valid = chunk_sample_ids(spec, epoch, c)
        seen += list(zip(ids.tolist(), valid.tolist()))[b * spec.batch_size:(b + 1) * spec.batch_size]
    state = json.loads(json.dumps(progress.to_dict()))
    resumed = Progress.from_dict(spec, state)
    rest = delivered(spec, epoch, rank, workers_after, resumed)
    assert sorted(seen + rest) == sorted(full)
    assert len(seen) + len(rest) == len(full)


def test_permutation_is_a_stable_function_of_its_key():
    p = permutation(10, (1, 2, 3))
    assert sorted(p.tolist()) == list(range(10))
    assert p.tolist() == permutation(10, (1, 2, 3)).tolist()
    assert p.tolist() != permutation(10, (1, 2, 4)).tolist()
    # pinned: the order must not change between releases or machines
    assert permutation(8, (0, 0, 1)).tolist() == PINNED_PERMUTATION


PINNED_PERMUTATION = [7, 6, 4, 5, 3, 1, 0, 2]  # recorded with NumPy 2.4 PCG64


def test_other_data_or_order_mid_epoch_is_refused_with_reason_and_another_cut_is_not():
    saved = plan_identity(PlanSpec(counts=(10, 10), batch_size=2, world_size=2))
    for change, named in [({"seed": 1}, "seed: saved 0, now 1"), ({"shuffle": False}, "shuffle: saved True, now False"),
                          ({"counts": (12, 8)}, r"counts_crc32: saved \d+, now \d+")]:
        now = PlanSpec(**{"counts": (10, 10), "batch_size": 2, "world_size": 2, **change})
        with pytest.raises(PlanError, match=named):
            check_resumable(saved, now, mid_epoch=True)
        check_resumable(saved, now, mid_epoch=False)  # at an epoch boundary it is fine
    # world size, batch size, shuffle window, drop_last: the rest of the epoch is planned anew
    check_resumable(saved, PlanSpec(counts=(10, 10), batch_size=3, world_size=4, chunk_batches=1, drop_last=False),
                    mid_epoch=True)


def test_progress_rejects_out_of_order_and_foreign_state():
    spec = PlanSpec(counts=(10,), batch_size=2, chunk_batches=2)
    p = Progress.for_rank(spec)
    with pytest.raises(PlanError, match="out of order"):
        p.advance(0, 1)
    with pytest.raises(PlanError, match="does not fit"):
        Progress.from_dict(spec, {"done_below": 0, "partial": {"99": 1}})


def test_bad_spec_values_raise():
    with pytest.raises(PlanError, match="batch_size"):
        PlanSpec(counts=(1,), batch_size=0)
    with pytest.raises(PlanError, match="rank 3"):
        rank_chunks(PlanSpec(counts=(4,), batch_size=1, world_size=2), 3)


def test_empty_and_tiny_datasets():
    assert steps_per_rank(PlanSpec(counts=(0, 0), batch_size=4)) == 0
    spec = PlanSpec(counts=(3,), batch_size=4, world_size=2, drop_last=False)
    assert steps_per_rank(spec) == 1
    items = delivered(spec, 0, 0) + delivered(spec, 0, 1)
    assert sorted(i for i, v in items if v) == [0, 1, 2] and sum(not v for _, v in items) == 5


@settings(max_examples=300, deadline=None)
@given(spec=specs, epoch=st.integers(0, 3))
def test_padding_is_spread_so_real_samples_per_rank_differ_by_at_most_one(spec, epoch):
    """With drop_last=False every rank gets floor(N/W) or ceil(N/W) real samples (issue 25: the
    padding used to land on the last ranks, some with no real sample at all)."""
    spec = dataclasses.replace(spec, drop_last=False)
    n, w = spec.num_samples, spec.world_size
    real = [sum(v for _, v in delivered(spec, epoch, r)) for r in range(w)]
    assert all(n // w <= x <= -(-n // w) for x in real), real
    assert sum(real) == n


def batches_of(spec: PlanSpec, epoch: int, rank: int) -> list[list[tuple[int, bool]]]:
    """(id, valid) of each batch of ``rank``, in the plan's order: a chunk's delivery order cut
    every ``batch_size`` samples."""
    out = []
    for c in rank_chunks(spec, rank):
        items = list(zip(*(a.tolist() for a in chunk_sample_ids(spec, epoch, c))))
        out += [items[i:i + spec.batch_size] for i in range(0, len(items), spec.batch_size)]
    return out


@settings(max_examples=300, deadline=None)
@given(spec=st.one_of(specs, object_specs, rowgroup_specs), epoch=st.integers(0, 3))
def test_one_process_without_drop_last_ends_with_a_short_batch_as_torch_does(spec, epoch):
    """Issue 35: ``world_size`` 1, ``drop_last=False``: ``steps`` batches, all full but the last,
    which holds the ``N % batch_size`` samples left; no padding at all (a val folder of 30
    images at batch 32 gave 32 samples, two of them repeats). Several ranks still pad."""
    spec = dataclasses.replace(spec, world_size=1, drop_last=False)
    n, b = spec.num_samples, spec.batch_size
    batches = batches_of(spec, epoch, 0)
    assert len(batches) == steps_per_rank(spec) == -(-n // b)
    assert [len(x) for x in batches] == [b] * (n // b) + ([n % b] if n % b else [])
    assert all(v for x in batches for _, v in x)
    assert sorted(i for x in batches for i, _ in x) == list(range(n))


def test_thirty_samples_at_batch_32_are_one_batch_of_30_on_one_process_and_padded_on_two():
    one = PlanSpec(counts=(1,) * 30, batch_size=32, drop_last=False, seed=5)
    (batch,) = batches_of(one, 0, 0)
    assert len(batch) == 30 and sorted(i for i, _ in batch) == list(range(30)) and all(v for _, v in batch)
    two = dataclasses.replace(one, world_size=2)
    ranks = [batches_of(two, 0, r) for r in range(2)]
    assert [[len(x) for x in r] for r in ranks] == [[32], [32]]  # equal steps and shapes on both ranks
    assert sorted(i for r in ranks for i, v in r[0] if v) == list(range(30))
    assert [sum(not v for _, v in r[0]) for r in ranks] == [17, 17]  # 15 real samples each, the rest padding


# ------------------------------------------------------------------------------ elastic resume (issue 25)

cuts = st.fixed_dictionaries({"batch_size": st.integers(1, 9), "world_size": st.integers(1, 8),
                              "drop_last": st.booleans(), "chunk_batches": st.integers(1, 5)})


def take(plan: PlanSpec, epoch: int, progress: Progress, k: int) -> list[tuple[int, bool]]:
    """Every rank delivers its next ``k`` batches, in the plan's order (the loader's, for any worker
    count); ``progress`` (every rank's: they move in lockstep) advances. Returns (id, valid) of all ranks."""
    out = []
    for rank in range(plan.world_size):
        out += delivered(plan, epoch, rank, 1, progress)[: k * plan.batch_size]
    for c in rank_chunks(plan, 0, progress):
        for b in range(c.first_batch, c.num_batches):
            if k == 0:
                return out
            progress.advance(c.index, b)
            k -= 1
    return out


def saved_state(plan: PlanSpec, progress: Progress) -> dict:
    """What a checkpoint holds of rank 0's position, after a trip through JSON."""
    return json.loads(json.dumps({"plan": plan_identity(plan), "progress": progress.to_dict(),
                                  "before": [part.to_dict() for part in plan.before]}))


def resumed(spec: PlanSpec, epoch: int, state: dict) -> tuple[PlanSpec, Progress]:
    return resume_plan(spec, epoch, state["plan"], state["progress"],
                       [Earlier.from_dict(epoch, d) for d in state["before"]])


def check_elastic(spec: PlanSpec, epoch: int, data, resumes: int) -> None:
    """Run part of an epoch, save rank 0's position, resume it under another cut (world size,
    batch size, shuffle window, drop_last; or the same), ``resumes`` times, then run the epoch
    out: every sample of the epoch is delivered once, the ranks of every plan take equal steps,
    and without drop_last the real samples per rank differ by at most one."""
    epoch_ids = sorted(i for r in range(spec.world_size) for i, v in delivered(spec, epoch, r) if v)
    plan, progress = spec, Progress.for_rank(spec)
    seen: list[int] = []
    done = 0  # batches every rank has taken this epoch
    dropped_at_most = 0  # samples a plan with drop_last may leave out of the rest: less than one step
    for _ in range(resumes):
        left = steps_per_rank(plan) - progress.batches_done
        if left <= 1:
            break
        k = data.draw(st.integers(0 if (progress.started or plan.before) else 1, left - 1), label="stop")
        seen += [i for i, v in take(plan, epoch, progress, k) if v]
        done += k
        state = saved_state(plan, progress)
        cut = data.draw(cuts, label="new cut")
        new = dataclasses.replace(spec, **cut)
        same = all(state["plan"][key] == value for key, value in cut.items())
        plan, progress = resumed(new, epoch, state)
        # len(): the batches of the epoch, those taken before the resume counted
        assert epoch_steps(plan) == done + steps_per_rank(plan) - progress.batches_done
        if same:  # the saved plan continues, in its order
            assert plan.before == tuple(Earlier.from_dict(epoch, d) for d in state["before"])
        elif cut["drop_last"]:
            dropped_at_most += cut["world_size"] * cut["batch_size"] - 1
        if not plan.drop_last:
            real = [sum(v for _, v in delivered(plan, epoch, r)) for r in range(plan.world_size)]
            assert max(real) - min(real) <= 1, real
    rest = [delivered(plan, epoch, r, 1, progress) for r in range(plan.world_size)]
    assert len({len(items) for items in rest}) == 1  # equal steps on every rank
    seen += [i for items in rest for i, v in items if v]
    assert len(seen) == len(set(seen))  # nothing twice
    assert set(seen) <= set(epoch_ids)
    assert len(epoch_ids) - len(seen) <= dropped_at_most  # nothing lost but what a drop_last plan drops


@settings(max_examples=300, deadline=None)
@given(spec=specs, epoch=st.integers(0, 3), data=st.data())
def test_elastic_resume_delivers_exactly_the_rest_of_the_epoch(spec, epoch, data):
    check_elastic(spec, epoch, data, resumes=1)


@settings(max_examples=150, deadline=None)
@given(spec=specs, epoch=st.integers(0, 3), data=st.data())
def test_resumes_one_after_another_in_one_epoch(spec, epoch, data):
    check_elastic(spec, epoch, data, resumes=3)


@settings(max_examples=60, deadline=None)
@given(spec=st.one_of(object_specs, rowgroup_specs), epoch=st.integers(0, 3), data=st.data())
def test_elastic_resume_over_objects_and_row_groups(spec, epoch, data):
    check_elastic(spec, epoch, data, resumes=2)


def test_a_resume_with_the_same_cut_keeps_the_order_of_an_uninterrupted_run():
    spec = PlanSpec(counts=(13, 0, 21, 8, 1), batch_size=3, world_size=2, seed=4, chunk_batches=2, drop_last=False)
    progress = Progress.for_rank(spec)
    first = take(spec, 1, progress, 3)
    plan, progress = resumed(spec, 1, saved_state(spec, progress))
    assert plan == spec and progress.batches_done == 3
    for rank in range(2):
        full = delivered(spec, 1, rank)
        assert full == first[rank * 9:(rank + 1) * 9] + delivered(plan, 1, rank, 1, progress)


def test_an_elastic_plan_is_the_rest_of_its_epoch_only():
    spec = PlanSpec(counts=(20,), batch_size=2, world_size=2)
    progress = Progress.for_rank(spec)
    take(spec, 0, progress, 1)
    plan, _ = resumed(dataclasses.replace(spec, world_size=3), 0, saved_state(spec, progress))
    assert plan.length == 16 and epoch_steps(plan) == 1 + 16 // 6  # drop_last: 4 of the rest left out
    with pytest.raises(PlanError, match="rest of epoch 0, not of epoch 1"):
        chunk_sample_ids(plan, 1, rank_chunks(plan, 0)[0])


def v1_delivered(spec: PlanSpec, epoch: int, rank: int, progress: Progress) -> list[tuple[int, bool]]:
    """What the plan of state version 1 delivered on ``rank`` up to ``progress``: contiguous rank
    spans of steps x batch positions, padding past the end of the sequence (the last ranks),
    chunk windows keyed by (seed, epoch, 2, start). A reference written out here, not the planner."""
    order = shard_order(spec, epoch)
    seq = np.concatenate([np.arange(spec.counts[s]) + spec.first_ids(s) for s in order] or [np.zeros(0, np.int64)])
    size = steps_per_rank(spec) * spec.batch_size
    out = []
    for index, first in enumerate(range(0, steps_per_rank(spec), spec.chunk_batches)):
        start = rank * size + first * spec.batch_size
        n = min(spec.chunk_batches, steps_per_rank(spec) - first) * spec.batch_size
        pos = start + (permutation(n, (spec.seed, epoch, 2, start)) if spec.shuffle else np.arange(n))
        pos = pos[: progress.done(index) * spec.batch_size]
        out += [(int(seq[p % spec.num_samples]), bool(p < spec.num_samples)) for p in pos]
    return out


def interleaved_progress(spec: PlanSpec, workers: int, data) -> Progress:
    """A rank's progress after some of its batches, delivered round-robin by ``workers`` workers
    (several chunks started at once), as a state of an older version could hold."""
    sizes = Progress.for_rank(spec).chunk_sizes
    queues = [[(c, b) for c in range(w, len(sizes), workers) for b in range(sizes[c])] for w in range(workers)]
    batches = [q[i] for i in range(max(map(len, queues))) for q in queues if i < len(q)]  # round-robin
    progress = Progress.for_rank(spec)
    for c, b in batches[: data.draw(st.integers(1, len(batches) - 1))]:
        progress.advance(c, b)
    return progress


@settings(max_examples=200, deadline=None)
@given(spec=specs, epoch=st.integers(0, 3), data=st.data(), workers=st.integers(1, 4))
def test_a_version_1_state_resumes_under_any_cut_with_exactly_the_rest(spec, epoch, data, workers):
    """A mid-epoch state of version 1: padding on the last ranks, and chunks delivered interleaved
    by several workers (several chunks started). Resumed under its own cut or another, the
    samples not yet delivered by any rank are delivered, each once. Such a state predates blocks
    (it has no ``block``: shards whole), and the new settings' block waits for the next epoch."""
    new_block, spec = spec.block, dataclasses.replace(spec, block=0)
    steps = steps_per_rank(spec)
    if steps < 2 or spec.num_samples == 0:
        return
    progress = interleaved_progress(spec, workers, data)
    seen = [i for r in range(spec.world_size) for i, v in v1_delivered(spec, epoch, r, progress) if v]
    cut = data.draw(st.one_of(st.just({}), cuts))
    new = dataclasses.replace(spec, **cut, block=new_block)
    saved = {k: v for k, v in plan_identity(spec).items() if k not in ("block", "keyed")}  # v1 had neither
    state = json.loads(json.dumps({"plan": saved, "progress": progress.to_dict()}))
    plan, rest_progress = resume_plan(new, epoch, state["plan"], state["progress"], spread=False, short_tail=False)
    assert plan.block == 0
    rest = [delivered(plan, epoch, r, 1, rest_progress) for r in range(plan.world_size)]
    assert len({len(items) for items in rest}) == 1
    seen += [i for items in rest for i, v in items if v]
    assert len(seen) == len(set(seen))
    epoch_all = spec.num_samples if not spec.drop_last else steps * spec.world_size * spec.batch_size
    lost = epoch_all - len(seen)
    assert 0 <= lost <= (new.world_size * new.batch_size - 1 if new.drop_last and plan.before else 0)


@settings(max_examples=200, deadline=None)
@given(spec=st.one_of(specs, object_specs), epoch=st.integers(0, 3), data=st.data(), workers=st.integers(1, 4))
def test_a_version_2_state_of_one_process_resumes_inside_its_padded_last_chunk_with_exactly_the_rest(
        spec, epoch, data, workers):
    """Versions 1 and 2 padded one process's last batch too (the layout :func:`v1_delivered` writes
    out: with one rank, version 2's spread padding is version 1's). A state saved inside that last
    chunk, whose order this version's short batch changes, resumes under its own cut with the
    samples it had not delivered, each once; a state saved before it continues the same plan.
    Such a state predates blocks: shards whole, and no ``block`` in it."""
    spec = dataclasses.replace(spec, world_size=1, drop_last=False, block=0)
    steps = steps_per_rank(spec)
    if steps < 2 or spec.num_samples == 0:
        return
    progress = interleaved_progress(spec, workers, data)
    seen = [i for i, v in v1_delivered(spec, epoch, 0, progress) if v]
    saved = {k: v for k, v in plan_identity(spec).items() if k not in ("block", "keyed")}  # v1 had neither
    state = json.loads(json.dumps({"version": 2, "plan": saved, "progress": progress.to_dict()}))
    plan, rest_progress = resume_plan(spec, epoch, state["plan"], state["progress"], short_tail=False)
    if len(progress.chunk_sizes) - 1 not in progress.partial:
        assert plan == dataclasses.replace(spec, keyed=not spec.placed)  # not begun: the same plan goes on
    rest = [i for i, v in delivered(plan, epoch, 0, 1, rest_progress) if v]
    assert sorted(seen + rest) == list(range(spec.num_samples))
