"""Sources read in place (issue 15): image folders and Parquet tables, no conversion step.

Real components on local files; the same sources on loopback S3 are in tests/stream/test_s3_stream.py
and across two gloo ranks in tests/stream/test_inplace_ranks.py.
"""
from __future__ import annotations

import json
import logging
import pickle

import fsspec
import pytest
from datagen import payload, write_dataset
from inplace_data import image_ids, label_of, write_class_folder, write_flat_folder, write_parquet

from gpupipe.core.errors import ConfigError, ShardFormatError, StorageError
from gpupipe.formats.manifest import Manifest
from gpupipe.loader.encoded import EncodedDataset, EncodedLoader, StreamConfig
from gpupipe.prepare.indexer import index_in_place
from gpupipe.sources.source import Source, resolve

pyarrow = pytest.importorskip("pyarrow")


def loader(url, *, batch_size=4, workers=0, on_error="raise", drop_last=False, **kw):
    stream = StreamConfig(shuffle_buffer=8, on_error=on_error)
    return EncodedLoader(url, batch_size=batch_size, num_workers=workers, rank=0, world_size=1, drop_last=drop_last,
                         stream=stream, **kw)


def epoch_ids(ld) -> list[int]:
    return [i for b in ld for i in image_ids(b)]


# ------------------------------------------------------------------------------ image folders

@pytest.mark.parametrize("workers", [0, 2])
def test_class_folder_is_read_in_place_exactly_once(tmp_path, workers, caplog):
    write_class_folder(str(tmp_path / "imgs"), 23)
    ld = loader(str(tmp_path / "imgs"), workers=workers)
    assert ld.source.kind == "folder" and ld.source.manifest.classes == ("c0", "c1", "c2")
    assert len(ld) == 6 and sorted(epoch_ids(ld)) == list(range(23))
    assert "notes.txt" in caplog.text  # the stray file is reported, not read as an image


@pytest.mark.parametrize("labels", ["csv", "json"])
def test_flat_folder_takes_labels_from_its_mapping_file(tmp_path, labels):
    write_flat_folder(str(tmp_path / "flat"), 10, labels=labels)
    ld = loader(str(tmp_path / "flat"))
    assert sorted(epoch_ids(ld)) == list(range(10))
    assert ld.source.manifest.classes == (("c0", "c1", "c2") if labels == "csv" else ())


def test_flat_folder_image_without_a_label_is_refused(tmp_path):
    write_flat_folder(str(tmp_path / "flat"), 5)
    (tmp_path / "flat" / "extra.jpg").write_bytes(payload(99))
    with pytest.raises(ConfigError, match=r"1 of 6 images have no label \(extra.jpg"):
        loader(str(tmp_path / "flat"))


def test_a_split_lacking_a_class_numbers_the_rest_by_the_given_list(tmp_path):
    write_class_folder(str(tmp_path / "val"), 6)
    for p in (tmp_path / "val" / "c0").iterdir():  # val has no c0 images
        p.unlink()
    (tmp_path / "val" / "c0").rmdir()
    own = resolve(Source(str(tmp_path / "val"))).manifest
    assert own.classes == ("c1", "c2") and own.objects.labels.tolist() == [0, 0, 1, 1]  # shifted by one
    train = ("c0", "c1", "c2")
    given = resolve(Source(str(tmp_path / "val"), classes=train)).manifest
    assert given.classes == train and given.objects.labels.tolist() == [1, 1, 2, 2]
    with pytest.raises(ConfigError, match=r"class\(es\) \['c2'\] that the class list"):
        resolve(Source(str(tmp_path / "val"), classes=("c0", "c1")))
    index_in_place(str(tmp_path / "val"), classes=train, progress=False)
    assert sorted(epoch_ids(loader(str(tmp_path / "val")))) == [1, 2, 4, 5]  # labels checked: c<i % 3>
    with pytest.raises(ConfigError, match="numbers 3 classes"):
        resolve(Source(str(tmp_path / "val"), classes=("c1", "c2")))


