"""Targets read in place: an image folder with its COCO file, and Parquet target columns —
resolved, read by the worker-side readers into samples with ``json`` / ``mask.png`` members,
and written by ``gpupipe ingest`` into shards whose members parse back to the same boxes."""
from __future__ import annotations

import io
import json
import pickle
import uuid

import fsspec
import numpy as np
import pytest

from gpupipe.core.errors import ConfigError
from gpupipe.formats.annotations import parse_boxes
from gpupipe.formats.manifest import Manifest
from gpupipe.formats.tar import group_by_key, iter_members
from gpupipe.plan import Span
from gpupipe.prepare.ingest import ingest
from gpupipe.sources.source import Source, resolve
from gpupipe.storage.fetch import FetchConfig, Fetcher
from gpupipe.stream.readers import object_spans, rowgroup_spans

PIL = pytest.importorskip("PIL.Image")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

CATEGORIES = [{"id": 18, "name": "dog"}, {"id": 1, "name": "person"}, {"id": 3, "name": "car"}]
CLASSES = ("person", "car", "dog")  # sorted by category id


def jpeg(w: int, h: int, seed: int) -> bytes:
    buf = io.BytesIO()
    PIL.new("RGB", (w, h), (seed * 40 % 256, 90, 10)).save(buf, "JPEG")
    return buf.getvalue()


def coco_doc(n: int) -> dict:
    """``n`` images ``<i>.jpg`` of 32 x 24: image i has i % 3 boxes (one a crowd, dropped, when i is 4)."""
    images = [{"id": 100 + i, "file_name": f"{i:012d}.jpg", "width": 32, "height": 24} for i in range(n)]
    anns = []
    for i in range(n):
        for k in range(i % 3):
            x, y = 1.5 + k + i / 7, 2 + k / 3
            anns.append({"id": 1000 + 10 * i + k, "image_id": 100 + i, "bbox": [x, y, 4.1 + k, 3.3],
                         "category_id": CATEGORIES[(i + k) % 3]["id"], "iscrowd": 0,
                         "segmentation": [[x, y, x + 4, y, x + 4, y + 3, x, y + 3]]})
    anns.append({"id": 9, "image_id": 100 + min(4, n - 1), "bbox": [0, 0, 9, 9], "category_id": 1, "iscrowd": 1,
                 "segmentation": {"counts": [0, 81], "size": [24, 32]}})
    return {"images": images, "annotations": anns, "categories": CATEGORIES}


def expected(doc: dict) -> dict[str, tuple[np.ndarray, list[int]]]:
    """key -> (float32 xyxy boxes, labels) as the source must give them."""
    label = {c["id"]: CLASSES.index(c["name"]) for c in CATEGORIES}
    out = {im["file_name"][:-4]: ([], []) for im in doc["images"]}
    key = {im["id"]: im["file_name"][:-4] for im in doc["images"]}
    for a in doc["annotations"]:
        if a["iscrowd"]:
            continue
        x, y, w, h = a["bbox"]
        out[key[a["image_id"]]][0].append([x, y, x + w, y + h])
        out[key[a["image_id"]]][1].append(label[a["category_id"]])
    return {k: (np.array(b, dtype=np.float64).reshape(-1, 4).astype(np.float32), lab) for k, (b, lab) in out.items()}


def write_coco(url: str, n: int = 6, *, where: str = "inside", storage_options: dict | None = None) -> dict:
    """``url/<i>.jpg`` and the COCO file: ``inside`` the folder (``instances_x.json``), ``beside``
    it (``<parent>/annotations/instances_<folder>.json``) or ``custom`` (``<parent>/my.json``)."""
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    root = root.rstrip("/")
    fs.makedirs(root, exist_ok=True)
    doc = coco_doc(n)
    for i in range(n):
        fs.pipe_file(f"{root}/{i:012d}.jpg", jpeg(32, 24, i))
    parent, name = root.rsplit("/", 1)
    path = {"inside": f"{root}/instances_x.json", "beside": f"{parent}/annotations/instances_{name}.json",
            "custom": f"{parent}/my.json"}[where]
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, json.dumps(doc).encode())
    return doc


