"""GpuLoader on the CPU path (real DALI CPU decoders and Pillow): batches, resume, bad data."""
from __future__ import annotations

import importlib.util
import threading
import time

import numpy as np
import pytest
import torch

from gpupipe import GpuLoader
from gpupipe.core.errors import ConfigError, DecodeError, StorageError
from gpupipe.formats.writer import ShardSink
from gpupipe.tools.synth import synthetic_jpeg

HAS_DALI = importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None
BACKENDS = [pytest.param("dali", marks=[pytest.mark.dali, pytest.mark.skipif(not HAS_DALI, reason="no DALI")]), "pil"]
N = 60


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """60 small real JPEGs (label = id % 7) in 4 shards; sample 13 is corrupt (cut in half)."""
    root = tmp_path_factory.mktemp("gpu") / "ds"
    rng = np.random.default_rng(0)
    with ShardSink(str(root), shard_size=16) as sink:
        for i in range(N):
            data = synthetic_jpeg(rng, (40 + i % 3, 30))
            if i == 13:
                data = data[: len(data) // 2]
            sink.write(f"s{i:04d}", {"jpg": data, "cls": str(i % 7).encode()})
    return str(root)


def make(shards, backend, **kw):
    kw.setdefault("on_error", "skip")
    return GpuLoader(shards, batch_size=8, image_size=(24, 32), decode=backend, device="cpu", num_workers=1,
                     rank=0, world_size=1, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_batches_are_uint8_nchw_channels_last_with_labels(shards, backend):
    loader = make(shards, backend, drop_last=False)
    seen = []
    for images, labels in loader:
        assert images.shape[1:] == (3, 24, 32) and images.dtype == torch.uint8
        assert images.is_contiguous(memory_format=torch.channels_last)
        seen.append(labels)
    assert len(seen) == len(loader) == -(-N // 8)
    assert loader.stats.batches == len(loader) and loader.stats.decode_s > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_corrupt_image_is_skipped_counted_and_masked(shards, backend):
    loader = make(shards, backend, drop_last=False, shuffle=False)
    masks = {}
    for batch in loader:
        for i, (sid, ok, label) in enumerate(zip(batch.sample_ids.tolist(), batch.valid.tolist(),
                                                 batch.labels.tolist())):
            masks[sid] = masks.get(sid, False) or ok  # padding repeats samples as invalid
            if sid == 13:  # replaced: another sample's pixels, with that sample's label
                twin = next(j for j in range(len(batch)) if j != i and torch.equal(batch.images[j], batch.images[i]))
                assert label == batch.sample_ids[twin] % 7 == batch.labels[twin]
            else:
                assert label == sid % 7
    assert [s for s, ok in masks.items() if not ok] == [13]
    assert loader.decoder.stats.skipped == 1 and "s0013" in loader.decoder.stats.skipped_keys


@pytest.mark.parametrize("backend", BACKENDS)
def test_on_error_raise_names_the_sample(shards, backend):
    loader = make(shards, backend, on_error="raise", shuffle=False)
    with pytest.raises(DecodeError, match="s0013"):
        list(loader)


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_counts_delivered_batches_not_decoded_ahead(shards, backend):
    full = make(shards, backend, seed=4, prefetch=3)
    expected = sorted(i for b in full for i in b.sample_ids.tolist())
    first = make(shards, backend, seed=4, prefetch=3)
    got = []
    for n, b in enumerate(first):
        got += b.sample_ids.tolist()
        if n == 2:
            break  # the producer has decoded further ahead by now
    resumed = make(shards, backend, seed=4)
    resumed.load_state_dict(first.state_dict())
    got += [i for b in resumed for i in b.sample_ids.tolist()]
    assert sorted(got) == expected


def test_every_iter_starts_a_fresh_pass_and_only_a_loaded_state_continues_one(shards):
    loader = make(shards, "pil", seed=4, prefetch=3)
    e0 = [b.sample_ids.tolist() for b in loader]
    e1 = [b.sample_ids.tolist() for b in loader]
    loader.set_epoch(0)
    for n, _ in enumerate(loader):
        if n == 2:
            state = loader.state_dict()
            break  # decoded ahead further than that by now
    assert [b.sample_ids.tolist() for b in loader] == e0  # the whole epoch again, not its rest
    resumed = make(shards, "pil", seed=4)
    resumed.load_state_dict(state)
    assert [b.sample_ids.tolist() for b in resumed] == e0[3:]
    assert [b.sample_ids.tolist() for b in resumed] == e1


def test_a_pass_with_a_worker_ends_when_its_batches_do(shards):
    """No fixed cost per pass: after the last batch (or a ``break``) the worker process ends at
    once, not after a poll or join timeout (it was 5 s per pass: torch's status interval)."""
    loader = make(shards, "pil")  # one worker
    for _ in range(2):
        last = time.monotonic()
        for _ in loader:
            last = time.monotonic()
        assert time.monotonic() - last < 2.0
    it = iter(loader)
    next(it)
    t0 = time.monotonic()
    it.close()  # what a break does
    assert time.monotonic() - t0 < 2.0


def test_same_seed_same_pixels_and_epochs_differ(shards):
    a = [b.images.clone() for b in make(shards, "pil", seed=1, resize="random_resized_crop")]
    b = [b.images.clone() for b in make(shards, "pil", seed=1, resize="random_resized_crop")]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    loader = make(shards, "pil", seed=1, resize="random_resized_crop")
    list(loader)
    second = [b.images.clone() for b in loader]  # the next epoch
    assert not all(torch.equal(x, y) for x, y in zip(a, second))


def test_augment_callable_runs_in_its_own_stage_thread(shards):
    def to_float(images, batch):
        assert threading.current_thread().name == "gpupipe-augment"
        return images.float() / 255

    for images, _ in make(shards, "pil", augment=to_float):
        assert images.dtype == torch.float32 and float(images.max()) <= 1.0


def test_storage_error_in_workers_reaches_the_training_loop(shards, tmp_path):
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(shards, copy)
    loader = make(str(copy), "pil", on_error="raise")
    (copy / "shard-000002.tar").unlink()
    with pytest.raises(StorageError, match="shard-000002"):
        list(loader)


def test_breaking_early_leaves_no_stage_thread(shards):
    loader = make(shards, "pil", augment=lambda images: images.float())
    for _ in loader:
        break
    assert not [t for t in threading.enumerate() if t.name in ("gpupipe-decode", "gpupipe-augment") and t.is_alive()]


def test_unknown_keys_and_bad_values_raise_naming_them(shards):
    from gpupipe.config.schema import load_config

    loader = GpuLoader(load_config({"source": shards, "decode": {"image_size": [16, 16], "backend": "pil"},
                                    "loader": {"batch_size": 8, "device": "cpu", "num_workers": 0},
                                    "stream": {"shuffle_buffer": 16}}).split("train"))
    assert len(loader) == N // 8
    with pytest.raises(ConfigError, match="loader.batchsize"):
        load_config({"source": shards, "loader": {"batchsize": 8}})
    with pytest.raises(ConfigError, match="shuffle_bufer"):
        load_config({"source": shards, "stream": {"shuffle_bufer": 3}})
    with pytest.raises(TypeError, match="batchsize"):
        GpuLoader(shards, batchsize=8)
    with pytest.raises(ConfigError, match="loader.batch_size: must be >= 1"):  # the keyword form, same message
        GpuLoader(shards, batch_size=0)


def test_bad_decode_settings_raise_config_errors(shards):
    with pytest.raises(ConfigError, match="backend"):
        make(shards, "turbojpeg")
    with pytest.raises(ConfigError, match="on_error"):
        make(shards, "pil", on_error="ignore")
    with pytest.raises(ConfigError, match="nvjpeg"):
        _ = make(shards, "nvjpeg").decoder


def test_transforms_pipeline_gets_the_batch_key_and_resumes_identically(shards):
    import gpupipe.transforms as T

    def pipeline():
        return T.Compose([T.RandomAffine(20), T.RandomHorizontalFlip(), T.ToDtype(torch.float32),
                          T.ColorJitter(0.2, 0.2, 0.2, 0.1), T.Normalize([0.5] * 3, [0.25] * 3)])

    full = {int(i): img for b in make(shards, "pil", seed=2, augment=pipeline())
            for i, img in zip(b.sample_ids, b.images)}
    first = make(shards, "pil", seed=2, augment=pipeline())
    for n, b in enumerate(first):
        assert b.images.dtype == torch.float32
        if n == 1:
            break
    resumed = make(shards, "pil", seed=2, augment=pipeline())
    resumed.load_state_dict(first.state_dict())
    for b in resumed:  # the same samples get the very same augmentation after a resume
        for i, img in zip(b.sample_ids.tolist(), b.images):
            assert torch.equal(img, full[i])


def test_decode_of_the_next_batch_overlaps_the_augment_of_this_one(shards):
    """The stages overlap: some decode span starts before the augment span of the batch
    before it ends (one thread each; the timeline records both)."""
    def slow(images):
        time.sleep(0.05)  # an augmentation the decoder must not wait for
        return images.float()

    loader = make(shards, "pil", augment=slow, prefetch=2)
    loader.timeline = []
    assert sum(1 for _ in loader) >= 3
    decode = [(a, b) for name, a, b in loader.timeline if name == "decode"]
    augment = [(a, b) for name, a, b in loader.timeline if name == "augment"]
    assert len(decode) == len(augment) >= 3
    overlapped = sum(decode[i + 1][0] < augment[i][1] for i in range(len(augment) - 1))
    assert overlapped >= len(augment) // 2, (decode, augment)
    assert loader.stats.augment_s >= 0.05 * len(augment) * 0.9


def test_a_list_of_transforms_is_composed_and_a_wrong_list_named(shards):
    """``augment=[T.X(), T.Y()]`` runs as ``T.Compose([...])`` would; anything not a gpupipe
    transform in it is refused when the loader is made, not as 'list is not callable' in the
    first batch."""
    import gpupipe.transforms as T

    steps = [T.RandomHorizontalFlip(p=0.5), T.ToDtype(torch.float32, scale=True)]
    listed = next(iter(make(shards, "pil", augment=steps, seed=4)))
    composed = next(iter(make(shards, "pil", augment=T.Compose(steps), seed=4)))
    assert listed.images.dtype == torch.float32 and torch.equal(listed.images, composed.images)
    with pytest.raises(ConfigError, match=r"augment: transforms\[1\] should be a gpupipe Transform \(got function\)"
                                          r".*from_torchvision"):
        make(shards, "pil", augment=[T.RandomHorizontalFlip(), lambda x: x])
    with pytest.raises(ConfigError, match="augment: expected a transform, a list of transforms"):
        make(shards, "pil", augment=42)


def test_stage_times_are_current_while_a_pass_is_open(shards):
    """Read mid-pass, with the pass never closed (as the bench's compare mode once did on a GPU,
    where they read 0.000): the stage times already count the batches delivered."""
    loader = make(shards, "pil")
    it = iter(loader)
    next(it), next(it)
    assert loader.stats.images == 16 and loader.stats.decode_s > 0 and loader.stats.wait_bytes_s > 0
    before = loader.stats.decode_s
    it.close()
    assert before <= loader.stats.decode_s < 2 * before + 1.0  # closing adds what the stages did since, once
