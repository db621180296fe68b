"""The loader says, once, when its shuffle leaves batches of one or two classes (issue 35): shards
written in class order and a shuffle window smaller than a class's run of samples. The same samples
written in a shuffled order give no warning and batches like a uniform shuffle's.

The class-ordered case needs a window of consecutive samples: shards whole (``shuffle_block=0``,
the default on object storage without ``fetch.cache_dir``). With the default blocks on local
shards the same data mixes, and nothing warns."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from gpupipe import GpuLoader
from gpupipe.formats.writer import ShardSink
from gpupipe.loader.encoded import EncodedLoader
from gpupipe.tools.synth import synthetic_jpeg

CLASSES, PER_CLASS, BATCH, WINDOW = 10, 64, 32, 64  # 20 batches an epoch; a window of 2 batches


def write(root: str, order: np.ndarray, image=lambda i: b"\xff\xd8\xff" + int(i).to_bytes(4, "big")) -> str:
    """Samples ``order`` (ids; class = id // PER_CLASS) in that order, a class's worth to a shard."""
    with ShardSink(root, shard_size=PER_CLASS, classes=tuple(f"c{c}" for c in range(CLASSES))) as sink:
        for i in order:
            sink.write(f"k{int(i):05d}", {"jpg": image(i), "cls": str(int(i) // PER_CLASS).encode()})
    return root


@pytest.fixture(scope="module")
def sorted_shards(tmp_path_factory) -> str:
    return write(str(tmp_path_factory.mktemp("mix") / "sorted"), np.arange(CLASSES * PER_CLASS))


@pytest.fixture(scope="module")
def shuffled_shards(tmp_path_factory) -> str:
    order = np.random.default_rng(0).permutation(CLASSES * PER_CLASS)
    return write(str(tmp_path_factory.mktemp("mix") / "shuffled"), order)


def mixing_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gpupipe.loader.mixing"]


def loader(url: str, **kw) -> EncodedLoader:
    kw = {"batch_size": BATCH, "shuffle_buffer": WINDOW, "shuffle_block": 0, "num_workers": 0, "rank": 0,
          "world_size": 1, **kw}
    return EncodedLoader(url, **kw)


def test_class_ordered_shards_warn_once_per_loader(sorted_shards, caplog):
    one = loader(sorted_shards)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):  # three epochs
            assert sum(1 for _ in one) == 20
    (message,) = mixing_warnings(caplog)
    assert sorted_shards in message and "set stream.shuffle_block to a few samples" in message
    m = one.mixing.result
    assert m.batches == 20 and m.top_share > 0.8 and m.top_share > 2 * m.uniform_top_share
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        list(loader(sorted_shards))  # another loader says it again
    assert len(mixing_warnings(caplog)) == 1


@pytest.mark.parametrize("seed", range(5))
def test_the_same_samples_shuffled_at_rest_never_warn(shuffled_shards, caplog, seed):
    one = loader(shuffled_shards, seed=seed)
    with caplog.at_level(logging.WARNING):
        assert sum(1 for _ in one) == 20
    assert not mixing_warnings(caplog)
    m = one.mixing.result
    assert m.labels == CLASSES and abs(m.top_share - m.uniform_top_share) < 0.05


def test_a_window_that_covers_the_classes_does_not_warn(sorted_shards, caplog):
    one = loader(sorted_shards, shuffle_buffer=CLASSES * PER_CLASS)  # what the warning tells the user to do
    with caplog.at_level(logging.WARNING):
        list(one)
    assert not mixing_warnings(caplog) and one.mixing.result.batches == 20


def test_no_check_without_shuffle_and_with_workers_the_same_verdict(sorted_shards, caplog):
    with caplog.at_level(logging.WARNING):
        plain = loader(sorted_shards, shuffle=False)
        list(plain)
        assert plain.mixing is None and not mixing_warnings(caplog)
        two = loader(sorted_shards, num_workers=2)
        list(two)
    assert len(mixing_warnings(caplog)) == 1 and two.mixing.warned


def test_only_rank_0_checks(sorted_shards, caplog):
    with caplog.at_level(logging.WARNING):
        for rank in range(2):
            list(loader(sorted_shards, rank=rank, world_size=2))
    assert len(mixing_warnings(caplog)) == 1


def test_gpu_loader_warns_too(tmp_path, caplog):
    rng = np.random.default_rng(0)
    images = {i: synthetic_jpeg(rng, (16, 16)) for i in range(CLASSES * PER_CLASS)}
    url = write(str(tmp_path / "sorted"), np.arange(CLASSES * PER_CLASS), image=images.__getitem__)
    gpu = GpuLoader(url, batch_size=BATCH, shuffle_buffer=WINDOW, shuffle_block=0, image_size=(8, 8), decode="pil",
                    device="cpu", num_workers=0, rank=0, world_size=1)
    with caplog.at_level(logging.WARNING):
        for _ in gpu:
            pass
    assert len(mixing_warnings(caplog)) == 1


def test_class_ordered_shards_mix_with_the_default_blocks(sorted_shards, caplog):
    """The default ``shuffle_block`` on local shards (blocks of 4, spread over each window): the
    class-ordered shards give batches near a uniform shuffle's, and nothing warns."""
    one = loader(sorted_shards, shuffle_block=None)
    with caplog.at_level(logging.WARNING):
        assert sum(1 for _ in one) == 20
    assert not mixing_warnings(caplog)
    m = one.mixing.result
    assert one.spec.block == 4 and m.top_share < 1.25 * m.uniform_top_share