def local_fetcher() -> Fetcher:
    return Fetcher(fsspec.filesystem("file"), FetchConfig(retries=0))


def samples_of(reads) -> list:
    out = []
    for read in reads:
        assert not read.problems, read.problems
        out.extend(read.samples)
    return out


def check_boxes(samples, want) -> None:
    assert sorted(s.key for s in samples) == sorted(want)
    for s in samples:
        boxes, labels = parse_boxes(s.fields["json"], s.key, len(CLASSES))
        assert boxes.tobytes() == want[s.key][0].tobytes(), s.key  # bit-exact float32
        assert labels.tolist() == want[s.key][1], s.key


# ------------------------------------------------------------------------------ COCO image folder

@pytest.mark.parametrize("where", ["inside", "beside"])
def test_folder_with_coco_gives_each_image_its_boxes(tmp_path, where):
    doc = write_coco(str(tmp_path / "val2017"), where=where)
    src = resolve(Source(str(tmp_path / "val2017"), targets="boxes"))
    assert src.manifest.classes == CLASSES and src.targets == ("boxes",)
    assert src.manifest.objects.labels.tolist() == [-1] * 6
    assert not src.skipped  # instances_x.json is not reported as a stray file
    spans = [Span(i, 0, 1) for i in (5, 0, 3, 1, 2, 4)]
    samples = samples_of(object_spans(local_fetcher(), src, spans))
    assert [s.key for s in samples] == [f"{i:012d}" for i in (5, 0, 3, 1, 2, 4)]
    assert all("cls" not in s.fields and "jpg" in s.fields and "mask.png" not in s.fields for s in samples)
    check_boxes(samples, expected(doc))
    assert parse_boxes(samples[1].fields["json"], "x")[0].shape == (0, 4)  # image 0 has no boxes


def test_masks_come_with_their_images_at_the_image_size(tmp_path):
    write_coco(str(tmp_path / "imgs"), n=3, where="custom")
    src = resolve(Source(str(tmp_path / "imgs"), targets="boxes+masks", annotations=str(tmp_path / "my.json")))
    (sample,) = samples_of(object_spans(local_fetcher(), src, [Span(2, 0, 1)]))
    mask = np.asarray(PIL.open(io.BytesIO(sample.fields["mask.png"])))
    assert mask.shape == (24, 32) and set(np.unique(mask).tolist()) == {0, 2, 3}  # car (1) + 1, dog (2) + 1
    assert len(parse_boxes(sample.fields["json"], "k")[0]) == 2


def test_without_targets_the_folder_is_read_as_before(tmp_path):
    write_coco(str(tmp_path / "imgs"))
    src = resolve(Source(str(tmp_path / "imgs")))
    assert src.annotations is None and src.targets == ()
    (sample,) = samples_of(object_spans(local_fetcher(), src, [Span(0, 0, 1)]))
    assert set(sample.fields) == {"jpg"}


def test_the_resolved_source_pickles_compactly_for_workers(tmp_path):
    write_coco(str(tmp_path / "imgs"), n=30)
    src = resolve(Source(str(tmp_path / "imgs"), targets="boxes"))
    back = pickle.loads(pickle.dumps(src))
    assert back.annotations.boxes.tobytes() == src.annotations.boxes.tobytes()
    assert len(pickle.dumps(src.annotations)) < 6000


def test_an_index_json_does_not_stop_the_coco_file_being_read(tmp_path, caplog):
    from gpupipe.prepare.indexer import index_in_place as index

    doc = write_coco(str(tmp_path / "imgs"))
    index(str(tmp_path / "imgs"), progress=False)
    caplog.clear()
    src = resolve(Source(str(tmp_path / "imgs"), targets="boxes"))
    assert "no index.json" not in caplog.text  # described by the index
    check_boxes(samples_of(object_spans(local_fetcher(), src, [Span(i, 0, 1) for i in range(6)])), expected(doc))


