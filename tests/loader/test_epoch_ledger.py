"""The epoch ledger (gpupipe.loader.epoch): epoch numbering, the delivered position, defer and
commit, and the saved state — a round trip through JSON resumes exactly where the
uninterrupted run is, and a state from another plan or another format is refused by name."""
from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupipe.core.errors import PlanError
from gpupipe.loader.epoch import STATE_VERSION, EpochLedger
from gpupipe.plan import PlanSpec, Progress, plan_identity

specs = st.builds(PlanSpec, counts=st.lists(st.integers(0, 30), min_size=1, max_size=6).map(tuple),
                  batch_size=st.integers(1, 5), world_size=st.integers(1, 3), seed=st.integers(0, 2**32),
                  shuffle=st.booleans(), drop_last=st.booleans(), chunk_batches=st.integers(1, 4))
# The properties below draw ~600 times per example. A strategy built anew for each draw is validated
# anew each time, which cost hypothesis more than the ledger under test (15 s of the test's 20 s):
# the fixed choices are built once, and a chunk is picked by its index in the open ones (st.integers
# is cached by its bounds), the same draw st.sampled_from makes.
DELIVER_OPS = st.sampled_from(["deliver", "deliver", "deliver", "save_load", "break"])
DEFER_OPS = st.sampled_from(["yield", "yield", "commit", "commit", "crash"])


def draw_one(data: st.DataObject, options: list[int]) -> int:
    """One of ``options``, as ``data.draw(st.sampled_from(options))`` would give it."""
    return options[data.draw(st.integers(0, len(options) - 1))]


def restored(ledger: EpochLedger, spec: PlanSpec | None = None) -> EpochLedger:
    """A new ledger loaded from ``ledger``'s state after a trip through JSON (a checkpoint file)."""
    fresh = EpochLedger(spec or ledger.spec)
    fresh.load_state_dict(json.loads(json.dumps(ledger.state_dict())))
    return fresh


def position(ledger: EpochLedger) -> tuple:
    """Where the next iteration starts: the epoch, whether it is complete (the next iteration
    then starts the epoch after it, afresh) and, mid-epoch, the batches delivered per chunk."""
    state = ledger.state_dict()
    return state["epoch"], state["complete"], None if state["complete"] else state["progress"]


def deliver_in_order(ledger: EpochLedger, n: int | None = None) -> None:
    """Yield the first ``n`` (default: all) batches of the epoch, chunk by chunk."""
    batches = [(c, b) for c, size in enumerate(ledger.progress.chunk_sizes) for b in range(size)]
    for c, b in batches[:n]:
        ledger.yielded(c, b)


# 10 samples, batch 2: 5 steps in chunks of 2, 2 and 1 batches
SMALL = PlanSpec(counts=(4, 6), batch_size=2, chunk_batches=2, seed=3)


# ------------------------------------------------------------------------------ epochs and position

def test_a_new_ledger_is_at_the_start_of_epoch_0():
    ledger = EpochLedger(SMALL)
    assert (ledger.epoch, ledger.complete, ledger.progress.batches_done) == (0, False, 0)
    assert ledger.progress.chunk_sizes == (2, 2, 1)
    state = ledger.state_dict()
    assert state == {"version": STATE_VERSION, "epoch": 0, "complete": False, "plan": plan_identity(SMALL),
                     "before": [], "progress": {"done_below": 0, "partial": {}}}


def test_a_plain_loop_delivers_on_yield_and_the_last_batch_completes_the_epoch():
    ledger = EpochLedger(SMALL)
    ledger.begin()
    for done, (c, b) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)], start=1):
        ledger.yielded(c, b)
        assert ledger.progress.batches_done == done and not ledger.complete
    ledger.yielded(2, 0)
    # complete as soon as the last batch is delivered: a consumer may stop at len() without
    # running the iteration out
    assert ledger.complete and ledger.progress.complete
    ledger.begin()
    assert (ledger.epoch, ledger.complete, ledger.progress.batches_done) == (1, False, 0)


