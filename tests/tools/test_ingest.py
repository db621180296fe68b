"""ingest / index / inspect on tiny generated datasets, in tmp_path and in memory://."""
from __future__ import annotations

import hashlib
import io
import logging
import random
import time
import uuid

import fsspec
import pytest

from gpupipe.core.errors import ConfigError, StorageError
from gpupipe.formats.manifest import MANIFEST_NAME, Manifest
from gpupipe.formats.tar import group_by_key, iter_members
from gpupipe.plan import shuffle_buffer
from gpupipe.prepare.indexer import index
from gpupipe.prepare.ingest import ingest
from gpupipe.prepare.tasks import _ordered_map
from gpupipe.tools.sourceinfo import inspect

PIL = pytest.importorskip("PIL.Image")
CLASSES = ("cat", "dog", "eel")
FORMATS = (("JPEG", "jpg"), ("PNG", "png"), ("WEBP", "webp"), ("JPEG", "jpeg"), ("GIF", "gif"), ("BMP", "bmp"))
FIELD_OF = {"jpg": "jpg", "jpeg": "jpg", "png": "png", "webp": "webp", "gif": "gif", "bmp": "bmp"}


def encode(fmt: str, size: tuple[int, int], seed: int) -> bytes:
    rng = random.Random(seed)
    img = PIL.new("RGB", size, tuple(rng.randrange(256) for _ in range(3)))
    img.putpixel((0, 0), (seed % 256, 0, 0))
    buf = io.BytesIO()
    img.save(buf, fmt)
    return buf.getvalue()


@pytest.fixture
def memroot():
    """A fresh memory:// folder URL, removed afterwards."""
    url = f"memory://gpupipe-test-{uuid.uuid4().hex}"
    yield url
    fs = fsspec.filesystem("memory")
    path = fs._strip_protocol(url)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def make_image_folder(url: str) -> tuple[dict[bytes, str], set[str]]:
    """3 classes x 6 good images (all formats) plus 4 bad files.
    Returns ({image bytes: class}, {bad file paths as the filesystem names them})."""
    fs, root = fsspec.core.url_to_fs(url)
    good, bad = {}, set()
    for c, name in enumerate(CLASSES):
        fs.makedirs(f"{root}/{name}", exist_ok=True)
        for i, (fmt, ext) in enumerate(FORMATS):
            data = encode(fmt, (8 + 4 * i, 8 + 3 * c), seed=10 * c + i)
            fs.pipe_file(f"{root}/{name}/img.{i}.{ext}", data)
            good[data] = name
    jpeg = encode("JPEG", (16, 16), seed=99)
    for path, data in {f"{root}/cat/corrupt.jpg": jpeg[:30], f"{root}/dog/empty.jpg": b"",
                       f"{root}/dog/page.jpg": b"<!DOCTYPE html><html><body>Not found</body></html>",
                       f"{root}/eel/notes.txt": b"some notes"}.items():
        fs.pipe_file(path, data)
        bad.add(path)
    return good, bad


def read_by_offsets(url: str) -> tuple[Manifest, list]:
    """Every sample, each read by its own byte range from the manifest's offsets."""
    fs, root = fsspec.core.url_to_fs(url)
    manifest = Manifest.from_json(fs.cat_file(f"{root}/{MANIFEST_NAME}"))
    samples = []
    for entry in manifest.shards:
        path = f"{root}/{entry.name}"
        for i in range(entry.num_samples):
            start, end = entry.byte_range(i, i + 1)
            got = list(group_by_key(iter_members([fs.cat_file(path, start=start, end=end)], base_offset=start)))
            assert len(got) == 1 and got[0].offset == start
            samples.append(got[0])
    return manifest, samples