def test_images_at_two_levels_are_refused(tmp_path):
    write_class_folder(str(tmp_path / "imgs"), 4)
    (tmp_path / "imgs" / "top.jpg").write_bytes(payload(7))
    with pytest.raises(ConfigError, match="top level .*top.jpg.* and in sub-folders"):
        loader(str(tmp_path / "imgs"))


def test_the_folder_above_datasets_is_refused_not_read_as_classes(tmp_path):
    """data/ with images/ (class sub-folders), shards/ (tar + index.json) and val-shards/ (tar
    only): read as an image folder, images/ and val-images/ would be two classes mixing
    train and val. A class folder with a stray .tar beside its images stays a class."""
    write_class_folder(str(tmp_path / "data" / "images"), 6)
    write_class_folder(str(tmp_path / "data" / "val-images"), 3)
    write_dataset(str(tmp_path / "data" / "shards"), [4, 2])
    (tmp_path / "data" / "val-shards").mkdir()
    (tmp_path / "data" / "val-shards" / "shard-000000.tar").write_bytes(b"\0" * 1024)
    with pytest.raises(ConfigError, match=r"holds dataset folders \(shards/, val-shards/ .*sub-folders \(images, "
                                          r"shards, val-images, val-shards\) would be the classes; give one "
                                          r"dataset's folder, e\.g\. .*data/images/"):
        loader(str(tmp_path / "data"))
    from gpupipe.prepare.ingest import ingest

    with pytest.raises(ConfigError, match="holds dataset folders"):  # ingest reads an image folder the same way
        ingest(str(tmp_path / "data"), str(tmp_path / "out"), shard_size=4, progress=False)
    (tmp_path / "data" / "images" / "c1" / "backup.tar").write_bytes(b"\0" * 1024)
    assert sorted(epoch_ids(loader(str(tmp_path / "data" / "images")))) == list(range(6))


def test_glob_that_matches_no_shards_says_to_read_the_folder(tmp_path):
    write_class_folder(str(tmp_path / "imgs"), 3)
    with pytest.raises(StorageError, match=r"holds images: give the folder URL .* or run `gpupipe ingest"):
        loader(str(tmp_path / "imgs" / "*.tar"))


def test_object_deleted_after_indexing_fails_or_is_skipped_and_counted(tmp_path):
    write_class_folder(str(tmp_path / "imgs"), 12)
    index_in_place(str(tmp_path / "imgs"), progress=False)
    (tmp_path / "imgs" / "c1" / "img00004.jpg").unlink()
    with pytest.raises(StorageError, match=r"img00004.jpg"):
        list(loader(str(tmp_path / "imgs")))
    ld = loader(str(tmp_path / "imgs"), on_error="skip")
    assert sorted(epoch_ids(ld)) == sorted(set(range(12)) - {4})  # labels of the others unchanged
    assert ld.stats.skipped == 1


def test_checksums_catch_an_object_replaced_after_indexing(tmp_path):
    write_class_folder(str(tmp_path / "imgs"), 6)
    index_in_place(str(tmp_path / "imgs"), checksums=True, progress=False)
    (tmp_path / "imgs" / "c0" / "img00003.jpg").write_bytes(payload(4))  # same size, other bytes
    with pytest.raises(ShardFormatError, match="img00003.jpg.*checksum"):
        list(loader(str(tmp_path / "imgs")))


def test_index_makes_the_same_plan_without_listing(tmp_path, caplog):
    write_class_folder(str(tmp_path / "imgs"), 17)
    with caplog.at_level(logging.WARNING):
        listed = [image_ids(b) for b in loader(str(tmp_path / "imgs"), seed=3)]
    assert "described 17 images at start" in caplog.text
    manifest = index_in_place(str(tmp_path / "imgs"), progress=False)
    assert manifest.kind == "folder" and manifest.num_samples == 17
    assert json.loads((tmp_path / "imgs" / "index.json").read_text())["version"] == 2
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        indexed = loader(str(tmp_path / "imgs"), seed=3)
    assert "index.json" not in caplog.text
    assert [image_ids(b) for b in indexed] == listed