def test_an_interrupted_pass_is_not_continued_the_next_starts_the_same_epoch_afresh():
    """torch's rule: every iteration is a new pass. A ``break`` (Lightning's sanity check,
    ``limit_val_batches``) neither moves the epoch on nor leaves a position for the next pass."""
    ledger = EpochLedger(SMALL)
    ledger.begin()
    deliver_in_order(ledger, 3)  # chunk 0 whole, chunk 1 batch 0
    assert ledger.state_dict()["progress"] == {"done_below": 1, "partial": {"1": 1}}  # what a checkpoint saves
    ledger.begin()  # the loop broke out; a new iteration starts
    assert (ledger.epoch, ledger.complete, ledger.progress.batches_done) == (0, False, 0)
    deliver_in_order(ledger)  # the whole epoch, from its first batch
    ledger.finished()
    ledger.begin()
    assert ledger.epoch == 1


def test_only_a_loaded_state_is_continued_and_only_by_the_next_pass():
    ledger = EpochLedger(SMALL)
    ledger.begin()
    deliver_in_order(ledger, 3)
    again = restored(ledger)
    again.begin()
    assert again.progress.batches_done == 3  # continues at chunk 1, batch 1
    with pytest.raises(PlanError, match="out of order"):
        again.yielded(1, 0)  # already delivered: it would count twice
    again.yielded(1, 1)
    again.begin()  # that pass broke off too: the next is a fresh pass over epoch 0
    assert (again.epoch, again.progress.batches_done) == (0, 0)


def test_finished_completes_an_epoch_streamed_without_a_manifest():
    """Without a manifest batches come with chunk -1: no position to keep, so only the end of the
    iteration completes the epoch, and a state saved in the middle restarts that epoch."""
    spec = PlanSpec(counts=(0, 0, 0), batch_size=4)  # counts unknown: zeros, as EncodedLoader plans them
    ledger = EpochLedger(spec)
    ledger.begin()
    for b in range(5):
        ledger.yielded(-1, b)
    assert not ledger.complete and ledger.progress.batches_done == 0
    middle = restored(ledger)
    assert (middle.epoch, middle.complete, middle.progress.batches_done) == (0, False, 0)
    ledger.finished()
    assert ledger.complete
    ledger.begin()
    assert ledger.epoch == 1 and not ledger.complete


def test_set_epoch_keeps_a_loaded_position_only_for_its_own_epoch():
    ledger = EpochLedger(SMALL)
    ledger.begin()
    deliver_in_order(ledger, 2)
    again = restored(ledger)
    again.set_epoch(0)  # Lightning sets the epoch it resumes in: the position stays
    again.begin()
    assert again.progress.batches_done == 2
    other = restored(ledger)
    other.set_epoch(4)  # another epoch: the position is dropped
    other.begin()
    assert (other.epoch, other.complete, other.progress.batches_done) == (4, False, 0)
    deliver_in_order(other)
    assert other.complete
    other.set_epoch(5)  # the next epoch, named after the last one completed
    other.begin()
    assert other.epoch == 5, "begin() must not move past an epoch that set_epoch() just started"


# ------------------------------------------------------------------------------ defer and commit

def test_deferred_batches_count_only_when_committed():
    ledger = EpochLedger(SMALL)
    ledger.defer()
    ledger.begin()
    deliver_in_order(ledger, 3)  # fetched ahead by the consumer ...
    assert ledger.progress.batches_done == 0
    ledger.commit()  # ... one reached a training step
    assert ledger.state_dict()["progress"] == {"done_below": 0, "partial": {"0": 1}}
    ledger.commit()
    assert ledger.state_dict()["progress"] == {"done_below": 1, "partial": {}}