def check_image_folder_result(report, dst: str, good: dict[bytes, str], bad: set[str]) -> None:
    manifest, samples = read_by_offsets(dst)
    assert report.num_samples == manifest.num_samples == len(samples) == len(good)
    assert report.classes == manifest.classes == CLASSES
    assert report.num_shards == len(manifest.shards) and report.bytes == manifest.total_bytes
    assert {path for path, _ in report.skipped} == bad and all(reason for _, reason in report.skipped)
    seen = {}
    for s in samples:
        (image_field,) = set(s.fields) - {"cls"}
        assert image_field in FIELD_OF.values() and "." not in s.key.rsplit("/", 1)[1]
        class_name = good[s.fields[image_field]]
        assert s.key.split("/")[0] == class_name
        assert int(s.fields["cls"]) == CLASSES.index(class_name)
        seen[s.fields[image_field]] = s.key
    assert set(seen) == set(good) and len(set(seen.values())) == len(good)


def test_ingest_image_folder_local(tmp_path, caplog):
    good, bad = make_image_folder(str(tmp_path / "src"))
    with caplog.at_level(logging.WARNING, logger="gpupipe.prepare.ingest"):
        report = ingest(str(tmp_path / "src"), str(tmp_path / "out"), shard_size=5, progress=False)
    check_image_folder_result(report, str(tmp_path / "out"), good, bad)
    # a task a shard: 5 inputs of the plan each (the bad ones among them), so skips leave shorter shards
    assert report.num_shards == report.tasks == 5 and sum(report.task_samples) == 18
    assert "5 tasks, 1-5 samples each" in report.summary()
    for path in bad:
        assert path in caplog.text  # every skip is logged, not only listed
    assert (tmp_path / "out" / "classes.txt").read_text().split() == list(CLASSES)
    assert "4 skipped" in report.summary() and "page.jpg" in report.summary()


def test_ingest_memory_filesystem(memroot):
    good, bad = make_image_folder(f"{memroot}/src")
    report = ingest(f"{memroot}/src", f"{memroot}/out", shard_size=7, workers=3, progress=False)
    check_image_folder_result(report, f"{memroot}/out", good, bad)


def test_manifest_offsets_match_streamed_shards(tmp_path):
    make_image_folder(str(tmp_path / "src"))
    ingest(str(tmp_path / "src"), str(tmp_path / "out"), shard_size=8, progress=False)
    manifest, by_range = read_by_offsets(str(tmp_path / "out"))
    streamed = []
    for entry in manifest.shards:
        data = (tmp_path / "out" / entry.name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry.sha256 and len(data) == entry.size
        streamed.extend(group_by_key(iter_members([data])))
    assert [(s.key, s.offset, dict(s.fields)) for s in streamed] == [
        (s.key, s.offset, dict(s.fields)) for s in by_range]


def shard_digests(path) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.glob("*.tar"))]


def test_ingest_is_deterministic(tmp_path):
    make_image_folder(str(tmp_path / "src"))
    runs = {}
    for name, seed, shuffle in (("a", 7, True), ("b", 7, True), ("c", 8, True), ("d", 0, False)):
        ingest(str(tmp_path / "src"), str(tmp_path / name), seed=seed, shuffle=shuffle, shard_size=5,
               workers=4, progress=False)
        runs[name] = [s.key for s in read_by_offsets(str(tmp_path / name))[1]]
    assert shard_digests(tmp_path / "a") == shard_digests(tmp_path / "b")
    assert (tmp_path / "a" / MANIFEST_NAME).read_bytes() == (tmp_path / "b" / MANIFEST_NAME).read_bytes()
    assert runs["a"] != runs["c"] and sorted(runs["a"]) == sorted(runs["c"])
    assert runs["d"] == sorted(runs["d"])  # sorted source order (a key is the path without its extension)


def split_images(dst) -> dict[str, set[bytes]]:
    """The image bytes in each split under ``dst``, read by the manifests' offsets."""
    out = {}
    for split in ("train", "val"):
        manifest, samples = read_by_offsets(str(dst / split))
        assert manifest.classes == CLASSES and (dst / split / "classes.txt").read_text().split() == list(CLASSES)
        out[split] = {s.fields[f] for s in samples for f in s.fields if f != "cls"}
        assert len(out[split]) == len(samples) == manifest.num_samples
    return out