# ------------------------------------------------------------------------------ Parquet

WRITERS = ["binary", "hf", "pandas"]


def _writer(layout):
    if layout == "pandas":
        pytest.importorskip("pandas", reason="pandas is not installed (not a dependency); the pyarrow writers "
                                             "cover the layout")
    return layout


@pytest.mark.parametrize("layout", WRITERS)
def test_parquet_written_every_way_is_read_identically(tmp_path, layout):
    write_parquet(str(tmp_path / "t"), [17, 0, 9, 14], layout=_writer(layout))
    ld = loader(str(tmp_path / "t"), seed=1)
    assert ld.source.kind == "parquet"
    batches = [(image_ids(b), b.sample_ids.tolist()) for b in ld]
    assert sorted(i for ids, _ in batches for i in ids) == list(range(40))
    assert all(ids == sids for ids, sids in batches)  # sample ids are row numbers in file order
    write_parquet(str(tmp_path / "ref"), [17, 0, 9, 14], layout="binary")
    assert batches == [(image_ids(b), b.sample_ids.tolist()) for b in loader(str(tmp_path / "ref"), seed=1)]
    if layout == "hf":
        assert ld.source.manifest.classes == ("c0", "c1", "c2")  # from the ClassLabel metadata


def test_parquet_reads_only_the_two_column_chunks(tmp_path):
    import random

    import pyarrow.parquet as pq

    rng = random.Random(0)
    blobs = [rng.randbytes(20_000) for _ in range(20)]  # a large column between image and label
    pq.write_table(pyarrow.table({"image": [payload(i) for i in range(20)], "embedding": blobs,
                                  "label": [label_of(i) for i in range(20)]}), str(tmp_path / "t.parquet"),
                   row_group_size=5)
    ld = loader(str(tmp_path / "t.parquet"))
    table = ld.source.manifest.parquet
    assert table.columns.image == "image" and table.columns.label == "label"
    assert all(len(table.byte_ranges(g)) == 2 for g in range(len(table)))  # the embedding chunk is not read
    fetched = sum(b - a for g in range(len(table)) for a, b in table.byte_ranges(g))
    assert fetched < 0.05 * table.file_sizes[0]
    assert sorted(epoch_ids(ld)) == list(range(20))


def test_glob_and_list_of_parquet_files(tmp_path):
    write_parquet(str(tmp_path / "t"), [5, 6, 7])
    assert sorted(epoch_ids(loader(str(tmp_path / "t" / "*.parquet")))) == list(range(18))
    files = [str(tmp_path / "t" / f"part-00{k}.parquet") for k in (0, 2)]
    assert sorted(epoch_ids(loader(files))) == list(range(5)) + list(range(11, 18))


def test_parquet_columns_can_be_named(tmp_path):
    import pyarrow.parquet as pq

    pq.write_table(pyarrow.table({"pixels": [payload(i) for i in range(6)], "y": [label_of(i) for i in range(6)],
                                  "z": [payload(0)] * 6}), str(tmp_path / "odd.parquet"))
    with pytest.raises(ConfigError, match=r"cannot tell the image column .*\['pixels', 'y', 'z'\]"):
        loader(str(tmp_path / "odd.parquet"))
    named = resolve(Source(str(tmp_path / "odd.parquet"), image_column="pixels", label_column="y"))
    assert named.manifest.parquet.columns.leaves == ("pixels", "y")
    index_in_place(str(tmp_path / "odd.parquet"), image_column="pixels", label_column="y", progress=False)
    assert sorted(epoch_ids(loader(str(tmp_path / "odd.parquet")))) == list(range(6))  # the index remembers


