"""Issue 34: what the tar scan found in a local shard is remembered while the file stays as it was
(:mod:`gpupipe.stream.memo`). A later pass over the same samples is not scanned and delivers what
a scan delivers — in this process and in stream workers; a shard written in place or replaced
since is scanned again, so a sample damaged meanwhile is found as before, never delivered."""
from __future__ import annotations

import os

import numpy as np
import pytest
from datagen import ids_of, write_dataset

from gpupipe.core.errors import GpupipeError
from gpupipe.decode import columns
from gpupipe.decode.settings import DecodeConfig
from gpupipe.formats import headers
from gpupipe.formats.headers import probe_batch
from gpupipe.formats.manifest import MANIFEST_NAME, Manifest
from gpupipe.loader.encoded import EncodedLoader, StreamConfig
from gpupipe.stream import chunks
from gpupipe.stream.memo import SCANNED, ScanMemo
from gpupipe.tools.synth import synthetic_jpeg


def loader(path, workers: int = 0, **kw) -> EncodedLoader:
    return EncodedLoader(str(path), batch_size=8, seed=3, drop_last=False, num_workers=workers,
                         stream=StreamConfig(shuffle_buffer=32, unit_batches=2), **kw)


def delivered(ld: EncodedLoader, epoch: int) -> list[tuple]:
    ld.set_epoch(epoch)
    return [(b.keys, b.labels.tolist(), b.sample_ids.tolist(), b.valid.tolist(), ids_of(b)) for b in ld]


