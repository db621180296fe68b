"""Boxes and masks travel from tar shards into ``EncodedBatch.targets`` exactly.

Generated detection shards (:func:`gpupipe.tools.synth.detection_sample`) are read by the
``EncodedLoader`` — with and without ``index.json``, in this process and in a worker, shuffled,
resumed — and every delivered sample's boxes, labels and encoded mask must be the very ones
written for its key. Bad annotations follow ``on_error``; spans with targets keep the vectorized
scan, and so do shards without any.
"""
from __future__ import annotations

import numpy as np
import pytest
from datagen import write_detection
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupipe.config.split import SplitConfig
from gpupipe.core.errors import ShardFormatError
from gpupipe.core.types import ErrorPolicy, World
from gpupipe.decode.base import DecodeConfig
from gpupipe.loader.encoded import EncodedLoader
from gpupipe.sources.source import Source
from gpupipe.stream import chunks
from gpupipe.stream.batch import SampleTable, pack_table
from gpupipe.stream.chunks import StreamConfig
from gpupipe.stream.targets import TargetColumns

N = 30


def _loader(url, kinds=("boxes", "masks"), *, workers: int = 0, on_error: str = "raise", seed: int = 3,
            shuffle: bool = True, drop_last: bool = False, world: World | None = None) -> EncodedLoader:
    policy = ErrorPolicy(on_error)
    split = SplitConfig(Source(str(url), targets=kinds), batch_size=4, num_workers=workers, seed=seed,
                        stream=StreamConfig(shuffle=shuffle, shuffle_buffer=8, drop_last=drop_last, on_error=policy),
                        decode=DecodeConfig(on_error=policy, seed=seed))
    return EncodedLoader(split, world=world or World())


def _delivered(batches, kinds=("boxes", "masks")) -> dict[str, tuple]:
    """Key → (boxes, labels, mask bytes) of every valid sample, checking each batch's layout."""
    out: dict[str, tuple] = {}
    for b in batches:
        t = b.targets
        assert t is not None and t.kinds == tuple(kinds)
        counts = t.box_counts.tolist() if "boxes" in kinds else [0] * len(b)
        starts = np.cumsum([0] + counts)
        if "boxes" in kinds:
            assert t.boxes.shape == (starts[-1], 4) and t.box_labels.shape == (starts[-1],)
        for i, key in enumerate(b.keys):
            if not bool(b.valid[i]):
                assert counts[i] == 0 and ("masks" not in kinds or len(t.mask(i)) == 0)
                continue
            assert key not in out, f"{key} delivered twice"
            boxes = t.boxes[starts[i]:starts[i + 1]].numpy().copy() if "boxes" in kinds else None
            labels = t.box_labels[starts[i]:starts[i + 1]].numpy().copy() if "boxes" in kinds else None
            out[key] = (boxes, labels, bytes(t.mask(i)) if "masks" in kinds else None)
    return out


def _check(got: dict, written: dict, kinds=("boxes", "masks")) -> None:
    assert sorted(got) == sorted(written)
    for key, (boxes, labels, mask) in got.items():
        sample, fields = written[key]
        if "boxes" in kinds:
            np.testing.assert_array_equal(boxes, sample.boxes, err_msg=key)
            np.testing.assert_array_equal(labels, sample.labels, err_msg=key)
        if "masks" in kinds:
            assert mask == fields["mask.png"], key


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("manifest", [True, False])
def test_targets_round_trip_exactly(tmp_path, workers, manifest):
    written = write_detection(str(tmp_path / "ds"), N, shard_size=8, manifest=manifest)
    loader = _loader(tmp_path / "ds", workers=workers)
    batches = list(loader)
    got = _delivered(batches)
    _check(got, written)
    keys = [k for b in batches for k in b.keys]
    assert keys != sorted(keys), "shuffled: each sample's targets must have moved with it"
    assert sum(len(s.boxes) == 0 for s, _ in written.values()) >= 5  # images without objects are among them
    assert any((s.boxes[:, :2] == 0).any() for s, _ in written.values())  # boxes touching an edge too


