"""`gpupipe validate` and `gpupipe inspect` on sources read in place: an image folder (class
sub-folders, flat with labels.csv) and Parquet files. Bad images are named by their URL, bad
rows by file and row; a file the loader skips is listed, not quarantined; a changed image fails
its index.json checksum; a Parquet file whose footer is damaged is one line, exit 2."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from decode_corpus import cases
from lightning_util import real_jpeg
from test_cli_validate_preview import damaged  # 5: a JPEG whose Huffman table is bogus (a real decode fails)

from gpupipe.prepare.indexer import index_in_place
from gpupipe.tools.cli import main
from gpupipe.tools.validate import validate

FOLDER_BAD = {"c1/corrupt": "decode failed", "c1/page": "not an image", "c1/half": "truncated"}  # by sample key


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """c0/, c1/: four good JPEGs, three bad ones and a notes.txt in a class folder."""
    root = tmp_path_factory.mktemp("inplace") / "imgs"
    for c in ("c0", "c1"):
        (root / c).mkdir(parents=True)
    for i in range(4):
        (root / f"c{i % 2}" / f"img{i}.jpg").write_bytes(real_jpeg(i))
    (root / "c0" / "notes.txt").write_text("a note, not an image")
    (root / "c1" / "corrupt.jpg").write_bytes(damaged(5))
    (root / "c1" / "page.jpg").write_bytes(cases()["bad-html"][0])
    (root / "c1" / "half.jpg").write_bytes(cases()["bad-truncated-50"][0])
    return root


def write_table(path: Path, images: list, row_group_rows: int = 3) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"image": pa.array(images, pa.binary()), "label": [i % 2 for i in range(len(images))]}),
                   path, row_group_size=row_group_rows)


def test_validate_a_class_folder_names_each_bad_image(folder: Path, tmp_path: Path, capsys):
    assert main(["validate", str(folder), "--quarantine", str(tmp_path / "q.jsonl"), "--quiet"]) == 1
    out = capsys.readouterr().out
    entries = [json.loads(line) for line in (tmp_path / "q.jsonl").read_text().splitlines()]
    assert {e["key"]: e["kind"] for e in entries} == FOLDER_BAD
    assert all(e["shard"] == f"{folder}/{e['key']}.jpg" and e["offset"] == 0 and e["reason"] for e in entries)
    assert "7 samples in 1 image folder" in out and "4 good, 3 quarantined" in out, out
    assert f"{folder}/c1/corrupt.jpg: dali: " in out  # decoded for real with DALI (CPU), and named by its URL
    # the loader skips notes.txt (not an image file name): listed, not a sample, not a problem
    assert "skipped 1 file(s)" in out and f"{folder}/c0/notes.txt: not an image file name" in out


def test_validate_a_flat_folder_checks_index_json_checksums(tmp_path: Path):
    flat = tmp_path / "flat"
    flat.mkdir()
    for i in range(3):
        (flat / f"s{i}.jpg").write_bytes(real_jpeg(i))
    (flat / "labels.csv").write_text("filename,label\ns0.jpg,0\ns1.jpg,1\ns2.jpg,0\n")
    index_in_place(str(flat), checksums=True, progress=False)
    clean = validate(str(flat), decode="pil")
    assert (clean.checked, clean.problems, clean.skipped) == (3, [], [])
    data = bytearray(real_jpeg(1))
    data[-3] ^= 0x01  # same size, one bit in the entropy-coded data: decodes, but is not what was indexed
    (flat / "s1.jpg").write_bytes(bytes(data))
    changed = validate(str(flat), decode="pil")
    assert [(p.shard, p.key, p.kind) for p in changed.problems] == [(f"{flat}/s1.jpg", "s1", "checksum")]
    assert "rerun `gpupipe index`" in changed.problems[0].reason


def test_validate_parquet_names_null_and_undecodable_cells(tmp_path: Path, capsys):
    images = [real_jpeg(0), real_jpeg(1), None, real_jpeg(3), damaged(5)]
    write_table(tmp_path / "pq" / "part-0.parquet", images)
    write_table(tmp_path / "pq" / "part-1.parquet", [real_jpeg(6), real_jpeg(7)])
    assert main(["validate", str(tmp_path / "pq"), "--decode", "pil", "--quarantine", str(tmp_path / "q.tsv"),
                 "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "7 samples in 3 row group(s) in 2 Parquet file(s)" in out and "5 good, 2 quarantined" in out, out
    lines = (tmp_path / "q.tsv").read_text().splitlines()[1:]
    got = [tuple(line.split("\t")[:4]) for line in lines]
    part0 = str(tmp_path / "pq" / "part-0.parquet")
    assert got == [(part0, "row 2", "2", "no image"), (part0, "row 4", "4", "decode failed")]
    assert f"{part0}, row 4: pil: " in out


def test_validate_a_parquet_file_with_a_damaged_footer_is_one_line(tmp_path: Path, capsys):
    path = tmp_path / "pq" / "part-0.parquet"
    write_table(path, [real_jpeg(0), real_jpeg(1)])
    data = bytearray(path.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")
    data[-8 - footer:-8] = b"\x07" * footer  # the footer's thrift bytes, garbled; the trailer stays
    path.write_bytes(bytes(data))
    assert main(["validate", str(tmp_path / "pq"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpupipe: error: ") and str(path) in err[0] and "footer" in err[0], err


def test_inspect_an_image_folder_says_what_it_is(tmp_path: Path, capsys):
    from datagen import payload
    from inplace_data import write_class_folder

    write_class_folder(str(tmp_path / "imgs"), 5)
    assert main(["inspect", str(tmp_path / "imgs"), "--keys", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    size = sum(len(payload(i)) for i in range(5))
    assert lines[1:7] == ["kind:     image folder (read in place)", "units:    5 images", "samples:  5",
                          f"bytes:    {size} B", "classes:  3 (c0, c1, c2)", "fields:   cls, jpg"]
    assert lines[7:] == ["first objects:", "  c0/img00000.jpg", "  c0/img00003.jpg"]


def test_inspect_parquet_names_its_row_groups_columns_and_first_rows(tmp_path: Path, capsys):
    from inplace_data import write_parquet

    write_parquet(str(tmp_path / "pq"), [5, 5], layout="hf", row_group_rows=3)
    assert main(["inspect", str(tmp_path / "pq"), "--keys", "4", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["kind"], info["units"], info["files"], info["samples"]) == ("parquet", 4, 2, 10)
    assert info["bytes"] == sum(p.stat().st_size for p in (tmp_path / "pq").glob("*.parquet"))
    assert (info["image_column"], info["label_column"], info["classes"]) == ("image.bytes", "label", ["c0", "c1", "c2"])
    assert info["first_keys"] == ["part-000.parquet/0", "part-000.parquet/1", "part-000.parquet/2",
                                  "part-000.parquet/3"]  # across the first row group's end
    assert main(["inspect", str(tmp_path / "pq")]) == 0
    out = capsys.readouterr().out
    assert "units:    4 row groups in 2 files" in out and "columns:  image=image.bytes, label=label" in out
    assert f"first keys ({tmp_path / 'pq'}/part-000.parquet):" in out


def test_validate_a_config_split_uses_its_parquet_columns(tmp_path: Path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    (tmp_path / "pq").mkdir()
    pq.write_table(pa.table({"thumb": pa.array([b"x"] * 2, pa.binary()), "jpeg": pa.array([real_jpeg(0), None]),
                             "label": [0, 1]}), tmp_path / "pq" / "part-0.parquet")
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({
        "source": {"train": str(tmp_path / "pq"), "image_column": "jpeg"}, "decode": {"image_size": [8, 8]},
        "loader": {"batch_size": 2, "num_workers": 0}}))
    # two binary columns: only the config's source.image_column says which one holds the images
    assert main(["validate", "--config", str(tmp_path / "p.yaml"), "--decode", "pil", "--quiet"]) == 1
    assert "1 good, 1 quarantined" in capsys.readouterr().out
