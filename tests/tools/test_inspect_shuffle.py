"""``gpupipe inspect URL --shuffle``: how well the loader's shuffle mixes labels, beside a uniform
shuffle of the same labels (issue 35). Class-ordered shards with a small window read far above
uniform; the same samples shuffled at rest read near it. Without --shuffle no sample is read."""
from __future__ import annotations

import json

import numpy as np
import pytest

from gpupipe.formats.writer import ShardSink
from gpupipe.tools.cli import main

CLASSES, PER_CLASS = 10, 64
ARGS = ["--shuffle", "--batch-size", "32", "--shuffle-buffer", "64", "--batches", "12", "--shuffle-block", "0"]


def write(root: str, order, labelled: bool = True) -> str:
    with ShardSink(root, shard_size=PER_CLASS, classes=tuple(f"c{c}" for c in range(CLASSES))) as sink:
        for i in order:
            fields = {"jpg": b"\xff\xd8\xff" + int(i).to_bytes(4, "big")}
            if labelled:
                fields["cls"] = str(int(i) // PER_CLASS).encode()
            sink.write(f"k{int(i):05d}", fields)
    return root


def inspect_json(capsys, url: str, *args: str) -> dict:
    assert main(["inspect", url, "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_class_ordered_shards_read_far_above_uniform(tmp_path, capsys):
    url = write(str(tmp_path / "sorted"), range(CLASSES * PER_CLASS))
    s = inspect_json(capsys, url, *ARGS)["shuffle"]
    assert (s["batches"], s["batch_size"], s["shuffle_buffer"], s["seed"], s["samples"]) == (12, 32, 64, 0, 384)
    assert s["far_from_uniform"] and s["top_share"] > 0.8 > 2 * s["uniform_top_share"]
    assert s["labels_per_batch"] < 2 < s["uniform_labels_per_batch"]
    assert main(["inspect", url, *ARGS]) == 0
    out = capsys.readouterr().out
    assert "shuffle:  the first 12 batches of 32 (shuffle_buffer 64, shuffle_block 0, seed 0): 384 labelled samples" in out
    assert f"most common label per batch: {100 * s['top_share']:.1f} % (uniform shuffle: " \
           f"{100 * s['uniform_top_share']:.1f} %)" in out
    assert f"labels per batch: {s['labels_per_batch']:.1f} (uniform: {s['uniform_labels_per_batch']:.1f})" in out
    assert "set stream.shuffle_block to a few samples" in out.lower()


def test_the_same_samples_shuffled_at_rest_read_near_uniform(tmp_path, capsys):
    url = write(str(tmp_path / "shuffled"), np.random.default_rng(0).permutation(CLASSES * PER_CLASS))
    s = inspect_json(capsys, url, *ARGS)["shuffle"]
    assert not s["far_from_uniform"] and s["labels"] == CLASSES
    assert abs(s["top_share"] - s["uniform_top_share"]) < 0.05
    assert abs(s["labels_per_batch"] - s["uniform_labels_per_batch"]) < 0.5
    assert main(["inspect", url, *ARGS]) == 0
    assert "close enough to uniform" in capsys.readouterr().out


def test_unlabelled_samples_say_so(tmp_path, capsys):
    url = write(str(tmp_path / "plain"), range(CLASSES * PER_CLASS), labelled=False)
    assert inspect_json(capsys, url, *ARGS)["shuffle"]["batches"] == 0
    assert main(["inspect", url, *ARGS]) == 0
    assert "no labels to compare" in capsys.readouterr().out


def test_without_shuffle_no_loader_is_built(tmp_path, capsys, monkeypatch):
    import gpupipe.loader.encoded as encoded

    url = write(str(tmp_path / "sorted"), range(CLASSES * PER_CLASS))
    monkeypatch.setattr(encoded, "EncodedLoader", lambda *a, **k: pytest.fail("inspect read samples"))
    assert "shuffle" not in inspect_json(capsys, url)
    with pytest.raises(BaseException, match="inspect read samples"):
        main(["inspect", url, "--shuffle"])


def test_help_says_what_the_numbers_mean(capsys):
    assert main(["inspect", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split()).lower()
    for needle in ("--shuffle", "--batches n", "--batch-size n", "--shuffle-buffer n", "uniform shuffle", "66 % (",
                   "set stream.shuffle_block to a few samples", "is my shuffle mixing classes?"):
        assert needle in text


def test_class_ordered_shards_mix_with_the_default_blocks(tmp_path, capsys):
    """The same class-ordered shards with the default ``shuffle_block`` (blocks of 4 for local tar
    shards, spread over the window): near a uniform shuffle, and no verdict against them."""
    url = write(str(tmp_path / "sorted"), range(CLASSES * PER_CLASS))
    s = inspect_json(capsys, url, *ARGS[:-2])["shuffle"]
    assert s["shuffle_block"] == 4 and not s["far_from_uniform"]
    assert s["top_share"] < 1.25 * s["uniform_top_share"]
