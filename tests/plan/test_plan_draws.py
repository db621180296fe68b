"""Several sources mixed in one plan (issue 35): each source's draw per epoch is exact, repeats are
even, a source drawn below its size covers all its samples over epochs, and the plan's contracts
(equal steps, the same order whatever the worker count, resume at any point, under another cut)
hold for a mix as for one source. Properties, over random sources, sizes, draws and cuts."""
from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_plan import delivered, take  # noqa: E402

from gpupipe.core.errors import PlanError
from gpupipe.plan import PlanSpec, Progress, draw_sizes, plan_identity, resume_plan, steps_per_rank


@st.composite
def mixes(draw):
    sources = draw(st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=4).filter(lambda c: sum(c) > 0),
                            min_size=1, max_size=3))
    counts = tuple(c for src in sources for c in src)
    draws = tuple((len(src), draw(st.integers(0, 3 * sum(src)))) for src in sources)
    spec = PlanSpec(counts=counts, batch_size=draw(st.integers(1, 7)), world_size=draw(st.integers(1, 4)),
                    seed=draw(st.integers(0, 2**32)), shuffle=draw(st.booleans()), drop_last=False,
                    chunk_batches=draw(st.integers(1, 4)), block=draw(st.one_of(st.just(0), st.integers(1, 6))),
                    draws=draws)
    return spec


def _source_of(spec: PlanSpec) -> np.ndarray:
    """The source of every global sample id."""
    return np.repeat(np.arange(len(spec.draws)), [sum(spec.counts[a:a + u]) for (u, _), a in
                                                  zip(spec.draws, np.cumsum([0] + [u for u, _ in spec.draws]))])


def _epoch(spec: PlanSpec, epoch: int) -> Counter:
    valid = [i for r in range(spec.world_size) for i, v in delivered(spec, epoch, r) if v]
    return Counter(valid)


@settings(max_examples=150, deadline=None)
@given(spec=mixes(), epoch=st.integers(0, 4))
def test_each_source_gives_its_draw_exactly_and_evenly_with_equal_steps(spec, epoch):
    steps = steps_per_rank(spec)
    for r in range(spec.world_size):
        items = delivered(spec, epoch, r)
        assert len(items) == (spec.num_samples if spec.world_size == 1 else steps * spec.batch_size)
    got = _epoch(spec, epoch)
    source = _source_of(spec)
    for s, (_, n) in enumerate(spec.draws):
        mine = [got.get(i, 0) for i in np.flatnonzero(source == s).tolist()]
        assert sum(mine) == n  # the draw, exactly
        assert max(mine) - min(mine) <= 1  # repeats even: each sample n // size or one more times
    assert sum(got.values()) == spec.num_samples