def test_a_config_passes_its_class_list_and_columns_to_every_split(tmp_path):
    """YAML's source.classes numbers a val folder that lacks a class like train (it raised a
    mismatch: the split was resolved without the list), and source.image_column/label_column
    reach a Parquet split."""
    from gpupipe.config.schema import load_config

    write_class_folder(str(tmp_path / "train"), 6)
    write_class_folder(str(tmp_path / "val"), 6)
    for p in (tmp_path / "val" / "c0").iterdir():
        p.unlink()
    (tmp_path / "val" / "c0").rmdir()
    import pyarrow.parquet as pq

    pq.write_table(pyarrow.table({"pixels": [payload(i) for i in range(6)], "y": [label_of(i) for i in range(6)],
                                  "z": [payload(0)] * 6}), str(tmp_path / "odd.parquet"))
    cfg = load_config({"source": {"train": str(tmp_path / "train"), "val": str(tmp_path / "val"),
                                  "test": str(tmp_path / "odd.parquet"), "classes": ["c0", "c1", "c2"],
                                  "image_column": "pixels", "label_column": "y"},
                       "loader": {"batch_size": 4, "num_workers": 0}, "augment": "none"})
    val = EncodedLoader(cfg.split("val"))
    assert val.source.manifest.classes == ("c0", "c1", "c2")
    assert sorted(epoch_ids(val)) == [1, 2, 4, 5]  # image_ids checks each label: c<i % 3>, not shifted
    assert sorted(epoch_ids(EncodedLoader(cfg.split("test")))) == list(range(6))


def test_parquet_with_the_wrong_schema_names_file_and_columns(tmp_path):
    write_parquet(str(tmp_path / "t"), [4, 4])
    import pyarrow.parquet as pq

    pq.write_table(pyarrow.table({"image": ["text, not bytes"] * 3, "label": [0, 1, 2]}),
                   str(tmp_path / "t" / "part-009.parquet"))
    with pytest.raises(ConfigError, match=r"column 'image' of .*part-009.parquet is string, but binary"):
        loader(str(tmp_path / "t"))
    with pytest.raises(ConfigError, match="image_column: column 'nope' of .* is missing"):
        resolve(Source(str(tmp_path / "t" / "part-000.parquet"), image_column="nope"))


def test_parquet_with_a_corrupt_footer_is_named(tmp_path):
    write_parquet(str(tmp_path / "t"), [6])
    path = tmp_path / "t" / "part-000.parquet"
    data = bytearray(path.read_bytes())
    data[-40:-8] = b"\xff" * 32
    path.write_bytes(bytes(data))
    with pytest.raises(ShardFormatError, match=r"part-000.parquet: the Parquet footer cannot be read"):
        loader(str(tmp_path / "t"))
    path.write_bytes(b"PAR1 but cut short")
    with pytest.raises(ShardFormatError, match="not a Parquet file"):
        loader(str(tmp_path / "t"))


def test_null_image_cell_raises_or_is_a_counted_skip_and_labels_stay(tmp_path):
    import pyarrow.parquet as pq

    images = [payload(i) for i in range(8)]
    images[5] = None
    (tmp_path / "t").mkdir()
    pq.write_table(pyarrow.table({"image": pyarrow.array(images, pyarrow.binary()),
                                  "label": [label_of(i) for i in range(8)]}), str(tmp_path / "t" / "a.parquet"),
                   row_group_size=3)
    with pytest.raises(ShardFormatError, match=r"sample 'a.parquet/5': the image cell is null"):
        list(loader(str(tmp_path / "t")))
    ld = loader(str(tmp_path / "t"), on_error="skip")
    batches = list(ld)
    assert sorted(i for b in batches for i in image_ids(b)) == [0, 1, 2, 3, 4, 6, 7]  # labels checked per image
    assert ld.stats.skipped == 1 and sum(len(b) for b in batches) == 8  # a placeholder keeps the step count


def test_parquet_index_with_checksums_is_used_and_catches_changes(tmp_path):
    write_parquet(str(tmp_path / "t"), [9, 8], row_group_rows=4)
    manifest = index_in_place(str(tmp_path / "t"), checksums=True, progress=False)
    assert manifest.kind == "parquet" and manifest.parquet.crc32 is not None and manifest.num_units == 5
    ld = loader(str(tmp_path / "t" / "*.parquet"))
    assert ld.source.manifest.to_json() == manifest.to_json()
    assert sorted(epoch_ids(ld)) == list(range(17))
    write_parquet(str(tmp_path / "t"), [9, 8], row_group_rows=3)  # rewritten: the index is stale
    with pytest.raises(ShardFormatError, match="rerun `gpupipe index`"):
        list(loader(str(tmp_path / "t")))


