"""The manifest of a source read in place (gpupipe.sources.inplace), from one listing: image
folders (class sub-folders, or flat with a labels file), Parquet files from their footers (row
groups as units; string labels read from their column chunks only) and the CRC-32s that
``gpupipe index --checksums`` adds. Real local files, written per test."""
from __future__ import annotations

import json
import logging
import random
import zlib

import fsspec
import pytest
from datagen import payload
from fsspec.implementations.local import LocalFileSystem
from inplace_data import write_class_folder, write_flat_folder, write_parquet

from gpupipe.core.errors import ConfigError, StorageError
from gpupipe.formats.folder import FolderListing, classify_listing
from gpupipe.formats.manifest import Manifest
from gpupipe.formats.rowgroups import TAIL_BYTES
from gpupipe.sources.inplace import describe_folder, describe_parquet_files, parquet_paths, with_checksums
from gpupipe.storage.fetch import FetchConfig, Fetcher

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


class RecordingFS(LocalFileSystem):
    """The local disk, noting every ranged read: ``(path, start, end)``."""

    reads: list

    def cat_file(self, path, start=None, end=None, **kwargs):
        self.reads.append((path, start, end))
        return super().cat_file(path, start=start, end=end, **kwargs)


def fetcher(config: FetchConfig | None = None) -> Fetcher:
    fs = RecordingFS(skip_instance_cache=True)
    fs.reads = []
    return Fetcher(fs, config or FetchConfig(retries=0))


def listing(path) -> FolderListing:
    """The folder's listing, classified, as the source resolver makes it."""
    fs = fsspec.filesystem("file")
    root = fs._strip_protocol(str(path))
    return classify_listing(root, fs.find(root, maxdepth=None, withdirs=False, detail=True))


def folder_manifest(path, f: Fetcher | None = None, **kw) -> Manifest:
    return describe_folder(f or fetcher(), str(path).rstrip("/") + "/", listing(path), **kw)


def parquet_manifest(path, f: Fetcher | None = None, **kw) -> Manifest:
    names, sizes = parquet_paths(listing(path))
    return describe_parquet_files(f or fetcher(), str(path).rstrip("/") + "/", names, sizes, **kw)


# ------------------------------------------------------------------------------ image folders

def test_class_sub_folders_number_the_sorted_class_names(tmp_path):
    write_class_folder(str(tmp_path / "imgs"), 7)  # c<i % 3>/img<i>.jpg, and a notes.txt
    m = folder_manifest(tmp_path / "imgs")
    assert m.kind == "folder" and m.classes == ("c0", "c1", "c2")
    t = m.objects
    assert list(t.names) == ["c0/img00000.jpg", "c0/img00003.jpg", "c0/img00006.jpg", "c1/img00001.jpg",
                             "c1/img00004.jpg", "c2/img00002.jpg", "c2/img00005.jpg"]
    assert t.labels.tolist() == [0, 0, 0, 1, 1, 2, 2]
    assert t.sizes.tolist() == [len(payload(i)) for i in (0, 3, 6, 1, 4, 2, 5)]
    assert t.crc32 is None
    assert m.sample_counts() == (1,) * 7 and m.num_units == m.num_samples == 7


def test_class_folders_given_a_class_list_are_numbered_by_it(tmp_path):
    write_class_folder(str(tmp_path / "imgs"), 4)
    m = folder_manifest(tmp_path / "imgs", classes=("c2", "c1", "c0", "c9"))
    assert m.classes == ("c2", "c1", "c0", "c9")
    assert dict(zip(m.objects.names, m.objects.labels.tolist())) == {
        "c0/img00000.jpg": 2, "c0/img00003.jpg": 2, "c1/img00001.jpg": 1, "c2/img00002.jpg": 0}
    with pytest.raises(ConfigError, match=r"class\(es\) \['c2'\] that the class list"):
        folder_manifest(tmp_path / "imgs", classes=("c0", "c1"))


def test_describing_a_folder_reads_no_image(tmp_path):
    write_class_folder(str(tmp_path / "imgs"), 5)
    f = fetcher()
    folder_manifest(tmp_path / "imgs", f)
    assert f.fs.reads == []
    write_flat_folder(str(tmp_path / "flat"), 5)
    f = fetcher()
    folder_manifest(tmp_path / "flat", f)
    assert [r[0].rsplit("/", 1)[1] for r in f.fs.reads] == ["labels.csv"]  # its labels file, nothing else


