"""Issue 34: a worker's unit of work is ``stream.unit_batches`` batches of a shuffle window, not the
window. The loader delivers the very batches, in the very order, that whole windows gave (the plan's
order: tests/plan/test_plan_units.py checks it for every plan), for any unit size and worker
count, also when resumed mid-unit under another unit size; a unit's tar spans are scanned in one
call, and bad data in a unit follows ``on_error`` as before."""
from __future__ import annotations

import pytest
from datagen import ids_of, write_dataset

from gpupipe.core.errors import ConfigError, ShardFormatError
from gpupipe.formats.manifest import MANIFEST_NAME, Manifest
from gpupipe.loader.encoded import EncodedLoader, StreamConfig
from gpupipe.plan import chunk_sample_ids, rank_chunks
from gpupipe.plan_units import rank_units
from gpupipe.stream import chunks

COUNTS = [23, 0, 41, 7, 30, 1, 19]  # 121 samples, uneven, one shard empty
WINDOW, BATCH = 16, 4  # chunks of 4 batches


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("units") / "ds")
    write_dataset(path, COUNTS)
    return path


def loader(url: str, unit_batches: int, workers: int = 0, rank: int = 1, world: int = 2, **kw) -> EncodedLoader:
    return EncodedLoader(url, batch_size=BATCH, num_workers=workers, seed=5, rank=rank, world_size=world, drop_last=False,
                         stream=StreamConfig(shuffle_buffer=WINDOW, unit_batches=unit_batches), **kw)


def rows(batches) -> list[tuple[int, int, list[int], list[int], list[bool]]]:
    return [(b.chunk, b.batch, ids_of(b), b.sample_ids.tolist(), b.valid.tolist()) for b in batches]


def whole_windows(ld: EncodedLoader) -> list[tuple[list[int], list[bool]]]:
    """The batches as whole windows read them before units (the plan's chunk order)."""
    out = []
    for c in rank_chunks(ld.spec, ld.world.rank):
        ids, valid = chunk_sample_ids(ld.spec, ld.epoch, c)
        out += [(ids[i:i + BATCH].tolist(), valid[i:i + BATCH].tolist()) for i in range(0, len(ids), BATCH)]
    return out


@pytest.mark.parametrize("unit_batches, workers", [(1, 0), (1, 2), (2, 2), (3, 0), (3, 3), (99, 2)])
def test_the_batches_do_not_depend_on_the_unit_size_or_the_worker_count(url, unit_batches, workers):
    ld = loader(url, unit_batches, workers)
    got = rows(ld)
    assert [(ids, valid) for _, _, _, ids, valid in got] == whole_windows(ld)
    assert got == rows(loader(url, 4, 0))  # a unit as large as the window: the window whole, as before


def test_a_resume_inside_a_unit_under_another_unit_size_and_worker_count(url):
    full = rows(loader(url, 1))
    first = loader(url, 3, workers=2)
    head = []
    for b in first:
        head += rows([b])
        if len(head) == 6:  # chunk 1, batch 1: inside the unit of batches 0-2
            break
    state = first.state_dict()
    second = loader(url, 2, workers=3)
    second.load_state_dict(state)
    assert head + rows(second) == full


def test_a_unit_is_scanned_in_one_call(url, monkeypatch):
    calls = []
    real = chunks.scan_span
    monkeypatch.setattr(chunks, "scan_span", lambda *a, **k: calls.append(len(a[1]) - 1) or real(*a, **k))
    ld = loader(url, 2)
    batches = list(ld)
    assert len(calls) == len(rank_units(ld.spec, 1, None, 2)) == 8  # 4 chunks of 4 batches, units of 2
    assert sum(calls) == len(batches) * BATCH


def test_bad_data_in_a_unit_follows_on_error(tmp_path):
    path = tmp_path / "ds"
    write_dataset(str(path), [40, 40])
    entry = Manifest.from_json((path / MANIFEST_NAME).read_text()).shards[1]
    shard = path / entry.name
    data = bytearray(shard.read_bytes())
    data[int(entry.offsets[5]) + 148] ^= 0x11  # the header checksum of the shard's sixth sample
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardFormatError, match="part-0001.tar"):
        list(loader(str(path), 1, rank=0, world=1))
    ld = loader(str(path), 1, rank=0, world=1, on_error="skip")
    got = rows(ld)
    assert ld.stats.skipped == 1
    delivered = [i for _, _, ids, _, _ in got for i in ids]
    assert 45 not in delivered and len(delivered) == len(set(delivered))
    # the placeholder keeps its place: the batches are those of the window, sample 45 not valid
    assert [ids for _, _, _, ids, _ in got] == [ids for ids, _ in whole_windows(ld)]


def test_a_damaged_header_costs_its_own_sample_only(tmp_path):
    """A tar header damaged on disk hides where the next member starts; the samples after it in
    the same byte range are read from their own offsets in the manifest, not lost with it (not
    shuffled, a whole window reads the shard as one range)."""
    path = tmp_path / "ds"
    write_dataset(str(path), [40])
    entry = Manifest.from_json((path / MANIFEST_NAME).read_text()).shards[0]
    data = bytearray((path / entry.name).read_bytes())
    data[int(entry.offsets[5]) + 148] ^= 0x11  # the header checksum of the sixth sample
    (path / entry.name).write_bytes(bytes(data))
    ld = EncodedLoader(str(path), batch_size=BATCH, seed=5, drop_last=False, on_error="skip",
                       stream=StreamConfig(shuffle=False, shuffle_buffer=40, unit_batches=99))
    delivered = [i for _, _, ids, _, _ in rows(ld) for i in ids]
    assert ld.stats.skipped == 1 and sorted(delivered) == [i for i in range(40) if i != 5]


def test_unit_batches_below_one_is_refused():
    with pytest.raises(ConfigError, match="stream.unit_batches: must be >= 1, got 0"):
        StreamConfig(unit_batches=0)
