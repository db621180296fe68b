"""One reader per format (issue 24): ``gpupipe ingest`` and reading in place read a source by the
same rules, so the same bytes give the same samples, labels and errors on both paths.

Each row of the table writes a small source with real pyarrow / Pillow files and reads it twice:
(a) ``ingest`` into shards, read back with ``EncodedLoader``; (b) ``EncodedLoader`` on the source
in place. Both must give the samples the rule says -- as (key, label, image bytes) -- or both
refuse the source with the same error, or both find the same bad samples: ingest skips and lists
them, the loader raises the same ``ShardFormatError`` (``on_error="raise"``) or skips them.

One difference is by design and has its row: ingest also checks each image's header before
writing it, so bytes that are no image are left out of the shards, where the loader hands them
to the decoder (whose ``on_error`` decides).
"""
from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpupipe.core.errors import ConfigError, GpupipeError, ShardFormatError, StorageError
from gpupipe.loader.encoded import EncodedLoader
from gpupipe.prepare.ingest import ingest
from gpupipe.sources.source import Source, resolve

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
PIL = pytest.importorskip("PIL.Image")

Triple = tuple[str, int, bytes]


def img(i: int, fmt: str = "JPEG") -> bytes:
    """A real image, different for every ``i``."""
    buf = io.BytesIO()
    image = PIL.new("RGB", (8 + i % 5, 8), ((37 * i) % 256, (11 * i) % 256, 200))
    image.putpixel((0, 0), (i % 256, i // 256, 7))
    image.save(buf, fmt)
    return buf.getvalue()


# ---------------------------------------------------------------- sources: each returns (url, the samples the rule gives)

def parquet(tmp: Path, columns: dict, name: str = "t.parquet", metadata: dict | None = None,
            rows_per_group: int = 3) -> str:
    table = pa.table(columns)
    if metadata is not None:
        table = table.replace_schema_metadata({"huggingface": json.dumps(metadata)})
    (tmp / "src").mkdir(exist_ok=True)
    pq.write_table(table, str(tmp / "src" / name), row_group_size=rows_per_group)
    return str(tmp / "src")


def binary(values) -> pa.Array:
    return pa.array(values, pa.binary())


def rows(name: str, labels, images) -> list[Triple]:
    return [(f"{name}/{i}", label, image) for i, (label, image) in enumerate(zip(labels, images))]


def named_image_column(tmp):
    images, thumbs = [img(i) for i in range(5)], [img(100 + i) for i in range(5)]
    src = parquet(tmp, {"thumb": binary(thumbs), "image": binary(images), "label": [i % 3 for i in range(5)]})
    return src, rows("t.parquet", [i % 3 for i in range(5)], images)


def only_binary_column(tmp):
    images = [img(i) for i in range(4)]
    src = parquet(tmp, {"caption": [f"no. {i}" for i in range(4)], "pixels": binary(images), "label": [1, 0, 1, 0]})
    return src, rows("t.parquet", [1, 0, 1, 0], images)


def two_binary_columns(tmp):
    a, b = [img(i) for i in range(4)], [img(50 + i) for i in range(4)]
    src = parquet(tmp, {"a": binary(a), "b": binary(b), "label": [0, 1, 2, 3]})
    return src, rows("t.parquet", [0, 1, 2, 3], b)  # what image_column="b" gives


def explicit_label_column(tmp):
    images = [img(i) for i in range(4)]
    src = parquet(tmp, {"image": binary(images), "label": [9, 9, 9, 9], "y": [3, 2, 1, 0]})
    return src, rows("t.parquet", [3, 2, 1, 0], images)


def int_labels(tmp):
    images, labels = [img(i) for i in range(7)], [4, 0, 7, 2, 2, 0, 1]
    return parquet(tmp, {"image": binary(images), "label": labels}), rows("t.parquet", labels, images)


def string_labels(tmp):
    images, names = [img(i) for i in range(6)], ["emu", "cat", "dog", "cat", "emu", "emu"]
    src = parquet(tmp, {"image": binary(images), "class": names})
    return src, rows("t.parquet", [("cat", "dog", "emu").index(n) for n in names], images)


def hugging_face_layout(tmp):
    """``{bytes, path}`` struct images (only ``bytes`` read; ``path`` names nothing) and a ClassLabel."""
    images = [img(i, "PNG") for i in range(5)]
    struct = pa.array([{"bytes": b, "path": f"photo{i}.png"} for i, b in enumerate(images)],
                      pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    features = {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": ["a", "b", "c"]}}
    src = parquet(tmp, {"image": struct, "label": [2, 0, 1, 1, 0]}, metadata={"info": {"features": features}})
    return src, rows("t.parquet", [2, 0, 1, 1, 0], images)


def null_label(tmp):
    images, labels = [img(i) for i in range(5)], [0, 1, None, 1, 0]
    src = parquet(tmp, {"image": binary(images), "label": pa.array(labels, pa.int64())})
    return src, [r for r in rows("t.parquet", labels, images) if r[1] is not None]


def null_image(tmp):
    images = [img(0), None, img(2), img(3)]
    src = parquet(tmp, {"image": binary(images), "label": [0, 1, 0, 1]})
    return src, [r for r in rows("t.parquet", [0, 1, 0, 1], images) if r[2] is not None]


def label_past_the_class_list(tmp):
    images, labels = [img(i) for i in range(4)], [0, 5, 2, 1]
    features = {"label": {"_type": "ClassLabel", "names": ["a", "b", "c"]}}
    src = parquet(tmp, {"image": binary(images), "label": labels}, metadata={"info": {"features": features}})
    return src, [r for r in rows("t.parquet", labels, images) if r[1] != 5]


def minus_one_is_no_label(tmp):
    images, labels = [img(i) for i in range(4)], [0, -1, 2, -1]
    return parquet(tmp, {"image": binary(images), "label": labels}), rows("t.parquet", labels, images)


def no_label_column(tmp):
    images = [img(i) for i in range(4)]
    return parquet(tmp, {"image": binary(images), "caption": list("abcd")}), rows("t.parquet", [-1] * 4, images)


def float_labels(tmp):
    return parquet(tmp, {"image": binary([img(0), img(1)]), "label": [0.0, 1.0]}), None


def list_image_column(tmp):
    images = pa.array([[img(0)], [img(1)]], pa.list_(pa.binary()))
    return parquet(tmp, {"image": images, "label": [0, 1]}), None


def empty_file(tmp):
    return parquet(tmp, {"image": binary([]), "label": pa.array([], pa.int64())}), None


def empty_file_beside_another(tmp):
    parquet(tmp, {"image": binary([]), "label": pa.array([], pa.int64())}, name="a.parquet")
    images = [img(i) for i in range(3)]
    return parquet(tmp, {"image": binary(images), "label": [1, 1, 0]}, name="b.parquet"), rows("b.parquet", [1, 1, 0],
                                                                                                 images)


def string_labels_given_classes(tmp):
    images, names = [img(i) for i in range(4)], ["dog", "cat", "dog", "dog"]
    src = parquet(tmp, {"image": binary(images), "label": names})
    return src, rows("t.parquet", [("ant", "cat", "dog").index(n) for n in names], images)


def delta_overwritten(tmp):
    """A Delta table: its latest snapshot, not the files an overwrite removed."""
    deltalake = pytest.importorskip("deltalake")
    url = str(tmp / "src")
    deltalake.write_deltalake(url, pa.table({"image": binary([img(i) for i in range(4)]), "label": [0, 1, 0, 1]}))
    images = [img(10 + i) for i in range(3)]
    deltalake.write_deltalake(url, pa.table({"image": binary(images), "label": [2, 2, 1]}), mode="overwrite")
    (file,) = deltalake.DeltaTable(url).file_uris()
    return url, rows(Path(file).name, [2, 2, 1], images)


def files(tmp: Path, tree: dict[str, bytes | str]) -> str:
    for rel, data in tree.items():
        path = tmp / "src" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
    return str(tmp / "src")


def class_folders(tmp):
    tree = {"dog/b.jpg": img(1), "cat/a.jpg": img(0), "cat/sub/c.jpg": img(2), "notes.txt": "not an image"}
    return files(tmp, tree), [("cat/a", 0, img(0)), ("cat/sub/c", 0, img(2)), ("dog/b", 1, img(1))]


def flat_labels_csv(tmp):
    tree = {f"img{i}.jpg": img(i) for i in range(4)} | {
        "labels.csv": "filename,class\nimg0.jpg,dog\nimg1.jpg,cat\nimg2,dog\nimg3.jpg,cat\n"}  # img2: by its stem
    return files(tmp, tree), [(f"img{i}", (1, 0, 1, 0)[i], img(i)) for i in range(4)]


def flat_labels_json(tmp):
    tree = {f"img{i}.png": img(i, "PNG") for i in range(3)} | {"labels.json": json.dumps({"img0": 2, "img1": 0,
                                                                                          "img2.png": 5})}
    return files(tmp, tree), [("img0", 2, img(0, "PNG")), ("img1", 0, img(1, "PNG")), ("img2", 5, img(2, "PNG"))]


def flat_file_missing_from_labels(tmp):
    tree = {f"img{i}.jpg": img(i) for i in range(4)} | {"labels.csv": "filename,label\nimg0.jpg,0\nimg1.jpg,1\n"}
    return files(tmp, tree), None


def flat_without_labels(tmp):
    return files(tmp, {f"img{i}.jpg": img(i) for i in range(3)}), [(f"img{i}", -1, img(i)) for i in range(3)]


def non_image_files(tmp):
    tree = {"cat/a.jpg": img(0), "cat/notes.txt": "notes", "dog/data.bin": b"\0\1", "dog/b.jpg": img(1),
            "dog/noext": img(2)}
    return files(tmp, tree), [("cat/a", 0, img(0)), ("dog/b", 1, img(1))]


def hidden_files(tmp):
    tree = {"cat/a.jpg": img(0), "cat/.b.jpg": img(1), ".cache/c.jpg": img(2), "dog/.thumbs/d.jpg": img(3),
            "dog/e.jpg": img(4), "dog/.DS_Store": "x"}
    return files(tmp, tree), [("cat/a", 0, img(0)), ("dog/e", 1, img(4))]


def extension_case_and_dots(tmp):
    tree = {"cat/A.JPG": img(0), "cat/b.Png": img(1, "PNG"), "dog/c.jpeg": img(2), "dog/img.1.jpg": img(3),
            "dog/p.jpg": img(4, "PNG")}  # a PNG named .jpg: the bytes say what it is
    return files(tmp, tree), [("cat/A", 0, img(0)), ("cat/b", 0, img(1, "PNG")), ("dog/c", 1, img(2)),
                              ("dog/img_1", 1, img(3)), ("dog/p", 1, img(4, "PNG"))]


def images_at_two_levels(tmp):
    return files(tmp, {"cat/a.jpg": img(0), "top.jpg": img(1)}), None


def one_name_two_extensions(tmp):
    """Two samples, as torchvision's ImageFolder reads them; their keys keep the extension (issue 36)."""
    return files(tmp, {"cat/x.jpg": img(0), "cat/x.png": img(1, "PNG"), "dog/y.jpg": img(2)}), [
        ("cat/x_jpg", 0, img(0)), ("cat/x_png", 0, img(1, "PNG")), ("dog/y", 1, img(2))]


def two_images_one_key(tmp):
    """Keys that collide even with their extensions kept."""
    return files(tmp, {"cat/x.jpg": img(0), "cat/x.png": img(1, "PNG"), "cat/x_png.gif": img(2, "GIF")}), None


def folder_given_classes(tmp):
    tree = {"cat/a.jpg": img(0), "dog/b.jpg": img(1)}
    return files(tmp, tree), [("cat/a", 1, img(0)), ("dog/b", 2, img(1))]


def folder_class_not_given(tmp):
    return files(tmp, {"cat/a.jpg": img(0), "emu/b.jpg": img(1)}), None


def empty_image_file(tmp):
    return files(tmp, {"cat/a.jpg": img(0), "cat/empty.jpg": b"", "dog/b.jpg": img(1)}), [
        ("cat/a", 0, img(0)), ("dog/b", 1, img(1))]


def not_an_image(tmp):
    page = b"<!DOCTYPE html><html><body>Not found</body></html>"
    return files(tmp, {"cat/a.jpg": img(0), "cat/page.jpg": page, "dog/b.jpg": img(1)}), [
        ("cat/a", 0, img(0)), ("dog/b", 1, img(1))]


# ---------------------------------------------------------------- the table

@dataclass(frozen=True)
class Case:
    build: Callable[[Path], tuple[str, list[Triple] | None]]
    options: dict = field(default_factory=dict)  # Source(...) and ingest(...) take the same names
    error: type[GpupipeError] | None = None  # the source is refused: both raise this, with one message
    match: str = ""  # what the message says (the refusal, or each bad sample's reason)
    bad: int = 0  # samples both find unusable: ingest skips and lists them, the loader raises or skips
    not_read: tuple[str, ...] = ()  # files both leave out (listed by ingest, in source.skipped in place)
    probed: tuple[str, ...] = ()  # keys only ingest drops: its header check (the loader's decoder sees them)
    at_start: str = ""  # what a loader says when it is made, before any batch, of bad samples it knows of then


CASES = {
    # Parquet: which image column
    "parquet: a conventional image column wins": Case(named_image_column),
    "parquet: the only binary column": Case(only_binary_column),
    "parquet: two binary columns, none named": Case(two_binary_columns, error=ConfigError,
                                                    match=r"cannot tell the image column .*\['a', 'b'\]"),
    "parquet: an explicit image column": Case(two_binary_columns, {"image_column": "b"}),
    "parquet: a missing explicit image column": Case(only_binary_column, {"image_column": "image"},
                                                     error=ConfigError, match="image_column: column 'image' of .* is "
                                                                              "missing"),
    "parquet: an explicit label column": Case(explicit_label_column, {"label_column": "y"}),
    "parquet: a list column is no image column": Case(list_image_column, error=ConfigError,
                                                      match="no image-bytes column"),
    "parquet: a Hugging Face struct and ClassLabel": Case(hugging_face_layout),
    # Parquet: labels
    "parquet: integer labels are kept": Case(int_labels),
    "parquet: string labels number the sorted names": Case(string_labels),
    "parquet: string labels by a given class list": Case(string_labels_given_classes,
                                                         {"classes": ("ant", "cat", "dog")}),
    "parquet: a name outside the given list": Case(string_labels_given_classes, {"classes": ("ant", "cat")},
                                                   error=ConfigError, match=r"class\(es\) \['dog'\] that the class "
                                                                            r"list \(2 classes \[ant, cat\]\)"),
    "parquet: a null label is a bad row": Case(null_label, bad=1, match=r"sample 't.parquet/2': the label cell is "
                                                                         r"null"),
    "parquet: a null image is a bad row": Case(null_image, bad=1, match="sample 't.parquet/1': the image cell is null"),
    "parquet: a label past the ClassLabel names": Case(label_past_the_class_list, bad=1,
                                                       match=r"label 5 is not a class number \(0 to 2"),
    "parquet: -1 means no label": Case(minus_one_is_no_label),
    "parquet: no label column, unlabelled": Case(no_label_column),
    "parquet: float labels": Case(float_labels, error=ConfigError, match="labels must be integers or strings"),
    # Parquet: files
    "parquet: an empty file alone": Case(empty_file, error=StorageError, match=r"no rows in 1 Parquet file"),
    "parquet: an empty file beside another": Case(empty_file_beside_another),
    "delta: the latest snapshot only": Case(delta_overwritten),
    # image folders
    "folder: class sub-folders": Case(class_folders, not_read=("notes.txt",)),
    "folder: a given class list": Case(folder_given_classes, {"classes": ("ant", "cat", "dog")}),
    "folder: a class outside the given list": Case(folder_class_not_given, {"classes": ("cat", "dog")},
                                                   error=ConfigError, match=r"class\(es\) \['emu'\]"),
    "folder: flat with labels.csv": Case(flat_labels_csv),
    "folder: flat with labels.json": Case(flat_labels_json),
    "folder: an explicit labels file": Case(flat_labels_json, {"labels": "LABELS"}),
    "folder: a file missing from labels.csv": Case(flat_file_missing_from_labels, error=ConfigError,
                                                   match=r"2 of 4 images have no label \(img2.jpg, img3.jpg"),
    "folder: flat without labels, unlabelled": Case(flat_without_labels),
    "folder: non-image files": Case(non_image_files, not_read=("cat/notes.txt", "dog/data.bin", "dog/noext")),
    "folder: hidden files and folders": Case(hidden_files, not_read=(".cache/c.jpg", "cat/.b.jpg", "dog/.DS_Store",
                                                                     "dog/.thumbs/d.jpg")),
    "folder: extensions in any case, dots in names": Case(extension_case_and_dots),
    "folder: images at two levels": Case(images_at_two_levels, error=ConfigError,
                                         match="images at the top level .*top.jpg.* and in sub-folders"),
    "folder: one name, two extensions": Case(one_name_two_extensions),
    "folder: two images with one key": Case(two_images_one_key, error=ConfigError,
                                            match="cat/x.png and .*cat/x_png.gif give one sample key 'cat/x_png'"),
    "folder: an empty image file": Case(empty_image_file, bad=1, match=r"sample 'cat/empty': the image is empty",
                                        at_start="1 of its 3 images is empty (0 bytes): cat/empty.jpg"),
    "folder: bytes that are no image": Case(not_an_image, probed=("cat/page",)),
}


def read(source, on_error: str = "raise") -> list[Triple]:
    """Every valid sample the loader delivers, as (key, label, image bytes), sorted."""
    loader = EncodedLoader(source, batch_size=4, shuffle=False, drop_last=False, on_error=on_error, num_workers=0,
                           rank=0, world_size=1)
    return sorted((b.keys[i], int(b.labels[i]), bytes(b.image(i))) for b in loader for i in range(len(b))
                  if bool(b.valid[i]))


def attempt(fn):
    try:
        return fn(), None
    except GpupipeError as exc:
        return None, exc


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_ingest_and_in_place_read_one_source_alike(case: Case, tmp_path: Path):
    src, expected = case.build(tmp_path)
    options = dict(case.options)
    if options.get("labels") == "LABELS":  # a mapping file somewhere else, named explicitly
        (tmp_path / "elsewhere.json").write_bytes((Path(src) / "labels.json").read_bytes())
        (Path(src) / "labels.json").unlink()
        options["labels"] = str(tmp_path / "elsewhere.json")
    report, ingest_error = attempt(lambda: ingest(src, str(tmp_path / "shards"), shard_size=3, shuffle=False,
                                                  progress=False, **options))
    in_place, in_place_error = attempt(lambda: read(Source(src, **options)))

    if case.error is not None:  # the source is refused: by both, with one message
        assert type(ingest_error) is type(in_place_error) is case.error, (ingest_error, in_place_error)
        assert str(ingest_error) == str(in_place_error) and re.search(case.match, str(in_place_error))
        assert not (tmp_path / "shards").exists()
        return
    assert ingest_error is None, ingest_error
    left_out = resolve(Source(src, **options), use_index=False).skipped  # files the listing does not read
    assert sorted(p[len(src) + 1:] for p, _ in left_out) == sorted(case.not_read)
    skipped = {p[len(src) + 1:]: reason for p, reason in report.skipped}
    assert {p: skipped[p] for p in case.not_read} == {p[len(src) + 1:]: reason for p, reason in left_out}
    bad = [reason for p, reason in skipped.items() if p not in case.not_read]
    assert len(bad) == case.bad + len(case.probed), bad

    if case.bad:  # the same bad samples, for the same reason (or named when the loader is made: an empty file)
        assert isinstance(in_place_error, ShardFormatError), in_place_error
        assert (in_place_error.reason in bad and re.search(case.match, in_place_error.reason)) or \
            (case.at_start and case.at_start in in_place_error.reason), in_place_error
        in_place = read(Source(src, **options), on_error="skip")
    else:
        assert in_place_error is None, in_place_error
    # ingest's header check is its own: reading in place, the decoder judges these bytes
    assert sorted(t[0] for t in in_place if t[0] in case.probed) == sorted(case.probed)
    assert read(str(tmp_path / "shards")) == [t for t in in_place if t[0] not in case.probed] == sorted(expected)
