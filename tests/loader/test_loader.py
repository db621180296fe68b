"""EncodedLoader end to end on local files and memory://: exactly-once, equal steps, resume."""
from __future__ import annotations

import pickle
import subprocess
import sys
import uuid

import pytest
import torch
from datagen import ids_of, write_dataset

from gpupipe.core.errors import ConfigError, PlanError, StorageError
from gpupipe.loader.encoded import EncodedLoader, StreamConfig

COUNTS = [23, 0, 41, 7, 30, 1]  # uneven, with an empty shard
N = sum(COUNTS)


@pytest.fixture(params=["file", "memory"])
def dataset_url(request, tmp_path):
    if request.param == "file":
        url = str(tmp_path / "ds")
    else:
        url = f"memory://gpupipe-test-{uuid.uuid4().hex}"
    write_dataset(url, COUNTS)
    yield url
    if request.param == "memory":
        import fsspec
        fsspec.filesystem("memory").rm(url.split("://")[1], recursive=True)


def epoch_ids(loader) -> list[int]:
    return [i for b in loader for i in ids_of(b)]


@pytest.mark.parametrize("workers", [0, 2])
def test_one_epoch_delivers_every_sample_once(dataset_url, workers):
    loader = EncodedLoader(dataset_url, batch_size=8, num_workers=workers, drop_last=False, rank=0, world_size=1,
                           stream=StreamConfig(shuffle_buffer=16))
    ids = epoch_ids(loader)
    assert sorted(ids) == list(range(N))
    assert len(loader) == loader.stats.batches == -(-N // 8)
    assert ids != sorted(ids)  # shuffled


def test_ranks_take_equal_steps_and_split_exactly(dataset_url):
    seen, steps = [], set()
    for rank in range(3):
        loader = EncodedLoader(dataset_url, batch_size=5, num_workers=0, rank=rank, world_size=3, drop_last=True)
        batches = list(loader)
        steps.add(len(batches))
        assert len(batches) == len(loader)
        seen += [i for b in batches for i in ids_of(b)]
    assert steps == {N // 15}
    assert len(seen) == len(set(seen)) == (N // 15) * 15


def test_epochs_reshuffle_and_are_reproducible(dataset_url):
    a = EncodedLoader(dataset_url, batch_size=4, num_workers=0, seed=3, rank=0, world_size=1)
    e0, e1 = epoch_ids(a), epoch_ids(a)  # the second pass is the next epoch
    assert e0 != e1
    b = EncodedLoader(dataset_url, batch_size=4, num_workers=0, seed=3, rank=0, world_size=1)
    b.set_epoch(1)
    assert epoch_ids(b) == e1


@pytest.mark.parametrize("stop_after,workers_after", [(1, 0), (5, 2), (11, 1)])
def test_resume_mid_epoch_delivers_exactly_the_rest(dataset_url, stop_after, workers_after):
    full = EncodedLoader(dataset_url, batch_size=4, num_workers=0, seed=1, rank=0, world_size=1)
    full.set_epoch(2)
    expected = sorted(epoch_ids(full))
    first = EncodedLoader(dataset_url, batch_size=4, num_workers=2, seed=1, rank=0, world_size=1)
    first.set_epoch(2)
    seen, state = read_then_save(first, stop_after)
    resumed = EncodedLoader(dataset_url, batch_size=4, num_workers=workers_after, seed=1, rank=0, world_size=1)
    resumed.load_state_dict(state)
    rest = epoch_ids(resumed)
    assert sorted(seen + rest) == expected
    assert len(seen) + len(rest) == len(expected)


def _peek(loader, batches: int) -> list[int]:
    """``for b in loader: ...; break`` after ``batches`` batches (Lightning's sanity check,
    ``limit_val_batches``)."""
    seen = []
    for n, b in enumerate(loader):
        seen += ids_of(b)
        if n + 1 == batches:
            break
    return seen


@pytest.mark.parametrize("workers", [0, 1])
def test_every_iter_starts_a_fresh_pass_over_the_current_epoch(dataset_url, workers):
    """torch's rule: a new ``for`` is a new pass. A pass broken off does not move the epoch and is
    not continued; the pass after it is the whole epoch, in the same order; a complete pass moves on."""
    reference = EncodedLoader(dataset_url, batch_size=4, num_workers=0, seed=5, rank=0, world_size=1)
    e0, e1 = epoch_ids(reference), epoch_ids(reference)
    loader = EncodedLoader(dataset_url, batch_size=4, num_workers=workers, seed=5, rank=0, world_size=1)
    assert _peek(loader, 3) == e0[:12]
    assert epoch_ids(loader) == e0  # the whole epoch, not the batches after the peek
    assert loader.epoch == 0
    assert epoch_ids(loader) == e1  # the complete pass moved the epoch on
    loader.set_epoch(0)
    assert _peek(loader, 1) == e0[:4] and _peek(loader, 1) == e0[:4]


def test_load_state_dict_continues_the_saved_pass_once(dataset_url):
    """Only ``load_state_dict`` continues a pass, and only for the next ``iter()``."""
    reference = EncodedLoader(dataset_url, batch_size=4, num_workers=0, seed=5, rank=0, world_size=1)
    e0, e1 = epoch_ids(reference), epoch_ids(reference)
    first = EncodedLoader(dataset_url, batch_size=4, num_workers=0, seed=5, rank=0, world_size=1)
    seen = _peek(first, 5)
    resumed = EncodedLoader(dataset_url, batch_size=4, num_workers=0, seed=5, rank=0, world_size=1)
    resumed.load_state_dict(first.state_dict())
    resumed.set_epoch(0)  # Lightning sets the epoch it resumes in: the saved position stays
    assert seen + _peek(resumed, 2) == e0[:28]  # continues at batch 6 ...
    assert epoch_ids(resumed) == e0  # ... once: the next iter() is a fresh pass over epoch 0
    again = EncodedLoader(dataset_url, batch_size=4, num_workers=0, seed=5, rank=0, world_size=1)
    again.load_state_dict(first.state_dict())
    assert seen + epoch_ids(again) == e0 and epoch_ids(again) == e1  # run to its end: epoch 1 next
    other = EncodedLoader(dataset_url, batch_size=4, num_workers=0, seed=5, rank=0, world_size=1)
    other.load_state_dict(first.state_dict())
    other.set_epoch(1)  # another epoch: the saved position is dropped
    assert epoch_ids(other) == e1


def test_more_workers_than_cores_is_warned_once_naming_the_default(tmp_path, monkeypatch, caplog):
    """num_workers=4 on 2 cores ran 18x slower than 0, without a word."""
    import os

    from gpupipe.core import machine
    from gpupipe.loader.gpu import GpuLoader

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(machine, "_WARNED", set(), raising=False)
    url = str(tmp_path / "ds")
    write_dataset(url, [8])
    with caplog.at_level("WARNING", logger="gpupipe"):
        EncodedLoader(url, batch_size=4, num_workers=2, rank=0, world_size=1)  # as many as the cores: no warning
        EncodedLoader(url, batch_size=4, num_workers=4, rank=0, world_size=1)
        EncodedLoader(url, batch_size=4, num_workers=4, rank=0, world_size=1)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert "num_workers=4" in lines[0] and "2 cores" in lines[0] and "the default picks 1" in lines[0], lines[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="gpupipe"):  # decoding on the CPU: the default is 0, and says why
        GpuLoader(url, batch_size=4, image_size=8, decode="pil", device="cpu", num_workers=3, rank=0, world_size=1)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "num_workers=3" in line and "the default picks 0" in line and "decod" in line, line


def test_resume_with_another_seed_mid_epoch_fails_clearly(dataset_url):
    """Another world size or batch size resumes (tests/loader/test_elastic.py); another seed
    would put other samples at the positions already delivered."""
    a = EncodedLoader(dataset_url, batch_size=4, num_workers=0, rank=0, world_size=2, seed=1)
    next(iter(a))
    b = EncodedLoader(dataset_url, batch_size=4, num_workers=0, rank=0, world_size=3, seed=2)
    with pytest.raises(PlanError, match="seed: saved 1, now 2"):
        b.load_state_dict(a.state_dict())


def test_padding_keeps_shapes_and_marks_invalid(dataset_url):
    padded, valid = 0, []
    for rank in range(4):
        loader = EncodedLoader(dataset_url, batch_size=16, num_workers=0, rank=rank, world_size=4, drop_last=False)
        batches = list(loader)
        assert all(len(b) == 16 for b in batches)
        assert len(batches) == -(-N // 64)
        padded += sum(int((~b.valid).sum()) for b in batches)
        valid += [i for b in batches for i in ids_of(b)]
    assert padded == 4 * 16 * len(batches) - N
    assert sorted(valid) == list(range(N))


def test_dataset_pickles_as_plain_data(dataset_url):
    loader = EncodedLoader(dataset_url, batch_size=4, num_workers=0, storage_options={}, rank=0, world_size=1)
    ds = pickle.loads(pickle.dumps(loader._dataset()))
    assert sum(len(b) for b in ds) == (N // 4) * 4


def test_spawned_workers_build_their_own_filesystem(tmp_path):
    url = str(tmp_path / "ds")
    write_dataset(url, [10, 10])
    code = (
        "import torch.multiprocessing as mp, sys\n"
        "from gpupipe.loader.encoded import EncodedLoader\n"
        "from torch.utils.data import DataLoader\n"
        f"L = EncodedLoader({url!r}, batch_size=5, num_workers=2, rank=0, world_size=1)\n"
        "dl = DataLoader(L._dataset(), batch_size=None, num_workers=2, multiprocessing_context='spawn')\n"
        "print(sum(len(b) for b in dl))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "20"


def test_too_small_for_one_step_per_rank(tmp_path):
    url = str(tmp_path / "ds")
    write_dataset(url, [3])
    with pytest.raises(ConfigError, match="drop_last=False or a smaller batch_size"):
        EncodedLoader(url, batch_size=4, rank=0, world_size=1)


def test_missing_folder_names_the_url(tmp_path):
    with pytest.raises(StorageError, match="nowhere"):
        EncodedLoader(str(tmp_path / "nowhere") + "/", batch_size=4, rank=0, world_size=1)


def test_without_manifest_streams_whole_shards_with_a_warning(tmp_path, caplog):
    url = str(tmp_path / "ds")
    write_dataset(url, [6, 9, 5], manifest=False)
    loader = EncodedLoader(url + "/part-{0000..0002}.tar", batch_size=4, num_workers=0, drop_last=False, rank=0, world_size=1)
    assert "no index.json" in caplog.text
    assert sorted(i for b in loader for i in ids_of(b, with_manifest=False)) == list(range(20))
    with pytest.raises(TypeError, match="gpupipe index"):
        len(loader)


def test_import_gpupipe_stays_light():
    code = "import sys, gpupipe; print(sorted(m for m in ('torch','nvidia.dali','lightning','kornia','s3fs') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


class _ForeignFinalizer:
    """Records (in a file) a finalizer run by a process other than its creator."""

    def __init__(self, marker):
        self.pid, self.marker, self.me = __import__("os").getpid(), marker, self  # a reference cycle

    def __del__(self):
        import os
        if os.getpid() != self.pid:
            open(self.marker, "a").write(f"{os.getpid()}\n")


def test_forked_workers_never_finalize_the_parents_garbage(tmp_path, monkeypatch):
    """A worker's garbage collector must not run destructors of objects the training
    process left in reference cycles (a DALI pipeline's destructor deadlocks there)."""
    import gc

    from gpupipe.loader.encoded import EncodedDataset

    class Collecting(EncodedDataset):
        def __iter__(self):
            gc.collect()  # what an allocation-triggered collection in the worker would do
            yield from super().__iter__()

    url = str(tmp_path / "ds")
    write_dataset(url, [12])
    loader = EncodedLoader(url, batch_size=4, num_workers=1, rank=0, world_size=1)
    monkeypatch.setattr(loader, "_dataset", lambda: Collecting(loader.source, loader.spec, loader.stream,
                                                               loader.world, loader.epoch, None))
    marker = tmp_path / "finalized-in-child"
    gc.disable()
    try:
        _ForeignFinalizer(str(marker))  # cyclic garbage, not yet collected
        assert sum(len(b) for b in loader) == 12
    finally:
        gc.enable()
        gc.collect()
    assert not marker.exists(), marker.read_text()


def test_empty_image_member_is_named_and_its_slot_is_a_genuine_pair(tmp_path):
    """A sample whose .jpg member has 0 bytes: under ``raise`` the error says it is empty;
    under ``skip`` its slot carries a real image with that image's label (not -1)."""
    import numpy as np

    from gpupipe.core.errors import ShardFormatError
    from gpupipe.loader.gpu import GpuLoader
    from gpupipe.tools.synth import synthetic_jpeg

    url = str(tmp_path / "ds")
    write_dataset(url, [8], image=lambda i: b"" if i == 3 else synthetic_jpeg(np.random.default_rng(i), (24, 24)))
    strict = GpuLoader(url, batch_size=8, image_size=8, decode="pil", num_workers=0, shuffle=False, device="cpu")
    with pytest.raises(ShardFormatError, match=r"'k0000003': image member \.jpg is empty"):
        list(strict)
    lenient = GpuLoader(url, batch_size=8, image_size=8, decode="pil", num_workers=0, shuffle=False, device="cpu",
                        on_error="skip")
    (batch,) = list(lenient)
    ids, labels = batch.sample_ids.tolist(), batch.labels.tolist()
    slot = ids.index(3)
    assert not batch.valid[slot] and labels[slot] != -1
    source = next(i for i in range(8) if i != slot and bool(batch.valid[i]) and
                  torch.equal(batch.images[i], batch.images[slot]))
    assert labels[slot] == labels[source] == ids[source] % 10
    assert lenient.stats.skipped == 1


@pytest.mark.parametrize("bad", [b"", b"\xff\xd8\xff\xe0 not a jpeg"])
def test_padding_repeat_of_a_bad_sample_is_counted_once(tmp_path, bad):
    """End-of-epoch padding (on ranks: one process has none) repeats sample 0 on rank 0 of two
    when 3 samples make a batch of 4 on each; when it is bad (empty member: the stream's skip;
    corrupt: the decoder's) ``stats.skipped`` counts it once, not twice."""
    import numpy as np

    from gpupipe.loader.gpu import GpuLoader
    from gpupipe.tools.synth import synthetic_jpeg

    url = str(tmp_path / "ds")
    write_dataset(url, [3], image=lambda i: bad if i == 0 else synthetic_jpeg(np.random.default_rng(i), (24, 24)))
    loader = GpuLoader(url, batch_size=4, image_size=8, decode="pil", num_workers=0, shuffle=False, drop_last=False,
                       device="cpu", on_error="skip", rank=0, world_size=2)
    batches = list(loader)
    assert [b.sample_ids.tolist() for b in batches] == [[0, 1, 2, 0]]  # rank 0 holds 0 and 1; 2 and 0 repeated
    assert [b.valid.tolist() for b in batches] == [[False, True, False, False]]  # 0 bad, then padding
    assert loader.stats.skipped == 1


def read_then_save(loader, batches: int) -> tuple[list[int], dict]:
    """The ids of ``loader``'s first ``batches`` batches, and its state then (through pickle, as a
    checkpoint keeps it)."""
    seen = []
    for n, b in enumerate(loader):
        seen += ids_of(b)
        if n + 1 == batches:
            break
    return seen, pickle.loads(pickle.dumps(loader.state_dict()))
