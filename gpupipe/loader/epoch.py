"""The epoch and resume position of one rank's loader: what counts as delivered, and when.

The whole story, in one place:

* A batch is **read** when the workers hand it to the training process, **yielded** when
  the loader gives it to the consumer, and **delivered** when the consumer has used it.
  Only delivered batches move the resume position that :meth:`EpochLedger.state_dict`
  saves; a run resumed from it continues with exactly the batches not yet delivered,
  none lost and none repeated. ``GpuLoader`` reads and decodes ahead of the loop: those
  batches are not delivered, and a resume reads them again.
* In a plain loop, yielded means delivered: the loop asks for batch i+1 only after it
  has used batch i (:meth:`EpochLedger.yielded` delivers at once).
* Lightning fetches ahead: it asks for batch i+1 before the training step on batch i
  runs, so a checkpoint saved in that step must not count i+1. After :meth:`defer`,
  yielded batches wait in a queue, and :meth:`commit` — called by the DataModule's
  ``on_after_batch_transfer`` when a batch reaches a training step — delivers the
  oldest. Batches yielded but never committed when an iteration stops are dropped from
  the queue at the next :meth:`begin`.
* Every iteration is a **pass**, as with torch's DataLoader: :meth:`begin` starts the
  current epoch from its first batch, whatever an earlier pass delivered (a ``break``
  after a few batches — Lightning's sanity check, ``limit_val_batches`` — is not
  continued by the next ``for``). Only :meth:`load_state_dict` continues a pass: the
  next :meth:`begin` after it starts where the saved state stopped, once.
* The epoch is **complete** when its last batch was delivered: after the iteration ran
  to its end and the queue is empty, or as soon as the plan's progress says every batch
  was delivered (a consumer may stop at ``len()`` without running the iteration out).
  The next :meth:`begin` then moves on to the next epoch; so does :meth:`set_epoch`.
* The saved state is rank 0's, and it is every rank's: ranks take their steps in lockstep and
  deliver the plan's batches in order. Loaded under the settings it was saved with, it
  continues the same plan. Loaded under another world size, batch size, shuffle window or
  ``drop_last``, the epoch goes on with a plan over its samples that no rank has delivered yet
  (:func:`gpupipe.plan.resume_plan`): :attr:`EpochLedger.plan` is then not :attr:`EpochLedger.spec`
  until the epoch ends, and the state records the earlier parts (``before``).

State format, version 4: ``{"version": 4, "epoch", "complete", "plan": plan_identity(plan),
"before": [Earlier.to_dict(), ...], "progress": Progress.to_dict()}``, and for a mix of sources
``"per_source"``: the samples of each source delivered in the epoch so far. Version 4 places the
units of an image folder (one sample each) per position (``plan["keyed"]``); a state of version 3
or older goes on with its epoch in the layout it was saved in, a permutation of all units. Version 3
ends the epoch of one process without ``drop_last`` with a short batch; versions 2 (that batch
padded) and 1 (no ``before``; padding on the last ranks when ``drop_last`` is off) still load: a
pass saved inside a last chunk that held their padding goes on with exactly its undelivered samples.
"""
from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence

from gpupipe.core.errors import PlanError
from gpupipe.plan import Earlier, PlanSpec, Progress, epoch_steps, plan_identity, resume_plan

__all__ = ["EpochLedger", "STATE_VERSION"]

STATE_VERSION = 4  # 4: one-sample units placed per position (issue 39); 3: one process's last batch
_LOADABLE = (1, 2, 3, 4)  # short (issue 35); 2: padding spread over the ranks, "before" (issue 25)