@pytest.mark.parametrize("kinds", [("boxes",), ("masks",)])
def test_one_kind_alone(tmp_path, kinds):
    written = write_detection(str(tmp_path / "ds"), 12, shard_size=5, kinds=kinds)
    batches = list(_loader(tmp_path / "ds", kinds))
    _check(_delivered(batches, kinds), written, kinds)


def test_classification_source_carries_no_targets(tmp_path):
    write_detection(str(tmp_path / "ds"), 8)
    assert all(b.targets is None for b in _loader(tmp_path / "ds", ()))


def test_resume_mid_epoch_gives_the_same_targets(tmp_path):
    written = write_detection(str(tmp_path / "ds"), N, shard_size=8)
    whole = _delivered(list(_loader(tmp_path / "ds")))
    first = _loader(tmp_path / "ds")
    head = []
    for b in first:
        head.append(b)
        if len(head) == 3:
            break
    state = first.state_dict()
    second = _loader(tmp_path / "ds")
    second.load_state_dict(state)
    tail = list(second)
    got = _delivered(head + tail)  # (asserts no key twice)
    _check(got, written)
    assert {k: (b.tolist(), lab.tolist(), m) for k, (b, lab, m) in got.items()} == \
           {k: (b.tolist(), lab.tolist(), m) for k, (b, lab, m) in whole.items()}


def _scan_results(monkeypatch) -> list:
    """Record what ``chunks._scanned`` answers for each span (None: the streaming reader)."""
    seen: list = []
    real = chunks._scanned

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(chunks, "_scanned", spy)
    return seen


def test_spans_with_targets_take_the_fast_path_and_match_the_slow_one(tmp_path, monkeypatch):
    write_detection(str(tmp_path / "ds"), N, shard_size=8)
    seen = _scan_results(monkeypatch)
    fast = list(_loader(tmp_path / "ds"))
    assert seen and all(t is not None and t.targets is not None for t in seen)
    monkeypatch.setattr(chunks, "scan_span", lambda *a, **k: None)
    slow = list(_loader(tmp_path / "ds"))

    def flat(batches):
        return [(b.keys, b.valid.tolist(), bytes(b.data.numpy()), b.targets.box_counts.tolist(),
                 b.targets.boxes.tolist(), b.targets.box_labels.tolist(), bytes(b.targets.mask_data.numpy()),
                 b.targets.mask_offsets.tolist()) for b in batches]

    assert flat(fast) == flat(slow)


def test_shards_without_targets_keep_the_fast_path(tmp_path, monkeypatch):
    """Classification reads scan no more members than before, and every span is scanned."""
    write_detection(str(tmp_path / "ds"), N, shard_size=8, kinds=())
    asked: list = []
    real = chunks.scan_span
    monkeypatch.setattr(chunks, "scan_span", lambda *a, **k: asked.append(k.get("member_exts")) or real(*a, **k))
    seen = _scan_results(monkeypatch)
    assert sum(b.valid.sum().item() for b in _loader(tmp_path / "ds", ())) == N
    assert seen and all(t is not None and t.targets is None for t in seen)
    assert set(asked) == {()}


_BAD = {
    "bad .json": lambda f: {**f, "json": b'{"boxes": [[1, 2, 3]], "labels": [0]}'},
    "missing .json": lambda f: {k: v for k, v in f.items() if k != "json"},
    "missing .mask.png": lambda f: {k: v for k, v in f.items() if k != "mask.png"},
    "label outside the classes": lambda f: {**f, "json": b'{"boxes": [[1, 2, 3, 4]], "labels": [7]}'},
}


@pytest.mark.parametrize("manifest", [True, False])
@pytest.mark.parametrize("bad", list(_BAD))
def test_bad_annotations_follow_on_error(tmp_path, bad, manifest):
    if bad == "label outside the classes" and not manifest:
        pytest.skip("without index.json there is no class list to check labels against")
    written = write_detection(str(tmp_path / "ds"), 12, shard_size=5, manifest=manifest, damage={6: _BAD[bad]})
    with pytest.raises(ShardFormatError, match="det_000006"):
        list(_loader(tmp_path / "ds"))
    loader = _loader(tmp_path / "ds", on_error="skip")
    batches = list(loader)
    assert loader.stats.skipped == 1
    got = _delivered(batches)  # (asserts a placeholder has no boxes and an empty mask)
    del written["det_000006"]
    _check(got, written)
    if manifest:
        placeholders = [(b, i) for b in batches for i, k in enumerate(b.keys) if k == "det_000006"]
        assert len(placeholders) == 1 and not bool(placeholders[0][0].valid[placeholders[0][1]])