def test_hidden_files_and_non_images_are_left_out_and_reported(tmp_path, caplog):
    root = tmp_path / "imgs"
    write_class_folder(str(root), 3)  # with notes.txt at the top
    (root / "c0" / ".DS_Store").write_bytes(b"x")
    (root / "c1" / ".hidden.jpg").write_bytes(payload(50))
    (root / ".cache").mkdir()
    (root / ".cache" / "c9").mkdir()
    (root / ".cache" / "c9" / "thumb.jpg").write_bytes(payload(51))
    (root / "c2" / "caption.txt").write_bytes(b"a cat")
    (root / "index.json").write_bytes(b"{}")  # expected beside the data: never reported
    (root / "classes.txt").write_bytes(b"c0\n")
    with caplog.at_level(logging.WARNING):
        m = folder_manifest(root)
    assert list(m.objects.names) == ["c0/img00000.jpg", "c1/img00001.jpg", "c2/img00002.jpg"]
    assert m.classes == ("c0", "c1", "c2")
    assert "5 file(s) are not read as images" in caplog.text
    assert "index.json" not in caplog.text and "classes.txt" not in caplog.text


@pytest.mark.parametrize("kind", ["csv", "json"])
def test_a_flat_folder_takes_its_labels_from_its_labels_file(tmp_path, kind):
    write_flat_folder(str(tmp_path / "flat"), 5, labels=kind)
    m = folder_manifest(tmp_path / "flat")
    assert list(m.objects.names) == [f"img{i:05d}.jpg" for i in range(5)]
    assert m.objects.labels.tolist() == [0, 1, 2, 0, 1]
    # CSV: class names c<k>, numbered sorted; JSON: integers as given (keyed by the stem), no names
    assert m.classes == (("c0", "c1", "c2") if kind == "csv" else ())


def test_a_flat_folder_with_names_as_labels_numbers_them_sorted(tmp_path):
    root = tmp_path / "flat"
    root.mkdir()
    names = ["dog", "cat", "dog", "bird"]
    for i in range(len(names)):
        (root / f"p{i}.png").write_bytes(payload(i))
    (root / "labels.json").write_text(json.dumps([{"file": f"p{i}.png", "label": n} for i, n in enumerate(names)]))
    m = folder_manifest(root)
    assert m.classes == ("bird", "cat", "dog") and m.objects.labels.tolist() == [2, 1, 2, 0]


def test_a_flat_folder_without_a_labels_file_has_label_minus_one(tmp_path):
    root = tmp_path / "flat"
    root.mkdir()
    for i in range(3):
        (root / f"img{i}.jpg").write_bytes(payload(i))
    (root / "README.md").write_bytes(b"not an image")
    m = folder_manifest(root)
    assert list(m.objects.names) == ["img0.jpg", "img1.jpg", "img2.jpg"]
    assert m.objects.labels.tolist() == [-1, -1, -1] and m.classes == ()


def test_a_labels_file_named_explicitly_wins_over_the_one_in_the_folder(tmp_path):
    write_flat_folder(str(tmp_path / "flat"), 3)  # labels.csv: c0, c1, c2
    other = tmp_path / "relabelled.csv"
    other.write_text("file,label\nimg00000.jpg,7\nimg00001.jpg,8\nimg00002.jpg,9\n")
    m = folder_manifest(tmp_path / "flat", labels=str(other))
    assert m.objects.labels.tolist() == [7, 8, 9] and m.classes == ()


def test_an_explicit_labels_file_for_class_sub_folders_is_refused(tmp_path):
    write_class_folder(str(tmp_path / "imgs"), 3)
    other = tmp_path / "labels.csv"
    other.write_text("file,label\nc0/img00000.jpg,1\n")
    with pytest.raises(ConfigError, match="has class sub-folders, which give the labels"):
        folder_manifest(tmp_path / "imgs", labels=str(other))


def test_images_at_the_top_and_in_sub_folders_are_refused(tmp_path):
    write_class_folder(str(tmp_path / "imgs"), 3)
    (tmp_path / "imgs" / "stray.jpg").write_bytes(payload(9))
    with pytest.raises(ConfigError, match=r"images at the top level \(stray.jpg"):
        folder_manifest(tmp_path / "imgs")