def test_no_coco_file_says_where_it_looked_and_how_to_name_one(tmp_path):
    write_coco(str(tmp_path / "imgs"), where="custom")
    with pytest.raises(ConfigError, match=r"imgs/instances_\*\.json and .*annotations/instances_imgs\.json.*"
                                          r"annotations:"):
        resolve(Source(str(tmp_path / "imgs"), targets="boxes"))
    with pytest.raises(ConfigError, match="nope.json does not exist"):
        resolve(Source(str(tmp_path / "imgs"), targets="boxes", annotations=str(tmp_path / "nope.json")))


def test_two_coco_files_in_the_folder_ask_which(tmp_path):
    write_coco(str(tmp_path / "imgs"))
    (tmp_path / "imgs" / "instances_y.json").write_text("{}")
    with pytest.raises(ConfigError, match="holds 2 COCO files.*annotations:"):
        resolve(Source(str(tmp_path / "imgs"), targets="boxes"))


def test_images_and_annotations_that_do_not_match_the_folder_are_named(tmp_path):
    write_coco(str(tmp_path / "imgs"))
    (tmp_path / "imgs" / "stray.jpg").write_bytes(jpeg(8, 8, 1))
    with pytest.raises(ConfigError, match=r"not in .*instances_x.json \(stray.jpg\)"):
        resolve(Source(str(tmp_path / "imgs"), targets="boxes"))
    (tmp_path / "imgs" / "stray.jpg").unlink()
    (tmp_path / "imgs" / "000000000003.jpg").unlink()
    with pytest.raises(ConfigError, match=r"lists 1 image\(s\) that are not images in .*\(000000000003.jpg\)"):
        resolve(Source(str(tmp_path / "imgs"), targets="boxes"))


def test_a_coco_folder_must_be_flat_and_takes_no_labels_file(tmp_path):
    write_coco(str(tmp_path / "imgs" / "sub"), where="custom")
    with pytest.raises(ConfigError, match="in sub-folders.*top level"):
        resolve(Source(str(tmp_path / "imgs"), targets="boxes", annotations=str(tmp_path / "imgs" / "my.json")))
    write_coco(str(tmp_path / "flat"))
    (tmp_path / "flat" / "labels.csv").write_text("file,label\n")
    with pytest.raises(ConfigError, match="Leave source.labels out"):
        resolve(Source(str(tmp_path / "flat"), targets="boxes", labels=str(tmp_path / "flat" / "labels.csv")))


def test_a_bad_annotation_fails_at_resolve_naming_image_and_annotation(tmp_path):
    from gpupipe.core.errors import ShardFormatError

    doc = write_coco(str(tmp_path / "imgs"))
    doc["annotations"][2]["bbox"] = [1, 1, -2, 3]
    (tmp_path / "imgs" / "instances_x.json").write_text(json.dumps(doc))
    a = doc["annotations"][2]
    with pytest.raises(ShardFormatError, match=rf"annotation {a['id']} of image '{a['image_id'] - 100:012d}.jpg'"):
        resolve(Source(str(tmp_path / "imgs"), targets="boxes"))


# ------------------------------------------------------------------------------ Parquet

def box_rows(ids: list[int]) -> tuple[list, list, list]:
    """Per row: boxes (xyxy lists, i % 3 of them), their labels, a mask PNG."""
    boxes, labels, masks = [], [], []
    for i in ids:
        boxes.append([[0.5 + k + i / 9, 1.25, 3.7 + k + i / 9, 5.0 + k] for k in range(i % 3)])
        labels.append([(i + k) % 3 for k in range(i % 3)])
        buf = io.BytesIO()
        PIL.fromarray(np.full((24, 32), i % 3, dtype=np.uint8), mode="L").save(buf, "PNG")
        masks.append(buf.getvalue())
    return boxes, labels, masks


