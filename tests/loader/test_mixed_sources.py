"""Several sources mixed in one loader (issue 35): ``source.train`` as a list of
``{url, weight | repeat | samples}``. The plan's side (exact draws, repeats, resume under any
cut) is tests/plan/test_plan_draws.py; here the loader's: per-epoch counts exactly
``draw_sizes``', batches that mix the sources, labels matched by class name, a mid-epoch resume
that delivers exactly the rest, and a clear ConfigError for each mix that cannot be read."""
from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pytest
from datagen import write_dataset, write_detection

from gpupipe.config.schema import load_config
from gpupipe.core.errors import ConfigError, ShardFormatError
from gpupipe.formats.writer import ShardSink
from gpupipe.loader.encoded import EncodedLoader
from gpupipe.plan import draw_sizes
from gpupipe.sources.mixed import relabel
from gpupipe.sources.resolved import SourcePart


def _source(root: Path, prefix: str, n: int, classes: list[str], shard_size: int = 10) -> str:
    """``n`` samples under ``root`` keyed ``<prefix>NNNNN``, sample i of class ``classes[i % len]``,
    labelled in the source's own numbering (its index lists ``classes``)."""
    with ShardSink(str(root), shard_size=shard_size, classes=tuple(classes)) as sink:
        for i in range(n):
            sink.write(f"{prefix}{i:05d}", {"jpg": b"\xff\xd8\xff" + i.to_bytes(4, "big"),
                                            "cls": str(i % len(classes)).encode()})
    return str(root)


def _epoch(loader) -> list[tuple[str, int]]:
    return [(k, int(label)) for b in loader for k, label in zip(b.keys, b.labels)]


@pytest.fixture
def two(tmp_path: Path) -> tuple[str, str]:
    return (_source(tmp_path / "a", "a", 60, ["cat", "dog"]), _source(tmp_path / "b", "b", 40, ["dog", "owl"]))


def test_weights_3_to_1_give_exactly_draw_sizes_in_batches_of_both(two):
    a, b = two
    loader = EncodedLoader([{"url": a, "weight": 3}, {"url": b, "weight": 1}], batch_size=10, num_workers=0, seed=3)
    want = draw_sizes([60, 40], weight=[3, 1])
    assert want == (75, 25) and loader.spec.draws == ((6, 75), (4, 25))
    assert loader.source.manifest.classes == ("cat", "dog", "owl")  # the union by name, first source's order first
    for epoch in range(2):
        batches = list(loader)
        keys = [k for batch in batches for k in batch.keys]
        got = collections.Counter(k[0] for k in keys)
        assert (got["a"], got["b"]) == want, epoch
        assert loader.stats.per_source == list(want)
        assert sum(1 for batch in batches if {k[0] for k in batch.keys} == {"a", "b"}) >= len(batches) // 2
        for batch in batches:  # b's dog (its label 0) and owl (1) are the union's 1 and 2
            for key, label in zip(batch.keys, batch.labels.tolist()):
                i = int(key[1:])
                assert label == (i % 2 if key[0] == "a" else 1 + i % 2), key
    assert loader.epoch == 1


def test_repeat_and_samples(two):
    a, b = two
    loader = EncodedLoader([{"url": a, "repeat": 0.5}, {"url": b, "samples": 70}], batch_size=10, num_workers=0)
    keys = collections.Counter(k for batch in loader for k in batch.keys)
    assert sum(n for k, n in keys.items() if k[0] == "a") == 30
    assert sum(n for k, n in keys.items() if k[0] == "b") == 70
    assert set(k for k in keys if k[0] == "b") == {f"b{i:05d}" for i in range(40)}  # all of b, some twice
    assert max(keys.values()) == 2