@pytest.fixture
def counted(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = chunks.scan_span
    monkeypatch.setattr(chunks, "scan_span", lambda *a, **k: calls.append(len(a[1]) - 1) or real(*a, **k))
    return calls


def test_a_pass_over_samples_scanned_before_is_not_scanned_and_delivers_the_same(tmp_path, counted):
    write_dataset(str(tmp_path / "ds"), [40, 40, 17])
    ld = loader(tmp_path / "ds")
    first = delivered(ld, 0)
    scanned = sum(counted)
    assert scanned == 97 and len(SCANNED) == 97
    assert delivered(ld, 0) == first and delivered(ld, 1) != first  # (another epoch, another order)
    assert sum(counted) == scanned  # both passes from the memo
    remembered = delivered(ld, 1)
    SCANNED.clear()
    assert delivered(ld, 1) == remembered and sum(counted) == 2 * scanned  # scanned again: the same


def test_stream_workers_remember_for_their_next_pass(tmp_path):
    write_dataset(str(tmp_path / "ds"), [40, 40, 17])
    fresh = [delivered(loader(tmp_path / "ds"), e) for e in (0, 1)]
    SCANNED.clear()
    ld = loader(tmp_path / "ds", workers=2)  # persistent workers: later passes from their own memo, as fresh scans
    assert [delivered(ld, e) for e in (0, 1, 0)] == fresh + fresh[:1]
    ld.close()


@pytest.mark.parametrize("how", ["in place", "replaced"])
def test_a_shard_changed_since_its_scan_is_scanned_again(tmp_path, counted, how):
    """One image byte of a sample flipped after the first pass (the same size: only the file's
    modification time or inode says so): the next pass scans that shard again and finds the
    sample's checksum wrong, as it would without a memo."""
    path = tmp_path / "ds"
    write_dataset(str(path), [40, 40], checksums=True)
    ld = loader(path)
    first = delivered(ld, 0)
    entry = Manifest.from_json((path / MANIFEST_NAME).read_text()).shards[1]
    shard = path / entry.name
    data = bytearray(shard.read_bytes())
    data[int(entry.offsets[7]) + 512 + 10] ^= 0x40  # in the first member's data (its header is 512 bytes)
    if how == "in place":
        with open(shard, "r+b") as f:
            f.write(bytes(data))
    else:
        (tmp_path / "new.tar").write_bytes(bytes(data))
        os.replace(tmp_path / "new.tar", shard)
    before = sum(counted)
    with pytest.raises(GpupipeError, match="part-0001.tar"):
        delivered(ld, 0)
    assert sum(counted) > before
    skipping = loader(path, on_error="skip")
    got = delivered(skipping, 0)
    assert skipping.stats.skipped == 1
    assert [ids for *_, ids in got] == [[i for i in ids if i != 47] for *_, ids in first]


def test_the_memo_keeps_at_most_its_limit_and_forgets_a_file_seen_otherwise():
    memo = ScanMemo(limit=10)
    one = np.arange(3)
    memo.remember("a", (1, 2, 3, 4), 6, one, one, one + 10, one, ["a0", "a1", "a2"])
    assert memo.known(["a"], one, np.zeros(3, np.int64)) is not None
    assert memo.known(["a"], np.arange(4), np.zeros(4, np.int64)) is None  # sample 3 not scanned yet
    memo.remember("b", (5, 6, 7, 8), 5, one, one, one, one, ["b0", "b1", "bb2"])
    assert len(memo) == 5 and memo.known(["a"], one, np.zeros(3, np.int64)) is None  # 6 + 5 > 10: "a" went
    identities, at, size, label, keys, header = memo.known(["b"], one[::-1].copy(), np.zeros(3, np.int64))
    assert identities == {0: (5, 6, 7, 8)} and keys == ["bb2", "b1", "b0"] and size.tolist() == [2, 1, 0]
    assert header.tolist() == [-1, -1, -1]  # no probe verdict kept yet
    memo.remember_headers("b", (5, 6, 7, 0), one[:1], np.array([4], np.int32))  # read under another identity
    memo.remember_headers("b", (5, 6, 7, 8), one[1:], np.array([4, 5], np.int32))
    assert memo.known(["b"], one, np.zeros(3, np.int64))[5].tolist() == [-1, 4, 5]
    memo.remember("b", (5, 6, 7, 9), 5, one[:1], one[:1], one[:1], one[:1], ["b0"])  # the file seen otherwise
    assert memo.known(["b"], one[:2], np.zeros(2, np.int64)) is None
    assert memo.known(["b"], one[:1], np.zeros(1, np.int64))[0] == {0: (5, 6, 7, 9)}
    memo.remember("c", (1, 1, 1, 1), 11, one, one, one, one, ["c0", "c1", "c2"])  # more than the limit
    assert memo.known(["c"], one, np.zeros(3, np.int64)) is None


BAD = 21  # a sample whose image is no JPEG


def jpeg_dataset(path) -> None:
    write_dataset(str(path), [40, 40, 17], image=lambda i: b"\xff\xd8 no jpeg" if i == BAD
                  else synthetic_jpeg(np.random.default_rng(i), (16 + i % 3, 16)))


def probed_passes(ld: EncodedLoader, calls: dict[str, int], passes: int) -> list[tuple[dict, list]]:
    """Each pass: the probe calls it made (in the stream's units, in the batches) and per batch
    (the headers it carries, the rows it refused, a fresh probe's headers of its bytes)."""
    out = []
    for _ in range(passes):
        ld.set_epoch(0)
        before = dict(calls)
        got = []
        for b in ld:
            fresh = probe_batch(b.images(), ld.decode.max_pixels)
            got.append((b.probed.headers(), sorted(b.probed.reasons), fresh.headers(), sorted(fresh.reasons)))
        out.append(({k: calls[k] - before[k] for k in calls}, got))
    return out


@pytest.fixture
def probes(monkeypatch) -> dict[str, int]:
    calls = {"unit": 0, "batch": 0}

    def counting(where, real):
        return lambda *a, **k: calls.__setitem__(where, calls[where] + 1) or real(*a, **k)
    monkeypatch.setattr(chunks, "probe_batch", counting("unit", chunks.probe_batch))
    monkeypatch.setattr(columns, "probe_batch", counting("batch", columns.probe_batch))
    return calls


def test_probe_verdicts_are_kept_with_the_scan_and_are_what_a_probe_finds(tmp_path, probes):
    """Pass 1 scans and probes each batch; pass 2 takes the scan from the memo and probes each
    unit's images once, keeping the verdicts; pass 3 probes nothing. Every pass's batches carry
    exactly the headers (and refusals) a probe of their bytes gives."""
    jpeg_dataset(tmp_path / "ds")
    ld = loader(tmp_path / "ds")
    ld.decode = DecodeConfig()
    passes = probed_passes(ld, probes, 3)
    assert [calls for calls, _ in passes] == [{"unit": 0, "batch": 13}, {"unit": 7, "batch": 1}, {"unit": 1, "batch": 1}]
    for _, batches in passes:
        for carried, refused, fresh, fresh_refused in batches:
            assert carried == fresh and refused == fresh_refused
        assert sum(len(refused) for _, refused, _, _ in batches) == 1  # the bad image, every pass
    assert passes[0][1] == passes[1][1] == passes[2][1]


def test_probe_verdicts_kept_under_one_pixel_limit_are_not_taken_under_another(tmp_path, probes):
    jpeg_dataset(tmp_path / "ds")
    ld = loader(tmp_path / "ds")
    ld.decode = DecodeConfig()
    probed_passes(ld, probes, 2)  # verdicts kept: every good image passed
    ld.decode = DecodeConfig(max_pixels=200)  # 16x16 = 256 pixels: now every image is refused
    for _, batches in probed_passes(ld, probes, 2):
        for carried, refused, fresh, fresh_refused in batches:
            assert carried == fresh and refused == fresh_refused
            assert all(h is None for h in carried) and len(refused) == len(carried)


def test_verdicts_past_the_registry_s_size_are_not_kept(monkeypatch):
    """A registry with room for one verdict (empty: what other tests kept stays out): the first
    distinct header gets a number, the others none; a number stands for its header under its
    limit only."""
    monkeypatch.setattr(headers, "_IDS", {})
    monkeypatch.setattr(headers, "_BY_ID", [])
    monkeypatch.setattr(headers, "_IDS_MAX", 1)
    images = [synthetic_jpeg(np.random.default_rng(i), (16 + i, 16)) for i in range(3)]  # 3 sizes: 3 headers
    probed = probe_batch(images, None)
    assert len(probed.table) == 3
    ids = headers.header_ids(probed)
    assert ids.tolist() == [0, -1, -1] and headers.probed_from_ids(ids, None) is None
    assert headers.probed_from_ids(ids[:1], None).headers() == probe_batch(images[:1], None).headers()
    assert headers.probed_from_ids(ids[:1], 10**9) is None and headers.kept_under(ids, 10**9).tolist() == [-1, -1, -1]
    assert headers.kept_under(ids, None).tolist() == [0, -1, -1]


def _use_both_locks(out) -> None:
    image = synthetic_jpeg(np.random.default_rng(0), (16, 16))
    ids = headers.header_ids(probe_batch([image], None))
    SCANNED.remember_headers("x", (), np.arange(1), ids)
    out.put(int(ids[0]) >= 0)


def test_a_forked_worker_does_not_inherit_a_held_lock():
    """Another thread of the training process holds the memo's and the verdicts' locks while a
    stream worker is forked: the worker has locks of its own and does not hang."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    with SCANNED._lock, headers._IDS_LOCK:
        child = ctx.Process(target=_use_both_locks, args=(out,))
        child.start()
    child.join(20)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive and child.exitcode == 0 and out.get(timeout=5)
