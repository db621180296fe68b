"""`gpupipe validate` and `gpupipe preview` through a subprocess: a dataset with a corrupt, a
truncated and a 65500x65500-header JPEG and a sample without an image are quarantined with reasons (exit 1), a clean one passes
(exit 0), the preview PNG has the grid's size and real pixels, bad input is one line (exit 2)."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from lightning_util import real_jpeg, write_split
from tvshim import child_pythonpath

from gpupipe.formats.writer import ShardSink
from gpupipe.tools.preview import layout
from gpupipe.tools.validate import Problem, read_quarantine, write_quarantine

GPUPIPE = [sys.executable, "-m", "gpupipe.tools.cli"]
BAD = {"s00002": "truncated", "s00005": "decode failed", "s00007": "too many pixels", "s00010": "no image"}


def gpupipe(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*GPUPIPE, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": child_pythonpath()})


def assert_one_line_error(run: subprocess.CompletedProcess, needle: str) -> None:
    assert run.returncode == 2, run.stdout + run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpupipe: error: ") and needle in lines[0], run.stderr
    assert "Traceback" not in run.stderr


def damaged(i: int) -> bytes:
    """Sample i's JPEG; 2 cut in half, 5 with a bogus Huffman table (passes the header checks,
    fails a real decode), 7 declaring 65500x65500 pixels."""
    data = real_jpeg(i)
    if i == 2:
        return data[:len(data) // 2]
    if i == 5:
        at = data.index(b"\xff\xc4") + 5  # marker, length, class/id: the 16 code-length counts follow
        return data[:at] + b"\xff" * 16 + data[at + 16:]
    if i == 7:
        at = data.index(b"\xff\xc0") + 5  # marker, length, precision: height and width follow
        return data[:at] + struct.pack(">HH", 65500, 65500) + data[at + 4:]
    return data


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("validate")
    with ShardSink(str(root / "bad"), shard_size=4) as sink:
        for i in range(10):
            sink.write(f"s{i:05d}", {"jpg": damaged(i), "cls": str(i % 3).encode()})
        sink.write("s00010", {"txt": b"a caption, no image", "cls": b"1"})
    write_split(str(root / "clean"), 10, shard_size=4)
    (root / "pipeline.yaml").write_text(yaml.safe_dump({
        "source": {"train": str(root / "clean"), "val": str(root / "clean")}, "seed": 3,
        "decode": {"image_size": [24, 32], "on_error": "skip"}, "augment": "complex",
        "loader": {"batch_size": 4, "num_workers": 0}}))
    return root


def test_validate_quarantines_bad_images_with_reasons(data: Path, tmp_path: Path):
    run = gpupipe("validate", str(data / "bad"), "--quarantine", "q.jsonl", "--quiet", cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    entries = [json.loads(line) for line in (tmp_path / "q.jsonl").read_text().splitlines()]
    assert {e["key"]: e["kind"] for e in entries} == BAD
    assert all(e["shard"].endswith(".tar") and e["offset"] > 0 and e["reason"] for e in entries)
    assert "65500x65500" in next(e["reason"] for e in entries if e["key"] == "s00007")
    assert "11 samples in 3 shard(s)" in run.stdout and "7 good, 4 quarantined" in run.stdout
    for kind in BAD.values():
        assert kind in run.stdout


def test_validate_a_clean_config_split_with_pillow(data: Path, tmp_path: Path):
    run = gpupipe("validate", "--config", str(data / "pipeline.yaml"), "--split", "val", "--decode", "pil",
                  "--quarantine", "q.txt", "--quiet", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "10 good, 0 quarantined" in run.stdout and "pil on cpu" in run.stdout
    assert read_quarantine(str(tmp_path / "q.txt")) == []


@pytest.mark.parametrize("name", ["q.jsonl", "q.tsv"])
def test_quarantine_files_read_back(tmp_path: Path, name: str):
    problems = [Problem("s3://b/shard-000001.tar", "k\u00e9y 1", 1536, "decode failed", "pil: broken\tdata\nstream"),
                Problem("/d/shard-000002.tar", "", 0, "unreadable shard", "truncated tar")]
    write_quarantine(str(tmp_path / name), problems)
    back = read_quarantine(str(tmp_path / name))
    assert [(p.shard, p.key, p.offset, p.kind) for p in back] == [(p.shard, p.key, p.offset, p.kind) for p in problems]


def test_preview_writes_a_grid_of_real_pixels(data: Path, tmp_path: Path):
    from PIL import Image

    run = gpupipe("preview", "--config", str(data / "pipeline.yaml"), "--n", "6", "--out", "grid.png",
                  "--compare", "--epoch", "1", "--seed-offset", "2", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    with Image.open(tmp_path / "grid.png") as img:
        pixels = np.asarray(img.convert("RGB"), dtype=np.float64)
    grid = layout(6, (24, 32), compare=True)
    assert (grid.cols, grid.rows) == (3, 2) and grid.tile == (2 * 32 * 3, 24 * 3)
    assert pixels.shape == (grid.size[1], grid.size[0], 3)
    tile = pixels[4:4 + 72, 4 + 96:4 + 192]  # the first augmented image
    assert tile.std() > 10 and pixels.std() > 10


def test_validate_an_empty_index_says_it_is_empty(tmp_path: Path):
    ShardSink(str(tmp_path / "empty")).close()  # an index.json with no shards
    assert_one_line_error(gpupipe("validate", str(tmp_path / "empty"), cwd=tmp_path), "the dataset is empty")


def test_validate_checks_a_folder_indexed_in_place(tmp_path: Path):
    (tmp_path / "flat").mkdir()
    for i in range(2):
        (tmp_path / "flat" / f"s{i}.jpg").write_bytes(real_jpeg(i))
    (tmp_path / "flat" / "labels.csv").write_text("filename,label\ns0.jpg,0\ns1.jpg,1\n")
    assert gpupipe("index", str(tmp_path / "flat"), "--quiet", cwd=tmp_path).returncode == 0
    run = gpupipe("validate", str(tmp_path / "flat"), "--quiet", cwd=tmp_path)  # more: test_validate_inplace.py
    assert run.returncode == 0 and "2 samples in 1 image folder" in run.stdout, run.stdout + run.stderr


def test_bad_input_is_one_line(data: Path, tmp_path: Path):
    (tmp_path / "bad.yaml").write_text("source: {train: x}\naugment: [{name: RandomHflip}]\n")
    assert_one_line_error(gpupipe("validate", str(tmp_path / "missing"), cwd=tmp_path), "missing")
    assert_one_line_error(gpupipe("validate", cwd=tmp_path), "--config")
    assert_one_line_error(gpupipe("preview", "--config", "bad.yaml", cwd=tmp_path), "RandomHorizontalFlip")
    assert_one_line_error(gpupipe("validate", "--config", "bad.yaml", cwd=tmp_path), "augment[0].name")
    assert_one_line_error(gpupipe("preview", "--config", str(data / "pipeline.yaml"), "--split", "test",
                                  cwd=tmp_path), "source.test")


def test_validate_as_tasks_in_two_processes_finds_what_one_process_finds(data: Path):
    """--processes: a task a shard, each with its own decoder; the report is the same."""
    from gpupipe.tools.validate import validate

    one = validate(str(data / "bad"), decode="pil")
    two = validate(str(data / "bad"), decode="pil", processes=2)
    assert (two.checked, two.problems, two.backend) == (one.checked, one.problems, one.backend)
    assert {p.key: p.kind for p in two.problems} == BAD and two.checked == 11