def write_parquet_targets(url: str, counts=(5, 4), *, flat: bool = False, float_type=None, drop: str = "",
                          storage_options: dict | None = None) -> dict:
    """``part-<k>.parquet`` with image, label, boxes, box_labels, mask columns (``drop``: one left out).
    Returns key -> (float32 boxes, labels, mask bytes)."""
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    root = root.rstrip("/")
    fs.makedirs(root, exist_ok=True)
    float_type = float_type or pa.float64()
    start, want = 0, {}
    for k, n in enumerate(counts):
        ids = list(range(start, start + n))
        start += n
        boxes, labels, masks = box_rows(ids)
        cells = [[v for b in bs for v in b] for bs in boxes] if flat else boxes
        btype = pa.list_(float_type) if flat else pa.list_(pa.list_(float_type))
        cols = {"image": pa.array([jpeg(32, 24, i) for i in ids], pa.binary()), "label": pa.array(
            [i % 3 for i in ids], pa.int64()), "boxes": pa.array(cells, btype),
                "caption": [f"row {i}" for i in ids], "box_labels": pa.array(labels, pa.list_(pa.int64())),
                "mask": pa.array(masks, pa.binary())}
        cols.pop(drop, None)
        with fs.open(f"{root}/part-{k:03d}.parquet", "wb") as f:
            pq.write_table(pa.table(cols), f, row_group_size=3)
        for r, (b, lab, m) in enumerate(zip(boxes, labels, masks)):
            arr = np.array(b, dtype=np.float64).astype(float_type.to_pandas_dtype()).reshape(-1, 4)
            want[f"part-{k:03d}.parquet/{r}"] = (arr.astype(np.float32), lab, m)
    return want


def parquet_samples(fetcher, src) -> list:
    t = src.manifest.parquet
    spans = [Span(g, 0, int(t.rows[g])) for g in range(len(t))]
    return samples_of(rowgroup_spans(fetcher, src, spans))


@pytest.mark.parametrize(("flat", "float_type"), [(False, "float64"), (True, "float32")])
def test_parquet_target_columns_become_json_and_mask_members(tmp_path, flat, float_type):
    want = write_parquet_targets(str(tmp_path / "pq"), flat=flat, float_type=getattr(pa, float_type)())
    src = resolve(Source(str(tmp_path / "pq"), targets="boxes+masks"))
    assert src.manifest.parquet.columns.targets == ("boxes", "box_labels", "mask")
    samples = parquet_samples(local_fetcher(), src)
    check_boxes(samples, {k: v[:2] for k, v in want.items()})
    assert all(s.fields["mask.png"] == want[s.key][2] for s in samples)
    assert all("cls" in s.fields for s in samples)  # the image's label column is still read


def test_parquet_target_chunks_are_fetched_by_range_with_the_image_chunk(tmp_path):
    from fsspec.implementations.local import LocalFileSystem

    class Noting(LocalFileSystem):
        reads: list = []

        def cat_file(self, path, start=None, end=None, **kw):
            self.reads.append((path, start, end))
            return super().cat_file(path, start=start, end=end, **kw)

    write_parquet_targets(str(tmp_path / "pq"), counts=(6,))
    src = resolve(Source(str(tmp_path / "pq"), targets="boxes"))
    t = src.manifest.parquet
    fs = Noting(skip_instance_cache=True)
    parquet_samples(Fetcher(fs, FetchConfig(retries=0, block_bytes=1 << 20)), src)
    size = int(t.file_sizes[0])
    assert fs.reads and all(a is not None and b is not None and b - a < size for _, a, b in fs.reads)
    fetched = [(a, b) for _, a, b in fs.reads]
    for g in range(len(t)):
        for k in range(0, t.ranges.shape[1], 2):  # image, label, boxes, box_labels chunks: each inside a read
            a, b = (int(v) for v in t.ranges[g, k:k + 2])
            assert a < 0 or any(lo <= a and b <= hi for lo, hi in fetched), (g, k)
    assert t.ranges.shape[1] == 8  # the mask column is not read for boxes alone
    # exactly the planned ranges, no read past them (pyarrow asking for a chunk not fetched reads it apart)
    assert sorted(fetched) == sorted(r for g in range(len(t)) for r in t.byte_ranges(g))


