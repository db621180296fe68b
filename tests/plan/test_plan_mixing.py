"""Shuffle quality that does not depend on the order at rest (issue 35): the plan's blocks.

Shards written in class order (a sorted ImageFolder packed without shuffling) are the common
worst case. The plan's delivery order is checked on such a layout against a uniform shuffle of
the same labels: the share of the most common class per batch and the classes per batch.
Pure arithmetic on the plan (no reading), so cheap enough to run on the issue's own sizes.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_plan import delivered  # noqa: E402  (tests/plan is on sys.path under pytest's rootdir layout)

from gpupipe.loader.encoded import DEFAULT_BLOCK  # noqa: E402
from gpupipe.plan import PlanSpec, Progress, blocks, chunk_sample_ids, plan_identity, rank_chunks, resume_plan


def _batches(spec: PlanSpec, epoch: int) -> np.ndarray:
    """Sample ids of rank 0's batches in delivery order, (steps, batch_size)."""
    ids = np.concatenate([chunk_sample_ids(spec, epoch, c)[0] for c in rank_chunks(spec, 0)])
    return ids.reshape(-1, spec.batch_size)


def _quality(labels: np.ndarray, batches: np.ndarray, classes: int) -> tuple[float, float]:
    """(mean share of the most common label per batch, mean labels per batch)."""
    counts = np.stack([np.bincount(labels[b], minlength=classes) for b in batches])
    return float((counts.max(1) / batches.shape[1]).mean()), float((counts > 0).sum(1).mean())


def _uniform(labels: np.ndarray, batch: int, classes: int, rounds: int = 8) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    n = len(labels) // batch * batch
    got = [_quality(labels, rng.permutation(len(labels))[:n].reshape(-1, batch), classes) for _ in range(rounds)]
    return float(np.mean([g[0] for g in got])), float(np.mean([g[1] for g in got]))


@pytest.mark.parametrize("samples, classes, shards", [(8000, 10, 8), (20000, 100, 100)])
def test_class_ordered_shards_mix_like_a_uniform_shuffle_with_blocks(samples, classes, shards):
    """The issue's data (8,000 samples of 10 classes in 8 class-ordered shards) and a 100-class,
    100-shard variant, batch 256, the default window (1,024) and block (4, spread over the
    window): the most common class takes at most 1.25x a uniform shuffle's share, and as many
    classes appear per batch. With shards whole (block 0, the layout before) the same data gives
    batches of a few classes."""
    counts = (samples // shards,) * shards
    labels = np.arange(samples) * classes // samples  # class order at rest
    uniform_share, uniform_present = _uniform(labels, 256, classes)
    for block in (DEFAULT_BLOCK, 0):
        spec = PlanSpec(counts=counts, batch_size=256, chunk_batches=4, seed=3, block=block)
        share, present = np.mean([_quality(labels, _batches(spec, e), classes) for e in range(3)], axis=0)
        if block:
            assert share <= 1.25 * uniform_share, (share, uniform_share)
            assert present >= uniform_present - 0.5, (present, uniform_present)
        else:
            assert share >= 2 * uniform_share and present < 0.8 * uniform_present, (share, present)


def test_blocks_cut_every_shard_into_runs_in_file_order():
    shard, first, count = blocks((10, 0, 3, 8), 4)
    assert shard.tolist() == [0, 0, 0, 2, 3, 3]
    assert first.tolist() == [0, 4, 8, 0, 0, 4] and count.tolist() == [4, 4, 2, 3, 4, 4]
    shard, first, count = blocks((10, 0, 3), 0)
    assert shard.tolist() == [0, 1, 2] and first.tolist() == [0, 0, 0] and count.tolist() == [10, 0, 3]


def test_a_block_is_read_as_one_span_of_its_shard():
    """Reads stay byte ranges: every span of a window lies inside one block, and the spans of a
    whole chunk are at most as many as its blocks (plus a wrap for padding)."""
    from gpupipe.plan import chunk_spans

    spec = PlanSpec(counts=(100, 37, 64), batch_size=16, chunk_batches=4, seed=1, block=8)
    for chunk in rank_chunks(spec, 0):
        spans = chunk_spans(spec, 0, chunk)
        assert sum(map(len, spans)) == chunk.num_batches * 16
        assert all(s.start // 8 == (s.stop - 1) // 8 for s in spans)  # inside one block of its shard
        assert len(spans) <= -(-chunk.num_batches * 16 // 8) + 2


def test_a_mid_epoch_resume_keeps_the_blocks_it_was_saved_with():
    """Which sample sits at which position depends on the blocks: a state saved with block 8 and
    resumed with block 16 configured continues the epoch with 8 (the rest exactly), and a state
    from before blocks (no ``block``) with shards whole."""
    spec = PlanSpec(counts=(50, 40, 30), batch_size=8, chunk_batches=2, seed=5, block=8)
    progress = Progress.for_rank(spec)
    for c, b in [(0, 0), (0, 1), (1, 0)]:
        progress.advance(c, b)
    whole = [i for i, _ in delivered(spec, 0, 0, 1)]
    plan, rest = resume_plan(dataclasses.replace(spec, block=16), 0, plan_identity(spec), progress.to_dict())
    assert plan.block == 8 and whole[24:] == [i for i, _ in delivered(plan, 0, 0, 1, rest)]
    old = {k: v for k, v in plan_identity(dataclasses.replace(spec, block=0)).items() if k != "block"}
    plan, _ = resume_plan(spec, 0, old, Progress.for_rank(dataclasses.replace(spec, block=0)).to_dict())
    assert plan.block == 0


def test_a_negative_block_is_refused():
    from gpupipe.core.errors import PlanError

    with pytest.raises(PlanError, match="block"):
        PlanSpec(counts=(4,), batch_size=2, block=-1)


def test_the_default_block_grows_past_16m_samples_so_the_layout_stays_small():
    """An epoch's layout holds every block: the default keeps them at most MAX_BLOCKS (4M)."""
    from gpupipe.formats.manifest import Manifest
    from gpupipe.loader.encoded import MAX_BLOCKS, block_for
    from gpupipe.sources.resolved import ResolvedSource
    from gpupipe.stream.settings import StreamConfig

    local = ResolvedSource(shard_urls=["/data/a.tar"], manifest=Manifest(shards=()))  # tar shards
    assert block_for(local, StreamConfig(), 1_280_000) == DEFAULT_BLOCK
    assert block_for(local, StreamConfig(), 100_000_000) == 24 and 100_000_000 / 24 <= MAX_BLOCKS
    assert block_for(local, StreamConfig(shuffle_block=2), 100_000_000) == 2  # a setting is a setting
    remote = ResolvedSource(shard_urls=["s3://b/a.tar"], manifest=Manifest(shards=()))
    assert block_for(remote, StreamConfig(), 1_000) == 0  # object storage without the cache: shards whole