def test_uncommitted_batches_are_forgotten_by_the_next_pass():
    ledger = EpochLedger(SMALL)
    ledger.defer()
    ledger.begin()
    deliver_in_order(ledger, 4)
    ledger.commit()
    ledger.begin()  # interrupted: three batches were yielded but never used
    ledger.commit()  # nothing is pending any more: nothing moves
    assert ledger.progress.batches_done == 0  # a new pass, from the epoch's first batch
    ledger.yielded(0, 0)
    ledger.commit()
    assert ledger.progress.batches_done == 1


def test_a_resumed_deferring_consumer_continues_at_the_first_uncommitted_batch():
    ledger = EpochLedger(SMALL)
    ledger.defer()
    ledger.begin()
    deliver_in_order(ledger, 4)
    ledger.commit()
    again = restored(ledger)  # a checkpoint saved now, loaded by a new process
    again.defer()
    again.begin()
    again.yielded(0, 1)  # the next batch to deliver is the first uncommitted one
    again.commit()
    assert again.progress.batches_done == 2


def test_an_epoch_with_batches_pending_completes_at_its_last_commit():
    ledger = EpochLedger(SMALL)
    ledger.defer()
    ledger.begin()
    deliver_in_order(ledger)
    ledger.finished()
    for _ in range(4):
        ledger.commit()
        assert not ledger.complete
    ledger.commit()
    assert ledger.complete
    ledger.begin()
    assert ledger.epoch == 1


def test_the_end_of_an_iteration_without_manifest_waits_for_its_commits():
    ledger = EpochLedger(PlanSpec(counts=(0,), batch_size=2))
    ledger.defer()
    ledger.begin()
    ledger.yielded(-1, 0)
    ledger.yielded(-1, 1)
    ledger.finished()
    ledger.commit()
    assert not ledger.complete
    ledger.commit()
    assert ledger.complete


def test_commit_without_defer_is_a_mistake():
    with pytest.raises(RuntimeError, match="defer"):
        EpochLedger(SMALL).commit()


# ------------------------------------------------------------------------------ saved state

def test_a_mid_epoch_state_resumes_at_the_same_batch():
    ledger = EpochLedger(SMALL)
    ledger.begin()
    ledger.set_epoch(2)
    deliver_in_order(ledger, 3)
    again = restored(ledger)
    assert again.state_dict() == ledger.state_dict()
    again.begin()
    assert again.epoch == 2
    with pytest.raises(PlanError, match="out of order"):
        again.yielded(0, 0)
    again.yielded(1, 1)


def test_an_end_of_epoch_state_resumes_with_the_next_epoch():
    ledger = EpochLedger(SMALL)
    ledger.begin()
    deliver_in_order(ledger)
    ledger.finished()
    again = restored(ledger)
    assert (again.epoch, again.complete) == (0, True)
    again.begin()
    assert (again.epoch, again.complete, again.progress.batches_done) == (1, False, 0)


def test_a_state_in_the_format_of_version_1_still_loads():
    """What STATE_VERSION guards: the layout of the saved dict. This one is written out as a
    checkpoint of version 1 holds it (Lightning keeps it in the .ckpt file); renaming or
    reshaping a key without a new version would break every saved run."""
    state = {"version": 1, "epoch": 3, "complete": False,
             "plan": {"num_samples": 10, "num_shards": 2, "batch_size": 2, "world_size": 1, "seed": 3,
                      "shuffle": True, "drop_last": True, "chunk_batches": 2},
             "progress": {"done_below": 1, "partial": {"1": 1}}}
    assert STATE_VERSION == 4
    ledger = EpochLedger(SMALL)
    ledger.load_state_dict(state)
    assert (ledger.epoch, ledger.complete) == (3, False)
    assert ledger.plan == SMALL  # its plan is this version's: the same batches follow, in the same order
    assert (ledger.progress.done(0), ledger.progress.done(1), ledger.progress.done(2)) == (2, 1, 0)


