"""Evaluation as torch has it (issue 35): one process without ``drop_last`` ends a pass with a
short batch of the samples left, not a full batch padded with repeats. Padding (repeats marked
invalid) stays only where ranks need equal steps."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from datagen import ids_of, write_dataset
from test_loader import read_then_save

import gpupipe.transforms as T
from gpupipe import GpuLoader
from gpupipe.loader.encoded import EncodedLoader
from gpupipe.tools.synth import synthetic_jpeg

HAS_DALI = importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None
BACKENDS = [pytest.param("dali", marks=[pytest.mark.dali, pytest.mark.skipif(not HAS_DALI, reason="no DALI")]), "pil"]


@pytest.fixture(scope="module")
def val_folder(tmp_path_factory) -> str:
    """The user's case: a val folder of 30 images, ``<class>/img<i>.jpg``, three classes."""
    root = tmp_path_factory.mktemp("short") / "val"
    rng = np.random.default_rng(0)
    for i in range(30):
        (root / f"c{i % 3}").mkdir(parents=True, exist_ok=True)
        (root / f"c{i % 3}" / f"img{i:03d}.jpg").write_bytes(synthetic_jpeg(rng, (20, 16)))
    return str(root)


@pytest.fixture(scope="module")
def shards70(tmp_path_factory) -> str:
    """70 samples in uneven shards; image bytes encode the sample id (``datagen.ids_of`` checks them)."""
    url = str(tmp_path_factory.mktemp("short") / "ds")
    write_dataset(url, [25, 0, 31, 14])
    return url


def encoded(url: str, **kw) -> EncodedLoader:
    kw = {"batch_size": 32, "drop_last": False, "rank": 0, "world_size": 1, "num_workers": 0, **kw}
    return EncodedLoader(url, **kw)


def test_a_folder_of_30_images_at_batch_32_is_one_batch_of_30(val_folder):
    loader = encoded(val_folder)
    batches = list(loader)
    assert len(loader) == len(batches) == 1
    (batch,) = batches
    assert len(batch) == 30 and batch.valid.tolist() == [True] * 30
    assert sorted(batch.sample_ids.tolist()) == list(range(30))


@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_loader_gives_the_folder_as_one_batch_of_30_distinct_images(val_folder, backend):
    """The tuple form the user wrote (``for images, labels in loader``), through decode and a
    batch-shaped augment pipeline."""
    loader = GpuLoader(val_folder, batch_size=32, image_size=(16, 16), decode=backend, device="cpu", num_workers=0,
                       drop_last=False, rank=0, world_size=1,
                       augment=T.Compose([T.RandomHorizontalFlip(), T.ToDtype(torch.float32), T.Normalize([0.5] * 3, [0.25] * 3)]))
    assert len(loader) == 1
    shapes = [(tuple(images.shape), tuple(labels.shape)) for images, labels in loader]
    assert shapes == [((30, 3, 16, 16), (30,))]
    (batch,) = list(loader)  # the next epoch, looked at whole
    assert batch.valid.tolist() == [True] * 30 and sorted(batch.sample_ids.tolist()) == list(range(30))
    assert sorted(batch.labels.tolist()) == sorted(i % 3 for i in range(30))  # classes by folder, sorted order


@pytest.mark.parametrize("workers", [0, 2])
def test_70_samples_at_batch_32_give_32_32_6_each_once(shards70, workers):
    loader = encoded(shards70, num_workers=workers)
    batches = list(loader)
    assert [len(b) for b in batches] == [32, 32, 6] and len(loader) == 3
    assert all(b.valid.all() for b in batches)
    ids = [i for b in batches for i in ids_of(b)]
    assert sorted(ids) == list(range(70)) and ids != sorted(ids)  # each once, shuffled


@pytest.mark.parametrize("stop_after", [1, 2])
def test_a_mid_epoch_resume_delivers_the_rest_with_the_short_batch_last(shards70, stop_after):
    first = encoded(shards70, num_workers=2, seed=3)
    seen, state = read_then_save(first, stop_after)
    resumed = encoded(shards70, num_workers=2, seed=3)
    resumed.load_state_dict(state)
    assert len(resumed) == 3
    rest = list(resumed)
    assert [len(b) for b in rest] == [32, 32, 6][stop_after:]
    assert sorted(seen + [i for b in rest for i in ids_of(b)]) == list(range(70))


def test_two_ranks_still_pad_to_equal_steps_with_repeats_marked_invalid(shards70):
    ranks = [list(encoded(shards70, rank=r, world_size=2)) for r in range(2)]
    assert [[len(b) for b in batches] for batches in ranks] == [[32, 32], [32, 32]]
    assert [len(encoded(shards70, rank=r, world_size=2)) for r in range(2)] == [2, 2]
    valid = [sum(int(b.valid.sum()) for b in batches) for batches in ranks]
    assert valid == [35, 35]  # 29 padding positions each, marked invalid
    ids = [i for batches in ranks for b in batches for i in ids_of(b)]
    assert sorted(ids) == list(range(70))


def _bad_last(bad: bytes):
    """Sample 68 (in the last, short batch when not shuffled) replaced by ``bad``."""
    rng = np.random.default_rng(1)
    return lambda i: bad if i == 68 else synthetic_jpeg(rng, (16, 16))


@pytest.mark.parametrize("bad", [b"", b"\xff\xd8\xff\xe0 not a jpeg"])
def test_a_bad_sample_in_the_short_batch_is_replaced_and_the_batch_stays_short(tmp_path, bad):
    """``on_error: skip``: an empty member (the stream's skip) or a corrupt image (the decoder's)
    is replaced, masked and counted once; the last batch keeps its 6 samples."""
    url = str(tmp_path / "ds")
    write_dataset(url, [40, 30], image=_bad_last(bad))
    loader = GpuLoader(url, batch_size=32, image_size=8, decode="pil", device="cpu", num_workers=0, shuffle=False,
                       drop_last=False, on_error="skip", rank=0, world_size=1)
    batches = list(loader)
    assert [len(b) for b in batches] == [32, 32, 6]
    last = batches[-1]
    assert last.images.shape[0] == 6 and last.sample_ids.tolist() == list(range(64, 70))
    assert last.valid.tolist() == [True] * 4 + [False, True]
    assert loader.stats.skipped == 1


def test_a_folder_of_30_in_the_dict_form_has_30_rows(val_folder):
    """``batch_format: dict`` (the DataModule's) is built from the same batch: 30 rows everywhere."""
    from gpupipe.lightning import _as_dict

    loader = GpuLoader(val_folder, batch_size=32, image_size=(16, 16), decode="pil", device="cpu", num_workers=0,
                       drop_last=False, rank=0, world_size=1)
    (out,) = [_as_dict(b) for b in loader]
    assert {k: len(out[k]) for k in ("images", "labels", "valid", "sample_ids")} == dict.fromkeys(
        ("images", "labels", "valid", "sample_ids"), 30)

