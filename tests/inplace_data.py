"""Tiny generated sources read in place: image folders and Parquet tables.

Every image is ``datagen.payload(i)`` (JPEG magic, then bytes that encode ``i``), so a
delivered batch says which image it holds without decoding; ``label_of(i)`` is its label.
"""
from __future__ import annotations

import json

import fsspec
from datagen import payload

CLASSES = 3


def label_of(i: int) -> int:
    return i % CLASSES


def write_class_folder(url: str, n: int, *, storage_options: dict | None = None) -> None:
    """``url/c<label>/img<i>.jpg`` for ``i`` in ``range(n)``, plus a stray ``notes.txt``."""
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    root = root.rstrip("/")
    for i in range(n):
        fs.makedirs(f"{root}/c{label_of(i)}", exist_ok=True)
        fs.pipe_file(f"{root}/c{label_of(i)}/img{i:05d}.jpg", payload(i))
    fs.makedirs(root, exist_ok=True)
    fs.pipe_file(f"{root}/notes.txt", b"not an image")


def write_flat_folder(url: str, n: int, *, labels: str = "csv", storage_options: dict | None = None) -> None:
    """``url/img<i>.jpg`` and a labels file: ``csv`` (class names ``c<label>``) or ``json``
    (integer labels, keyed by the stem)."""
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    root = root.rstrip("/")
    fs.makedirs(root, exist_ok=True)
    for i in range(n):
        fs.pipe_file(f"{root}/img{i:05d}.jpg", payload(i))
    if labels == "csv":
        rows = "".join(f"img{i:05d}.jpg,c{label_of(i)}\n" for i in range(n))
        fs.pipe_file(f"{root}/labels.csv", ("filename,class\n" + rows).encode())
    else:
        fs.pipe_file(f"{root}/labels.json", json.dumps({f"img{i:05d}": label_of(i) for i in range(n)}).encode())


def parquet_table(ids: list[int], layout: str = "binary"):
    """A pyarrow table of images ``ids``: ``binary`` (``image`` bytes, int ``label``) or
    ``hf`` (Hugging Face ``datasets`` Image layout: ``image`` = {bytes, path}, ``label``
    a ClassLabel in the schema metadata), with an unrelated column in between."""
    import pyarrow as pa

    images = [payload(i) for i in ids]
    labels = pa.array([label_of(i) for i in ids], pa.int64())
    if layout == "binary":
        return pa.table({"image": pa.array(images, pa.binary()), "caption": [f"no. {i}" for i in ids],
                         "label": labels})
    struct = pa.array([{"bytes": b, "path": f"img{i:05d}.jpg"} for i, b in zip(ids, images)],
                      pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    features = {"image": {"_type": "Image"},
                "label": {"_type": "ClassLabel", "names": [f"c{k}" for k in range(CLASSES)]}}
    table = pa.table({"image": struct, "caption": [f"no. {i}" for i in ids], "label": labels})
    return table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})


def write_parquet(url: str, counts: list[int], *, layout: str = "binary", row_group_rows: int = 7,
                  storage_options: dict | None = None) -> None:
    """Files ``part-<k>.parquet`` with ``counts[k]`` rows each, ids in file order, written
    with pyarrow (``layout`` as in :func:`parquet_table`) or pandas (``layout="pandas"``)."""
    import pyarrow.parquet as pq

    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    root = root.rstrip("/")
    fs.makedirs(root, exist_ok=True)
    start = 0
    for k, n in enumerate(counts):
        ids = list(range(start, start + n))
        start += n
        path = f"{root}/part-{k:03d}.parquet"
        if layout == "pandas":
            import pandas as pd

            frame = pd.DataFrame({"image": [payload(i) for i in ids], "label": [label_of(i) for i in ids]})
            with fs.open(path, "wb") as f:
                frame.to_parquet(f, row_group_size=row_group_rows, engine="pyarrow")
            continue
        with fs.open(path, "wb") as f:
            pq.write_table(parquet_table(ids, layout), f, row_group_size=row_group_rows)


def image_ids(batch) -> list[int]:
    """Ids of the valid images of an EncodedBatch, read from the bytes; checks each label."""
    out = []
    for i in range(len(batch)):
        if bool(batch.valid[i]):
            data = bytes(batch.image(i))
            sid = int.from_bytes(data[3:7], "big")
            assert data == payload(sid), "image bytes do not match their sample"
            assert int(batch.labels[i]) == label_of(sid), (batch.keys[i], int(batch.labels[i]))
            out.append(sid)
    return out