def test_a_version_1_state_with_padding_on_the_last_rank_resumes_with_exactly_the_rest():
    """Version 1 put the padding on the last ranks (without drop_last): 10 samples on 2 ranks at
    batch 3 gave rank 0 six real samples and rank 1 four; version 2 gives five each. A mid-epoch
    state of version 1 is loaded by planning the samples it had not delivered — the same set, not
    the same order (tests/plan/test_plan.py checks the set for any plan)."""
    spec = PlanSpec(counts=(4, 6), batch_size=3, world_size=2, chunk_batches=1, drop_last=False, seed=3)
    state = {"version": 1, "epoch": 0, "complete": False, "plan": plan_identity(spec),
             "progress": {"done_below": 1, "partial": {}}}
    ledger = EpochLedger(spec)
    ledger.load_state_dict(state)
    assert ledger.plan.before and ledger.plan.before[0].spread is False
    assert ledger.plan.length == 10 - 3 - 3  # one batch of 3 delivered on each rank
    assert ledger.steps == 1 + 1
    again = restored(ledger)  # saved again, now as version 4 with the earlier part recorded
    assert again.plan == ledger.plan and again.state_dict()["version"] == 4


@pytest.mark.parametrize("partial, continues", [({"0": 1}, True), ({"1": 1}, False)])
def test_a_version_2_state_of_one_process_loads_and_plans_the_rest_only_inside_its_padded_last_chunk(
        partial, continues):
    """Version 2 padded one process's last batch too: 10 samples at batch 3 were 4 batches of 3,
    the last chunk (batches 2-3) 4 samples and 2 repeats; version 3 ends with a batch of 1, which
    changes that chunk's order. A state saved before it continues the same plan; one saved inside
    it plans the samples it had not delivered (tests/plan/test_plan.py checks the set)."""
    spec = PlanSpec(counts=(4, 6), batch_size=3, chunk_batches=2, drop_last=False, seed=3)
    state = {"version": 2, "epoch": 0, "complete": False, "plan": plan_identity(spec),
             "progress": {"done_below": 0 if continues else 1, "partial": partial}}
    ledger = EpochLedger(spec)
    ledger.load_state_dict(state)
    if continues:
        assert ledger.plan == spec and ledger.progress.batches_done == 1 and ledger.steps == 4
        return
    (part,) = ledger.plan.before
    assert part.short_tail is False and part.batches_done == 3
    assert 1 <= ledger.plan.length <= 3  # 4 real samples of the last chunk, 1 to 3 of them delivered
    assert ledger.steps == 3 + 1
    again = restored(ledger)  # saved again as version 4, the earlier part's padded layout recorded
    assert again.plan == ledger.plan and again.state_dict()["before"][0]["short_tail"] is False


@pytest.mark.parametrize("version", [None, 0, STATE_VERSION + 1, str(STATE_VERSION)])
@pytest.mark.parametrize("complete", [False, True])
def test_a_state_of_another_version_is_refused_even_at_an_epoch_boundary(version, complete):
    ledger = EpochLedger(SMALL)
    deliver_in_order(ledger, None if complete else 1)
    state = ledger.state_dict()
    assert state["complete"] is complete
    if version is None:
        del state["version"]
    else:
        state["version"] = version
    fresh = EpochLedger(SMALL)
    with pytest.raises(PlanError, match=rf"loader state version {version!r} is not {STATE_VERSION}"):
        fresh.load_state_dict(state)
    assert (fresh.epoch, fresh.progress.batches_done) == (0, 0)  # nothing half-loaded


@pytest.mark.parametrize("change, named", [
    ({"seed": 4}, "seed: saved 3, now 4"),
    ({"shuffle": False}, "shuffle: saved True, now False"),
    ({"counts": (4, 6, 5)}, "num_samples: saved 10, now 15"),
])
def test_a_mid_epoch_state_of_other_data_or_order_is_refused_naming_what_changed(change, named):
    ledger = EpochLedger(SMALL)
    deliver_in_order(ledger, 1)
    with pytest.raises(PlanError, match=rf"cannot resume mid-epoch with other data or another sample order "
                                        rf"\(.*{named}.*resume from an end-of-epoch checkpoint"):
        restored(ledger, dataclasses.replace(SMALL, **change))