def test_val_fraction_carves_a_deterministic_split(tmp_path, capsys):
    from gpupipe.prepare.ingest import in_val_split
    from gpupipe.tools.cli import main

    good, _ = make_image_folder(str(tmp_path / "src"))
    report = ingest(str(tmp_path / "src"), str(tmp_path / "a"), val_fraction=0.2, seed=5, shard_size=4, progress=False)
    first = split_images(tmp_path / "a")
    assert first["train"] | first["val"] == set(good) and not first["train"] & first["val"]
    assert report.splits == {"train": len(first["train"]), "val": len(first["val"])} and first["val"]
    assert report.num_samples == len(good) and not (tmp_path / "a" / MANIFEST_NAME).exists()
    assert main(["ingest", str(tmp_path / "src"), str(tmp_path / "b"), "--val-fraction", "0.2", "--seed", "5",
                 "--quiet"]) == 0
    assert f"{tmp_path / 'b'}/train/index.json, {tmp_path / 'b'}/val/index.json" in capsys.readouterr().out
    assert split_images(tmp_path / "b") == first  # a second run: the same split
    (tmp_path / "src" / "cat" / "new.png").write_bytes(encode("PNG", (9, 9), seed=1234))
    ingest(str(tmp_path / "src"), str(tmp_path / "c"), val_fraction=0.2, seed=5, progress=False)
    grown = split_images(tmp_path / "c")
    assert first["train"] <= grown["train"] and first["val"] <= grown["val"]  # more files move none of the others
    keys = [f"class_{i % 7}/img_{i}.jpg" for i in range(20_000)]
    share = sum(in_val_split(k, 5, 0.2) for k in keys) / len(keys)
    assert 0.19 < share < 0.21 and [in_val_split(k, 6, 0.2) for k in keys] != [in_val_split(k, 5, 0.2) for k in keys]
    with pytest.raises(ConfigError, match=r"val_fraction must be in \[0, 1\)"):
        ingest(str(tmp_path / "src"), str(tmp_path / "d"), val_fraction=1.0, progress=False)


# ---------------------------------------------------------------- parquet


def write_parquet(url: str, table, row_group_size: int) -> None:
    import pyarrow.parquet as pq

    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "wb") as f:
        pq.write_table(table, f, row_group_size=row_group_size)


def test_parquet_binary_column_int_labels(tmp_path):
    pa = pytest.importorskip("pyarrow")
    images = [encode("JPEG", (8 + i, 9), seed=i) for i in range(11)]
    images[4] = b"GIF89a not really"  # corrupt
    labels = [i % 3 for i in range(11)]
    labels[6] = None
    for part, rows in (("a", range(0, 6)), ("b", range(6, 11))):
        table = pa.table({"id": list(rows), "img": pa.array([images[i] for i in rows], pa.binary()),
                          "label": pa.array([labels[i] for i in rows], pa.int64())})
        write_parquet(str(tmp_path / "pq" / f"part-{part}.parquet"), table, row_group_size=2)
    report = ingest(str(tmp_path / "pq"), str(tmp_path / "out"), shard_size=4, progress=False)
    manifest, samples = read_by_offsets(str(tmp_path / "out"))
    assert report.num_samples == len(samples) == 9 and report.classes == ()
    assert {(p.split("/pq/")[1], "GIF" in r or "null" in r) for p, r in report.skipped} == {
        ("part-a.parquet/4", True), ("part-b.parquet/0", True)}  # <file>/<row>, as the sample keys
    got = {s.fields["jpg"]: int(s.fields["cls"]) for s in samples}
    assert got == {images[i]: labels[i] for i in range(11) if i not in (4, 6)}
    by_glob = ingest(str(tmp_path / "pq" / "*.parquet"), str(tmp_path / "out2"), shard_size=4, progress=False)
    assert shard_digests(tmp_path / "out") == shard_digests(tmp_path / "out2") and by_glob.num_samples == 9


