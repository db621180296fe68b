"""Is a shuffle mixing classes? Two numbers per pass, beside what a uniform shuffle would give.

From the labels of a pass's first batches, :func:`mixing` measures how concentrated each batch is
— the share of its most common label, and how many distinct labels it holds — and what the same
two numbers are expected to be when the same labels (the histogram of those batches together) are
dealt into batches of the same sizes by a uniform shuffle. Shards written in class order and read
with too small a shuffle window give batches of one or two classes: 66 % of a batch one class
where a uniform shuffle gives 13 % (8,000 samples of 10 classes, batch 256).

The expectation is a seeded simulation (a few ms for 20 batches of 256): the same inputs give the
same numbers. It is taken over the histogram of the batches seen, so it shows batches less mixed
than the first batches together — what a shuffle window too small for the order at rest gives
once those batches span more than one window; it cannot see classes those batches never reach.

:class:`MixingCheck` is the loader's use of it: it collects the labels of a shuffled pass's first
batches and logs one warning when they are far less mixed than uniform (:func:`far_from_uniform`).
"""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

__all__ = ["Mixing", "mixing", "far_from_uniform", "MixingCheck", "SIGMAS", "TOP_MARGIN", "LABELS_MARGIN", "CHECK_SAMPLES",
           "CHECK_BATCHES", "MIN_CHECK_BATCH"]

log = logging.getLogger(__name__)
ADVICE = ("set stream.shuffle_block to a few samples (e.g. 4: blocks of the shards spread over each window; on "
          "object storage with stream.fetch.cache_dir), raise stream.shuffle_buffer, or write the shards shuffled "
          "(gpupipe ingest does)")  # what to change, said by the warning and by `gpupipe inspect --shuffle`

# far_from_uniform: a mean beyond the uniform expectation by SIGMAS standard deviations of that mean
# under a uniform shuffle, and by a margin: the most common label's share above it by the uniform
# share itself or TOP_MARGIN, whichever is smaller; the labels per batch below it by LABELS_MARGIN of it.
SIGMAS = 6.0
TOP_MARGIN = 0.10
LABELS_MARGIN = 0.25
# MixingCheck: a pass's first batches until CHECK_SAMPLES labelled samples, within CHECK_BATCHES
# (least, most); no check below MIN_CHECK_BATCH samples a batch (a share of 1 in 4 says little).
CHECK_SAMPLES = 2048
CHECK_BATCHES = (8, 64)
MIN_CHECK_BATCH = 16
_SIMULATED = 1 << 15  # samples the uniform expectation deals out (whole rounds of the pool, 4 to 64)
_TABLE = 1 << 22  # _batch_stats counts in a (batches, classes) table up to this many cells


@dataclass(frozen=True)
class Mixing:
    """How mixed ``batches`` batches of ``samples`` labelled samples (``labels`` distinct labels in
    all) were. ``top_share``: the mean over batches of the most common label's share of its batch;
    ``labels_per_batch``: the mean number of distinct labels in a batch; ``uniform_*``: the same
    two means expected when a uniform shuffle deals the same labels into batches of the same
    sizes, and ``uniform_*_sd`` the standard deviation of one batch's number under it."""

    batches: int
    samples: int
    labels: int
    top_share: float
    labels_per_batch: float
    uniform_top_share: float
    uniform_labels_per_batch: float
    uniform_top_share_sd: float
    uniform_labels_per_batch_sd: float

    def as_dict(self) -> dict:
        """JSON-able: a number not measured (no labelled batch) is ``None``."""
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(self).items()}