@pytest.mark.parametrize("cut", [dict(), dict(batch_size=5)])
def test_mid_epoch_resume_of_a_mix_delivers_exactly_the_rest(two, cut):
    a, b = two
    urls = [{"url": a, "weight": 2}, {"url": b, "repeat": 1.5}]
    whole = collections.Counter(k for k, _ in _epoch(EncodedLoader(urls, batch_size=10, num_workers=0, seed=5)))
    first = EncodedLoader(urls, batch_size=10, num_workers=0, seed=5)
    seen = collections.Counter()
    for i, batch in enumerate(first):
        seen.update(batch.keys)
        if i == 3:
            break
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint keeps it
    assert sum(state["per_source"]) == 40 and state["per_source"] == first.stats.per_source
    again = EncodedLoader(urls, batch_size=cut.get("batch_size", 10), num_workers=2, seed=5)
    again.load_state_dict(state)
    assert again.stats.per_source == state["per_source"]
    rest = collections.Counter(k for batch in again for k in batch.keys)
    assert seen + rest == whole
    assert again.stats.per_source == [sum(n for k, n in whole.items() if k[0] == s) for s in "ab"]


def test_yaml_list_form_through_the_config(two, tmp_path: Path):
    a, b = two
    path = tmp_path / "mix.yaml"
    path.write_text(f"source:\n  train:\n    - {{url: {a}, weight: 1}}\n    - {{url: {b}, weight: 1}}\n"
                    "  classes: [owl, dog, cat, bat]\nloader: {batch_size: 10, num_workers: 0}\n")
    loader = EncodedLoader(load_config(path).split("train"))
    assert loader.source.manifest.classes == ("owl", "dog", "cat", "bat")
    labels = {(k[0], int(k[1:]) % 2): int(label) for k, label in _epoch(loader)}
    assert labels == {("a", 0): 2, ("a", 1): 1, ("b", 0): 1, ("b", 1): 0}


def test_a_list_of_url_strings_stays_one_source(tmp_path: Path):
    urls = write_dataset(str(tmp_path / "d"), [5, 5])
    loader = EncodedLoader(urls, batch_size=5, num_workers=0, shuffle=False)
    assert loader.spec.draws == () and loader.source.parts == () and loader.stats.per_source == []


def test_image_folders_mix_by_class_name(tmp_path: Path):
    for root, classes in (("f1", ["cat", "dog"]), ("f2", ["dog", "emu"])):
        for c in classes:
            (tmp_path / root / c).mkdir(parents=True)
            for i in range(3):
                (tmp_path / root / c / f"{root}{c}{i}.jpg").write_bytes(b"\xff\xd8\xff" + bytes(8))
    loader = EncodedLoader([{"url": str(tmp_path / "f1")}, {"url": str(tmp_path / "f2"), "weight": 1}],
                           batch_size=4, num_workers=0, drop_last=False)
    assert loader.source.manifest.classes == ("cat", "dog", "emu")
    got = {k: int(label) for k, label in _epoch(loader)}
    assert len(got) == 12, got  # keys are <class>/<name>: the label is the union's number of that class
    assert all(label == ("cat", "dog", "emu").index(k.split("/")[0]) for k, label in got.items()), got


def _box_labels(loader) -> dict[int, list[int]]:
    out = {}
    for batch in loader:
        assert batch.targets is not None
        ends = np.cumsum(batch.targets.box_counts.numpy())
        labels = batch.targets.box_labels.numpy()
        for i, sid in enumerate(batch.sample_ids.tolist()):
            out[sid] = labels[ends[i] - batch.targets.box_counts[i].item():ends[i]].tolist()
    return out


def test_targets_come_from_every_source_with_box_labels_renumbered(tmp_path: Path):
    write_detection(str(tmp_path / "d1"), 12, seed=1, kinds=("boxes",))
    write_detection(str(tmp_path / "d2"), 8, seed=2, kinds=("boxes",), num_classes=4)
    alone = [_box_labels(EncodedLoader(str(tmp_path / d), batch_size=4, num_workers=0, targets="boxes",
                                       shuffle=False)) for d in ("d1", "d2")]
    reverse = [f"class_{c}" for c in (3, 2, 1, 0)]
    loader = EncodedLoader([{"url": str(tmp_path / "d1")}, {"url": str(tmp_path / "d2")}], batch_size=4,
                           num_workers=0, targets="boxes", classes=reverse)
    got = _box_labels(loader)  # by sample id: both sources key their samples det_NNNNNN
    assert sorted(got) == list(range(20))
    want = {**alone[0], **{12 + i: labels for i, labels in alone[1].items()}}
    assert got == {i: [3 - c for c in labels] for i, labels in want.items()}
    assert any(want[i] for i in range(12)) and any(want[i] for i in range(12, 20))