def test_parquet_string_labels_and_struct_column(memroot):
    pa = pytest.importorskip("pyarrow")
    names = ["zebra", "ant", "moth", "ant", "zebra", "moth", "ant"]
    images = [encode("PNG", (10, 8 + i), seed=i) for i in range(len(names))]
    image_col = pa.array([{"bytes": b, "path": f"photo.{i}.png"} for i, b in enumerate(images)],
                         pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    write_parquet(f"{memroot}/train.parquet", pa.table({"image": image_col, "class": names}), row_group_size=3)
    report = ingest(f"{memroot}/train.parquet", f"{memroot}/out", shard_size=3, progress=False)
    assert report.classes == ("ant", "moth", "zebra") and report.num_samples == 7 and not report.skipped
    _, samples = read_by_offsets(f"{memroot}/out")
    for s in samples:
        i = images.index(s.fields["png"])
        assert int(s.fields["cls"]) == report.classes.index(names[i])
        assert s.key == f"train.parquet/{i}"  # the key reading in place gives: <file>/<row>


def test_parquet_column_errors(tmp_path):
    pa = pytest.importorskip("pyarrow")
    write_parquet(str(tmp_path / "x.parquet"), pa.table({"text": ["a"], "label": [1]}), row_group_size=1)
    with pytest.raises(ConfigError, match="no image-bytes column"):
        ingest(str(tmp_path / "x.parquet"), str(tmp_path / "out"), progress=False)
    with pytest.raises(ConfigError, match="column 'pixels' of .* is missing"):
        ingest(str(tmp_path / "x.parquet"), str(tmp_path / "out"), image_column="pixels", progress=False)


def test_missing_source_and_bad_arguments(tmp_path):
    with pytest.raises(StorageError, match="no such folder") as info:
        ingest(str(tmp_path / "nope"), str(tmp_path / "out"), progress=False)
    assert isinstance(info.value, OSError)
    (tmp_path / "src" / "a").mkdir(parents=True)
    with pytest.raises(ConfigError, match="inside the source"):
        ingest(str(tmp_path / "src"), str(tmp_path / "src" / "shards"), progress=False)
    with pytest.raises(ConfigError, match="shard_size"):
        ingest(str(tmp_path / "src"), str(tmp_path / "out"), shard_size=0, progress=False)


def test_a_flat_folder_is_read_as_in_place(tmp_path, capsys, caplog):
    """A flat folder is read as the loader reads it in place (issue 24; ingest refused it):
    labelled by its labels.csv, else unlabelled -- no ``cls``, label -1 -- with a warning."""
    from gpupipe.tools.cli import main

    for i in range(3):
        (tmp_path / "flat" / "x").mkdir(parents=True, exist_ok=True)
        (tmp_path / "flat" / f"img{i}.jpg").write_bytes(encode("JPEG", (8, 8), seed=i))
    (tmp_path / "flat" / "x" / "notes.txt").write_text("not an image")
    with caplog.at_level(logging.WARNING):
        report = ingest(str(tmp_path / "flat"), str(tmp_path / "out"), progress=False)
    assert "without a labels file" in caplog.text and report.classes == ()
    assert [path.rsplit("/", 2)[1:] for path, _ in report.skipped] == [["x", "notes.txt"]]
    _, samples = read_by_offsets(str(tmp_path / "out"))
    assert sorted(s.key for s in samples) == ["img0", "img1", "img2"] and all("cls" not in s.fields for s in samples)
    (tmp_path / "flat" / "labels.csv").write_text("filename,label\nimg0.jpg,cat\nimg1.jpg,dog\nimg2,cat\n")
    assert main(["ingest", str(tmp_path / "flat"), str(tmp_path / "out2"), "--quiet"]) == 0
    assert "2 classes" in capsys.readouterr().out
    _, samples = read_by_offsets(str(tmp_path / "out2"))
    assert sorted((s.key, int(s.fields["cls"])) for s in samples) == [("img0", 0), ("img1", 1), ("img2", 0)]
    for i in range(3):
        (tmp_path / "flat" / f"img{i}.jpg").unlink()
    with pytest.raises(StorageError, match=r"no tar shards, images or .parquet files here"):
        ingest(str(tmp_path / "flat"), str(tmp_path / "out3"), progress=False)


# ---------------------------------------------------------------- index / inspect


def test_index_webdataset_shards(tmp_path):
    wds = pytest.importorskip("webdataset")
    keys = [f"sample{i:04d}" for i in range(10)]
    with wds.ShardWriter(str(tmp_path / "wds-%06d.tar"), maxcount=4, verbose=0) as sink:
        for i, key in enumerate(keys):
            sink.write({"__key__": key, "jpg": encode("JPEG", (8, 8), seed=i), "cls": i % 2, "json": {"i": i}})
    (tmp_path / "classes.txt").write_text("even\nodd\n")
    manifest = index(str(tmp_path), workers=2, progress=False)
    urls = sorted(str(p) for p in tmp_path.glob("*.tar"))
    read_back = [s["__key__"] for s in wds.WebDataset(urls, shardshuffle=False)]
    _, samples = read_by_offsets(str(tmp_path))
    assert manifest.num_samples == len(read_back) == 10 and manifest.sample_counts() == (4, 4, 2)
    assert [s.key for s in samples] == read_back == keys
    assert manifest.classes == ("even", "odd")
    assert index(str(tmp_path / "wds-{000000..000002}.tar"), progress=False) == manifest
    assert index(str(tmp_path / "wds-*.tar"), progress=False) == manifest


def test_index_reproduces_ingest_manifest_and_checks_folders(memroot):
    make_image_folder(f"{memroot}/src")
    written = ingest(f"{memroot}/src", f"{memroot}/out", shard_size=5, progress=False)
    fs = fsspec.filesystem("memory")
    original = fs.cat_file(f"{memroot}/out/{MANIFEST_NAME}")
    assert index(f"{memroot}/out/", progress=False).to_json().encode() == original
    assert written.num_samples == 18
    fs.pipe_file(f"{memroot}/other/x.tar", fs.cat_file(f"{memroot}/out/shard-000000.tar"))
    with pytest.raises(ConfigError, match="one folder"):
        index([f"{memroot}/out/shard-000000.tar", f"{memroot}/other/x.tar"], progress=False)
    with pytest.raises(StorageError):
        index(f"{memroot}/out/nothing-*.tar", progress=False)


def test_inspect_with_and_without_manifest(tmp_path):
    make_image_folder(str(tmp_path / "src"))
    ingest(str(tmp_path / "src"), str(tmp_path / "out"), shard_size=5, progress=False)
    _, samples = read_by_offsets(str(tmp_path / "out"))
    info = inspect(str(tmp_path / "out"), keys=3)
    assert (info["manifest"], info["shards"], info["samples"]) == (True, 5, 18)  # a shard a task of 5 inputs
    assert info["classes"] == list(CLASSES) and info["bytes"] > 0
    assert info["first_keys"] == [s.key for s in samples[:3]] and "cls" in info["fields"]
    (tmp_path / "out" / MANIFEST_NAME).unlink()
    bare = inspect(str(tmp_path / "out"), keys=7)
    assert (bare["manifest"], bare["samples"], bare["shards"]) == (False, None, 5)
    assert bare["first_keys"] == [s.key for s in samples[:5]]  # the first shard holds 5


# ---------------------------------------------------------------- helpers


def test_ordered_map_keeps_order_with_bounded_lookahead():
    started: list[int] = []

    def slow(i: int) -> int:
        started.append(i)
        time.sleep(random.random() / 500)
        return i * i

    out = _ordered_map(slow, range(50), workers=4, ahead=6)
    first = next(out)
    assert first == 0 and max(started) <= 6
    assert [first, *out] == [i * i for i in range(50)]


def test_buffer_shuffle_is_a_deterministic_permutation():
    import numpy as np

    a = list(shuffle_buffer(range(100), 16, np.random.default_rng(3)))
    b = list(shuffle_buffer(range(100), 16, np.random.default_rng(3)))
    assert a == b and sorted(a) == list(range(100)) and a != list(range(100))


def test_ingest_to_and_from_s3(tmp_path, s3_bucket):
    """Local folder → S3 with destination options; then S3 → S3, index and inspect on S3."""
    good, bad = make_image_folder(str(tmp_path / "src"))
    opts = s3_bucket.storage_options
    report = ingest(str(tmp_path / "src"), s3_bucket.url("out"), shard_size=10, progress=False,
                    dst_storage_options=opts)
    assert report.num_samples == len(good) and report.num_shards == 3  # 21 inputs, 10 a task
    s3_bucket.fs().put(str(tmp_path / "src"), s3_bucket.url("src"), recursive=True)
    again = ingest(s3_bucket.url("src"), s3_bucket.url("out2"), shard_size=10, progress=False, processes=2,
                   storage_options=opts)  # same protocol: the destination reuses them; s3fs ran in the driver first
    assert again.num_samples == len(good) and len(again.skipped) == len(bad)
    fs = s3_bucket.fs()
    for shard in ("shard-000000.tar", "shard-000001.tar", "shard-000002.tar"):  # same keys and order from either source
        assert fs.cat_file(f"{s3_bucket.name}/out/{shard}") == fs.cat_file(f"{s3_bucket.name}/out2/{shard}")
    original = fs.cat_file(f"{s3_bucket.name}/out/{MANIFEST_NAME}")
    assert index(s3_bucket.url("out"), storage_options=opts, progress=False).to_json().encode() == original
    assert index(s3_bucket.url("out"), storage_options=opts, progress=False, processes=2).to_json().encode() == original
    info = inspect(s3_bucket.url("out"), storage_options=opts, keys=2)
    assert (info["samples"], info["shards"], len(info["first_keys"])) == (len(good), 3, 2)


def test_index_reads_shards_in_blocks(tmp_path, monkeypatch):
    """Many small blocks (not whole shards), crossing member and shard boundaries, give the
    same manifest as ingest wrote."""
    import gpupipe.prepare.indexer as indexer_module
    from gpupipe.storage.fetch import FetchConfig

    make_image_folder(str(tmp_path / "src"))
    ingest(str(tmp_path / "src"), str(tmp_path / "out"), shard_size=6, progress=False)
    original = (tmp_path / "out" / MANIFEST_NAME).read_text()
    sizes = []
    real_index_shard = indexer_module.index_shard

    def spy(name, chunks):
        return real_index_shard(name, (sizes.append(len(c)) or c for c in chunks))

    monkeypatch.setattr(indexer_module, "index_shard", spy)
    monkeypatch.setattr(indexer_module, "FetchConfig",
                        lambda **kw: FetchConfig(block_bytes=1000, readahead_bytes=3000, **kw))
    assert index(str(tmp_path / "out"), workers=3, progress=False).to_json() == original
    assert max(sizes) == 1000 and len(sizes) > 3 * 3


def test_a_second_run_into_the_same_destination_refuses_naming_the_first_and_a_dead_ones_lock_is_taken_over(
        tmp_path, caplog):
    """Issue 39: two runs into one destination at once would interleave shards; the second refuses,
    naming the first (host, pid, start). A lock left by a run that is gone (killed, on this host)
    is taken over with a warning; a finished run leaves none."""
    import json
    import os
    import socket
    import subprocess
    import sys

    from gpupipe.prepare.ingest import LOCK_NAME

    src, dst = str(tmp_path / "src"), tmp_path / "dst"
    make_image_folder(f"file://{src}")
    dst.mkdir()
    lock = dst / LOCK_NAME
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": "just now"}))
    with pytest.raises(ConfigError, match=rf"being written by another `gpupipe ingest` \(pid {os.getpid()} on "):
        ingest(src, str(dst), progress=False)
    assert not (dst / MANIFEST_NAME).exists() and lock.exists()  # nothing written, the other run's lock kept
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": int(gone.stdout), "started": "earlier"}))
    with caplog.at_level(logging.WARNING):
        report = ingest(src, str(dst), progress=False)
    assert report.num_samples == 18 and "taking over" in caplog.text
    assert not lock.exists() and (dst / MANIFEST_NAME).exists()
    assert not [n for n in os.listdir(dst) if ".partial-" in n]