@pytest.mark.parametrize("change", [{"batch_size": 3}, {"world_size": 2}, {"chunk_batches": 1},
                                    {"drop_last": False}, {"batch_size": 1, "world_size": 3, "chunk_batches": 3}])
def test_a_mid_epoch_state_resumes_under_another_cut_with_the_rest_of_the_epoch(change):
    """World size, batch size, shuffle window, drop_last: the ledger plans the samples of the
    epoch not yet delivered; ``steps`` counts the batches delivered before too (what ``len()`` says),
    and the earlier part travels in the state, so that a second resume knows it."""
    ledger = EpochLedger(SMALL)
    ledger.set_epoch(2)
    deliver_in_order(ledger, 3)  # 6 of the 10 samples
    other = dataclasses.replace(SMALL, **change)
    again = restored(ledger, other)
    assert again.epoch == 2 and not again.complete and again.progress.batches_done == 0
    assert again.plan.before[0].batches_done == 3 and again.plan.length == 4
    assert again.steps == 3 + sum(again.progress.chunk_sizes)
    twice = restored(again)
    assert twice.plan == again.plan and twice.state_dict() == again.state_dict()
    deliver_in_order(twice)  # the rest of the epoch
    assert twice.complete
    twice.begin()  # the next epoch is a whole one again
    assert (twice.epoch, twice.plan, twice.steps) == (3, other, sum(Progress.for_rank(other).chunk_sizes))


def test_a_mid_epoch_state_of_other_data_with_the_same_totals_is_refused():
    """Units of other sizes with the same number of units and samples (shards re-cut) put other
    samples at every position of the epoch: resuming the old position would repeat some samples
    and skip others. The docs promise a PlanError when the data changed."""
    saved = PlanSpec(counts=(4, 6), batch_size=2, chunk_batches=2)
    recut = PlanSpec(counts=(6, 4), batch_size=2, chunk_batches=2)
    ledger = EpochLedger(saved)
    deliver_in_order(ledger, 3)
    with pytest.raises(PlanError, match=r"other data or another sample order \(counts_crc32: saved \d+, now \d+\)"):
        restored(ledger, recut)
    ledger.yielded(1, 1)
    ledger.yielded(2, 0)
    assert restored(ledger, recut).epoch == 0  # at the epoch boundary any change is allowed


@pytest.mark.parametrize("deliver", [0, None])  # the start of an epoch, its end
def test_a_state_of_another_plan_loads_at_an_epoch_boundary(deliver):
    ledger = EpochLedger(SMALL)
    ledger.set_epoch(6)
    deliver_in_order(ledger, deliver)
    other = PlanSpec(counts=(9, 9, 9), batch_size=4, world_size=2, seed=1, chunk_batches=1)
    again = restored(ledger, other)
    assert (again.epoch, again.complete) == (6, deliver is None)
    assert again.progress == Progress.for_rank(other)  # the new plan's chunks, none delivered


def test_a_state_whose_progress_does_not_fit_the_plan_is_refused():
    ledger = EpochLedger(SMALL)
    deliver_in_order(ledger, 1)
    state = ledger.state_dict()
    state["progress"] = {"done_below": 0, "partial": {"7": 1}}
    with pytest.raises(PlanError, match="does not fit this plan"):
        EpochLedger(SMALL).load_state_dict(state)


# ------------------------------------------------------------------------------ properties