def test_parquet_index_written_without_targets_still_reads_them(tmp_path, caplog):
    from gpupipe.prepare.indexer import index_in_place as index

    want = write_parquet_targets(str(tmp_path / "pq"))
    index(str(tmp_path / "pq"), progress=False)
    caplog.clear()
    src = resolve(Source(str(tmp_path / "pq"), targets="boxes"))
    assert "no index.json" not in caplog.text and src.manifest.parquet.columns.targets == ("boxes", "box_labels")
    check_boxes(parquet_samples(local_fetcher(), src), {k: v[:2] for k, v in want.items()})
    text = src.manifest.to_json()  # an index written with targets reads back the same
    assert Manifest.from_json(text).parquet.columns == src.manifest.parquet.columns


@pytest.mark.parametrize(("drop", "kinds"), [("boxes", "boxes"), ("box_labels", "boxes"), ("mask", "masks")])
def test_a_missing_target_column_is_named_with_its_file(tmp_path, drop, kinds):
    write_parquet_targets(str(tmp_path / "pq"), drop=drop)
    with pytest.raises(ConfigError, match=rf"part-000.parquet has no '{drop}' column"):
        resolve(Source(str(tmp_path / "pq"), targets=kinds))


def test_a_bad_parquet_row_is_a_problem_naming_its_sample(tmp_path):
    fs, root = fsspec.core.url_to_fs(str(tmp_path / "pq"))
    fs.makedirs(root, exist_ok=True)
    rows = [([[1, 1, 2, 2]], [0]), ([[1, 1, 0, 2]], [0]), ([[1, 1, 2, 2]], [0, 1]), (None, []),
            ([[1, 1, 2, float("inf")]], [0]), ([[1, 1, 2, 2]], [7]), ([], [])]
    table = pa.table({"image": [jpeg(8, 8, i) for i in range(len(rows))], "label": [0] * len(rows),
                      "boxes": pa.array([r[0] for r in rows], pa.list_(pa.list_(pa.float32()))),
                      "box_labels": pa.array([r[1] for r in rows], pa.list_(pa.int32()))})
    pq.write_table(table, f"{root}/part-000.parquet")
    src = resolve(Source(str(tmp_path / "pq"), targets="boxes", classes=["a", "b", "c"]))
    (read,) = rowgroup_spans(local_fetcher(), src, [Span(0, 0, len(rows))])
    assert [s is not None for s in read.samples] == [True, False, False, False, False, False, True]
    why = {i: e.reason for i, e in read.problems.items()}
    assert "part-000.parquet/1" in why[1] and "negative width or height" in why[1]
    assert "1 boxes and 2 box_labels" in why[2]
    assert "boxes cell is null" in why[3]
    assert "four finite numbers" in why[4]
    assert "box label 7 is not a class index (0..2)" in why[5]


# ------------------------------------------------------------------------------ ingest round trip

def shard_samples(url: str) -> dict[str, dict[str, bytes]]:
    fs, root = fsspec.core.url_to_fs(url)
    manifest = Manifest.from_json(fs.cat_file(f"{root}/index.json"))
    out = {}
    for shard in manifest.shards:
        data = fs.cat_file(f"{root}/{shard.name}")
        for s in group_by_key(iter_members([data], shard=shard.name), shard=shard.name):
            out[s.key] = dict(s.fields)
    return out


