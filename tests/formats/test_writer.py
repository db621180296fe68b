"""ShardSink writes each shard and the index whole or not at all (issue 39): on a local disk
through a hidden temporary name and a rename, so a run killed mid-write leaves no shard under its
final name; on object storage one put."""
from __future__ import annotations

import os

import pytest

from gpupipe.formats.manifest import MANIFEST_NAME, Manifest
from gpupipe.formats.writer import ShardSink


def test_a_local_shard_appears_whole_under_its_name_and_leaves_no_temporary_file(tmp_path):
    with ShardSink(str(tmp_path / "ds"), shard_size=2) as sink:
        for i in range(5):
            sink.write(f"k{i}", {"jpg": b"\xff\xd8\xff" + bytes([i]) * 100, "cls": b"0"})
    names = sorted(os.listdir(tmp_path / "ds"))
    assert names == [MANIFEST_NAME, "shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    manifest = Manifest.from_json((tmp_path / "ds" / MANIFEST_NAME).read_text())
    assert [e.size for e in manifest.shards] == [os.path.getsize(tmp_path / "ds" / e.name) for e in manifest.shards]


def test_a_write_that_fails_before_the_rename_leaves_neither_the_shard_nor_its_temporary(tmp_path, monkeypatch):
    sink = ShardSink(str(tmp_path / "ds"), shard_size=2)
    sink.write("k0", {"jpg": b"\xff\xd8\xff" + b"x" * 100})

    def killed(src, dst):  # the process dies between writing the bytes and the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        sink.write("k1", {"jpg": b"\xff\xd8\xff" + b"y" * 100})
    assert os.listdir(tmp_path / "ds") == []