@settings(max_examples=150, deadline=None)
@given(spec=specs, data=st.data())
def test_saving_and_loading_anywhere_keeps_the_position_of_an_uninterrupted_run(spec, data):
    """Any interleaving of chunks (workers deliver them round-robin, each in order), broken
    passes and save → load cycles, over three epochs: after every step the resumed ledger is
    where a ledger that was never saved and loaded is (a broken pass restarts both)."""
    reference, ledger = EpochLedger(spec), EpochLedger(spec)
    sizes = Progress.for_rank(spec).chunk_sizes
    for epoch in range(3):
        reference.begin()
        ledger.begin()
        assert ledger.epoch == reference.epoch == epoch
        nxt = [0] * len(sizes)
        while any(n < s for n, s in zip(nxt, sizes)):
            op = data.draw(DELIVER_OPS)
            if op == "deliver":
                c = draw_one(data, [c for c, (n, s) in enumerate(zip(nxt, sizes)) if n < s])
                reference.yielded(c, nxt[c])
                ledger.yielded(c, nxt[c])
                nxt[c] += 1
            elif op == "save_load":  # a new process loads the state and starts its pass: it continues
                ledger = restored(ledger)
                ledger.begin()
            else:  # the loop broke out and a new pass starts: from the epoch's first batch
                ledger.begin()
                reference.begin()
                nxt = [0] * len(sizes)
            assert position(ledger) == position(reference)
        if data.draw(st.booleans()):
            ledger = restored(ledger)  # saved between the last batch and the end of the iteration
        reference.finished()
        ledger.finished()
        assert ledger.complete and position(ledger) == position(reference)


@settings(max_examples=150, deadline=None)
@given(spec=specs, data=st.data())
def test_a_deferring_consumer_killed_anywhere_trains_on_every_batch_exactly_once(spec, data):
    """Lightning's way: batches are yielded ahead and committed one by one. The process dies at
    any point and resumes from the last state saved: over the whole run every batch of the
    epoch is committed exactly once, and the position always equals that of a plain ledger
    fed the committed batches only."""
    sizes = Progress.for_rank(spec).chunk_sizes
    every = {(c, b) for c, s in enumerate(sizes) for b in range(s)}
    reference, ledger = EpochLedger(spec), EpochLedger(spec)
    ledger.defer()
    ledger.begin()
    reference.begin()
    committed: list[tuple[int, int]] = []
    pending: list[tuple[int, int]] = []
    nxt = [0] * len(sizes)  # next batch to yield, per chunk
    while len(committed) < len(every):
        can_yield = [c for c, (n, s) in enumerate(zip(nxt, sizes)) if n < s]
        op = data.draw(DEFER_OPS)
        if op == "yield" and can_yield:
            c = draw_one(data, can_yield)
            ledger.yielded(c, nxt[c])
            pending.append((c, nxt[c]))
            nxt[c] += 1
        elif op == "commit" and pending:
            ledger.commit()
            committed.append(pending.pop(0))
            reference.yielded(*committed[-1])
        elif op == "crash":  # resume from a state saved now; what was yielded ahead is lost
            ledger = restored(ledger)
            ledger.defer()
            ledger.begin()
            pending.clear()
            nxt = [ledger.progress.done(c) for c in range(len(sizes))]
        assert position(ledger) == position(reference)
    assert sorted(committed) == sorted(every) and len(committed) == len(every)
    ledger.finished()
    assert ledger.complete
    ledger.begin()
    assert ledger.epoch == 1


def test_a_version_3_state_of_an_image_folder_goes_on_in_the_layout_it_was_saved_in():
    """Version 4 places one-sample units per position; a mid-epoch state of version 3 permuted all
    of them, and its epoch goes on in that layout (saved again, it says so), the next one in this
    version's."""
    spec = PlanSpec(counts=(1,) * 40, batch_size=4, chunk_batches=2, seed=3)
    old = dataclasses.replace(spec, keyed=False)
    plan = {k: v for k, v in plan_identity(old).items() if k != "keyed"}
    state = {"version": 3, "epoch": 0, "complete": False, "plan": plan, "progress": {"done_below": 1, "partial": {}}}
    ledger = EpochLedger(spec)
    ledger.load_state_dict(state)
    assert spec.placed and ledger.plan == old and ledger.progress.batches_done == 2
    assert restored(ledger).plan == old and ledger.state_dict()["plan"]["keyed"] is False
    ledger.set_epoch(1)
    assert ledger.plan == spec