class EpochLedger:
    """Epoch number, delivered position, and the queue of yielded-not-yet-used batches."""

    def __init__(self, spec: PlanSpec, sources: int = 0) -> None:
        self.spec = spec  # the plan of a whole epoch
        self.plan = spec  # the current epoch's: ``spec``, or after a resume under other settings, the rest
        self.epoch = 0
        self.complete = False
        self.progress = Progress.for_rank(spec)
        self._pending: collections.deque[tuple[int, int]] | None = None
        self._ended = False
        self._resume = False  # a loaded mid-epoch position: the next begin() continues it
        # a mix of ``sources``: samples of each delivered this epoch (one list, updated in place), and the
        # counts of batches read but not yet delivered, by (chunk, batch)
        self.per_source: list[int] = [0] * sources
        self._noted: dict[tuple[int, int], Sequence[int]] = {}

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` next (a position loaded for this very epoch is kept)."""
        if epoch != self.epoch or self.complete:
            self.epoch, self.complete = epoch, False
            self.plan = self.spec
            self.progress = Progress.for_rank(self.spec)
            self._resume = False
            self._count_from()

    def _count_from(self, counts: Sequence[int] = ()) -> None:
        self.per_source[:] = list(counts) or [0] * len(self.per_source)
        self._noted.clear()

    def noted(self, chunk: int, batch: int, counts: Sequence[int]) -> None:
        """Batch ``batch`` of chunk ``chunk`` holds ``counts`` samples of each source of a mix:
        added to :attr:`per_source` when it is delivered."""
        self._noted[(chunk, batch)] = counts

    @property
    def steps(self) -> int:
        """Batches of the current epoch on every rank, those delivered before a resume included."""
        return epoch_steps(self.plan)

    def steps_if_loaded(self, state: Mapping) -> int:
        """:attr:`steps` of the epoch ``state`` would continue (0 where it would be refused): what
        Lightning must be told as ``len()`` before the state is loaded at the first pass."""
        trial = EpochLedger(self.spec)
        try:
            trial.load_state_dict(state)
        except PlanError:
            return 0
        return trial.steps

    def begin(self) -> None:
        """A pass starts: over the next epoch if this one is complete, else over this one
        from its first batch — or from the position :meth:`load_state_dict` loaded, once;
        forget batches yielded but never used by the last pass."""
        if self.complete:
            self.set_epoch(self.epoch + 1)
        elif not self._resume:  # a fresh pass over the whole epoch, under the current settings
            self.plan, self.progress = self.spec, Progress.for_rank(self.spec)
            self._count_from()
        self._resume = False
        self._noted.clear()
        if self._pending is not None:
            self._pending.clear()
        self._ended = False

    def defer(self) -> None:
        """From now on a yielded batch counts only when :meth:`commit` says it was used."""
        self._pending = collections.deque()

    def yielded(self, chunk: int, batch: int) -> None:
        """Batch ``batch`` of chunk ``chunk`` went to the consumer."""
        if self._pending is None:
            self._deliver(chunk, batch)
        else:
            self._pending.append((chunk, batch))

    def commit(self) -> None:
        """The oldest batch yielded and not yet committed was used by a training step."""
        if self._pending is None:
            raise RuntimeError("commit() needs defer() first")
        if self._pending:
            self._deliver(*self._pending.popleft())
        if self._ended and not self._pending:
            self.complete = True

    def finished(self) -> None:
        """The iteration yielded the epoch's last batch."""
        self._ended = True
        if not self._pending:
            self.complete = True

    def _deliver(self, chunk: int, batch: int) -> None:
        counts = self._noted.pop((chunk, batch), ())
        for i, n in enumerate(counts):
            self.per_source[i] += int(n)
        if chunk >= 0:  # -1: streamed without a manifest, no position to keep
            self.progress.advance(chunk, batch)
            self.complete = self.complete or self.progress.complete

    # -- resume ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        state = {"version": STATE_VERSION, "epoch": self.epoch, "complete": self.complete,
                 "plan": plan_identity(self.plan), "before": [part.to_dict() for part in self.plan.before],
                 "progress": self.progress.to_dict()}
        if self.per_source:
            state["per_source"] = list(self.per_source)
        return state

    def load_state_dict(self, state: Mapping) -> None:
        """Continue where ``state`` (rank 0's, on every rank) left off; see the module's docstring."""
        version = state.get("version")
        if type(version) is not int or version not in _LOADABLE:
            raise PlanError(f"loader state version {version!r} is not {STATE_VERSION} "
                            f"(this gpupipe loads versions {', '.join(map(str, _LOADABLE))})")
        epoch, complete = int(state["epoch"]), bool(state["complete"])
        before = [Earlier.from_dict(epoch, d) for d in state.get("before", ())] if version >= 2 else []
        saved = state["progress"]
        mid_epoch = not complete and bool(saved["done_below"] or saved["partial"] or before)
        if mid_epoch:
            plan, progress = resume_plan(self.spec, epoch, state["plan"], saved, before, spread=version >= 2,
                                         short_tail=version >= 3)
        else:  # at an epoch boundary any plan may follow
            plan, progress = self.spec, Progress.for_rank(self.spec)
        self.epoch, self.plan, self.progress = epoch, plan, progress
        counts = state.get("per_source", ()) if mid_epoch else ()
        self._count_from([int(n) for n in counts] if len(counts) == len(self.per_source) else ())
        self.complete = complete or (mid_epoch and progress.complete)  # nothing of it left to deliver
        self._resume = mid_epoch  # the next pass continues it; any later one starts afresh
