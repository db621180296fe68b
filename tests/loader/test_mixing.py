"""The shuffle-mixing statistic (gpupipe.loader.mixing): pure, deterministic, and far from uniform
exactly where batches are far less mixed than a uniform shuffle of the same labels."""
from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupipe.loader import mixing as mixing_module
from gpupipe.loader.mixing import CHECK_BATCHES, MixingCheck, far_from_uniform, mixing


def cut(labels: np.ndarray, batch: int) -> list[np.ndarray]:
    return [labels[i:i + batch] for i in range(0, len(labels) - batch + 1, batch)]


def test_a_small_case_by_hand():
    m = mixing([[0, 0, 1, 1], [2, 2, 2, 3], [], [-1]])  # the empty batch is left out; -1 is a label here
    assert (m.batches, m.samples, m.labels) == (3, 9, 5)
    assert m.top_share == pytest.approx((0.5 + 0.75 + 1.0) / 3)
    assert m.labels_per_batch == pytest.approx((2 + 2 + 1) / 3)


def test_nothing_labelled_is_not_a_verdict():
    m = mixing([[], []])
    assert m.batches == 0 and math.isnan(m.top_share) and not far_from_uniform(m)
    assert m.as_dict()["top_share"] is None  # JSON-able


def test_the_uniform_expectation_of_distinct_labels_matches_the_exact_one():
    # batches of 16 drawn without replacement from 640 samples, 10 classes of 64:
    # E[distinct] = sum over classes of 1 - C(N - n_c, B) / C(N, B)
    exact = 10 * (1 - math.comb(640 - 64, 16) / math.comb(640, 16))
    m = mixing(cut(np.repeat(np.arange(10), 64), 16))
    assert m.uniform_labels_per_batch == pytest.approx(exact, abs=0.03)
    # the mean largest count of 16 such draws: 3.737 of 16 (0.2336), from 200,000 batches drawn apart from this code
    assert m.uniform_top_share == pytest.approx(0.2336, abs=0.006)


def test_the_table_and_the_sorted_pairs_count_alike(monkeypatch):
    labels = np.random.default_rng(3).integers(0, 37, 20 * 64)
    table = mixing(cut(labels, 64), seed=5)
    monkeypatch.setattr(mixing_module, "_TABLE", 0)
    assert mixing(cut(labels, 64), seed=5) == table


@settings(max_examples=40, deadline=None)
@given(classes=st.integers(1, 40), batch=st.integers(16, 256), batches=st.integers(8, 24), seed=st.integers(0, 2**16))
def test_an_interleaved_order_scores_like_uniform(classes, batch, batches, seed):
    labels = np.arange(batch * batches) % classes  # round robin: every batch as even as it can be
    m = mixing(cut(labels, batch), seed=seed)
    assert m.labels_per_batch == min(classes, batch) >= m.uniform_labels_per_batch - 1e-9
    assert m.top_share <= m.uniform_top_share + 1e-9
    assert not far_from_uniform(m)


@settings(max_examples=40, deadline=None)
@given(classes=st.integers(2, 8), batch=st.integers(16, 256), seed=st.integers(0, 2**16))
def test_a_sorted_order_scores_far_worse(classes, batch, seed):
    labels = np.repeat(np.arange(classes), batch)  # sorted, a batch's worth of each class: one class a batch
    m = mixing(cut(np.concatenate([labels, labels]), batch), seed=seed)
    assert m.top_share == 1.0 and m.labels_per_batch == 1.0
    assert m.uniform_labels_per_batch > 1.5 and m.uniform_top_share < 0.8
    assert far_from_uniform(m)


@settings(max_examples=60, deadline=None)
@given(classes=st.integers(1, 200), batch=st.integers(16, 256), batches=st.integers(8, 64),
       skew=st.floats(0.2, 5.0), seed=st.integers(0, 2**16))
def test_a_uniform_shuffle_is_never_far_from_uniform(classes, batch, batches, skew, seed):
    rng = np.random.default_rng(seed)
    weights = rng.dirichlet(np.full(classes, skew))  # any histogram, shuffled uniformly
    m = mixing(cut(rng.choice(classes, batch * batches, p=weights), batch), seed=seed)
    assert not far_from_uniform(m)