def test_relabel_is_one_lookup_and_names_a_label_past_its_list():
    parts = [SourcePart("a/", 1, 3, ("cat", "dog")), SourcePart("b/", 1, 2, ("dog", "owl"), np.array([1, 2]))]
    assert relabel(parts, np.arange(5), np.array([0, 1, -1, 0, 1])).tolist() == [0, 1, -1, 1, 2]
    with pytest.raises(ShardFormatError, match="b/: sample 'b1': label 2 is not below the 2 classes"):
        relabel(parts, np.array([4]), np.array([2]), ["b1"])


# -- what cannot be mixed: each a ConfigError that names the source ----------------------------------

@pytest.mark.parametrize("entry, message", [
    ({"weight": 1}, r"source\.train\[1\]: no url"),
    ({"url": "x", "weight": 1, "repeat": 2}, r"source\.train\[1\]: give one of weight, repeat or samples, not "
                                             "weight and repeat"),
    ({"url": "x", "samples": -3}, r"source\.train\[1\]: samples must be >= 0"),
    ({"url": "x", "weigth": 2}, r"source\.train\[1\]\.weigth: unknown key; did you mean 'weight'"),
    ({"url": "x", "weight": "lots"}, r"source\.train\[1\]\.weight: expected float"),
    ("y", r"source\.train\[1\]: expected a mapping with a url"),
])
def test_bad_entries_name_the_source_and_key(entry, message):
    with pytest.raises(ConfigError, match=message):
        load_config({"source": {"train": [{"url": "a", "weight": 1}, entry]}})


def test_sources_of_different_kinds_are_refused(two, tmp_path: Path):
    (tmp_path / "imgs" / "cat").mkdir(parents=True)
    (tmp_path / "imgs" / "cat" / "x.jpg").write_bytes(b"\xff\xd8\xff" + bytes(8))
    with pytest.raises(ConfigError, match=r"of one kind for now; these are tar source\.train\[0\].*folder "
                                          r"source\.train\[1\]"):
        EncodedLoader([{"url": two[0]}, {"url": str(tmp_path / "imgs")}], batch_size=4, num_workers=0)


def test_a_source_without_index_is_refused(two, tmp_path: Path):
    write_dataset(str(tmp_path / "bare"), [4, 4], manifest=False)
    with pytest.raises(ConfigError, match=r"source\.train\[1\] .*bare.*: no index\.json .*gpupipe index"):
        EncodedLoader([{"url": two[0]}, {"url": str(tmp_path / "bare") + "/"}], batch_size=4, num_workers=0)


def test_sources_on_two_filesystems_are_refused(two):
    with pytest.raises(ConfigError, match="on one filesystem for now; these are on file, memory"):
        EncodedLoader([{"url": two[0]}, {"url": "memory://elsewhere/"}], batch_size=4, num_workers=0)


def test_a_class_missing_from_the_declared_list_is_refused(two):
    with pytest.raises(ConfigError, match=r"source\.train\[1\] .*: class 'owl' is not in source\.classes"):
        EncodedLoader([{"url": two[0]}, {"url": two[1]}], batch_size=4, num_workers=0, classes=["cat", "dog"])


def test_a_source_without_class_names_among_named_ones_is_refused(two, tmp_path: Path):
    write_dataset(str(tmp_path / "nums"), [5])
    with pytest.raises(ConfigError, match=r"source\.train\[1\] .*nums.*: its index names no classes"):
        EncodedLoader([{"url": two[0]}, {"url": str(tmp_path / "nums")}], batch_size=4, num_workers=0)


def test_weights_that_sum_to_zero_are_a_config_error(two):
    with pytest.raises(ConfigError, match="source.train: .*weights of the sources sum to 0"):
        EncodedLoader([{"url": two[0], "weight": 0}, {"url": two[1], "weight": 0}], batch_size=4, num_workers=0)