def mixing(batches: Sequence[np.ndarray | torch.Tensor | Sequence[int]], *, seed: int = 0) -> Mixing:
    """The :class:`Mixing` of ``batches`` (each an array of the integer labels of one batch; empty
    batches are left out). Pure: the uniform expectation is drawn from a generator built from
    ``seed``. Renaming the labels (any one-to-one map) gives the same numbers."""
    arrays = [np.asarray(b, dtype=np.int64).reshape(-1) for b in batches]
    arrays = [a for a in arrays if a.size]
    if not arrays:
        return Mixing(0, 0, 0, *(math.nan,) * 6)
    sizes = np.array([a.size for a in arrays])
    names, codes = np.unique(np.concatenate(arrays), return_inverse=True)  # labels as 0..C-1
    codes = codes.reshape(-1)
    top, distinct = _batch_stats(codes, names.size, sizes, 1)
    rounds = min(64, max(4, -(-_SIMULATED // codes.size)))
    dealt = np.random.default_rng(seed).permuted(np.broadcast_to(codes, (rounds, codes.size)), axis=1)
    utop, udistinct = _batch_stats(dealt.reshape(-1), names.size, sizes, rounds)
    return Mixing(len(arrays), int(codes.size), int(names.size), float(top.mean()), float(distinct.mean()),
                  float(utop.mean()), float(udistinct.mean()), float(utop.std()), float(udistinct.std()))


def _batch_stats(codes: np.ndarray, classes: int, sizes: np.ndarray, rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """Per batch: the most common label's share, and the number of distinct labels. ``codes``
    (labels as ``0..classes-1``): ``rounds`` copies of the pass, each cut into batches of ``sizes``.
    A (batch, label) table of counts where it is small; else sorted (batch, label) pairs, whatever
    the number of classes."""
    n, every = sizes.size * rounds, np.tile(sizes, rounds)
    cell = np.repeat(np.arange(n), every) * classes + codes
    if n * classes <= _TABLE:
        table = np.bincount(cell, minlength=n * classes).reshape(n, classes)
        return table.max(axis=1) / every, np.count_nonzero(table, axis=1)
    pairs, counts = np.unique(cell, return_counts=True)
    owner = pairs // classes
    starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    return np.maximum.reduceat(counts, starts) / every, np.diff(np.r_[starts, owner.size])


def far_from_uniform(m: Mixing) -> bool:
    """True when the batches are far less mixed than a uniform shuffle's, by either number:

    * the most common label's share: above the uniform share by that share again (twice it), or
      by ``TOP_MARGIN`` (10 points) where that share is larger — 2 classes give 57 % at 32 a
      batch, and 67 % is already far;
    * the labels per batch: below the uniform number by ``LABELS_MARGIN`` (a quarter) of it —
      a window holding half the classes gave 5.8 of 10 labels a batch where the top share (23 %
      against 18.5 %) says little;

    and in either case by more than ``SIGMAS`` standard deviations of a mean of ``m.batches``
    batches under a uniform shuffle (one batch of 32 of 10 classes: ~3.5 points and ~0.6 labels;
    a mean of 8 batches ~1.2 points). Batches of a uniform shuffle stayed under a third of
    either threshold in 2,700 simulated passes (1 to 10,000 classes, batches of 16 to 256, skewed
    histograms too); the
    user's class-ordered shards were 66 % (uniform: 13 %) and 2.8 labels (uniform: 10)."""
    if not m.batches:
        return False
    root_n = math.sqrt(m.batches)
    top = m.top_share - m.uniform_top_share > max(SIGMAS * m.uniform_top_share_sd / root_n,
                                                  min(m.uniform_top_share, TOP_MARGIN))
    few = m.uniform_labels_per_batch - m.labels_per_batch > max(SIGMAS * m.uniform_labels_per_batch_sd / root_n,
                                                               LABELS_MARGIN * m.uniform_labels_per_batch)
    return top or few


class MixingCheck:
    """The labels of a shuffled pass's first batches, and one warning per loader when they are
    far less mixed than a uniform shuffle's (``source``: named in it). A pass's first ``batches``
    batches: :meth:`start` at the start of a pass, then :meth:`add` per batch (a mask and a copy
    of the batch's labels) until it returns ``False``, or :meth:`finish` at the end of a shorter
    pass; the judgement (~1 ms) once. ``result``: the last pass's :class:`Mixing`."""

    def __init__(self, source: str, batch_size: int):
        self.source = source
        self.batches = min(CHECK_BATCHES[1], max(CHECK_BATCHES[0], -(-CHECK_SAMPLES // max(1, batch_size))))
        self.enabled = batch_size >= MIN_CHECK_BATCH
        self.warned = False
        self.result: Mixing | None = None
        self._labels: list[np.ndarray] = []
        self._seen = 0

    def start(self) -> MixingCheck | None:
        """A new pass: self, ready for its first batch (what an earlier pass left unfinished is
        dropped); ``None`` when there is nothing to check (warned already, or batches too small)."""
        self._labels, self._seen = [], 0
        return self if self.enabled and not self.warned else None

    def add(self, labels: torch.Tensor, valid: torch.Tensor, has_targets: bool = False) -> bool:
        """Take one batch's labels ((B,) int64, ``valid`` (B,) bool); ``False`` once the pass's
        check is done (judged, or a batch without labels or with detection targets: nothing to
        judge), and the caller stops calling."""
        if has_targets:  # a detection batch: its per-image labels say nothing of its classes
            return False
        kept = labels[valid & (labels >= 0)]
        if not kept.numel():  # unlabelled (-1)
            return False
        self._labels.append(kept.numpy().copy())
        self._seen += 1
        if self._seen < self.batches:
            return True
        self._judge()
        return False

    def finish(self) -> None:
        """The pass ended before ``batches`` batches: judged on what it gave, if at least the least
        number (``CHECK_BATCHES[0]``)."""
        if self._labels and self._seen >= CHECK_BATCHES[0]:
            self._judge()

    def _judge(self) -> None:
        self.result = m = mixing(self._labels)
        self._labels = []
        if far_from_uniform(m):
            self.warned = True
            log.warning("the shuffle of %s is mixing classes poorly: over its first %d batches the most common label "
                        "was %.1f %% of a batch (a uniform shuffle of the same samples: %.1f %%), with %.1f labels in "
                        "a batch (uniform: %.1f). The shards are likely in class order; %s; check with "
                        "`gpupipe inspect URL --shuffle` (docs/tuning.md, \"Is my shuffle mixing classes?\")",
                        self.source, m.batches, 100 * m.top_share, 100 * m.uniform_top_share, m.labels_per_batch,
                        m.uniform_labels_per_batch, ADVICE)