def test_batches_of_half_the_classes_each_are_far_from_uniform_by_their_labels():
    # each batch even over 5 of 10 classes (a window holding half of them): the top share is near
    # uniform's, the number of labels is half of it
    halves = np.arange(50) % 5
    m = mixing([halves + 5 * (i % 2) for i in range(16)])
    assert m.top_share == 0.2 and m.top_share - m.uniform_top_share < 0.05
    assert m.labels_per_batch == 5 and m.uniform_labels_per_batch > 9.5
    assert far_from_uniform(m)


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 64), seed=st.integers(0, 2**16))
def test_renaming_the_labels_changes_nothing(batch, seed):
    rng = np.random.default_rng(seed)
    labels = np.sort(rng.integers(0, 12, 10 * batch))[rng.permutation(10 * batch) % 3 == 0]  # some order, some mix
    names = rng.choice(10**9, 12, replace=False) - 5 * 10**8  # any one-to-one renaming, negatives too
    assert mixing(cut(names[labels], batch), seed=seed) == mixing(cut(labels, batch), seed=seed)


def test_it_is_deterministic():
    labels = cut(np.random.default_rng(0).integers(0, 10, 20 * 256), 256)
    assert mixing(labels) == mixing([b.copy() for b in labels])
    assert mixing(labels, seed=1) != mixing(labels)  # the seed is the only randomness


# -- MixingCheck: the loader's per-pass check ---------------------------------------------------------


def feed(check: MixingCheck, labels: np.ndarray, batch: int, *, targets: bool = False) -> int:
    """Give a pass's batches to ``check`` the way the loader does; the batches it took."""
    run = check.start()
    taken = 0
    for b in cut(labels, batch):
        if run is None:
            break
        taken += 1
        t = torch.from_numpy(b.astype(np.int64))
        if not run.add(t, torch.ones(len(t), dtype=torch.bool), targets):
            run = None
    if run is not None:
        run.finish()
    return taken


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gpupipe.loader.mixing"]


def test_the_check_warns_once_per_loader_naming_the_source_and_the_settings(caplog):
    check = MixingCheck("s3://bucket/sorted", 32)
    sorted_labels = np.repeat(np.arange(10), 256)
    with caplog.at_level(logging.WARNING, logger="gpupipe.loader.mixing"):
        assert feed(check, sorted_labels, 32) == check.batches == 64  # 2,048 samples at 32 a batch
        assert feed(check, sorted_labels, 32) == 0  # warned: the next passes check nothing
    (message,) = warnings_of(caplog)
    assert "s3://bucket/sorted" in message and "100.0 %" in message
    assert "set stream.shuffle_block to a few samples" in message and "docs/tuning.md" in message


def test_the_check_takes_the_first_batches_only_and_stays_quiet_on_uniform_data(caplog):
    check = MixingCheck("ds", 256)
    labels = np.random.default_rng(1).integers(0, 10, 40 * 256)
    with caplog.at_level(logging.WARNING):
        assert feed(check, labels, 256) == CHECK_BATCHES[0]
        assert feed(check, labels, 256) == CHECK_BATCHES[0]  # not warned: every pass is checked again
    assert not warnings_of(caplog) and check.result.batches == CHECK_BATCHES[0]
    assert abs(check.result.top_share - check.result.uniform_top_share) < 0.03


def test_the_check_costs_nothing_without_labels_targets_or_large_enough_batches(caplog):
    sorted_labels = np.repeat(np.arange(10), 256)
    with caplog.at_level(logging.WARNING):
        assert feed(MixingCheck("ds", 32), np.full(2560, -1), 32) == 1  # unlabelled: stops at the first batch
        assert feed(MixingCheck("ds", 32), sorted_labels, 32, targets=True) == 1  # detection targets
        assert feed(MixingCheck("ds", 8), sorted_labels, 8) == 0  # a share of 1 in 8 says little
    assert not warnings_of(caplog)


def test_a_pass_shorter_than_the_check_is_judged_at_its_end_if_long_enough(caplog):
    sorted_labels = np.repeat(np.arange(10), 32)
    with caplog.at_level(logging.WARNING):
        assert feed(MixingCheck("short", 32), sorted_labels[:7 * 32], 32) == 7  # fewer than 8: no verdict
        assert not warnings_of(caplog)
        assert feed(MixingCheck("short", 32), sorted_labels, 32) == 10
    assert len(warnings_of(caplog)) == 1