def test_ingest_of_a_coco_folder_writes_json_and_mask_members_exactly(tmp_path):
    doc = write_coco(str(tmp_path / "val2017"), where="beside")
    report = ingest(str(tmp_path / "val2017"), str(tmp_path / "out"), shard_size=4, workers=2, progress=False,
                    targets="boxes,masks")
    assert report.num_samples == 6 and not report.skipped and report.classes == CLASSES
    got = shard_samples(str(tmp_path / "out"))
    want = expected(doc)
    for key, fields in got.items():
        assert set(fields) == {"jpg", "json", "mask.png"}, key  # no cls: a detection image has no one class
        boxes, labels = parse_boxes(fields["json"], key, len(CLASSES))
        assert boxes.tobytes() == want[key][0].tobytes() and labels.tolist() == want[key][1]
        assert np.asarray(PIL.open(io.BytesIO(fields["mask.png"]))).shape == (24, 32)
    assert sorted(got) == sorted(want)
    assert (tmp_path / "out" / "classes.txt").read_text().split() == list(CLASSES)


def test_ingest_of_parquet_with_targets_round_trips(tmp_path):
    want = write_parquet_targets(str(tmp_path / "pq"), flat=True)
    report = ingest(str(tmp_path / "pq"), str(tmp_path / "out"), shard_size=4, workers=2, progress=False,
                    targets="boxes+masks")
    assert report.num_samples == len(want) and not report.skipped
    got = shard_samples(str(tmp_path / "out"))
    assert sorted(got) == sorted(want)
    for key, fields in got.items():
        assert set(fields) == {"jpg", "cls", "json", "mask.png"}, key
        boxes, labels = parse_boxes(fields["json"], key)
        assert boxes.tobytes() == want[key][0].tobytes() and labels.tolist() == want[key][1]
        assert fields["mask.png"] == want[key][2]


# ------------------------------------------------------------------------------ loopback S3

def test_coco_folder_and_parquet_targets_from_s3(s3_bucket):
    opts = s3_bucket.storage_options
    doc = write_coco(s3_bucket.url("coco/val2017"), n=4, where="beside", storage_options=opts)
    src = resolve(Source(s3_bucket.url("coco/val2017/"), opts, targets="boxes"))
    fetcher = Fetcher.for_url(src.shard_urls[0], opts)
    check_boxes(samples_of(object_spans(fetcher, src, [Span(i, 0, 1) for i in range(4)])), expected(doc))
    want = write_parquet_targets(s3_bucket.url("pq"), counts=(4,), storage_options=opts)
    src = resolve(Source(s3_bucket.url("pq/"), opts, targets="boxes"))
    check_boxes(parquet_samples(Fetcher.for_url(src.shard_urls[0], opts), src), {k: v[:2] for k, v in want.items()})


def test_memory_filesystem_coco_folder():
    url = f"memory://coco-{uuid.uuid4().hex}/train2017"
    doc = write_coco(url, n=3)
    src = resolve(Source(url, targets="boxes"))
    fetcher = Fetcher.for_url(src.shard_urls[0], {})
    check_boxes(samples_of(object_spans(fetcher, src, [Span(i, 0, 1) for i in range(3)])), expected(doc))


def test_an_rle_mask_is_a_problem_for_its_sample_and_a_listed_skip_in_ingest(tmp_path):
    doc = write_coco(str(tmp_path / "imgs"), n=3)
    doc["annotations"][0]["segmentation"] = {"counts": "xyz", "size": [24, 32]}  # image 1's, not a crowd
    (tmp_path / "imgs" / "instances_x.json").write_text(json.dumps(doc))
    src = resolve(Source(str(tmp_path / "imgs"), targets="masks"))
    reads = list(object_spans(local_fetcher(), src, [Span(i, 0, 1) for i in range(3)]))
    assert [0 not in r.problems for r in reads] == [True, False, True]  # image 1: its key alone, and why
    assert (reads[1].samples[0].key, reads[1].samples[0].fields) == ("000000000001", {})
    assert "'000000000001.jpg'" in reads[1].problems[0].reason and "RLE" in reads[1].problems[0].reason
    assert set(reads[0].samples[0].fields) == {"jpg", "mask.png"}
    report = ingest(str(tmp_path / "imgs"), str(tmp_path / "out"), workers=1, progress=False, targets="masks")
    assert report.num_samples == 2 and len(report.skipped) == 1 and "RLE" in report.skipped[0][1]