@settings(max_examples=80, deadline=None)
@given(spec=mixes())
def test_a_source_drawn_below_its_size_sees_all_its_samples_over_epochs(spec):
    source = _source_of(spec)
    seen: Counter = Counter()
    epochs = max(-(-int((source == s).sum()) // n) for s, (_, n) in enumerate(spec.draws) if n) \
        if any(n for _, n in spec.draws) else 1
    for e in range(epochs):
        seen += _epoch(spec, e)
    for s, (_, n) in enumerate(spec.draws):
        mine = [seen.get(i, 0) for i in np.flatnonzero(source == s).tolist()]
        if n:
            assert min(mine) >= 1 and max(mine) - min(mine) <= 1  # every sample, as evenly as it goes


@settings(max_examples=100, deadline=None)
@given(spec=mixes(), epoch=st.integers(0, 3), data=st.data())
def test_a_mix_resumes_anywhere_under_its_cut_or_another_with_exactly_the_rest(spec, epoch, data):
    """Stopped after any number of steps and resumed under the same cut or another (world size,
    batch size), a mix delivers the rest of its epoch's draws: part + rest = the whole epoch."""
    steps = steps_per_rank(spec)
    if steps < 2:
        return
    progress = Progress.for_rank(spec)
    part = Counter(i for i, v in take(spec, epoch, progress, data.draw(st.integers(1, steps - 1))) if v)
    cut = data.draw(st.one_of(st.just({}), st.fixed_dictionaries({"batch_size": st.integers(1, 7),
                                                                  "world_size": st.integers(1, 4)})))
    plan, rest_progress = resume_plan(dataclasses.replace(spec, **cut), epoch, plan_identity(spec), progress.to_dict())
    rest = Counter(i for r in range(plan.world_size) for i, v in delivered(plan, epoch, r, 1, rest_progress) if v)
    assert part + rest == _epoch(spec, epoch)


def test_draw_sizes_by_weight_repeat_or_samples():
    assert draw_sizes((100, 50), weight=(1, 1)) == (75, 75)  # the weighted sources share their total size
    assert draw_sizes((100, 50, 10), weight=(3, 1, None), repeat=(None, None, 2.5)) == (113, 37, 25)
    assert draw_sizes((100, 50), samples=(10, None), repeat=(None, 1)) == (10, 50)
    assert sum(draw_sizes((7, 7, 7), weight=(1, 1, 1))) == 21
    with pytest.raises(PlanError, match="source 1: give one of weight, repeat or samples"):
        draw_sizes((10, 10), weight=(1, 2), repeat=(None, 1))
    with pytest.raises(PlanError, match="sum to 0"):
        draw_sizes((10,), weight=(0,))


def test_a_mix_is_part_of_the_plan_identity_and_a_mid_epoch_resume_with_another_is_refused():
    spec = PlanSpec(counts=(10, 10, 5), batch_size=4, draws=((2, 20), (1, 10)))
    other = dataclasses.replace(spec, draws=((2, 15), (1, 15)))
    with pytest.raises(PlanError, match="draws"):
        resume_plan(other, 0, plan_identity(spec), Progress.for_rank(spec).to_dict())
    old = {k: v for k, v in plan_identity(dataclasses.replace(spec, draws=())).items() if k != "draws"}
    resume_plan(dataclasses.replace(spec, draws=()), 0, old, Progress.for_rank(dataclasses.replace(spec, draws=())).to_dict())


def test_draws_must_cover_the_units():
    with pytest.raises(PlanError, match="do not cover"):
        PlanSpec(counts=(1, 2, 3), batch_size=1, draws=((2, 3),))
    with pytest.raises(PlanError, match="no samples"):
        PlanSpec(counts=(0, 2), batch_size=1, draws=((1, 3), (1, 2)))


@st.composite
def per_source_mixes(draw):
    """Mixes whose batches each hold one source: every draw whole batches, drop_last (or one rank)."""
    sources = draw(st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=4).filter(lambda c: sum(c) > 0),
                            min_size=2, max_size=3))
    batch = draw(st.integers(1, 6))
    counts = tuple(c for src in sources for c in src)
    draws = tuple((len(src), batch * draw(st.integers(0, 3 * sum(src) // batch + 1))) for src in sources)
    world = draw(st.integers(1, 3))
    return PlanSpec(counts=counts, batch_size=batch, world_size=world, seed=draw(st.integers(0, 2**32)),
                    shuffle=draw(st.booleans()), drop_last=world > 1 or draw(st.booleans()),
                    chunk_batches=draw(st.integers(1, 4)), block=draw(st.one_of(st.just(0), st.integers(1, 6))),
                    draws=draws, per_source=True)


@settings(max_examples=200, deadline=None)
@given(spec=per_source_mixes(), epoch=st.integers(0, 4))
def test_per_source_batches_hold_one_source_each_and_give_every_draw_exactly(spec, epoch):
    source = _source_of(spec)
    whole = Counter()
    for r in range(spec.world_size):
        items = delivered(spec, epoch, r)
        for i in range(0, len(items), spec.batch_size):
            ids = [sid for sid, _ in items[i:i + spec.batch_size]]
            assert len({int(source[sid]) for sid in ids}) == 1, (r, i, ids)  # one source a batch
        whole += Counter(sid for sid, v in items if v)
    steps = steps_per_rank(spec)
    dropped = spec.num_samples - spec.world_size * steps * spec.batch_size  # the tail no step of every rank takes
    assert sum(whole.values()) == spec.num_samples - dropped
    if dropped == 0:
        for s, (_, n) in enumerate(spec.draws):
            assert sum(c for sid, c in whole.items() if source[sid] == s) == n  # the draw, exactly


def test_per_source_batches_mix_each_source_inside_a_window_and_refuse_what_would_mix_sources():
    spec = PlanSpec(counts=(400, 400, 100, 100), batch_size=16, seed=1, chunk_batches=8, block=4,
                    draws=((2, 512), (2, 128)), per_source=True)
    items = delivered(spec, 0, 0)
    source = _source_of(spec)
    batches = [[sid for sid, _ in items[i:i + 16]] for i in range(0, len(items), 16)]
    kinds = [int(source[b[0]]) for b in batches]
    assert Counter(kinds) == {0: 32, 1: 8}  # a source's share of the batches is its share of the epoch
    assert kinds != sorted(kinds) and kinds != sorted(kinds, reverse=True)  # the sources' batches interleave
    places = [len({sid // 4 for sid in b}) for b, k in zip(batches, kinds) if k == 0]
    assert np.mean(places) > 12  # a window's samples of a source spread over its batches: not 4 blocks of 4 each
    with pytest.raises(PlanError, match="whole batches"):
        dataclasses.replace(spec, draws=((2, 500), (2, 128)))
    with pytest.raises(PlanError, match="drop_last"):
        dataclasses.replace(spec, world_size=2, drop_last=False)
    with pytest.raises(PlanError, match="whole batches"):
        PlanSpec(counts=(4,), batch_size=2, per_source=True)
    assert plan_identity(spec)["per_source"] is True


def test_per_source_resumes_exactly_under_its_cut_and_refuses_another():
    spec = PlanSpec(counts=(40, 30, 20), batch_size=5, world_size=2, seed=4, chunk_batches=2, block=3,
                    draws=((2, 60), (1, 20)), per_source=True)
    progress = Progress.for_rank(spec)
    part = Counter(i for i, v in take(spec, 1, progress, 3) if v)
    plan, rest_progress = resume_plan(spec, 1, plan_identity(spec), progress.to_dict())
    rest = Counter(i for r in range(plan.world_size) for i, v in delivered(plan, 1, r, 1, rest_progress) if v)
    assert part + rest == _epoch(spec, 1)
    with pytest.raises(PlanError, match="per-source batches resume only under the settings"):
        resume_plan(dataclasses.replace(spec, world_size=1), 1, plan_identity(spec), progress.to_dict())