def test_a_folder_without_images_is_an_error_naming_it(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    (root / ".secret.jpg").write_bytes(payload(1))  # hidden: not an image of the dataset
    (root / "notes.txt").write_bytes(b"x")
    with pytest.raises(StorageError, match=r"no images here \(names ending in .jpg") as err:
        folder_manifest(root)
    assert str(root) in str(err.value)


# ------------------------------------------------------------------------------ Parquet: the file list

def test_parquet_paths_lists_data_files_sorted_without_hidden_and_side_files():
    root = "/data/table"
    files = {f"{root}/{name}": size for name, size in [
        ("b.parquet", 20), ("a.parquet", 10), ("year=2024/c.parquet", 30), ("notes.txt", 1),
        ("_delta_log/00000.json", 2), ("_SUCCESS", 0), (".a.parquet.crc", 3), (".hidden.parquet", 4),
        ("_tmp/x.parquet", 5), ("year=2024/.staging/y.parquet", 6)]}
    names, sizes = parquet_paths(FolderListing("parquet", root, files))
    assert names == ["a.parquet", "b.parquet", "year=2024/c.parquet"]
    assert sizes == [10, 20, 30]


# ------------------------------------------------------------------------------ Parquet: row groups

def test_every_non_empty_row_group_is_a_unit_in_file_order(tmp_path):
    write_parquet(str(tmp_path / "pq"), [10, 0, 5], row_group_rows=4)  # ids 0..14, label id % 3
    m = parquet_manifest(tmp_path / "pq")
    t = m.parquet
    assert m.kind == "parquet" and list(t.files) == ["part-000.parquet", "part-001.parquet", "part-002.parquet"]
    assert m.sample_counts() == (4, 4, 2, 4, 1) and m.num_samples == 15
    assert t.file.tolist() == [0, 0, 0, 2, 2]  # the empty file gives no unit
    assert t.index.tolist() == [0, 1, 2, 0, 1] and t.first_row.tolist() == [0, 4, 8, 0, 4]
    assert (t.columns.image, t.columns.label, t.columns.string_labels) == ("image", "label", False)
    assert m.classes == ()
    sizes = [(tmp_path / "pq" / n).stat().st_size for n in t.files]
    assert t.file_sizes.tolist() == sizes
    for f, size in enumerate(sizes):  # the footer kept whole: a worker needs no read for it
        start, footer = t.footer(f)
        assert footer == (tmp_path / "pq" / t.files[f]).read_bytes()[start:] and start + len(footer) == size


def _big_table(labels: list) -> pa.Table:
    rng = random.Random(0)
    images = [b"\xff\xd8\xff" + rng.randbytes(40_000) for _ in labels]  # incompressible: big column chunks
    return pa.table({"image": pa.array(images, pa.binary()), "label": labels})


@pytest.mark.parametrize("labels", [[0, 1, 2, 1, 0, 2], ["dog", "cat", None, "bird", "dog", "cat"]])
def test_a_parquet_source_is_described_from_footers_and_label_chunks_only(tmp_path, labels):
    root = tmp_path / "pq"
    root.mkdir()
    for k in range(2):
        pq.write_table(_big_table(labels), root / f"part-{k}.parquet", row_group_size=2)
    f = fetcher()
    m = parquet_manifest(root, f)
    t = m.parquet
    assert m.sample_counts() == (2,) * 6
    sizes = {str(root / n): int(s) for n, s in zip(t.files, t.file_sizes)}
    assert min(sizes.values()) > 3 * TAIL_BYTES
    tails = [r for r in f.fs.reads if r[2] == sizes[r[0]]]
    assert sorted(r[0] for r in tails) == sorted(sizes)  # one read of each file's tail
    assert all(r[1] == sizes[r[0]] - TAIL_BYTES for r in tails)
    others = sorted((r[1], r[2]) for r in f.fs.reads if r not in tails)
    if isinstance(labels[0], int):
        assert others == [] and m.classes == ()
    else:
        assert others == sorted((int(a), int(b)) for a, b in t.ranges[:, 2:4].tolist())  # the label chunks
        assert m.classes == ("bird", "cat", "dog") and t.columns.string_labels
    images = [(int(a), int(b)) for a, b in t.ranges[:, :2].tolist()]
    assert not any(a < y and x < b for x, y in others for a, b in images), "an image column chunk was read"


def test_a_footer_longer_than_the_first_tail_read_takes_one_more_read(tmp_path):
    root = tmp_path / "pq"
    root.mkdir()
    n = 400  # a row group per row: a footer of ~87 KB, past the first read of 64 KiB
    pq.write_table(pa.table({"image": [payload(i) for i in range(n)], "label": [i % 5 for i in range(n)]}),
                   root / "many.parquet", row_group_size=1)
    data = (root / "many.parquet").read_bytes()
    footer_bytes = int.from_bytes(data[-8:-4], "little") + 8
    assert footer_bytes > TAIL_BYTES
    f = fetcher()
    m = parquet_manifest(root, f)
    size = len(data)
    assert [(a, b) for _, a, b in f.fs.reads] == [(size - TAIL_BYTES, size), (size - footer_bytes, size)]
    assert m.sample_counts() == (1,) * n and m.parquet.first_row.tolist() == list(range(n))
    assert m.parquet.footer(0) == (size - footer_bytes, data[size - footer_bytes:])


def test_string_labels_are_numbered_by_a_given_class_list(tmp_path):
    root = tmp_path / "pq"
    root.mkdir()
    pq.write_table(pa.table({"image": [payload(i) for i in range(3)], "label": ["cat", "dog", "cat"]}),
                   root / "a.parquet")
    m = parquet_manifest(root, classes=["ant", "cat", "dog"])
    assert m.classes == ("ant", "cat", "dog")
    with pytest.raises(ConfigError, match=r"class\(es\) \['dog'\] that the class list"):
        parquet_manifest(root, classes=["ant", "cat"])


def test_hugging_face_class_names_name_integer_labels(tmp_path):
    write_parquet(str(tmp_path / "hf"), [5], layout="hf", row_group_rows=2)
    m = parquet_manifest(tmp_path / "hf")
    assert m.classes == ("c0", "c1", "c2") and m.parquet.columns.image_field == "bytes"
    assert parquet_manifest(tmp_path / "hf", classes=("c0", "c1", "c2")).classes == ("c0", "c1", "c2")
    with pytest.raises(ConfigError, match="names its integer labels"):
        parquet_manifest(tmp_path / "hf", classes=("x", "y", "z"))


def test_plain_integer_labels_take_the_names_given(tmp_path):
    write_parquet(str(tmp_path / "pq"), [4])
    assert parquet_manifest(tmp_path / "pq").classes == ()
    assert parquet_manifest(tmp_path / "pq", classes=["a", "b", "c"]).classes == ("a", "b", "c")


def test_a_file_that_is_not_parquet_is_refused_naming_it(tmp_path):
    write_parquet(str(tmp_path / "pq"), [4, 4])
    (tmp_path / "pq" / "part-001.parquet").write_bytes(b"PAR1" + b"\0" * 100)  # no trailer
    with pytest.raises(Exception, match="part-001.parquet") as err:
        parquet_manifest(tmp_path / "pq")
    assert "PAR1" in str(err.value)


# ------------------------------------------------------------------------------ checksums

@pytest.mark.parametrize("block_bytes", [8 << 20, 7])  # whole objects, and each one cut in blocks
def test_checksums_of_a_folder_are_each_objects_crc32(tmp_path, block_bytes):
    write_class_folder(str(tmp_path / "imgs"), 5)
    m = folder_manifest(tmp_path / "imgs")
    root = str(tmp_path / "imgs") + "/"
    urls = [root + n for n in m.objects.names]
    ticks = []
    checked = with_checksums(fetcher(FetchConfig(retries=0, block_bytes=block_bytes)), m, urls, ticks.append)
    assert checked.objects.crc32.tolist() == [zlib.crc32((tmp_path / "imgs" / n).read_bytes()) for n in m.objects.names]
    assert sum(ticks) == int(m.objects.sizes.sum())
    assert m.objects.crc32 is None  # the described manifest is left as it was
    assert list(checked.objects.names) == list(m.objects.names) and checked.classes == m.classes
    assert Manifest.from_json(checked.to_json()).objects == checked.objects  # kept through index.json


@pytest.mark.parametrize("block_bytes", [8 << 20, 50])
def test_checksums_of_parquet_cover_the_bytes_the_stream_reads_per_row_group(tmp_path, block_bytes):
    write_parquet(str(tmp_path / "pq"), [6, 3], row_group_rows=2)
    m = parquet_manifest(tmp_path / "pq")
    t = m.parquet
    urls = [str(tmp_path / "pq" / t.files[int(f)]) for f in t.file]  # the file of each unit
    ticks = []
    checked = with_checksums(fetcher(FetchConfig(retries=0, block_bytes=block_bytes)), m, urls, ticks.append)
    expected = []
    for g in range(len(t)):
        data = (tmp_path / "pq" / t.files[int(t.file[g])]).read_bytes()
        crc = 0
        for a, b in t.byte_ranges(g):
            crc = zlib.crc32(data[a:b], crc)
        expected.append(crc)
    assert checked.parquet.crc32.tolist() == expected and len(set(expected)) == len(t)
    assert sum(ticks) == sum(b - a for g in range(len(t)) for a, b in t.byte_ranges(g))
    assert Manifest.from_json(checked.to_json()).parquet.crc32.tolist() == expected


def test_checksums_of_an_object_that_went_missing_fail_naming_it(tmp_path):
    write_class_folder(str(tmp_path / "imgs"), 4)
    m = folder_manifest(tmp_path / "imgs")
    urls = [str(tmp_path / "imgs" / n) for n in m.objects.names]
    (tmp_path / "imgs" / "c1" / "img00001.jpg").unlink()
    with pytest.raises(StorageError, match="img00001.jpg"):
        with_checksums(fetcher(), m, urls)