@pytest.mark.parametrize("workers", [0, 2])
def test_per_source_batching_gives_each_batch_one_source_drawn_by_weight(two, workers, tmp_path: Path):
    a, b = two
    loader = EncodedLoader([{"url": a, "weight": 3}, {"url": b, "weight": 1}], batch_size=10, num_workers=workers,
                           seed=3, batching="per_source")
    assert loader.spec.draws == ((6, 70), (4, 20))  # 75 and 25 rounded down to whole batches
    for epoch in range(2):
        batches = list(loader)
        sources = [{k[0] for k in batch.keys} for batch in batches]
        assert all(len(s) == 1 for s in sources), (epoch, sources)
        assert collections.Counter(s.pop() for s in sources) == {"a": 7, "b": 2}
        assert loader.stats.per_source == [70, 20]
    same = EncodedLoader([{"url": a, "weight": 3}, {"url": b, "weight": 1}], batch_size=10, num_workers=0, seed=3,
                         batching="per_source")
    same.set_epoch(1)
    assert [batch.keys for batch in same] == [batch.keys for batch in batches]  # the worker count changes nothing
    config = tmp_path / "c.yaml"
    config.write_text(f"source:\n  train:\n    - {{url: {a}, weight: 3}}\n    - {{url: {b}}}\n"
                      "stream: {batching: per_source}\nloader: {batch_size: 10}\n")
    from_yaml = EncodedLoader(load_config(config).split("train"))
    assert from_yaml.spec.per_source and from_yaml.spec.draws == ((6, 60), (4, 40))


def test_per_source_batching_refuses_one_source_a_source_below_a_batch_and_a_typo(two):
    a, b = two
    with pytest.raises(ConfigError, match="per_source needs several sources"):
        EncodedLoader(a, batch_size=10, batching="per_source")
    with pytest.raises(ConfigError, match=r"gives 7 samples an epoch, fewer than one batch of 10"):
        EncodedLoader([{"url": a}, {"url": b, "samples": 7}], batch_size=10, batching="per_source")
    with pytest.raises(ConfigError, match="stream.batching: 'per-source' is not one of 'mixed', 'per_source'"):
        EncodedLoader([{"url": a}, {"url": b}], batch_size=10, batching="per-source")


def test_parquet_sources_mix_by_weight_with_their_labels(tmp_path: Path):
    from inplace_data import image_ids, write_parquet

    pytest.importorskip("pyarrow")
    write_parquet(str(tmp_path / "p"), [20, 15])
    write_parquet(str(tmp_path / "q"), [12], row_group_rows=5)
    loader = EncodedLoader([{"url": str(tmp_path / "p"), "weight": 1}, {"url": str(tmp_path / "q"), "weight": 1}],
                           batch_size=6, num_workers=0, seed=2)
    want = draw_sizes([35, 12], weight=[1, 1])
    assert loader.spec.draws == ((len(loader.spec.counts) - 3, want[0]), (3, want[1]))  # q: 3 row groups
    for _epoch in range(2):
        batches = list(loader)
        ids = [i for b in batches for i in image_ids(b)]  # each image's bytes against its label
        assert len(ids) == sum(want) - sum(want) % 6 and loader.stats.per_source == list(
            np.bincount([int(s >= 35) for b in batches for s in b.sample_ids.tolist()], minlength=2))
    write_parquet(str(tmp_path / "hf"), [10], layout="hf")  # image as a {bytes, path} struct
    with pytest.raises(ConfigError, match=r"read other columns .*hf"):
        EncodedLoader([{"url": str(tmp_path / "p")}, {"url": str(tmp_path / "hf")}], batch_size=6)


def test_masks_mix_only_when_every_source_numbers_its_classes_as_the_mix(tmp_path: Path):
    """A mask's pixels are class numbers of its own source's list: renumbering box labels but not
    masks would give batches whose masks name the wrong classes. Refused, naming the source."""
    write_detection(str(tmp_path / "m1"), 12, seed=1, kinds=("boxes", "masks"))
    write_detection(str(tmp_path / "m2"), 8, seed=2, kinds=("boxes", "masks"))
    same = EncodedLoader([{"url": str(tmp_path / "m1")}, {"url": str(tmp_path / "m2")}], batch_size=4,
                         num_workers=0, targets="boxes+masks")
    assert sum(len(b) for b in same) == 20
    with pytest.raises(ConfigError, match=r"m1.*masks hold its own numbers"):
        EncodedLoader([{"url": str(tmp_path / "m1")}, {"url": str(tmp_path / "m2")}], batch_size=4,
                      targets="boxes+masks", classes=["class_2", "class_1", "class_0"])