def test_padding_carries_no_targets(tmp_path):
    """drop_last=False on two ranks pads each rank's tail with repeated samples, marked invalid: no
    boxes, no mask. One process pads nothing: its last batch is short (issue 35)."""
    write_detection(str(tmp_path / "ds"), 10, shard_size=5)
    ranks = [list(_loader(tmp_path / "ds", shuffle=False, world=World(rank=r, world_size=2))) for r in range(2)]
    assert [sum(not v for b in batches for v in b.valid.tolist()) for batches in ranks] == [3, 3]
    for batches in ranks:
        _delivered(batches)  # asserts it
    one = list(_loader(tmp_path / "ds", shuffle=False))
    assert [len(b) for b in one] == [4, 4, 2] and all(v for b in one for v in b.valid.tolist())
    assert len(_delivered(one)) == 10


# ------------------------------------------------------------------- the columns


@st.composite
def _tables(draw):
    """A SampleTable of n samples with ragged boxes and masks, and its rows as plain lists."""
    n = draw(st.integers(0, 6))
    counts = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    rows = [[(float(4 * i + j), float(j), float(i + 9), float(j + 9), 10 * i + j) for j in range(c)]
            for i, c in enumerate(counts)]
    masks = [bytes([i + 1]) * draw(st.integers(0, 3)) for i in range(n)]
    images = [bytes([200 + i]) * (i + 1) for i in range(n)]
    boxes = np.array([r[:4] for rs in rows for r in rs], np.float32).reshape(-1, 4)
    labels = np.array([r[4] for rs in rows for r in rs], np.int64)
    targets = TargetColumns(box_counts=np.array(counts, np.int64), boxes=boxes, box_labels=labels,
                            mask_buffer=np.arange(n, 2 * n, dtype=np.int64), mask_start=np.zeros(n, np.int64),
                            mask_size=np.array([len(m) for m in masks], np.int64))
    table = SampleTable(buffers=tuple(images + masks), buffer=np.arange(n, dtype=np.int64),
                        start=np.zeros(n, np.int64), size=np.arange(1, n + 1, dtype=np.int64),
                        labels=np.zeros(n, np.int64), sample_ids=np.arange(n, dtype=np.int64),
                        keys=[f"k{i}" for i in range(n)], valid=np.ones(n, bool), targets=targets)
    return table, [(images[i], rows[i], masks[i]) for i in range(n)]


def _as_rows(table: SampleTable) -> list:
    batch = pack_table(table)
    t = batch.targets
    starts = np.cumsum([0] + t.box_counts.tolist())
    return [(bytes(batch.image(i)),
             [(*t.boxes[starts[i] + j].tolist(), int(t.box_labels[starts[i] + j])) for j in range(int(t.box_counts[i]))],
             bytes(t.mask(i))) for i in range(len(batch))]


@settings(max_examples=40, deadline=None)
@given(a=_tables(), b=_tables(), data=st.data())
def test_take_and_concat_keep_ragged_targets_with_their_samples(a, b, data):
    (ta, ra), (tb, rb) = a, b
    both, rows = SampleTable.concat([ta, tb]), ra + rb
    assert _as_rows(both) == [(im, [tuple(r) for r in rs], m) for im, rs, m in rows]
    index = np.array(data.draw(st.lists(st.integers(0, max(len(rows) - 1, 0)), max_size=8 if rows else 0)),
                     dtype=np.int64)
    picked = both.take(index)
    assert _as_rows(picked) == [(rows[i][0], [tuple(r) for r in rows[i][1]], rows[i][2]) for i in index.tolist()]
    lo = data.draw(st.integers(0, len(rows)))
    assert _as_rows(both.take(slice(lo, None))) == _as_rows(both.take(np.arange(lo, len(rows))))