# ------------------------------------------------------------------------------ shared guarantees

@pytest.mark.parametrize("kind", ["folder", "parquet"])
def test_resume_mid_epoch_gives_exactly_the_rest(tmp_path, kind):
    url = str(tmp_path / kind)
    write_class_folder(url, 29) if kind == "folder" else write_parquet(url, [11, 18], row_group_rows=4)
    full = loader(url, seed=5, drop_last=True)
    whole = [image_ids(b) for b in full]
    first = loader(url, seed=5, drop_last=True)
    it = iter(first)
    seen = [image_ids(next(it)) for _ in range(3)]
    state = first.state_dict()
    it.close()
    rest = loader(url, seed=5, drop_last=True, workers=2)
    rest.load_state_dict(state)
    after = [image_ids(b) for b in rest]
    assert sorted(sum(seen + after, [])) == sorted(sum(whole, [])) and len(seen) + len(after) == len(whole)


@pytest.mark.parametrize("kind", ["folder", "parquet"])
def test_dataset_pickles_as_plain_data(tmp_path, kind):
    url = str(tmp_path / kind)
    write_class_folder(url, 9) if kind == "folder" else write_parquet(url, [9])
    ld = loader(url)
    ds = pickle.loads(pickle.dumps(ld._dataset()))
    assert isinstance(ds, EncodedDataset) and sorted(i for b in ds for i in image_ids(b)) == list(range(9))


def test_manifests_round_trip_and_tar_stays_version_1(tmp_path):
    write_class_folder(str(tmp_path / "f"), 5)
    write_parquet(str(tmp_path / "p"), [3, 4])
    for url in (tmp_path / "f", tmp_path / "p"):
        m = loader(str(url)).source.manifest
        again = Manifest.from_json(m.to_json())
        assert again.to_json() == m.to_json() and again.sample_counts() == m.sample_counts()
    write_dataset(str(tmp_path / "tar"), [3])
    assert json.loads((tmp_path / "tar" / "index.json").read_text())["version"] == 1


def test_a_manifest_naming_objects_outside_its_folder_is_refused(tmp_path):
    write_class_folder(str(tmp_path / "f"), 2)
    doc = json.loads(loader(str(tmp_path / "f")).source.manifest.to_json())
    doc["objects"]["names"][0] = "../../etc/passwd"
    (tmp_path / "f" / "index.json").write_text(json.dumps(doc))
    with pytest.raises(ShardFormatError, match="escapes the folder"):
        loader(str(tmp_path / "f"))


def test_memory_filesystem_works_too():
    write_class_folder("memory://inplace-mem/imgs", 7)
    try:
        assert sorted(epoch_ids(loader("memory://inplace-mem/imgs"))) == list(range(7))
    finally:
        fsspec.filesystem("memory").rm("/inplace-mem", recursive=True)



def test_gpupipe_index_cli_describes_folders_and_parquet(tmp_path, capsys):
    from gpupipe.tools.cli import main

    write_class_folder(str(tmp_path / "imgs"), 8)
    write_parquet(str(tmp_path / "t"), [5, 6], row_group_rows=4)
    assert main(["index", str(tmp_path / "imgs"), "--quiet", "--checksums"]) == 0
    assert "indexed 8 samples in 8 images" in capsys.readouterr().out
    assert Manifest.from_json((tmp_path / "imgs" / "index.json").read_text()).objects.crc32 is not None
    assert main(["index", str(tmp_path / "t" / "*.parquet"), "--quiet"]) == 0
    assert "indexed 11 samples in 4 row groups" in capsys.readouterr().out
    assert sorted(epoch_ids(loader(str(tmp_path / "t")))) == list(range(11))