def test_gpupipe_ingest_cli_takes_targets_and_annotations(tmp_path, capsys):
    from gpupipe.tools.cli import main

    doc = write_coco(str(tmp_path / "imgs"), n=3, where="custom")
    assert main(["ingest", str(tmp_path / "imgs"), str(tmp_path / "out"), "--targets", "boxes", "--annotations",
                 str(tmp_path / "my.json"), "--quiet"]) == 0
    assert "3 samples" in capsys.readouterr().out
    got = shard_samples(str(tmp_path / "out"))
    assert all(set(f) == {"jpg", "json"} for f in got.values())
    want = expected(doc)
    assert all(parse_boxes(f["json"], k)[0].tobytes() == want[k][0].tobytes() for k, f in got.items())


def test_flat_parquet_boxes_need_four_values_a_box(tmp_path):
    fs, root = fsspec.core.url_to_fs(str(tmp_path / "pq"))
    fs.makedirs(root, exist_ok=True)
    rows = [([1, 1, 2, 2, 3, 3, 4, 4], [0, 1]), ([1, 1, 2, 2, 3], [0]), ([1, None, 2, 2], [0])]
    table = pa.table({"image": [jpeg(8, 8, i) for i in range(3)],
                      "boxes": pa.array([r[0] for r in rows], pa.list_(pa.float64())),
                      "box_labels": pa.array([r[1] for r in rows], pa.list_(pa.int64()))})
    pq.write_table(table, f"{root}/part-000.parquet")
    src = resolve(Source(str(tmp_path / "pq"), targets="boxes"))
    (read,) = rowgroup_spans(local_fetcher(), src, [Span(0, 0, 3)])
    assert parse_boxes(read.samples[0].fields["json"], "k")[0].tolist() == [[1, 1, 2, 2], [3, 3, 4, 4]]
    assert sorted(read.problems) == [1, 2] and all("four finite numbers" in e.reason for e in read.problems.values())


def test_image_folders_with_coco_files_mix_with_each_image_keeping_its_boxes(tmp_path):
    """Two COCO folders in one mix (issue 35): each image's boxes from its own folder's file, in
    place, labels numbered as the mix's class list."""
    from gpupipe.loader.encoded import EncodedLoader

    docs = [write_coco(str(tmp_path / "a"), n=6), write_coco(str(tmp_path / "b"), n=4)]
    for a in docs[1]["annotations"]:  # b's boxes other than a's for the same file names
        a["bbox"] = [a["bbox"][0] + 1, a["bbox"][1] + 2, a["bbox"][2], a["bbox"][3]]
    (tmp_path / "b" / "instances_x.json").write_text(json.dumps(docs[1]))
    want = [expected(d) for d in docs]
    assert want[0]["000000000001"][0].tobytes() != want[1]["000000000001"][0].tobytes()
    loader = EncodedLoader([{"url": str(tmp_path / "a")}, {"url": str(tmp_path / "b")}], batch_size=5,
                           num_workers=0, targets="boxes", drop_last=False, classes=list(CLASSES))
    seen = 0
    for batch in loader:
        t = batch.targets
        ends = np.cumsum([0] + t.box_counts.tolist())
        for i, (key, sid) in enumerate(zip(batch.keys, batch.sample_ids.tolist())):
            boxes, labels = want[int(sid >= 6)][key]
            got = t.boxes[ends[i]:ends[i + 1]].numpy()
            assert got.tobytes() == boxes.tobytes() and t.box_labels[ends[i]:ends[i + 1]].tolist() == labels, key
            seen += 1
    assert seen == 10 and loader.stats.per_source == [6, 4]
